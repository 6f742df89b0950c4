// What each module of a decoder layer keeps from its forward for its backward, per micro-batch, described
// once: `megatrain plan` sums it (train/plan.cpp) and test/plan checks it against the tensors a real forward
// keeps (TransformerLayer::Saved). A module that keeps a new tensor adds it here.
#pragma once

#include <string>
#include <vector>

#include "model/layer_spec.h"

namespace mt {

struct KeptTensor {
  std::string name;        // the Saved member, e.g. "self_attention.q"
  int64_t numel = 0;
  bool statistic = false;  // norm / softmax statistics: fp32 (fp64 in fp64 runs); else the activation dtype
  bool index = false;      // int32 (MoE routing maps): 4 bytes whatever the dtypes
};

// Sizes on one rank: rows = B*T, or B*T/tp under sequence parallelism (the residual stream); heads, groups and
// ffn are this rank's shares.
// MoE layers: experts, topk, moe_ffn (per expert), shared_ffn (this rank's share of the shared expert, 0: none),
// capacity (a capacity factor is set: the choice is copied before the drop).
struct LayerDims {
  int64_t B = 0, T = 0, rows = 0, hidden = 0, heads = 0, groups = 0, head_dim = 0, ffn = 0;
  int64_t experts = 0, topk = 0, moe_ffn = 0, shared_ffn = 0;
  bool capacity = false;
};

std::vector<KeptTensor> norm_kept(const std::string& name, Normalization kind, int64_t rows);
std::vector<KeptTensor> self_attention_kept(const SelfAttentionSpec& spec, const LayerDims& d,
                                            RecomputePolicy::Mode mode);
// MoE: the rows an EP rank's experts receive depend on the routing; described for a balanced load (each rank's
// experts get rows x topk rows, i.e. as many as it routes) and no drop. The router's tensors are fp32 / int32
// (4 bytes: counted as statistics; fp64 in fp64 runs, where the int32 ones are over-counted).
std::vector<KeptTensor> mlp_kept(MLPKind kind, Activation activation, const LayerDims& d, bool keep_norm_act);
// An MoE layer's MLP slot (model/moe/moe_layer.h Saved) on one rank: the router's logits, scores and weights in
// the router dtype (fp32, fp64 in fp64 runs: counted as statistics), its top-k choice (int32); under expert
// parallelism the (token, rank) send map (int32) and the tokens this rank received with their routing weights; the
// two routing maps of the local experts (int32), their fc1 and activation outputs and outputs; the shared expert's
// fc1 and activation outputs. Rows: d.rows routed by this rank (each TP rank routes its own rows under sequence
// parallelism), recv_rows received by its experts (dropless and balanced: d.rows x topk) in recv_tokens tokens, all
// B*T rows for the tensor-parallel shared expert.
struct MoEDims {
  int64_t experts = 0, topk = 0;
  int64_t ffn = 0;          // moe_ffn_hidden_size (experts are not tensor-parallel)
  int64_t shared_ffn = 0;   // this rank's share of moe_shared_expert_intermediate_size (0: none)
  int64_t recv_rows = 0;    // routed slots this rank's experts receive
  int64_t ep = 1;           // parallel.expert
  int64_t recv_tokens = 0;  // EP > 1: the tokens that carry them (one per token and rank; kept for the backward)
  bool swiglu = true;       // fc1 is [gate; up] (2 x ffn wide)
  bool keep_input = false;  // the experts' permuted input rows kept (training.recompute_norm_act false), else permuted
                            // again in backward
  bool capacity = false;    // moe_expert_capacity_factor set: the choice after the drop is a second (N, k) map
  bool aux_loss = false, z_loss = false;  // the balancing losses' values (1 element each)
};
std::vector<KeptTensor> moe_kept(const MoEDims& m, const LayerDims& d);
// The whole layer: under full recompute only its input.
std::vector<KeptTensor> layer_kept(const TransformerLayerSpec& spec, Activation activation, const LayerDims& d,
                                   RecomputePolicy::Mode mode, bool keep_norm_act);
// A layer whose MLP is an MoE layer: layer_kept with the dense MLP's tensors replaced by moe_kept.
std::vector<KeptTensor> moe_layer_kept(const TransformerLayerSpec& spec, Activation activation, const LayerDims& d,
                                       const MoEDims& m, RecomputePolicy::Mode mode, bool keep_norm_act);

}  // namespace mt
