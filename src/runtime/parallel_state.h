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
  int dp_cp_rank = 0, dp_cp_size = 1;  // data x context: gradient reduction, distributed optimizer
  int tp_cp_rank = 0, tp_cp_size = 1;  // tensor x context
  int mp_rank = 0, mp_size = 1;        // model parallel: tensor x pipeline
  int ep_rank = 0, ep_size = 1;        // expert parallel (expert layers regroup data x context)
  int expert_dp_rank = 0, expert_dp_size = 1;  // expert data parallel: (data x context) / expert
  int embedding_rank = 0, embedding_size = 1;  // first + last stage; -1 / 0 on the middle stages
  bool sequence_parallel = false;
  Communicator* world = nullptr;
  Communicator* tp = nullptr;
  Communicator* pp = nullptr;
  Communicator* dp = nullptr;
  Communicator* cp = nullptr;
  Communicator* dp_cp = nullptr;
  Communicator* tp_cp = nullptr;
  Communicator* mp = nullptr;
  Communicator* ep = nullptr;
  Communicator* expert_dp = nullptr;
  Communicator* embedding = nullptr;  // null on the middle pipeline stages (not in any embedding group)
  bool is_first_stage() const { return pp_rank == 0; }
  bool is_last_stage() const { return pp_rank == pp_size - 1; }
  bool in_embedding_group() const { return embedding != nullptr; }
};

}  // namespace mt
