// Self-attention: linear_qkv (column-parallel, Megatron's grouped [q heads of group g, k_g, v_g]
// layout), optional RMSNorm of each q and k head (qk_layernorm), rotary embedding (position_embedding_type
// rope), causal grouped-query attention (over the context group when parallel.context > 1:
// parallel/context_parallel.h), linear_proj (row-parallel). Each TP rank holds H/tp query heads
// and G/tp key/value heads.
// Shapes: x (B*T, C) -> qkv (B*T, G_l*(R+2)*D) -> q (B,T,H_l,D), k/v (B,T,G_l,D) -> out (B,T,H_l,D)
// -> y (B*T, C).  R = H/G query heads per group, D = kv_channels (head dim, not necessarily C/H).
#pragma once

#include <memory>

#include "model/linear.h"
#include "core/rope_params.h"

namespace mt {

// What fills the attention's optional parts (layer_spec.h decides it per layer).
struct SelfAttentionSpec {
  bool qkv_bias = false;      // bias on linear_qkv
  bool proj_bias = false;     // bias on linear_proj
  bool qk_layernorm = false;  // RMSNorm on each q and k head (q_layernorm, k_layernorm)
  bool rope = false;          // rotary embedding of q and k
};

class SelfAttention {
 public:
  SelfAttention(const std::string& prefix, const SelfAttentionSpec& spec, const ModelContext& ctx, ParamStore& store);
  // q, k, v split out (q, k normed and rotated when those features are on); or, on the fused path, q holds the
  // whole projection (B, T, G_l*(R+2)*D) (the same bytes) and k, v stay undefined. out/lse are dropped under
  // selective recompute. qk_layernorm: q_pre, k_pre are q, k before their norms (B,T,H_l,D) / (B,T,G_l,D), with
  // the norms' statistics.
  struct Saved {
    Tensor q, k, v, out, lse;
    Tensor q_pre, k_pre;
    Norm::Saved q_norm, k_norm;
    Fp8Saved qkv_x, proj_x;  // FP8 layers: the linears' kept input copies
  };
  // x (rows_local, C) -> y (rows_local, C) [+ *residual]; rows_local = B*T, or B*T/tp under sequence parallelism.
  Tensor forward(Saved& s, const Tensor& x, int64_t B, int64_t T, const Tensor* residual = nullptr) const;
  // Returns dL/dx (rows_local, C). x may be undefined when backward_needs_input(s) is false.
  Tensor backward(const Tensor& dy, const Saved& s, const Tensor& x, int64_t B, int64_t T) const;
  // Whether backward reads x (not when linear_qkv kept its FP8 copy).
  static bool backward_needs_input(const Saved& s) { return !s.qkv_x.defined(); }

 private:
  // Attention on the fused projection, q, k and v never split out: GPU, no rotary embedding, no qk norm.
  bool fused() const;
  RopePositions positions(int64_t T) const;
  // s.out, s.lse from s.q, s.k, s.v: causal attention, over the context group when parallel.context > 1.
  void core_forward(Saved& s) const;

  const ModelContext* ctx_;
  int64_t heads_local_, groups_local_, head_dim_;
  bool rope_;
  RopeParams rope_params_;
  ColumnParallelLinear linear_qkv_;
  std::unique_ptr<Norm> q_layernorm_, k_layernorm_;  // qk_layernorm only
  RowParallelLinear linear_proj_;
};

}  // namespace mt
