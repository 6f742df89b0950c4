// Self-attention: linear_qkv (column-parallel, Megatron's grouped [q heads of group g, k_g, v_g]
// layout), rotary embedding (llama), causal grouped-query attention, linear_proj (row-parallel).
// Each TP rank holds H/tp query heads and G/tp key/value heads.
// Shapes: x (B*T, C) -> qkv (B*T, G_l*(R+2)*D) -> q (B,T,H_l,D), k/v (B,T,G_l,D) -> out (B,T,H_l,D)
// -> y (B*T, C).  R = H/G query heads per group.
#pragma once

#include "model/linear.h"

namespace mt {

class SelfAttention {
 public:
  SelfAttention(const std::string& prefix, const ModelContext& ctx, ParamStore& store);
  // q, k, v split out; or, on the fused path, q holds the whole projection (B, T, G_l*(R+2)*D) (the same
  // bytes) and k, v stay undefined. out/lse are dropped under selective recompute.
  struct Saved {
    Tensor q, k, v, out, lse;
  };
  // x (rows_local, C) -> y (rows_local, C) [+ *residual]; rows_local = B*T, or B*T/tp under sequence parallelism.
  Tensor forward(Saved& s, const Tensor& x, int64_t B, int64_t T, const Tensor* residual = nullptr) const;
  // Returns dL/dx (rows_local, C).
  Tensor backward(const Tensor& dy, const Saved& s, const Tensor& x, int64_t B, int64_t T) const;

 private:
  // Attention on the fused projection, q, k and v never split out: no rotary embedding, GPU.
  static bool fused(const ModelContext& c);

  const ModelContext* ctx_;
  int64_t heads_local_, groups_local_, head_dim_;
  ColumnParallelLinear linear_qkv_;
  RowParallelLinear linear_proj_;
};

// MLP: linear_fc1 (column-parallel; llama: [gate; up], each split over TP) -> GELU (gpt2) or
// SwiGLU (llama) -> linear_fc2 (row-parallel).  x (B*T, C) -> h (B*T, F_l or 2F_l) -> a (B*T, F_l) -> y.
class MLP {
 public:
  MLP(const std::string& prefix, const ModelContext& ctx, ParamStore& store);
  // a is the activation's output: gpt2 always keeps it (the GELU's output, from the fc1 GEMM's epilogue); llama
  // keeps the SwiGLU output only when RecomputePolicy::norm_act is false, else recomputes it from h inside the
  // SwiGLU backward's pass, which costs one extra write instead of keeping (B*T, F_l).
  struct Saved {
    Tensor h, a;
  };
  // y [+ *residual] (the residual added by fc2, see RowParallelLinear::forward).
  Tensor forward(Saved& s, const Tensor& x, const Tensor* residual = nullptr) const;
  // Consumes s (llama: h is overwritten by its gradient).
  Tensor backward(const Tensor& dy, Saved& s, const Tensor& x) const;

 private:
  const ModelContext* ctx_;
  int64_t ffn_local_;
  ColumnParallelLinear linear_fc1_;
  RowParallelLinear linear_fc2_;
};

}  // namespace mt
