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
};

// Sizes on one rank: rows = B*T, or B*T/tp under sequence parallelism (the residual stream); heads, groups and
// ffn are this rank's shares.
struct LayerDims {
  int64_t B = 0, T = 0, rows = 0, hidden = 0, heads = 0, groups = 0, head_dim = 0, ffn = 0;
};

std::vector<KeptTensor> norm_kept(const std::string& name, Normalization kind, int64_t rows);
std::vector<KeptTensor> self_attention_kept(const SelfAttentionSpec& spec, const LayerDims& d,
                                            RecomputePolicy::Mode mode);
std::vector<KeptTensor> mlp_kept(MLPKind kind, Activation activation, const LayerDims& d, bool keep_norm_act);
// The whole layer: under full recompute only its input.
std::vector<KeptTensor> layer_kept(const TransformerLayerSpec& spec, Activation activation, const LayerDims& d,
                                   RecomputePolicy::Mode mode, bool keep_norm_act);

}  // namespace mt
