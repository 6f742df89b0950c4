#include "optim/adamw.h"

#include <cmath>

#include "tensor/ops.h"

namespace mt {

double global_grad_norm(ParamStore& store, const ParallelState& ps) {
  double split = 0, replicated = 0;
  for (Param* p : store.params()) {
    double s = ops::sum_squares(p->grad);
    if (p->spec.partition_dim >= 0 && ps.tp_size > 1)
      split += s;
    else
      replicated += s;
  }
  double total = split + (ps.tp_rank == 0 ? replicated : 0.0);
  if (ps.tp_size > 1) total = ps.tp->all_reduce_scalar(total, ReduceOp::Sum);
  if (ps.pp_size > 1) total = ps.pp->all_reduce_scalar(total, ReduceOp::Sum);
  return std::sqrt(total);
}

AdamW::AdamW(ParamStore& store, const OptimizerConfig& cfg) : store_(&store), cfg_(cfg) {
  const Tensor& flat = store.flat_values();
  m_ = Tensor::zeros(flat.shape(), flat.dtype(), flat.device());
  v_ = Tensor::zeros(flat.shape(), flat.dtype(), flat.device());
  for (Param* p : store.params()) {
    switch (p->spec.kind) {
      case ParamKind::Weight: p->weight_decay = true; break;
      case ParamKind::Bias:
      case ParamKind::Norm: p->weight_decay = cfg.weight_decay_norms_and_biases; break;
      case ParamKind::Embedding: p->weight_decay = cfg.weight_decay_embeddings; break;
    }
  }
}

Tensor AdamW::exp_avg(const Param& p) const {
  return m_.slice(static_cast<int64_t>(p.flat_offset), p.value.numel()).view(p.local_shape);
}
Tensor AdamW::exp_avg_sq(const Param& p) const {
  return v_.slice(static_cast<int64_t>(p.flat_offset), p.value.numel()).view(p.local_shape);
}

void AdamW::step(double lr, double grad_scale) {
  ++step_;
  for (Param* p : store_->params()) {
    ops::AdamWArgs a;
    a.lr = lr;
    a.beta1 = cfg_.adam_beta1;
    a.beta2 = cfg_.adam_beta2;
    a.eps = cfg_.adam_eps;
    a.weight_decay = p->weight_decay ? cfg_.weight_decay : 0.0;
    a.step = step_;
    a.grad_scale = grad_scale;
    Tensor m = exp_avg(*p), v = exp_avg_sq(*p);
    ops::adamw_step(p->value, m, v, p->grad, a);
  }
}

}  // namespace mt
