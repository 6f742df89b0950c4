#include "parallel/mappings.h"

#include <cmath>

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

namespace {
template <typename T>
void combine(Tensor& max, Tensor& sumexp, Tensor& target, const ParallelState& ps) {
  const int64_t n = max.numel();
  T* m = max.data<T>();
  T* s = sumexp.data<T>();
  if (ps.tp_size > 1) {
    Tensor gmax = max.clone();
    ps.tp->all_reduce(gmax, ReduceOp::Max);
    const T* g = gmax.data<T>();
    for (int64_t i = 0; i < n; ++i) {
      s[i] = std::isinf(m[i]) ? T(0) : s[i] * std::exp(m[i] - g[i]);  // a slice with no valid column
      m[i] = g[i];
    }
    ps.tp->all_reduce(sumexp, ReduceOp::Sum);
    ps.tp->all_reduce(target, ReduceOp::Sum);
  }
  for (int64_t i = 0; i < n; ++i) m[i] = m[i] + std::log(s[i]);
}
}  // namespace

void combine_vocab_parallel_ce(Tensor& max, Tensor& sumexp, Tensor& target_logit, const ParallelState& ps) {
  MT_INTERNAL_ASSERT(max.device() == Device::CPU, "combine_vocab_parallel_ce on host statistics");
  if (max.dtype() == DType::F64)
    combine<double>(max, sumexp, target_logit, ps);
  else
    combine<float>(max, sumexp, target_logit, ps);
}

}  // namespace mt
