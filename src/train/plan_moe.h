// `megatrain plan` for mixture-of-experts models (issue #16 part 6), from the config alone: what an MoE layer
// holds per rank (model/moe/moe_layer.h: the router, El = E / parallel.expert local experts, the shared expert
// sliced over tensor parallelism), its activations per micro-batch (model/kept_tensors.h moe_kept) and the
// all-to-all traffic of its token dispatcher (parallel/token_dispatcher.h). plan.cpp counts the rest of the model
// from the GPTModel built on Device::Meta and leaves out what that model builds in an MoE layer's MLP slot.
//
// Balanced-routing assumptions (dropless routing varies every step): each rank's experts receive as many rows as
// the rank routes (rows x topk) in as many tokens as it sends (rows x moe_ranks_per_token), and (EP - 1) / EP of
// the token rows leave the rank.
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"
#include "model/kept_tensors.h"

namespace mt {

// One MoE layer's parameters.
struct MoELayerParams {
  int64_t router = 0;         // E x C, replicated over tensor parallelism
  int64_t expert = 0;         // one expert (train/metrics.h expert_params), replicated over tensor parallelism
  int64_t shared = 0;         // the shared expert, whole (0: none)
  int64_t shared_local = 0;   // its slices on one tensor-parallel rank
  int64_t shared_replicated = 0;  // of which replicated (GELU's fc2 bias)
};
MoELayerParams moe_layer_params(const ModelConfig& m, int tp);

// Layer i's parameters that belong to its MLP slot ("decoder.layers.<i>.mlp.*"); -1 for any other parameter.
int mlp_slot_layer(const std::string& name);

// The MLP slot of an MoE layer on one rank, for one micro-batch of B sequences of T tokens (T: this rank's share
// under context parallelism): moe_kept's dimensions.
MoEDims moe_dims(const ModelConfig& m, int tp, int64_t routed_rows, int ep = 1);

// The EP ranks a token goes to (token-level dispatch: once to each rank holding one of its experts), expected under
// uniform routing: EP x (1 - C(E - El, k) / C(E, k)). moe-64x-top8 at EP 2: 1.995 (where per-expert rows were 8).
double moe_ranks_per_token(const ModelConfig& m, int ep);

// All-to-all bytes of one MoE layer for one micro-batch on one rank: forward the tokens to the experts' ranks and
// their partial outputs back, backward the output gradients there and the input gradients back (full recompute
// repeats the forward's): rows x moe_ranks_per_token token rows of C elements each; plus each forward's local
// choices and weights (k int32 + k fp32 per token row) and counts (EP x (El + 1) int64), and the backward's
// routing-weight gradients (k fp32 per token row). 0 without expert parallelism (no exchange).
struct MoEA2ABytes {
  int64_t total = 0;    // through the all-to-alls (this rank's own share included)
  int64_t leaving = 0;  // the (EP - 1) / EP share that leaves the rank
};
MoEA2ABytes moe_a2a_bytes(const ModelConfig& m, int ep, int64_t routed_rows, int64_t act_bytes, bool full_recompute);

}  // namespace mt
