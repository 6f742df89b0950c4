// The parallel mesh: builds this rank's process groups from the layout and the world.
// Rank order as Megatron-Core: tensor fastest, then context, data, pipeline
//   global_rank = tp + TP * (cp + CP * (dp + DP * pp)).
#pragma once

#include <memory>
#include <vector>

#include "config/config.h"
#include "parallel/parallel_state.h"

namespace mt {

class Mesh {
 public:
  // Collective over the world. Throws mt::Error if the world does not fit the layout.
  Mesh(const ParallelConfig& par, const DerivedConfig& derived, Communicator& world);
  const ParallelState& state() const { return state_; }

 private:
  ParallelState state_;
  std::vector<std::unique_ptr<Communicator>> groups_;
};

}  // namespace mt
