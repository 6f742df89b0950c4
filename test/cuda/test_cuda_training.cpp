// The whole model on the GPU against the CPU backend, through the megatrain binary: 10 iterations
// of a small Llama-style and GPT-2-style config (head dim 64) give the CPU's losses to 1e-4
// relative in fp32, and track them within 2% in bf16 (fp32 master weights and gradients).
#include <cmath>

#include "catch.h"
#include "common/run_binary.h"

using namespace mt::test;

namespace {

std::string args(const std::string& config, const std::string& name, const std::string& extra) {
  return "train --config " + source_path(config) +
         " --set model.hidden_size=256 --set model.num_attention_heads=4 --set model.ffn_hidden_size=512"
         " --set model.vocab_size=500 --set model.seq_length=128 --set training.train_iters=10"
         " --set logging.log_interval=1 --set training.eval_iters=0 --set checkpoint.dir="
         " --set logging.metrics_file=" + (temp_dir() / (name + ".jsonl")).string() + " " + extra;
}

double rel(double a, double b) { return std::abs(a - b) / std::abs(b); }

void compare(const std::string& config, const std::string& extra, const std::string& tag) {
  REQUIRE(run_megatrain(args(config, tag + "-cpu", extra + " --set training.device=cpu"), tag + "-cpu").code == 0);
  RunResult f32 = run_megatrain(args(config, tag + "-f32", extra + " --set training.device=cuda"), tag + "-f32");
  INFO(f32.err.substr(0, 2000));
  REQUIRE(f32.code == 0);
  RunResult b16 = run_megatrain(
      args(config, tag + "-bf16", extra + " --set training.device=cuda --set training.precision=bf16"), tag + "-bf16");
  INFO(b16.err.substr(0, 2000));
  REQUIRE(b16.code == 0);
  auto cpu = read_metrics(temp_dir() / (tag + "-cpu.jsonl"));
  auto gf = read_metrics(temp_dir() / (tag + "-f32.jsonl"));
  auto gb = read_metrics(temp_dir() / (tag + "-bf16.jsonl"));
  REQUIRE(cpu.size() == 10);
  REQUIRE(gf.size() == 10);
  REQUIRE(gb.size() == 10);
  double worst_f32 = 0, worst_bf16 = 0;
  for (auto& [it, c] : cpu) {
    INFO(tag << " iteration " << it << ": cpu " << c.loss << ", gpu fp32 " << gf[it].loss << ", gpu bf16 " << gb[it].loss);
    CHECK(rel(gf[it].loss, c.loss) < 1e-4);
    CHECK(rel(gb[it].loss, c.loss) < 0.02);
    worst_f32 = std::max(worst_f32, rel(gf[it].loss, c.loss));
    worst_bf16 = std::max(worst_bf16, rel(gb[it].loss, c.loss));
  }
  WARN(tag << ": largest relative loss difference to the CPU over 10 iterations: fp32 " << worst_f32 << ", bf16 "
           << worst_bf16);
}

}  // namespace

TEST_CASE("llama on the GPU matches the CPU backend (fp32 1e-4, bf16 2%)", "[cuda][training]") {
  compare("configs/ci/tiny-llama.yaml", "--set model.num_query_groups=2", "llama");
}

TEST_CASE("gpt2 on the GPU matches the CPU backend (fp32 1e-4, bf16 2%)", "[cuda][training]") {
  compare("configs/ci/tiny-gpt2.yaml", "--set model.num_query_groups=4", "gpt2");
}
