// The checkpointing run the checkpoint-safety and async-save tests share: tiny-llama, 6 iterations, a checkpoint
// every 2, the checkpoints and the metrics file under temp_dir()/name.
#pragma once

#include <map>
#include <string>

#include "common/run_binary.h"

namespace mt::test {

inline std::string ckpt_run_args(const std::string& name, const std::string& extra = "") {
  const fs::path d = temp_dir() / name;
  return "train --config " + source_path("configs/ci/tiny-llama.yaml") +
         " --set training.train_iters=6 --set training.eval_interval=0" +
         " --set logging.log_interval=1 --set checkpoint.save_interval=2 --set checkpoint.dir=" +
         (d / "ckpt").string() + " --set logging.metrics_file=" + (d / "metrics.jsonl").string() + " " + extra;
}

inline std::map<int64_t, StepMetrics> ckpt_run_losses(const std::string& name) {
  return read_metrics(temp_dir() / name / "metrics.jsonl");
}

}  // namespace mt::test
