#include "model/linear.h"

#include "parallel/mappings.h"
#include "tensor/ops.h"

namespace mt {

namespace {
Param* add_param(ParamStore& store, const std::string& name, Shape shape, int pdim, int chunks, ParamInit init,
                 ParamKind kind) {
  ParamSpec s;
  s.name = name;
  s.global_shape = std::move(shape);
  s.partition_dim = pdim;
  s.partition_chunks = chunks;
  s.init = init;
  s.kind = kind;
  return store.add(s);
}
DType stat_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }
}  // namespace

// ---------------------------------------------------------------- column parallel

ColumnParallelLinear::ColumnParallelLinear(const std::string& name, int64_t in, int64_t out, bool bias,
                                           ParamInit init, const ModelContext& ctx, ParamStore& store, int chunks)
    : ctx_(&ctx) {
  weight_ = add_param(store, name + ".weight", {out, in}, 0, chunks, init, ParamKind::Weight);
  if (bias) bias_ = add_param(store, name + ".bias", {out}, 0, chunks, ParamInit::Zeros, ParamKind::Bias);
}

ColumnParallelLinear::ColumnParallelLinear(const std::string&, Param* shared_weight, const ModelContext& ctx)
    : ctx_(&ctx), weight_(shared_weight) {
  MT_INTERNAL_ASSERT(weight_->spec.partition_dim == 0, "tied weight must be split by rows");
}

void ColumnParallelLinear::forward(Tensor& y, const Tensor& x) const {
  // CopyToTP::forward is the identity: X is already replicated on every TP rank.
  ops::linear_forward(y, x, weight_->value, bias_ ? &bias_->value : nullptr);
}

void ColumnParallelLinear::backward(Tensor& dx, const Tensor& dy, const Tensor& x) const {
  ops::linear_backward(dx.defined() ? &dx : nullptr, &weight_->grad, bias_ ? &bias_->grad : nullptr, dy, x,
                       weight_->value);
  if (dx.defined()) CopyToTP::backward(dx, *ctx_->ps);
}

// ---------------------------------------------------------------- row parallel

RowParallelLinear::RowParallelLinear(const std::string& name, int64_t in, int64_t out, bool bias, ParamInit init,
                                     const ModelContext& ctx, ParamStore& store)
    : ctx_(&ctx) {
  weight_ = add_param(store, name + ".weight", {out, in}, 1, 1, init, ParamKind::Weight);
  if (bias) bias_ = add_param(store, name + ".bias", {out}, -1, 1, ParamInit::Zeros, ParamKind::Bias);
}

void RowParallelLinear::forward(Tensor& y, const Tensor& x) const {
  // The replicated bias is added by TP rank 0 only, before the sum over ranks.
  const Tensor* b = (bias_ && ctx_->ps->tp_rank == 0) ? &bias_->value : nullptr;
  ops::linear_forward(y, x, weight_->value, b);
  ReduceFromTP::forward(y, *ctx_->ps);
}

void RowParallelLinear::backward(Tensor& dx, const Tensor& dy, const Tensor& x) const {
  // ReduceFromTP::backward is the identity: dy is replicated.
  ops::linear_backward(&dx, &weight_->grad, bias_ ? &bias_->grad : nullptr, dy, x, weight_->value);
}

// ---------------------------------------------------------------- norm

Norm::Norm(const std::string& name, int64_t hidden, const ModelContext& ctx, ParamStore& store) : ctx_(&ctx) {
  weight_ = add_param(store, name + ".weight", {hidden}, -1, 1, ParamInit::Ones, ParamKind::Norm);
  if (!ctx.llama()) bias_ = add_param(store, name + ".bias", {hidden}, -1, 1, ParamInit::Zeros, ParamKind::Norm);
}

void Norm::forward(Tensor& y, Saved& s, const Tensor& x) const {
  const int64_t n = x.numel() / x.size(-1);
  const DType st = stat_dtype(x.dtype());
  s.rstd = Tensor::empty({n}, st, x.device());
  const double eps = ctx_->model->norm_epsilon;
  if (bias_) {
    s.mean = Tensor::empty({n}, st, x.device());
    ops::layernorm_forward(y, s.mean, s.rstd, x, weight_->value, bias_->value, eps);
  } else {
    ops::rmsnorm_forward(y, s.rstd, x, weight_->value, eps);
  }
}

void Norm::backward_accumulate(Tensor& dx, const Tensor& dy, const Tensor& x, const Saved& s) const {
  if (bias_)
    ops::layernorm_backward(dx, weight_->grad, bias_->grad, dy, x, weight_->value, s.mean, s.rstd,
                            ops::GradMode::Accumulate);
  else
    ops::rmsnorm_backward(dx, weight_->grad, dy, x, weight_->value, s.rstd, ops::GradMode::Accumulate);
}

}  // namespace mt
