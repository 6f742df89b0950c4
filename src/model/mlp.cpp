#include "model/mlp.h"

#include "tensor/ops.h"

namespace mt {

DenseMLP::DenseMLP(const std::string& prefix, const ModelContext& ctx, ParamStore& store)
    : ctx_(&ctx),
      swiglu_(ctx.features().activation == Activation::SwiGLU),
      ffn_local_(ctx.derived->ffn_hidden_size / ctx.ps->tp_size),
      linear_fc1_(prefix + ".linear_fc1", ctx.model->hidden_size,
                  static_cast<int64_t>(ctx.derived->ffn_hidden_size) * (swiglu_ ? 2 : 1),
                  ctx.features().add_bias_linear, ParamInit::Normal, ctx, store, swiglu_ ? 2 : 1),
      linear_fc2_(prefix + ".linear_fc2", ctx.derived->ffn_hidden_size, ctx.model->hidden_size,
                  ctx.features().add_bias_linear, ParamInit::ScaledNormal, ctx, store) {}

Tensor DenseMLP::forward(std::shared_ptr<MLPState>& state, const Tensor& x, const RowKey&,
                         const Tensor* residual) const {
  const ModelContext& c = *ctx_;
  auto s = std::make_shared<Saved>();
  state = s;
  if (swiglu_) {
    s->h = linear_fc1_.forward(x, &s->fc1_x);
    Tensor a = c.empty({s->h.size(0), ffn_local_});
    // FP8 tensorwise: a's amax taken in the SwiGLU's pass instead of one of its own before fc2's cast.
    Tensor a_amax = linear_fc2_.fp8_current_scaling() ? Tensor::empty({1}, DType::F32, c.device) : Tensor();
    ops::swiglu_forward(a, s->h, a_amax.defined() ? &a_amax : nullptr);
    Tensor y = linear_fc2_.forward(a, residual, &s->fc2_x, a_amax.defined() ? &a_amax : nullptr);
    // Kept for fc2's backward unless recomputed from h or (FP8) its FP8 copy was kept.
    if (!c.recompute.norm_act && !s->fc2_x.defined()) s->a = a;
    return y;
  }
  s->a = linear_fc1_.forward_gelu(x, &s->h);  // GELU in the GEMM's epilogue where possible
  return linear_fc2_.forward(s->a, residual);
}

bool DenseMLP::backward_needs_input(const MLPState& state) const {
  return !static_cast<const Saved&>(state).fc1_x.defined();
}

Tensor DenseMLP::backward(const Tensor& dy, std::shared_ptr<MLPState>& state, const Tensor& x) const {
  MT_INTERNAL_ASSERT(state, "DenseMLP::backward without a forward");
  Saved& s = static_cast<Saved&>(*state);  // made by forward above
  Tensor dh;
  // FP8 tensorwise: dh's amax taken in the SwiGLU backward's pass for fc1's cast (FP8 fc2 path only).
  Tensor dh_amax;
  if (swiglu_ && !s.a.defined() && linear_fc2_.fp8() && linear_fc1_.fp8_current_scaling())
    dh_amax = Tensor::empty({1}, DType::F32, ctx_->device);
  if (swiglu_ && !s.a.defined()) {
    // SwiGLU output recomputed (or FP8 kept), dh written over h
    dh = linear_fc2_.backward_swiglu(dy, s.h, &s.fc2_x, dh_amax.defined() ? &dh_amax : nullptr);
  } else if (swiglu_) {
    Tensor da = linear_fc2_.backward(dy, s.a);
    s.a = Tensor();
    dh = s.h;  // written over h: each element is read before it is overwritten
    ops::swiglu_backward(dh, da, s.h);
  } else {
    dh = linear_fc2_.backward_gelu(dy, s.a, s.h);  // GELU gradient in the dx GEMM's epilogue where possible
  }
  Fp8Saved fc1_x = std::move(s.fc1_x);
  state.reset();
  return linear_fc1_.backward(dh, x, true, &fc1_x, dh_amax.defined() ? &dh_amax : nullptr);
}

}  // namespace mt
