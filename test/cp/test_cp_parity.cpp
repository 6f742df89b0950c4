// Context parallelism end to end on the CPU backend (through mpirun): per-iteration loss and gradient norm of every
// context-parallel layout match the single-rank run of the same config and seed to 1e-5 relative over 10 iterations,
// for a GPT-2-style config (learned positions, tied embeddings) and a Llama-style one (RoPE, grouped-query
// attention); a checkpoint written under context 2 resumes under context 1 (and the reverse) on the uninterrupted
// run's loss curve; layouts context parallelism cannot run are refused naming the key.
#include <cmath>
#include <iterator>
#include <string>
#include <vector>

#include "catch.h"
#include "common/layout_parity.h"

using namespace mt::test;

namespace {

const Layout kLayouts[] = {
    {"cp2", 2, "--set parallel.context=2"},
    {"cp4", 4, "--set parallel.context=4"},
    {"cp2-a2a", 2, "--set parallel.context=2 --set parallel.cp_comm_type=a2a"},
    {"cp2-tp2sp", 4, "--set parallel.context=2 --set parallel.tensor=2 --set parallel.sequence_parallel=true"},
    {"cp2-pp2-dp2-distopt", 8,
     "--set parallel.context=2 --set parallel.pipeline=2 --set parallel.distributed_optimizer=true "
     "--set parallel.grad_bucket_size=30000"},
    {"cp2-recompute-full", 2, "--set parallel.context=2 --set training.recompute=full"},
};

void check_layouts(const std::string& config, const std::string& tag) {
  check_layouts_match_single(config, "--set model.num_layers=4", tag,
                             std::vector<Layout>(std::begin(kLayouts), std::end(kLayouts)));
}

}  // namespace

TEST_CASE("llama GQA: every context-parallel layout matches the single-rank run", "[cp][parity]") {
  check_layouts("configs/ci/tiny-llama.yaml", "cp-llama");
}

TEST_CASE("gpt2: every context-parallel layout matches the single-rank run", "[cp][parity]") {
  check_layouts("configs/ci/tiny-gpt2.yaml", "cp-gpt2");
}

TEST_CASE("a context-2 checkpoint resumes under context 1, and back, on the uninterrupted loss curve",
          "[cp][resume]") {
  const std::string base = "train --config " + source_path("configs/ci/tiny-llama.yaml") +
                           " --set model.num_layers=2 --set training.train_iters=12 --set logging.log_interval=1"
                           " --set training.eval_iters=0";
  auto run = [&](const std::string& name, const std::string& extra, int np) {
    RunResult r = run_megatrain(base + " --set checkpoint.dir=" + (temp_dir() / name).string() +
                                    " --set logging.metrics_file=" + (temp_dir() / (name + ".jsonl")).string() + " " +
                                    extra,
                                name, np);
    INFO(name << "\n" << r.err.substr(0, 2000));
    REQUIRE(r.code == 0);
  };
  run("cp-straight", "", 0);
  // context 2 for 6 iterations, then context 1; and context 1, then context 2 with the all-to-all.
  run("cp-2to1", "--set parallel.context=2 --set training.exit_interval=6", 2);
  REQUIRE(fs::exists(temp_dir() / "cp-2to1" / "iter_0000006" / "DONE"));
  run("cp-2to1", "", 0);
  run("cp-1to2", "--set training.exit_interval=6", 0);
  run("cp-1to2", "--set parallel.context=2 --set parallel.cp_comm_type=a2a", 2);
  auto a = read_metrics(temp_dir() / "cp-straight.jsonl");
  REQUIRE(a.size() == 12);
  for (const char* name : {"cp-2to1", "cp-1to2"}) {
    auto b = read_metrics(temp_dir() / (std::string(name) + ".jsonl"));
    REQUIRE(b.size() == 12);
    for (auto& [it, s] : a) {
      INFO(name << " iteration " << it << ": loss " << b[it].loss << " vs " << s.loss);
      CHECK(rel(b[it].loss, s.loss) < 1e-5);
      CHECK(rel(b[it].grad_norm, s.grad_norm) < 1e-5);
    }
  }
}

TEST_CASE("layouts context parallelism cannot run are refused, naming the key", "[cp][errors]") {
  struct Bad {
    int np;
    const char* args;
    const char* expect;
  } bad[] = {
      {2, "--set parallel.context=2 --set model.seq_length=30", "divisible by 2 x parallel.context"},
      {4, "--set parallel.context=4 --set parallel.cp_comm_type=a2a", "parallel.cp_comm_type a2a"},
      {2, "--set parallel.context=2 --set model.dropout=0.1", "model.dropout"},
      {2, "--set parallel.context=2 --set parallel.cp_comm_type=ring", "cp_comm_type"},
  };
  for (const Bad& b : bad) {
    RunResult r = run_megatrain("train --config " + source_path("configs/ci/tiny-llama.yaml") +
                                    " --set checkpoint.dir= " + b.args,
                                "cp-bad", b.np);
    INFO(b.args << "\n" << r.err);
    CHECK(r.code != 0);
    CHECK(r.err.find(b.expect) != std::string::npos);
    CHECK(r.out.find("parameters on rank") == std::string::npos);  // refused before building the model
  }
}
