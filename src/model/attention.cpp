#include "model/attention.h"

#include "parallel/context_parallel.h"
#include "tensor/ops.h"

namespace mt {

namespace {
int64_t qkv_width(const ModelContext& c) {
  const DerivedConfig& d = *c.derived;
  const int64_t R = c.model->num_attention_heads / d.num_query_groups;
  return static_cast<int64_t>(d.num_query_groups) * (R + 2) * d.head_dim;
}

RopeParams rope_params(const ModelFeatures& f) {
  RopeParams r(f.rope_theta);
  r.scaling = f.rope_scaling.enabled;
  r.factor = f.rope_scaling.factor;
  r.low_freq_factor = f.rope_scaling.low_freq_factor;
  r.high_freq_factor = f.rope_scaling.high_freq_factor;
  r.original_max_position_embeddings = f.rope_scaling.original_max_position_embeddings;
  return r;
}

DType stat_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }
}  // namespace

SelfAttention::SelfAttention(const std::string& prefix, const SelfAttentionSpec& spec, const ModelContext& ctx,
                             ParamStore& store)
    : ctx_(&ctx),
      heads_local_(ctx.model->num_attention_heads / ctx.ps->tp_size),
      groups_local_(ctx.derived->num_query_groups / ctx.ps->tp_size),
      head_dim_(ctx.derived->head_dim),
      rope_(spec.rope),
      rope_params_(rope_params(ctx.features())),
      linear_qkv_(prefix + ".linear_qkv", ctx.model->hidden_size, qkv_width(ctx), spec.qkv_bias,
                  ParamInit::Normal, ctx, store),
      linear_proj_(prefix + ".linear_proj", static_cast<int64_t>(ctx.model->num_attention_heads) * head_dim_,
                   ctx.model->hidden_size, spec.proj_bias, ParamInit::ScaledNormal, ctx, store) {
  MT_CHECK(ctx.derived->num_query_groups % ctx.ps->tp_size == 0, "model.num_query_groups (",
           ctx.derived->num_query_groups, ") must be divisible by parallel.tensor (", ctx.ps->tp_size,
           "): key/value heads replicated over tensor-parallel ranks are not supported yet");
  if (spec.qk_layernorm) {
    // RMSNorm over each head's D values (Qwen3), one weight (D) shared by all heads; each TP rank holds only its
    // heads, so the weight gradients are partial sums over TP. Registered after linear_qkv, before linear_proj.
    const bool partial = ctx.ps->tp_size > 1;
    q_layernorm_ = std::make_unique<Norm>(prefix + ".q_layernorm", head_dim_, Normalization::RMSNorm, partial, ctx, store);
    k_layernorm_ = std::make_unique<Norm>(prefix + ".k_layernorm", head_dim_, Normalization::RMSNorm, partial, ctx, store);
  }
}

// Without rotary embeddings or per-head norms the GPU attention runs on the fused projection (no split copies;
// cuDNN reads the heads in place); the CPU keeps the reference path (split, then attention): same math. Context
// parallelism needs q, k, v apart.
bool SelfAttention::fused() const {
  return !rope_ && !q_layernorm_ && ctx_->device != Device::CPU && ctx_->ps->cp_size == 1;
}

// The positions of the local sequence (two chunks under context parallelism).
RopePositions SelfAttention::positions(int64_t T) const {
  return context_chunk_positions(T, ctx_->ps->cp_size, ctx_->ps->cp_rank);
}

void SelfAttention::core_forward(Saved& s) const {
  if (ctx_->ps->cp_size > 1)
    context_attention_forward(s.out, s.lse, s.q, s.k, s.v, ctx_->derived->cp_comm_type, *ctx_->ps);
  else
    ops::attention_forward(s.out, s.lse, s.q, s.k, s.v);
}

