// The parallel mesh: builds this rank's process groups from the layout and the world.
// Rank order as Megatron-Core ("tp-cp-ep-dp-pp"): tensor fastest, then context, data, pipeline
//   global_rank = tp + TP * (cp + CP * (dp + DP * pp));
// expert layers regroup data x context into expert x expert-data (runtime/rank_generator.h, where
// the groups are computed as pure functions). Every group kind is one MPI_Comm_split of the world
// (color = the group's index, key = the rank's position in it), called by every rank in the same
// order, so the groups hold exactly the ranks rank_groups() lists, in its order.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "config/config.h"
#include "runtime/parallel_state.h"
#include "runtime/rank_generator.h"

namespace mt {

class Mesh {
 public:
  // Collective over the world. Throws mt::Error if the world does not fit the layout
  // (world == tensor x pipeline x context x data, expert dividing data x context).
  // Rank 0 logs the layout as a table (one row per global rank).
  // wrap (optional) replaces each group's MPI communicator by another over the same ranks (the
  // GPU backend wraps them in NCCL communicators).
  using Wrap = std::function<std::unique_ptr<Communicator>(std::unique_ptr<Communicator>)>;
  Mesh(const ParallelConfig& par, const DerivedConfig& derived, Communicator& world, const Wrap& wrap = {});
  // "rank 5 (tp 1, pp 1, dp 0, cp 0)": for messages that must say where a rank sits.
  std::string coords() const;
  const ParallelState& state() const { return state_; }
  const MeshSizes& sizes() const { return sizes_; }

 private:
  MeshSizes sizes_;
  ParallelState state_;
  std::vector<std::unique_ptr<Communicator>> groups_;
};

}  // namespace mt
