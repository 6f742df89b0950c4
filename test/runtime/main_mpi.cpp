// Test main for test/runtime: starts MPI (a plain process is a world of one), runs Catch2, shuts
// MPI down, so the same executable runs plain and under `mpirun -np N` (mt_add_mpi_test).
#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#include "runtime/mpi_communicator.h"

int main(int argc, char** argv) {
  mt::mpi_init(&argc, &argv);
  const int rc = Catch::Session().run(argc, argv);
  mt::mpi_finalize();
  return rc;
}
