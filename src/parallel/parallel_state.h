// Where this rank sits in the parallel layout, and the process groups it talks to. Passed
// explicitly (no globals). Built by the mesh (runtime/mesh.h); a single-rank run has every size 1.
#pragma once

#include "runtime/communicator.h"

namespace mt {

struct ParallelState {
  int world_rank = 0, world_size = 1;
  int tp_rank = 0, tp_size = 1;  // tensor parallel
  int pp_rank = 0, pp_size = 1;  // pipeline parallel
  int dp_rank = 0, dp_size = 1;  // data parallel
  int cp_rank = 0, cp_size = 1;  // context parallel
  bool sequence_parallel = false;
  Communicator* world = nullptr;
  Communicator* tp = nullptr;
  Communicator* pp = nullptr;
  Communicator* dp = nullptr;
  Communicator* cp = nullptr;
  bool is_first_stage() const { return pp_rank == 0; }
  bool is_last_stage() const { return pp_rank == pp_size - 1; }
};

}  // namespace mt
