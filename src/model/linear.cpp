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

// How this backward writes the weight's gradient (Overwrite on its first write of the step); the bias's column
// sums only accumulate: it is zeroed first when unwritten.
ops::GradMode weight_grad_mode(Param* weight, Param* bias) {
  if (bias) prepare_grad_accumulate(*bias);
  return grad_write_mode(*weight);
}
}  // namespace

// ---------------------------------------------------------------- column parallel

ColumnParallelLinear::ColumnParallelLinear(const std::string& name, int64_t in, int64_t out, bool bias,
                                           ParamInit init, const ModelContext& ctx, ParamStore& store, int chunks)
    : ctx_(&ctx) {
  weight_ = add_param(store, name + ".weight", {out, in}, 0, chunks, init, ParamKind::Weight);
  if (bias) bias_ = add_param(store, name + ".bias", {out}, 0, chunks, ParamInit::Zeros, ParamKind::Bias);
  // X replicated (gathered under SP), W and dY split by output features.
  fp8_ = Fp8Linear::make(ctx, name, {false, ctx.ps->tp_size > 1, ctx.ps->tp_size > 1});
}

ColumnParallelLinear::ColumnParallelLinear(const std::string&, Param* shared_weight, const ModelContext& ctx)
    : ctx_(&ctx), weight_(shared_weight) {
  MT_INTERNAL_ASSERT(weight_->spec.partition_dim == 0, "tied weight must be split by rows");
}

Tensor ColumnParallelLinear::forward(const Tensor& x, Fp8Saved* fp8_keep) const {
  const ParallelState& ps = *ctx_->ps;
  // Without SP, CopyToTP::forward is the identity: X is already replicated on every TP rank.
  Tensor xf = ps.sequence_parallel ? GatherFromSP::forward(x, ps) : x;
  Tensor y = ctx_->empty({xf.size(0), local_out()});
  if (fp8_)
    fp8_->forward(y, xf, weight_->value, bias_ ? &bias_->value : nullptr, ps, fp8_keep);
  else
    ops::linear_forward(y, xf, weight_->value, bias_ ? &bias_->value : nullptr);
  return y;
}

Tensor ColumnParallelLinear::forward_gelu(const Tensor& x, Tensor* pre) const {
  const ParallelState& ps = *ctx_->ps;
  Tensor xf = ps.sequence_parallel ? GatherFromSP::forward(x, ps) : x;
  *pre = ctx_->empty({xf.size(0), local_out()});
  Tensor y = ctx_->empty({xf.size(0), local_out()});
  if (fp8_) {
    fp8_->forward(*pre, xf, weight_->value, bias_ ? &bias_->value : nullptr, ps);
    ops::gelu_forward(y, *pre);
    return y;
  }
  ops::linear_gelu_forward(y, *pre, xf, weight_->value, bias_ ? &bias_->value : nullptr);
  return y;
}

Tensor ColumnParallelLinear::backward(const Tensor& dy, const Tensor& x, bool need_dx, const Fp8Saved* fp8_kept,
                                      Tensor* dy_amax) const {
  const ParallelState& ps = *ctx_->ps;
  // FP8: the plain order (no overlap variant yet).
  if (ctx_->tp_comm_overlap && ps.tp_size > 1 && !fp8_) return backward_overlapped(dy, x, need_dx);
  // With X's kept FP8 copy (made from the gathered rows) backward needs neither X nor its gather.
  const bool kept = fp8_ && fp8_kept && fp8_kept->defined();
  Tensor xf = kept ? Tensor() : ps.sequence_parallel ? GatherFromSP::forward(x, ps) : x;
  Tensor dxf;
  if (need_dx) dxf = ctx_->empty(xf.defined() ? xf.shape() : Shape{dy.size(0), weight_->local_shape[1]});
  const ops::GradMode wmode = weight_grad_mode(weight_, bias_);
  if (fp8_)
    fp8_->backward(need_dx ? &dxf : nullptr, &weight_->grad, bias_ ? &bias_->grad : nullptr, dy, xf, weight_->value,
                   wmode, ps, fp8_kept, dy_amax);
  else
    ops::linear_backward(need_dx ? &dxf : nullptr, &weight_->grad, bias_ ? &bias_->grad : nullptr, dy, xf,
                         weight_->value, ops::GradMode::Overwrite, wmode);
  if (!need_dx) return Tensor();
  if (ps.sequence_parallel) return GatherFromSP::backward(dxf, ps);
  CopyToTP::backward(dxf, ps);
  return dxf;
}

