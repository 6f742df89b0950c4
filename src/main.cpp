// megatrain entry point: MPI start-up (also as a plain process), the command line, and the rule
// that bad input ends in one clear line on stderr and a non-zero exit.
#include <cstdio>
#include <exception>

#include "core/check.h"
#include "runtime/mpi_communicator.h"
#include "train/cli.h"

int main(int argc, char** argv) {
  mt::mpi_init(&argc, &argv);
  int code = 0;
  try {
    code = mt::run_cli(argc, argv);
  } catch (const mt::Error& e) {
    if (mt::mpi_world_size() > 1)
      std::fprintf(stderr, "megatrain: error (rank %d): %s\n", mt::mpi_world_rank(), e.what());
    else
      std::fprintf(stderr, "megatrain: error: %s\n", e.what());
    std::fflush(stderr);
    mt::mpi_abort(1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "megatrain: internal error (rank %d): %s\n", mt::mpi_world_rank(), e.what());
    std::fflush(stderr);
    mt::mpi_abort(2);
  }
  mt::mpi_finalize();
  return code;
}
