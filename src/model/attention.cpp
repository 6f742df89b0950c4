#include "model/attention.h"

#include "tensor/ops.h"

namespace mt {

namespace {
int64_t qkv_width(const ModelContext& c) {
  const DerivedConfig& d = *c.derived;
  const int64_t R = c.model->num_attention_heads / d.num_query_groups;
  return static_cast<int64_t>(d.num_query_groups) * (R + 2) * d.head_dim;
}
}  // namespace

SelfAttention::SelfAttention(const std::string& prefix, const ModelContext& ctx, ParamStore& store)
    : ctx_(&ctx),
      heads_local_(ctx.model->num_attention_heads / ctx.ps->tp_size),
      groups_local_(ctx.derived->num_query_groups / ctx.ps->tp_size),
      head_dim_(ctx.derived->head_dim),
      linear_qkv_(prefix + ".linear_qkv", ctx.model->hidden_size, qkv_width(ctx), !ctx.llama(), ParamInit::Normal,
                  ctx, store),
      linear_proj_(prefix + ".linear_proj", static_cast<int64_t>(ctx.model->num_attention_heads) * head_dim_,
                   ctx.model->hidden_size, !ctx.llama(), ParamInit::ScaledNormal, ctx, store) {
  MT_CHECK(ctx.derived->num_query_groups % ctx.ps->tp_size == 0, "model.num_query_groups (",
           ctx.derived->num_query_groups, ") must be divisible by parallel.tensor (", ctx.ps->tp_size,
           "): key/value heads replicated over tensor-parallel ranks are not supported yet");
}

// Without rotary embeddings the GPU attention runs on the fused projection (no split copies; cuDNN
// reads the heads in place); the CPU keeps the reference path (split, then attention): same math.
bool SelfAttention::fused(const ModelContext& c) { return !c.llama() && c.device != Device::CPU; }

Tensor SelfAttention::forward(Saved& s, const Tensor& x, int64_t B, int64_t T, const Tensor* residual) const {
  const ModelContext& c = *ctx_;
  Tensor qkv = linear_qkv_.forward(x);  // (B*T, G_l*(R+2)*D): rows gathered under SP
  if (fused(c)) {
    s.q = qkv.view({B, T, -1});  // the whole projection; k, v stay undefined
    s.out = c.empty({B, T, heads_local_, head_dim_});
    s.lse = Tensor::empty({B, heads_local_, T}, DType::F32, c.device);
    ops::attention_forward_qkv(s.out, s.lse, s.q, groups_local_);
    Tensor y = linear_proj_.forward(s.out.view({B * T, heads_local_ * head_dim_}), residual);
    if (c.recompute.mode == RecomputePolicy::Mode::Selective) s.out = s.lse = Tensor();  // recomputed in backward
    return y;
  }
  s.q = c.empty({B, T, heads_local_, head_dim_});
  s.k = c.empty({B, T, groups_local_, head_dim_});
  s.v = c.empty({B, T, groups_local_, head_dim_});
  if (c.llama())  // split and rotate q, k in one pass: only the rotated copies exist afterwards
    ops::qkv_split_rope_forward(s.q, s.k, s.v, qkv.view({B, T, -1}), c.model->rope_theta, 0);
  else
    ops::qkv_split_forward(s.q, s.k, s.v, qkv.view({B, T, -1}));
  s.out = c.empty({B, T, heads_local_, head_dim_});
  s.lse = Tensor::empty({B, heads_local_, T}, c.dtype == DType::F64 ? DType::F64 : DType::F32, c.device);
  ops::attention_forward(s.out, s.lse, s.q, s.k, s.v);
  Tensor y = linear_proj_.forward(s.out.view({B * T, heads_local_ * head_dim_}), residual);
  if (c.recompute.mode == RecomputePolicy::Mode::Selective) s.out = s.lse = Tensor();  // recomputed in backward
  return y;
}

Tensor SelfAttention::backward(const Tensor& dy, const Saved& saved, const Tensor& x, int64_t B, int64_t T) const {
  const ModelContext& c = *ctx_;
  Saved s = saved;
  if (!s.out.defined()) {  // selective recompute of the attention core
    s.out = c.empty({B, T, heads_local_, head_dim_});
    s.lse = Tensor::empty({B, heads_local_, T}, c.dtype == DType::F64 ? DType::F64 : DType::F32, c.device);
    if (!s.k.defined())
      ops::attention_forward_qkv(s.out, s.lse, s.q, groups_local_);
    else
      ops::attention_forward(s.out, s.lse, s.q, s.k, s.v);
  }
  Tensor dout = linear_proj_.backward(dy, s.out.view({B * T, heads_local_ * head_dim_}));
  if (!s.k.defined()) {  // the fused path
    Tensor dqkv = c.empty(s.q.shape());
    ops::attention_backward_qkv(dqkv, dout.view(s.out.shape()), s.q, s.out, s.lse, groups_local_);
    return linear_qkv_.backward(dqkv.view({B * T, -1}), x);
  }
  Tensor dq = c.empty(s.q.shape()), dk = c.empty(s.k.shape()), dv = c.empty(s.v.shape());
  ops::attention_backward(dq, dk, dv, dout.view(s.out.shape()), s.q, s.k, s.v, s.out, s.lse);
  Tensor dqkv = c.empty({B, T, linear_qkv_.local_out()});
  if (c.llama())
    ops::qkv_split_rope_backward(dqkv, dq, dk, dv, c.model->rope_theta, 0);
  else
    ops::qkv_split_backward(dqkv, dq, dk, dv);
  return linear_qkv_.backward(dqkv.view({B * T, -1}), x);
}

// ---------------------------------------------------------------- MLP

MLP::MLP(const std::string& prefix, const ModelContext& ctx, ParamStore& store)
    : ctx_(&ctx),
      ffn_local_(ctx.derived->ffn_hidden_size / ctx.ps->tp_size),
      linear_fc1_(prefix + ".linear_fc1", ctx.model->hidden_size,
                  static_cast<int64_t>(ctx.derived->ffn_hidden_size) * (ctx.llama() ? 2 : 1), !ctx.llama(),
                  ParamInit::Normal, ctx, store, ctx.llama() ? 2 : 1),
      linear_fc2_(prefix + ".linear_fc2", ctx.derived->ffn_hidden_size, ctx.model->hidden_size, !ctx.llama(),
                  ParamInit::ScaledNormal, ctx, store) {}

Tensor MLP::forward(Saved& s, const Tensor& x, const Tensor* residual) const {
  const ModelContext& c = *ctx_;
  if (c.llama()) {
    s.h = linear_fc1_.forward(x);
    Tensor a = c.empty({s.h.size(0), ffn_local_});
    ops::swiglu_forward(a, s.h);
    if (!c.recompute.norm_act) s.a = a;  // else backward recomputes it from h
    return linear_fc2_.forward(a, residual);
  }
  s.a = linear_fc1_.forward_gelu(x, &s.h);  // GELU in the GEMM's epilogue where possible
  return linear_fc2_.forward(s.a, residual);
}

Tensor MLP::backward(const Tensor& dy, Saved& s, const Tensor& x) const {
  const ModelContext& c = *ctx_;
  Tensor dh;
  if (c.llama() && !s.a.defined()) {
    dh = linear_fc2_.backward_swiglu(dy, s.h);  // SwiGLU output recomputed, dh written over h
  } else if (c.llama()) {
    Tensor da = linear_fc2_.backward(dy, s.a);
    s.a = Tensor();
    dh = s.h;  // written over h: each element is read before it is overwritten
    ops::swiglu_backward(dh, da, s.h);
  } else {
    dh = linear_fc2_.backward_gelu(dy, s.a, s.h);  // GELU gradient in the dx GEMM's epilogue where possible
  }
  s = Saved{};
  return linear_fc1_.backward(dh, x);
}

}  // namespace mt
