// Tiny training runs shared by the observability tests (each runs once per test process): the
// CI tiny Llama on mock data through the megatrain binary, as a user runs it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "catch.h"
#include "common/run_binary.h"

namespace mt::test {

inline const std::string& tiny_config() {
  static const std::string path = source_path("configs/ci/tiny-llama.yaml");
  return path;
}

// train --config tiny with the run's own checkpoint dir and metrics file under temp_dir()/name.
inline std::string tiny_train_args(const std::string& name, const std::string& extra) {
  const fs::path d = temp_dir() / name;
  return "train --config " + tiny_config() + " --set checkpoint.dir=" + (d / "ckpt").string() +
         " --set logging.metrics_file=" + (d / "metrics.jsonl").string() + " " + extra;
}

// The metrics file's records, in file order.
inline std::vector<nlohmann::json> metrics_records(const fs::path& file) {
  std::vector<nlohmann::json> out;
  std::ifstream f(file);
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

// The main run: 12 iterations, log_interval 5, eval_interval 10, a checkpoint every 4 (all kept),
// TensorBoard on. Stdout + stderr in `log`.
struct MainRun {
  fs::path dir;
  std::string log;
  int code = -1;
};
inline const MainRun& main_run() {
  static const MainRun run = [] {
    MainRun r;
    r.dir = temp_dir() / "main";
    RunResult res = run_megatrain(tiny_train_args("main", "--set training.train_iters=12 --set logging.log_interval=5 "
                                                          "--set checkpoint.save_interval=4 --set checkpoint.keep_last=0 "
                                                          "--set logging.tensorboard_dir=" +
                                                              (r.dir / "tb").string()),
                                  "main");
    r.code = res.code;
    r.log = res.out + res.err;
    return r;
  }();
  return run;
}

// The same 12 iterations with log_interval 1: every iteration's own loss.
inline const std::map<int64_t, nlohmann::json>& per_iteration_run() {
  static const std::map<int64_t, nlohmann::json> records = [] {
    RunResult res = run_megatrain(
        tiny_train_args("every", "--set training.train_iters=12 --set logging.log_interval=1 --set checkpoint.dir="),
        "every");
    REQUIRE(res.code == 0);
    std::map<int64_t, nlohmann::json> m;
    for (const auto& j : metrics_records(temp_dir() / "every" / "metrics.jsonl"))
      if (j.contains("loss")) m[j["iteration"].get<int64_t>()] = j;
    return m;
  }();
  return records;
}

}  // namespace mt::test
