// The collective watchdog on the CPU backend (MPI, 2 ranks, data 2): with
// training.collective_timeout_s set, a rank that stops taking part (MT_DEBUG_STALL_RANK sleeps
// forever before the step of MT_DEBUG_STALL_ITERATION) must not hang the job: the other rank
// reports "watchdog", the stuck collective, its group and its rank with mesh coordinates (see
// watchdog_report_missing in common/run_binary.h), and the job exits non-zero well within a minute.
// A healthy run with the watchdog on is not stopped. The same on GPUs: test/multigpu.
#include "catch.h"
#include "common/run_binary.h"

using namespace mt::test;

namespace {

std::string args(const std::string& name, int timeout_s) {
  return "train --config " + source_path("configs/ci/tiny-llama.yaml") +
         " --set training.device=cpu --set training.train_iters=10 --set logging.log_interval=1"
         " --set training.eval_iters=0 --set checkpoint.dir= --set training.collective_timeout_s=" +
         std::to_string(timeout_s) + " --set logging.metrics_file=" + (temp_dir() / (name + ".jsonl")).string();
}

}  // namespace

TEST_CASE("a rank that stalls in data 2 is reported by the watchdog and the job exits", "[parallel][watchdog]") {
  RunResult r = run_megatrain(args("stall", 5), "stall", 2,
                              "OMP_NUM_THREADS=1 MT_DEBUG_STALL_RANK=1 MT_DEBUG_STALL_ITERATION=3", 120);
  INFO("exit " << r.code << " after " << r.seconds << " s\nstderr:\n" << r.err.substr(0, 4000));
  CHECK_FALSE(r.timed_out);
  CHECK(r.code != 0);
  CHECK(r.seconds < 60);
  CHECK(watchdog_report_missing(r.err, "dp", 0) == "");
  CHECK(read_metrics(temp_dir() / "stall.jsonl").size() == 2);  // iterations 1 and 2 finished
}

TEST_CASE("the watchdog stays quiet in a healthy data 2 run", "[parallel][watchdog]") {
  // A generous timeout: CI runs the ranks oversubscribed beside other tests.
  RunResult r = run_megatrain(args("healthy", 30), "healthy", 2, "OMP_NUM_THREADS=1", 180);
  INFO("exit " << r.code << " after " << r.seconds << " s\nstderr:\n" << r.err.substr(0, 4000));
  REQUIRE(r.code == 0);
  CHECK(read_metrics(temp_dir() / "healthy.jsonl").size() == 10);
}