// parallel.tp_comm_overlap: the same result, with the communication beside the GEMMs (Megatron's
// overlap of the input-gradient all-reduce / reduce-scatter with the weight-gradient GEMM). On the
// TP group's stream: under SP the all-gather of the input rows runs while dX = dY W is computed,
// then the reduction of dX (all-reduce, or reduce-scatter under SP) while dW += dY^T X is.
Tensor ColumnParallelLinear::backward_overlapped(const Tensor& dy, const Tensor& x, bool need_dx) const {
  const ParallelState& ps = *ctx_->ps;
  const bool sp = ps.sequence_parallel;
  Tensor xf = x;
  std::unique_ptr<Work> gather, reduce;
  if (sp) {
    xf = ctx_->empty({x.size(0) * ps.tp_size, x.size(1)});
    gather = gather_sp_rows_async(xf, x, ps);
  }
  Tensor dx;
  if (need_dx) {
    Tensor dxf = ctx_->empty(xf.shape());
    ops::linear_backward(&dxf, nullptr, nullptr, dy, xf, weight_->value);  // reads dy and W only
    dx = sp ? ctx_->empty(x.shape()) : dxf;
    reduce = reduce_column_input_grad_async(dx, dxf, ps);
  }
  if (gather) gather->wait();
  const ops::GradMode wmode = weight_grad_mode(weight_, bias_);
  ops::linear_backward(nullptr, &weight_->grad, bias_ ? &bias_->grad : nullptr, dy, xf, weight_->value,
                       ops::GradMode::Overwrite, wmode);
  if (reduce) reduce->wait();
  return dx;
}

// ---------------------------------------------------------------- row parallel

RowParallelLinear::RowParallelLinear(const std::string& name, int64_t in, int64_t out, bool bias, ParamInit init,
                                     const ModelContext& ctx, ParamStore& store)
    : ctx_(&ctx) {
  weight_ = add_param(store, name + ".weight", {out, in}, 1, 1, init, ParamKind::Weight);
  if (bias) bias_ = add_param(store, name + ".bias", {out}, -1, 1, ParamInit::Zeros, ParamKind::Bias);
  // X and W split by input features, dY replicated (gathered under SP).
  fp8_ = Fp8Linear::make(ctx, name, {ctx.ps->tp_size > 1, ctx.ps->tp_size > 1, false});
}

// The FP8 GEMMs of a row-parallel backward into dx (rows_full, in_local), from the full dy.
namespace {
void fp8_row_backward(const Fp8Linear& f, Tensor& dx, Param* weight, Param* bias, const Tensor& dyf, const Tensor& x,
                      const ParallelState& ps, const Fp8Saved* kept) {
  const ops::GradMode wmode = weight_grad_mode(weight, bias);
  f.backward(&dx, &weight->grad, bias ? &bias->grad : nullptr, dyf, x, weight->value, wmode, ps, kept);
}
}  // namespace

Tensor RowParallelLinear::forward(const Tensor& x, const Tensor* residual, Fp8Saved* fp8_keep, Tensor* x_amax) const {
  const ParallelState& ps = *ctx_->ps;
  // The replicated bias is added by TP rank 0 only, before the sum over ranks.
  const Tensor* b = (bias_ && ps.tp_rank == 0) ? &bias_->value : nullptr;
  Tensor y = ctx_->empty({x.size(0), weight_->local_shape[0]});
  if (fp8_) {
    // tp 1: the residual in the GEMM's epilogue, as in the bf16 path
    fp8_->forward(y, x, weight_->value, b, ps, fp8_keep, x_amax, ps.tp_size == 1 ? residual : nullptr);
    if (ps.tp_size == 1) return y;
  } else if (ps.tp_size == 1) {
    ops::linear_forward(y, x, weight_->value, b, residual);
    return y;
  } else {
    ops::linear_forward(y, x, weight_->value, b);
  }
  if (ps.tp_size == 1) {
    if (residual) ops::add(y, y, *residual);
    return y;
  }
  if (ps.sequence_parallel) {
    y = ReduceScatterToSP::forward(y, ps);
  } else {
    ReduceFromTP::forward(y, ps);
  }
  if (residual) ops::add(y, y, *residual);
  return y;
}

