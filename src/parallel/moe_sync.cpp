#include "parallel/moe_sync.h"

#include <algorithm>

namespace mt {

void sum_over_routing_ranks(std::vector<int64_t>& values, const ParallelState& ps) {
  if (values.empty()) return;
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::I64);
  std::copy(values.begin(), values.end(), t.data<int64_t>());
  for (Communicator* g : {ps.dp, ps.cp, ps.sequence_parallel ? ps.tp : nullptr})
    if (g && g->size() > 1) g->all_reduce(t, ReduceOp::Sum);
  std::copy(t.data<int64_t>(), t.data<int64_t>() + t.numel(), values.begin());
}

}  // namespace mt