Tensor SelfAttention::forward(Saved& s, const Tensor& x, int64_t B, int64_t T, const Tensor* residual) const {
  const ModelContext& c = *ctx_;
  Tensor qkv = linear_qkv_.forward(x, &s.qkv_x);  // (B*T, G_l*(R+2)*D): rows gathered under SP
  if (fused()) {
    s.q = qkv.view({B, T, -1});  // the whole projection; k, v stay undefined
    s.out = c.empty({B, T, heads_local_, head_dim_});
    s.lse = Tensor::empty({B, heads_local_, T}, DType::F32, c.device);
    ops::attention_forward_qkv(s.out, s.lse, s.q, groups_local_);
    Tensor y = linear_proj_.forward(s.out.view({B * T, heads_local_ * head_dim_}), residual, &s.proj_x);
    if (c.recompute.mode == RecomputePolicy::Mode::Selective) s.out = s.lse = Tensor();  // recomputed in backward
    return y;
  }
  s.q = c.empty({B, T, heads_local_, head_dim_});
  s.k = c.empty({B, T, groups_local_, head_dim_});
  s.v = c.empty({B, T, groups_local_, head_dim_});
  if (q_layernorm_) {  // split, norm each q and k head, then rotate the normed q and k
    s.q_pre = c.empty(s.q.shape());
    s.k_pre = c.empty(s.k.shape());
    ops::qkv_split_forward(s.q_pre, s.k_pre, s.v, qkv.view({B, T, -1}));
    Tensor qn = s.q.view({-1, head_dim_}), kn = s.k.view({-1, head_dim_});
    q_layernorm_->forward(qn, s.q_norm, s.q_pre.view({-1, head_dim_}));
    k_layernorm_->forward(kn, s.k_norm, s.k_pre.view({-1, head_dim_}));
    if (rope_) {
      ops::rope_forward(s.q, rope_params_, positions(T));
      ops::rope_forward(s.k, rope_params_, positions(T));
    }
  } else if (rope_) {  // split and rotate q, k in one pass: only the rotated copies exist afterwards
    ops::qkv_split_rope_forward(s.q, s.k, s.v, qkv.view({B, T, -1}), rope_params_, positions(T));
  } else {
    ops::qkv_split_forward(s.q, s.k, s.v, qkv.view({B, T, -1}));
  }
  s.out = c.empty({B, T, heads_local_, head_dim_});
  s.lse = Tensor::empty({B, heads_local_, T}, stat_dtype(c.dtype), c.device);
  core_forward(s);
  Tensor y = linear_proj_.forward(s.out.view({B * T, heads_local_ * head_dim_}), residual, &s.proj_x);
  if (c.recompute.mode == RecomputePolicy::Mode::Selective) s.out = s.lse = Tensor();  // recomputed in backward
  return y;
}

Tensor SelfAttention::backward(const Tensor& dy, const Saved& saved, const Tensor& x, int64_t B, int64_t T) const {
  const ModelContext& c = *ctx_;
  Saved s = saved;
  if (!s.out.defined()) {  // selective recompute of the attention core
    s.out = c.empty({B, T, heads_local_, head_dim_});
    s.lse = Tensor::empty({B, heads_local_, T}, stat_dtype(c.dtype), c.device);
    if (!s.k.defined())
      ops::attention_forward_qkv(s.out, s.lse, s.q, groups_local_);
    else
      core_forward(s);
  }
  Tensor dout = linear_proj_.backward(dy, s.out.view({B * T, heads_local_ * head_dim_}), &s.proj_x);
  if (!s.k.defined()) {  // the fused path
    Tensor dqkv = c.empty(s.q.shape());
    ops::attention_backward_qkv(dqkv, dout.view(s.out.shape()), s.q, s.out, s.lse, groups_local_);
    return linear_qkv_.backward(dqkv.view({B * T, -1}), x, true, &s.qkv_x);
  }
  Tensor dq = c.empty(s.q.shape()), dk = c.empty(s.k.shape()), dv = c.empty(s.v.shape());
  if (c.ps->cp_size > 1)
    context_attention_backward(dq, dk, dv, dout.view(s.out.shape()), s.q, s.k, s.v, s.out, s.lse,
                               c.derived->cp_comm_type, *c.ps);
  else
    ops::attention_backward(dq, dk, dv, dout.view(s.out.shape()), s.q, s.k, s.v, s.out, s.lse);
  Tensor dqkv = c.empty({B, T, linear_qkv_.local_out()});
  if (q_layernorm_) {  // rotate back, then through the norms (their weight gradients accumulate)
    if (rope_) {
      ops::rope_backward(dq, rope_params_, positions(T));
      ops::rope_backward(dk, rope_params_, positions(T));
    }
    Tensor dq_pre = c.zeros(s.q_pre.shape()), dk_pre = c.zeros(s.k_pre.shape());
    Tensor dq_pre_rows = dq_pre.view({-1, head_dim_}), dk_pre_rows = dk_pre.view({-1, head_dim_});
    q_layernorm_->backward_accumulate(dq_pre_rows, dq.view({-1, head_dim_}), s.q_pre.view({-1, head_dim_}), s.q_norm);
    k_layernorm_->backward_accumulate(dk_pre_rows, dk.view({-1, head_dim_}), s.k_pre.view({-1, head_dim_}), s.k_norm);
    ops::qkv_split_backward(dqkv, dq_pre, dk_pre, dv);
  } else if (rope_) {
    ops::qkv_split_rope_backward(dqkv, dq, dk, dv, rope_params_, positions(T));
  } else {
    ops::qkv_split_backward(dqkv, dq, dk, dv);
  }
  return linear_qkv_.backward(dqkv.view({B * T, -1}), x, true, &s.qkv_x);
}

}  // namespace mt
