// Start-up checks of issue #20: checkpoint.dir that cannot be created is refused by `train` before
// iteration 1 (config and plan warn); the plan's memory estimate is compared with this machine's
// memory (plan prints a warning, train logs it before allocating).
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "catch.h"
#include "common/run_binary.h"
#include "config/config_loader.h"
#include "core/check.h"
#include "train/plan.h"
#include "train/preflight.h"

using mt::str_cat;
using namespace mt::test;

namespace {

const char* kTinyYaml = R"(model:
  num_layers: 2
  hidden_size: 32
  num_attention_heads: 4
  ffn_hidden_size: 64
  vocab_size: 64
  seq_length: 16
training:
  train_iters: 2
  eval_iters: 0
  device: cpu
data:
  mock: true
logging:
  log_interval: 1
)";

fs::path tiny_yaml() {
  const fs::path p = temp_dir() / "preflight.yaml";
  if (!fs::exists(p)) std::ofstream(p) << kTinyYaml;
  return p;
}

}  // namespace

TEST_CASE("preflight: checkpoint_dir_problem names the part of the path that blocks it", "[plan][preflight]") {
  const fs::path dir = temp_dir() / "ckdirs";
  fs::create_directories(dir / "exists");
  std::ofstream(dir / "afile") << "x";
  CHECK(mt::checkpoint_dir_problem("") == "");
  CHECK(mt::checkpoint_dir_problem((dir / "exists").string()) == "");
  CHECK(mt::checkpoint_dir_problem((dir / "new" / "deeper").string()) == "");  // creatable, not created
  CHECK(!fs::exists(dir / "new"));
  const std::string under_file = mt::checkpoint_dir_problem((dir / "afile" / "ckpt").string());
  CHECK(under_file == str_cat("'", (dir / "afile").string(), "' is a file, not a directory"));
  CHECK(mt::checkpoint_dir_problem((dir / "afile").string()) ==
        str_cat("'", (dir / "afile").string(), "' is a file, not a directory"));
  if (::geteuid() != 0) {  // root may write anywhere
    fs::create_directories(dir / "ro");
    fs::permissions(dir / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    CHECK(mt::checkpoint_dir_problem((dir / "ro" / "ckpt").string()).find("cannot create it in") != std::string::npos);
    fs::permissions(dir / "ro", fs::perms::owner_all);
  }
}

TEST_CASE("preflight: train refuses a checkpoint.dir under a file before iteration 1; config and plan warn",
          "[plan][preflight]") {
  const fs::path blocker = temp_dir() / "not-a-dir";
  std::ofstream(blocker) << "x";
  const std::string set = " --set checkpoint.dir=" + (blocker / "ckpt").string();
  const std::string expect = str_cat("checkpoint.dir '", (blocker / "ckpt").string(), "' cannot be created: '",
                                     blocker.string(), "' is a file, not a directory");
  const RunResult train = run_megatrain("train --config " + tiny_yaml().string() + set, "ck-train");
  INFO(train.out << train.err);
  CHECK(train.code != 0);
  CHECK(train.err.find("megatrain: error: config " + tiny_yaml().string() + ": " + expect) != std::string::npos);
  CHECK((train.out + train.err).find("iter 1/") == std::string::npos);  // before the first iteration
  CHECK(read_file(blocker) == "x");                                     // nothing touched

  const RunResult config = run_megatrain("config --config " + tiny_yaml().string() + set, "ck-config");
  CHECK(config.code == 0);
  CHECK(config.err.find("warning: checkpoint.dir '" + (blocker / "ckpt").string() + "' cannot be created here") !=
        std::string::npos);
  const RunResult plan = run_megatrain("plan --world-size 1 --config " + tiny_yaml().string() + set, "ck-plan");
  CHECK(plan.code == 0);
  CHECK(plan.out.find("warning: checkpoint.dir") != std::string::npos);

  // A creatable directory: training runs and saves there.
  const fs::path good = temp_dir() / "ck-good" / "run";
  const RunResult ok = run_megatrain("train --config " + tiny_yaml().string() + " --set checkpoint.dir=" + good.string(),
                                     "ck-ok");
  INFO(ok.err);
  CHECK(ok.code == 0);
  CHECK(fs::exists(good / "latest"));
}

TEST_CASE("preflight: under mpirun, a kill timeout too short to save after Ctrl-C / SIGTERM is reported",
          "[plan][preflight]") {
  const char* hnp = "895549440.0;tcp://10.0.0.1:47451";  // OMPI_MCA_orte_hnp_uri: started by mpirun
  // Open MPI's default (unset) is 1 s; the ways to stop with a checkpoint are named.
  const std::string unset = mt::mpirun_kill_timeout_warning("ck", hnp, nullptr, nullptr);
  CHECK(unset.find("kill them 1 s later (Open MPI's odls_base_sigkill_timeout), before a checkpoint is written") !=
        std::string::npos);
  CHECK(unset.find("send SIGUSR1 or SIGTERM to one rank") != std::string::npos);
  CHECK(mt::mpirun_kill_timeout_warning("ck", hnp, "30", nullptr).find("kill them 30 s later") != std::string::npos);
  CHECK(mt::mpirun_kill_timeout_warning("ck", hnp, "x", nullptr).find("kill them 1 s later") != std::string::npos);
  CHECK(mt::mpirun_kill_timeout_warning("ck", hnp, "60", nullptr).empty());  // mt::kStopSaveSeconds: the user's choice
  CHECK(mt::mpirun_kill_timeout_warning("", hnp, nullptr, nullptr).empty());        // no checkpoints to save
  CHECK(mt::mpirun_kill_timeout_warning("ck", nullptr, nullptr, nullptr).empty());  // not under mpirun (alone, srun)
  CHECK(mt::mpirun_kill_timeout_warning("ck", "", nullptr, nullptr).empty());
  // Started through scripts/launch_mpirun.sh (MT_LAUNCHED_BY): Ctrl-C / SIGTERM reach mpirun as SIGUSR1.
  CHECK(mt::mpirun_kill_timeout_warning("ck", hnp, nullptr, "launch_mpirun.sh").empty());
  CHECK(!mt::mpirun_kill_timeout_warning("ck", hnp, nullptr, "other").empty());
  CHECK(unset.find("start the job with scripts/launch_mpirun.sh") != std::string::npos);
}

TEST_CASE("preflight: memory_warning compares ranks x estimate with the budget", "[plan][preflight]") {
  const mt::MemoryBudget budget{int64_t{10} << 30, "the host's available memory"};
  CHECK(mt::memory_warning(int64_t{5} << 30, 2, budget).empty());  // exactly fits
  const std::string w = mt::memory_warning(int64_t{6} << 30, 2, budget);
  CHECK(w == "the memory estimate (megatrain plan) of 6.00 GiB per rank x 2 ranks = 12.00 GiB exceeds the "
             "host's available memory, 10.00 GiB; training will likely run out of memory: lower "
             "training.micro_batch_size, set training.recompute, or spread the model over more ranks");
  CHECK(mt::memory_warning(int64_t{1} << 40, 1, mt::MemoryBudget{}).empty());  // unknown budget: nothing to say
  const mt::MemoryBudget host = mt::host_memory_available();
  CHECK(host.bytes > 0);  // Linux: MemAvailable
}

TEST_CASE("preflight: plan_peak_bytes_per_rank is the largest stage total in the training.recompute column",
          "[plan][preflight]") {
  mt::Config cfg = mt::load_config(tiny_yaml().string(), {"parallel.pipeline=2", "training.global_batch_size=4"});
  for (const char* mode : {"none", "selective", "full"}) {
    cfg.training.recompute = mode;
    const mt::PlanReport r = mt::make_plan(cfg, 2);
    const int i = std::string(mode) == "none" ? 0 : std::string(mode) == "selective" ? 1 : 2;
    CHECK(mt::plan_peak_bytes_per_rank(r) == std::max(r.stages[0].total(i), r.stages[1].total(i)));
  }
}

TEST_CASE("preflight: plan warns when the estimate exceeds the host's memory (CPU run)", "[plan][preflight]") {
  // About 2.7 T parameters: some 40,000 GiB of weights, gradients and Adam state on one rank.
  const std::string huge = " --set model.num_layers=64 --set model.hidden_size=65536 --set model.num_attention_heads=64 "
                           "--set model.ffn_hidden_size=131072";
  const RunResult big = run_megatrain("plan --world-size 1 --config " + tiny_yaml().string() + huge, "mem-big");
  INFO(big.err);
  CHECK(big.code == 0);
  CHECK(big.out.find("warning: the memory estimate (megatrain plan) of ") != std::string::npos);
  CHECK(big.out.find("exceeds the host's available memory (MemAvailable of /proc/meminfo)") != std::string::npos);
#if !defined(MEGATRAIN_HAVE_CUDA)
  // A bf16 run is a GPU run planned elsewhere: this GPU-less host's memory says nothing about it.
  const RunResult gpu = run_megatrain("plan --world-size 1 --config " + tiny_yaml().string() + huge +
                                          " --set training.device=auto --set training.precision=bf16",
                                      "mem-gpu-elsewhere");
  CHECK(gpu.code == 0);
  CHECK(gpu.out.find("warning: the memory estimate") == std::string::npos);
#endif
  const RunResult small = run_megatrain("plan --world-size 1 --config " + tiny_yaml().string(), "mem-small");
  CHECK(small.code == 0);
  CHECK(small.out.find("warning") == std::string::npos);
}
