#include "runtime/mesh.h"

#include "runtime/mpi_communicator.h"

namespace mt {

Mesh::Mesh(const ParallelConfig& par, const DerivedConfig& d, Communicator& world) {
  const int model_parallel = par.tensor * par.pipeline * par.context;
  MT_CHECK(world.size() == model_parallel * d.data_parallel_size, "the layout tensor ", par.tensor, " x pipeline ",
           par.pipeline, " x context ", par.context, " x data ", d.data_parallel_size, " needs ",
           model_parallel * d.data_parallel_size, " ranks, but ", world.size(), " were started");
  MT_CHECK(world.size() == 1, "this version of megatrain trains on one rank; ", world.size(),
           " ranks were started (the layout would be tensor ", par.tensor, " x pipeline ", par.pipeline,
           " x context ", par.context, " x data ", d.data_parallel_size,
           "): start it without mpirun or with 'mpirun -np 1'");
  state_.world_rank = world.rank();
  state_.world_size = world.size();
  state_.world = &world;
  // Single rank: every group is this rank alone.
  for (const char* name : {"tp", "pp", "dp", "cp"}) groups_.push_back(make_mpi_subgroup({world.rank()}, name));
  state_.tp = groups_[0].get();
  state_.pp = groups_[1].get();
  state_.dp = groups_[2].get();
  state_.cp = groups_[3].get();
  state_.sequence_parallel = par.sequence_parallel;
}

}  // namespace mt
