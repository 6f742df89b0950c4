// Communicator over an MPI communicator, host (CPU) buffers. Also MPI start-up and shutdown.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/communicator.h"

namespace mt {

// Initializes MPI once (safe as a plain process: a singleton world of one). Idempotent.
void mpi_init(int* argc, char*** argv);
void mpi_finalize();
int mpi_world_rank();
int mpi_world_size();
[[noreturn]] void mpi_abort(int code);

// The world group.
std::unique_ptr<Communicator> make_world_communicator();
// A subgroup of the world containing exactly `ranks` (global ranks, ascending); this rank must be
// in it. Collective over the world: every rank calls it once per group of its partition, in the
// same order (see Mesh).
std::unique_ptr<Communicator> make_mpi_subgroup(const std::vector<int>& ranks, const std::string& name);
// MPI_Comm_split of the world: ranks passing the same `color` form one group, ordered by `key`
// (then by world rank). Collective over the world: every rank calls it, in the same order. A rank
// passing color < 0 joins no group and gets nullptr.
std::unique_ptr<Communicator> make_mpi_split(int color, int key, const std::string& name);

}  // namespace mt
