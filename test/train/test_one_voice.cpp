// Issue #20, item 2 (one job, one voice): under mpirun a configuration error is printed once, by
// rank 0, without MPI_Abort's banner, and every rank exits 1; logs carry no ANSI colour codes when
// the output is not a terminal; MEGATRAIN_LOG_ALL_RANKS=1 still shows every rank's log.
#include "catch.h"
#include "common/run_binary.h"

using namespace mt::test;

namespace {

const std::string kTiny = source_path("configs/ci/tiny-llama.yaml");

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("mpirun -np 2 with a bad config: one error line, exit 1, no abort banner", "[e2e][mpi][errors]") {
  // mpirun's own notice about a non-zero exit is silenced by mpirun -q (orte_execute_quiet); what
  // megatrain prints must then be exactly one line.
  RunResult r = run_megatrain("train --config " + kTiny + " --set model.hiden_size=64", "voice", 2,
                              "OMPI_MCA_orte_execute_quiet=1", 120);
  const std::string all = r.out + r.err;
  INFO(all);
  CHECK(r.code == 1);
  CHECK(count_lines(all) == 1);
  CHECK(count(all, "megatrain: error: config ") == 1);
  CHECK(all.find("did you mean 'model.hidden_size'") != std::string::npos);
  CHECK(all.find("MPI_ABORT") == std::string::npos);
  CHECK(all.find("rank 1") == std::string::npos);
  // Without -q, mpirun adds its notice, but megatrain's line is still printed once and no rank aborts.
  RunResult loud = run_megatrain("train --config " + kTiny + " --set model.hiden_size=64", "voice_loud", 2, "", 120);
  CHECK(loud.code == 1);
  CHECK(count(loud.out + loud.err, "megatrain: error") == 1);
  CHECK((loud.out + loud.err).find("MPI_ABORT") == std::string::npos);
}

TEST_CASE("logs have no colour codes off a terminal; every rank's log on request", "[e2e][mpi][log]") {
  const std::string args = "train --config " + kTiny + " --set training.train_iters=2 --set training.eval_iters=0 " +
                           "--set checkpoint.dir= --set logging.metrics_file= --set logging.log_interval=1";
  RunResult r = run_megatrain(args, "nocolor", 2, "", 300);
  REQUIRE(r.code == 0);
  CHECK((r.out + r.err).find('\033') == std::string::npos);
  CHECK(count(r.out, "iter 2/2") == 1);  // rank 0 only
  RunResult all = run_megatrain(args, "allranks", 2, "MEGATRAIN_LOG_ALL_RANKS=1", 300);
  REQUIRE(all.code == 0);
  CHECK(all.out.find("[rank 1]") != std::string::npos);
  CHECK((all.out + all.err).find('\033') == std::string::npos);
}
