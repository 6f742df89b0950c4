// Test main for test/cp_mpi: starts MPI (a plain process is a world of one), runs Catch2, shuts MPI down, so the
// same executable runs plain and under `mpirun -np N` (mt_add_mpi_test in test/CMakeLists.txt).
#include "runtime/mpi_communicator.h"
#include "test_main.h"

int main(int argc, char** argv) {
  mt::mpi_init(&argc, &argv);
  const int rc = Catch::Session().run(argc, argv);
  mt::mpi_finalize();
  return rc;
}
