// Every parallel layout on several GPUs (mpirun, one process per GPU, NCCL) against the 1-GPU run
// of the same config and seed: per-iteration loss and gradient norm over 10 iterations agree to
// 1e-4 relative in fp32 and within 2% in bf16 (fp32 master weights and gradients; bf16 rounding
// differs with the GEMM shapes of each split). The CPU backend already proves every layout exact
// (test/parallel/test_layout_parity.cpp); this proves the NCCL communicators and the device paths.
//
// The model is configs/ci/tiny-llama.yaml widened as in test/cuda/test_cuda_training.cpp (head dim
// 64, the GPU kernels' common case) with 8 layers, so that pipeline 2 x virtual 2 has 2 layers a
// chunk; global batch 8 = 4 micro-batches of 2 on one GPU, 2 of 2 per data-parallel rank.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>

#include "catch.h"
#include "common/run_binary.h"

using namespace mt::test;

namespace {

const char* const kConfig = "configs/ci/tiny-llama.yaml";
const char* const kModel =
    " --set model.num_layers=8 --set model.hidden_size=256 --set model.num_attention_heads=4"
    " --set model.num_query_groups=2 --set model.ffn_hidden_size=512 --set model.vocab_size=500"
    " --set model.seq_length=128 --set training.micro_batch_size=2 --set training.global_batch_size=8"
    " --set optimizer.lr=3e-4";
constexpr int kIters = 10;
// Relative tolerance of the loss per precision (the targets): fp32 differs only by summation
// order (TP splits the GEMMs' reductions); bf16 by the rounding of activations in GEMMs of other
// shapes. The gradient norm is checked 10x looser: it is the most sensitive number of a step (the
// first run on 4 H200s, at lr 1e-3, matched the loss to 3e-6 / 1.0% but the norm of one clipped,
// spiking step only to 2e-4 / 14%, identically for every TP layout: rounding amplified by training,
// not a race). A missing or doubled reduction moves both by far more.
constexpr double kTolF32 = 1e-4, kTolBF16 = 0.02, kNormFactor = 10;
// NVLink multicast stays off (also set by main_multigpu.cpp for every run).
const char* const kEnv = "NCCL_NVLS_ENABLE=0";

std::string args(const std::string& name, const std::string& precision, const std::string& extra) {
  return "train --config " + source_path(kConfig) + kModel + " --set training.device=cuda --set training.precision=" +
         precision + " --set training.train_iters=" + std::to_string(kIters) +
         " --set logging.log_interval=1 --set training.eval_iters=0 --set checkpoint.dir= --set logging.metrics_file=" +
         (temp_dir() / (name + ".jsonl")).string() + " " + extra;
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

// The 1-GPU run of a precision, run once per test process.
const std::map<int64_t, StepMetrics>& single_gpu(const std::string& precision) {
  static std::map<std::string, std::map<int64_t, StepMetrics>> cache;
  auto it = cache.find(precision);
  if (it != cache.end()) return it->second;
  const std::string name = "single-" + precision;
  RunResult r = run_megatrain(args(name, precision, ""), name, 0, kEnv, 300);
  INFO(name << " (1 GPU)\n" << r.err.substr(0, 3000));
  REQUIRE(r.code == 0);
  auto m = read_metrics(temp_dir() / (name + ".jsonl"));
  REQUIRE(m.size() == kIters);
  return cache.emplace(precision, std::move(m)).first->second;
}

void check_layout(const std::string& layout, int np, const std::string& layout_args) {
  for (const std::string precision : {"fp32", "bf16"}) {
    const double tol = precision == "fp32" ? kTolF32 : kTolBF16;
    const auto& single = single_gpu(precision);
    const std::string name = layout + "-" + precision;
    RunResult r = run_megatrain(args(name, precision, layout_args), name, np, kEnv, 300);
    INFO(name << " (" << np << " GPUs, " << r.seconds << " s)\n" << r.err.substr(0, 3000));
    REQUIRE(!r.timed_out);
    REQUIRE(r.code == 0);
    auto m = read_metrics(temp_dir() / (name + ".jsonl"));
    REQUIRE(m.size() == kIters);
    double worst_loss = 0, worst_norm = 0;
    for (auto& [it, s] : single) {
      INFO(name << " iteration " << it << ": loss " << m[it].loss << " vs " << s.loss << " on 1 GPU, grad norm "
                << m[it].grad_norm << " vs " << s.grad_norm);
      CHECK(rel(m[it].loss, s.loss) < tol);
      CHECK(rel(m[it].grad_norm, s.grad_norm) < kNormFactor * tol);
      worst_loss = std::max(worst_loss, rel(m[it].loss, s.loss));
      worst_norm = std::max(worst_norm, rel(m[it].grad_norm, s.grad_norm));
    }
    WARN(name << ": largest relative difference to 1 GPU over " << kIters << " iterations: loss " << worst_loss
              << ", grad norm " << worst_norm << " (tolerances " << tol << " and " << kNormFactor * tol << ")");
  }
}

}  // namespace

TEST_CASE("tensor 2 matches 1 GPU", "[multigpu][parity][tp]") { check_layout("tp2", 2, "--set parallel.tensor=2"); }

TEST_CASE("tensor 2 with sequence parallel matches 1 GPU", "[multigpu][parity][tp][sp]") {
  check_layout("tp2-sp", 2, "--set parallel.tensor=2 --set parallel.sequence_parallel=true");
}

TEST_CASE("tensor 2 with sequence parallel and TP communication overlap matches 1 GPU", "[multigpu][parity][tp][sp]") {
  check_layout("tp2-sp-overlap", 2,
               "--set parallel.tensor=2 --set parallel.sequence_parallel=true --set parallel.tp_comm_overlap=true");
}

TEST_CASE("pipeline 2 x virtual 2 (interleaved 1F1B) matches 1 GPU", "[multigpu][parity][pp]") {
  check_layout("pp2-vp2", 2, "--set parallel.pipeline=2 --set parallel.virtual_pipeline=2");
}

TEST_CASE("data 2 with the distributed optimizer matches 1 GPU", "[multigpu][parity][dp]") {
  // Buckets of 1M elements: several reduce-scatters / all-gathers in flight, cut across parameters.
  check_layout("dp2-distopt", 2, "--set parallel.distributed_optimizer=true --set parallel.grad_bucket_size=1000000");
}

TEST_CASE("tensor 2 x pipeline 2 matches 1 GPU", "[multigpu][parity][tp][pp][4gpu]") {
  check_layout("tp2-pp2", 4, "--set parallel.tensor=2 --set parallel.pipeline=2");
}

TEST_CASE("data 2 x tensor 2 matches 1 GPU", "[multigpu][parity][tp][dp][4gpu]") {
  check_layout("dp2-tp2", 4, "--set parallel.tensor=2");
}

// The 8-GPU issue's layout: every kind of parallelism at once (2 micro-batches per data rank, 2 layers a chunk).
TEST_CASE("tensor 2 (sequence parallel) x pipeline 2 x virtual 2 x data 2 (distributed optimizer) matches 1 GPU",
          "[multigpu][parity][tp][pp][dp][8gpu]") {
  check_layout("tp2sp-pp2vp2-dp2distopt", 8,
               "--set parallel.tensor=2 --set parallel.sequence_parallel=true --set parallel.pipeline=2"
               " --set parallel.virtual_pipeline=2 --set parallel.distributed_optimizer=true"
               " --set parallel.grad_bucket_size=1000000");
}
