#include "parallel/mappings.h"

#include "tensor/ops.h"

namespace mt {

void CopyToTP::backward(Tensor& grad, const ParallelState& ps) {
  if (ps.tp_size > 1) ps.tp->all_reduce(grad, ReduceOp::Sum);
}

void ReduceFromTP::forward(Tensor& x, const ParallelState& ps) {
  if (ps.tp_size > 1) ps.tp->all_reduce(x, ReduceOp::Sum);
}

Tensor GatherFromSP::forward(const Tensor& x, const ParallelState& ps) {
  if (ps.tp_size == 1) return x;
  Shape s = x.shape();
  s[0] *= ps.tp_size;
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  ps.tp->all_gather(out, x);
  return out;
}

Tensor GatherFromSP::backward(const Tensor& g, const ParallelState& ps) {
  if (ps.tp_size == 1) return g;
  Shape s = g.shape();
  MT_INTERNAL_ASSERT(s[0] % ps.tp_size == 0, "sequence-parallel rows ", s[0], " not divisible by tp ", ps.tp_size);
  s[0] /= ps.tp_size;
  Tensor out = Tensor::empty(s, g.dtype(), g.device());
  ps.tp->reduce_scatter(out, g, ReduceOp::Sum);
  return out;
}

Tensor ReduceScatterToSP::forward(const Tensor& x, const ParallelState& ps) { return GatherFromSP::backward(x, ps); }
Tensor ReduceScatterToSP::backward(const Tensor& g, const ParallelState& ps) { return GatherFromSP::forward(g, ps); }

std::unique_ptr<Work> gather_sp_rows_async(Tensor& full, const Tensor& part, const ParallelState& ps) {
  if (ps.tp_size == 1) {
    full.copy_from(part);
    return nullptr;
  }
  return ps.tp->all_gather_async(full, part);
}

std::unique_ptr<Work> reduce_column_input_grad_async(Tensor& dx, Tensor& dx_full, const ParallelState& ps) {
  if (ps.sequence_parallel) {
    if (ps.tp_size == 1) {
      dx.copy_from(dx_full);
      return nullptr;
    }
    return ps.tp->reduce_scatter_async(dx, dx_full, ReduceOp::Sum);
  }
  MT_INTERNAL_ASSERT(dx.raw() == dx_full.raw(), "reduce_column_input_grad_async: dx must be dx_full without "
                     "sequence parallelism (the all-reduce is in place)");
  if (ps.tp_size == 1) return nullptr;
  return ps.tp->all_reduce_async(dx_full, ReduceOp::Sum);
}

void combine_vocab_parallel_ce(Tensor& max, Tensor& sumexp, Tensor& target_logit, Tensor& loss,
                               const ParallelState& ps) {
  Tensor gmax = max;  // one slice: its own max
  if (ps.tp_size > 1) {
    gmax = max.clone();
    ps.tp->all_reduce(gmax, ReduceOp::Max);
    ops::cross_entropy_rescale(sumexp, max, gmax);
    ps.tp->all_reduce(sumexp, ReduceOp::Sum);
    ps.tp->all_reduce(target_logit, ReduceOp::Sum);
  }
  ops::cross_entropy_finish(max, loss, gmax, sumexp, target_logit);  // max becomes lse
}

}  // namespace mt
