#include "parallel/fp8_amax_reduce.h"

namespace mt {

void reduce_amax_over_tp(Tensor& amax, const ParallelState& ps) {
  if (ps.tp_size > 1) ps.tp->all_reduce(amax, ReduceOp::Max);
}

void reduce_amax_over_stage(Tensor& amax, const ParallelState& ps) {
  if (ps.tp_size > 1) ps.tp->all_reduce(amax, ReduceOp::Max);
  if (ps.dp_size > 1) ps.dp->all_reduce(amax, ReduceOp::Max);
  if (ps.cp_size > 1) ps.cp->all_reduce(amax, ReduceOp::Max);
}

}  // namespace mt