Tensor RowParallelLinear::backward(const Tensor& dy, const Tensor& x, const Fp8Saved* fp8_kept) const {
  const ParallelState& ps = *ctx_->ps;
  // Without SP, ReduceFromTP::backward is the identity: dy is replicated. The bias gradient comes
  // from the full dy on every rank, so the replicated bias stays identical across TP ranks.
  Tensor dyf = ps.sequence_parallel ? ReduceScatterToSP::backward(dy, ps) : dy;
  Tensor dx = ctx_->empty(x.defined() ? x.shape() : Shape{dyf.size(0), local_in()});
  if (fp8_) {
    fp8_row_backward(*fp8_, dx, weight_, bias_, dyf, x, ps, fp8_kept);
    return dx;
  }
  const ops::GradMode wmode = weight_grad_mode(weight_, bias_);
  ops::linear_backward(&dx, &weight_->grad, bias_ ? &bias_->grad : nullptr, dyf, x, weight_->value,
                       ops::GradMode::Overwrite, wmode);
  return dx;
}

Tensor RowParallelLinear::backward_gelu(const Tensor& dy, const Tensor& x, const Tensor& pre) const {
  const ParallelState& ps = *ctx_->ps;
  Tensor dyf = ps.sequence_parallel ? ReduceScatterToSP::backward(dy, ps) : dy;
  Tensor dpre = ctx_->empty(x.shape());
  if (fp8_) {  // the FP8 dgrad, then the GELU's backward
    Tensor dx = ctx_->empty(x.shape());
    fp8_row_backward(*fp8_, dx, weight_, bias_, dyf, x, ps, nullptr);
    ops::gelu_backward(dpre, dx, pre);
    return dpre;
  }
  const ops::GradMode wmode = weight_grad_mode(weight_, bias_);
  ops::linear_backward_gelu(dpre, &weight_->grad, bias_ ? &bias_->grad : nullptr, dyf, x, weight_->value, pre,
                            wmode);
  return dpre;
}

Tensor RowParallelLinear::backward_swiglu(const Tensor& dy, Tensor& h, const Fp8Saved* fp8_kept,
                                         Tensor* dh_amax) const {
  const ParallelState& ps = *ctx_->ps;
  Tensor dyf = ps.sequence_parallel ? ReduceScatterToSP::backward(dy, ps) : dy;
  if (fp8_) {  // the FP8 GEMMs (x = swiglu(h) recomputed unless its FP8 copy was kept), then the SwiGLU's backward
    Tensor x;
    if (!(fp8_kept && fp8_kept->defined())) {
      x = ctx_->empty({h.size(0), h.size(1) / 2});
      ops::swiglu_forward(x, h);
    }
    Tensor dx = ctx_->empty({h.size(0), h.size(1) / 2});
    fp8_row_backward(*fp8_, dx, weight_, bias_, dyf, x, ps, fp8_kept);
    Tensor dh = ctx_->empty(h.shape());
    ops::swiglu_backward(dh, dx, h, dh_amax);
    h = Tensor();
    return dh;
  }
  Tensor dh = h;  // in place: h is read before each of its elements is overwritten
  const ops::GradMode wmode = weight_grad_mode(weight_, bias_);
  ops::linear_backward_swiglu(dh, &weight_->grad, bias_ ? &bias_->grad : nullptr, dyf, weight_->value, h, wmode);
  h = Tensor();
  return dh;
}

// ---------------------------------------------------------------- norm

// Under sequence parallelism each TP rank sees only its rows: the gradients are partial sums.
Norm::Norm(const std::string& name, int64_t hidden, const ModelContext& ctx, ParamStore& store)
    : Norm(name, hidden, ctx.features().normalization, ctx.ps->sequence_parallel && ctx.ps->tp_size > 1, ctx, store) {}

Norm::Norm(const std::string& name, int64_t dim, Normalization kind, bool partial_grad_over_tp, const ModelContext& ctx,
           ParamStore& store)
    : ctx_(&ctx) {
  weight_ = add_param(store, name + ".weight", {dim}, -1, 1, ParamInit::Ones, ParamKind::Norm);
  if (kind == Normalization::LayerNorm)
    bias_ = add_param(store, name + ".bias", {dim}, -1, 1, ParamInit::Zeros, ParamKind::Norm);
  weight_->spec.sequence_parallel_grad = partial_grad_over_tp;
  if (bias_) bias_->spec.sequence_parallel_grad = partial_grad_over_tp;
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
  prepare_grad_accumulate(*weight_);  // the norm kernels only accumulate into dw (and db)
  if (bias_) {
    prepare_grad_accumulate(*bias_);
    ops::layernorm_backward(dx, weight_->grad, bias_->grad, dy, x, weight_->value, s.mean, s.rstd,
                            ops::GradMode::Accumulate);
  } else {
    ops::rmsnorm_backward(dx, weight_->grad, dy, x, weight_->value, s.rstd, ops::GradMode::Accumulate);
  }
}

}  // namespace mt
