// The tiny feature configs (configs/ci/qwen3-tiny.yaml: qk_layernorm, kv_channels != hidden/heads, GQA;
// qwen2-tiny.yaml: add_qkv_bias, tied; llama-gpt2features-tiny.yaml: GPT-2's features on the llama preset) train
// on the CPU through the megatrain binary: every loss finite, the loss falls.
#include <cmath>
#include <string>

#include "catch.h"
#include "common/run_binary.h"

using namespace mt::test;

TEST_CASE("the tiny feature configs train on the CPU with falling loss", "[e2e][features]") {
  for (const char* name : {"qwen3-tiny", "qwen2-tiny", "llama-gpt2features-tiny"}) {
    const fs::path metrics = temp_dir() / (std::string(name) + ".jsonl");
    const RunResult r = run_megatrain("train --config " + source_path(std::string("configs/ci/") + name + ".yaml") +
                                          " --set training.train_iters=20 --set logging.log_interval=1"
                                          " --set training.eval_iters=0 --set logging.metrics_file=" +
                                          metrics.string(),
                                      name);
    INFO(name << "\n" << r.err.substr(0, 2000));
    REQUIRE(r.code == 0);
    auto m = read_metrics(metrics);
    REQUIRE(m.size() == 20);
    for (auto& [it, s] : m) {
      INFO("iteration " << it);
      CHECK(std::isfinite(s.loss));
      CHECK(std::isfinite(s.grad_norm));
    }
    // Mock data is learnable: from about ln(128) = 4.85 the loss falls clearly in 20 steps.
    CHECK(m[1].loss > 4.5);
    CHECK(m[20].loss < m[1].loss - 0.3);
  }
}
