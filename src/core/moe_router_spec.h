// The router's choice rule, shared by the MoE ops (tensor/moe_ops.h) and their CUDA kernels (cuda/moe_cuda.h):
// plain data, so that the kernel layer can read it without the tensor layer.
#pragma once

#include <cstdint>

namespace mt::ops {

// How the router turns logits into expert choices and weights (Megatron-Core moe/router.py).
struct RouterSpec {
  int64_t topk = 1;
  bool sigmoid = false;       // score function: sigmoid (DeepSeek-V3) instead of softmax
  bool pre_softmax = false;   // softmax only: weights are the softmax over all E (not renormalized over the k)
  double scaling = 1.0;       // moe_router_topk_scaling_factor (1: none)
  // Weights are the chosen scores divided by their sum: softmax without pre_softmax (= softmax over the
  // k chosen logits), sigmoid when k > 1 (DeepSeek-V3).
  bool normalize() const { return sigmoid ? topk > 1 : !pre_softmax; }
};

// The most experts whose router input gradient (dlogits x the router weight) the permute's backward adds in its
// pass (tensor/moe_ops.h moe_permute_backward; its CUDA kernel holds a token's dlogits in registers).
inline constexpr int64_t kRouterTermMaxE = 16;

}  // namespace mt::ops
