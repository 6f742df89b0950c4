// megatrain entry point: MPI start-up (also as a plain process), the command line, and the rule
// that bad input ends in one clear line on stderr and a non-zero exit.
//
// One job, one voice: an error in the configuration ("config FILE: ...") is found by every rank
// alike, before any communication, so rank 0 alone prints it and every rank finalizes MPI and
// exits 1 (no MPI_Abort: Open MPI would add its abort banner; `mpirun -q` also silences mpirun's
// own "exited with non-zero status" notice). Any other error may be one rank's alone (its data
// file, a device): that rank prints it with its rank and aborts the job, so no rank waits forever.
#include <cstdio>
#include <exception>
#include <string>

#include "core/check.h"
#include "runtime/mpi_communicator.h"
#include "train/cli.h"
#include "train/trainer.h"

namespace {

bool is_config_error(const std::string& msg) { return msg.rfind("config ", 0) == 0; }

// `megatrain config` and `megatrain plan` check a configuration for --world-size ranks without
// communicating, and a request for help or the version (`megatrain`, `megatrain --help`, `megatrain
// convert import -h`, `megatrain --version`: subcommand names, then that one flag) only prints: no MPI
// start-up for them (about half a second for a lone process under Open MPI).
bool needs_mpi(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "config" || cmd == "plan" || argc == 1) return false;
  const std::string last = argv[argc - 1];
  if (last != "-h" && last != "--help" && last != "--version") return true;
  for (int i = 1; i < argc - 1; ++i)
    if (argv[i][0] == '-') return true;  // other options: the command runs as written
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (needs_mpi(argc, argv)) mt::mpi_init(&argc, &argv);
  int code = 0;
  try {
    code = mt::run_cli(argc, argv);
  } catch (const mt::Error& e) {
    mt::quiet_stop_signals();
    const std::string msg = e.what();
    const int world = mt::mpi_world_size(), rank = mt::mpi_world_rank();
    if (world > 1 && is_config_error(msg)) {
      if (rank == 0) std::fprintf(stderr, "megatrain: error: %s\n", msg.c_str());
      std::fflush(stderr);
      mt::mpi_finalize();
      return 1;
    }
    if (world > 1)
      std::fprintf(stderr, "megatrain: error (rank %d): %s\n", rank, msg.c_str());
    else
      std::fprintf(stderr, "megatrain: error: %s\n", msg.c_str());
    std::fflush(stderr);
    mt::mpi_abort(1);
  } catch (const std::exception& e) {
    mt::quiet_stop_signals();
    std::fprintf(stderr, "megatrain: internal error (rank %d): %s\n", mt::mpi_world_rank(), e.what());
    std::fflush(stderr);
    mt::mpi_abort(2);
  }
  mt::mpi_finalize();
  return code;
}
