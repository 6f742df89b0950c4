// The experts of one MoE layer held by this rank (Megatron-Core's GroupedMLP): for each local expert e, its
// rows -> linear_fc1 (C -> 2F [gate; up] for SwiGLU, F for GELU) -> activation -> linear_fc2 (F -> C). No biases.
// All local experts run as one grouped GEMM per projection (ops::moe_grouped_linear_*) and one activation launch
// over all rows. Equal counts (the MoE layer's padded layout) make each projection one strided batched GEMM.
//
// Parameters, one per expert, named by the GLOBAL expert index so that a checkpoint reshards over
// expert-parallel ranks by name: `<prefix>.<e>.linear_fc1.weight` (2F or F, C) and `<prefix>.<e>.linear_fc2.weight`
// (C, F), e in [first_expert, first_expert + local_experts). They are registered fc1 of every local expert, then
// fc2 of every local expert, so each projection's weights are consecutive in the store's flat buffers and are
// read as one stacked (El, OC, IC) tensor. Replicated over TP (expert tensor parallelism 1); under sequence
// parallelism each TP rank's gradient is a partial sum (sequence_parallel_grad). Their data-parallel reduction
// is over the expert-data-parallel group, not the data-parallel one.
#pragma once

#include <string>
#include <vector>

#include "model/model_context.h"
#include "params/param_store.h"

namespace mt {

// The expert gradients of a model chunk's MoE layers as storage for their SwiGLU outputs (Experts::keep_activation_in):
// `next` is where the next layer's output may start; the chunk's first MoE layer resets it to the start of its own
// gradients.
struct ActivationArena {
  char* next = nullptr;
};

class Experts {
 public:
  Experts(const std::string& prefix, int64_t first_expert, int64_t local_experts, int64_t ffn_hidden_size,
          bool swiglu, const ModelContext& ctx, ParamStore& store);
  struct Saved {
    std::vector<int64_t> counts;  // rows of each local expert
    Tensor h, a;                  // fc1 output (M, 2F or F); activation output (M, F): GELU's; SwiGLU's when it
                                  // lives in earlier layers' gradients (keep_activation_in), else recomputed in
                                  // backward, as the dense llama MLP
  };
  // x (M, C) grouped by local expert, counts[e] rows each -> (M, C).
  Tensor forward(Saved& s, const Tensor& x, const std::vector<int64_t>& counts) const;
  // dy (M, C) -> dx (M, C); the weights' gradients accumulate (the first write of a step overwrites). Consumes s.
  Tensor backward(const Tensor& dy, Saved& s, const Tensor& x) const { return backward_fc1(backward_fc2(dy, s), s, x); }
  // The same in two halves, so that a caller can drop dy before it needs x (fewer buffers alive at once):
  // fc2 and the activation: dy -> dh (M, 2F or F; SwiGLU: written over s.h); then fc1: dh -> dx, consuming s.
  Tensor backward_fc2(Tensor dy, Saved& s) const;
  Tensor backward_fc1(const Tensor& dh, Saved& s, const Tensor& x) const;
  int64_t local_experts() const { return local_experts_; }
  // SwiGLU: keep the forward's a (M, F) in the expert gradients of the chunk's earlier MoE layers, when it fits,
  // instead of recomputing it in the SwiGLU backward (the fc2 dx kernel then stores no a: H200, moe-8x-top2, ~2.7 GB
  // a step less written, -0.66 ms; no memory). Set (by GPTModel, with one arena for the chunk's MoE layers in layer
  // order; `first`: this is the chunk's first) only under ModelContext::gradients_free_until_backward: an earlier
  // layer's gradients are dead from its update (before its forward, so before this one's) to its backward (after this
  // one's). Each a goes at the arena's next 256-byte aligned address, if it ends before this layer's own gradients;
  // the arena only moves forward within a step, so the outputs alive together never overlap (a recomputing group
  // that holds the first layer starts it again: the layers after the group are done with theirs).
  void keep_activation_in(ActivationArena* arena, bool first) { arena_ = arena, arena_first_ = first; }
  // This layer's expert gradients as one flat span (fc1 then fc2 of every local expert: consecutive).
  Tensor gradient_span() const;

 private:
  // The stacked (El, OC, IC) view of consecutive parameters' values or gradients.
  Tensor stacked(const std::vector<Param*>& ps, bool grad) const;
  ops::GradMode grad_mode(const std::vector<Param*>& ps) const;
  // The sums of squares of ps' gradients from the op that just wrote them (undefined: none; ParamStore).
  void record_squares(const std::vector<Param*>& ps, Tensor squares) const;

  const ModelContext* ctx_;
  ParamStore* store_;
  int64_t local_experts_, ffn_;
  bool swiglu_;
  std::vector<Param*> fc1_, fc2_;
  ActivationArena* arena_ = nullptr;  // keep_activation_in
  bool arena_first_ = false;
};

}  // namespace mt
