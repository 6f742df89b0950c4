// A decoder layer's spec (Megatron-Core's TransformerLayerSubmodules): what fills each slot of layer N.
// One decision point per slot: the layer asks for its spec and builds from it; nothing else tests features.
#pragma once

#include <memory>
#include <string>

#include "model/attention.h"
#include "model/mlp.h"

namespace mt {

// The MLP slot's module. Only Dense today; a mixture-of-experts module goes here (with model.moe_layer_freq /
// DeepSeek's "first k layers dense" decided in mlp_kind_for_layer).
enum class MLPKind { Dense };

struct TransformerLayerSpec {
  Normalization norm = Normalization::RMSNorm;  // input_layernorm and pre_mlp_layernorm
  SelfAttentionSpec self_attention;
  MLPKind mlp = MLPKind::Dense;
};

// The module in layer `layer_number`'s MLP slot (global layer number, 0-based).
MLPKind mlp_kind_for_layer(const ModelFeatures& features, int layer_number);
TransformerLayerSpec layer_spec(const ModelFeatures& features, int layer_number);
// Builds the module of `kind` with parameters under `prefix` (decoder.layers.N.mlp).
std::unique_ptr<MLPModule> build_mlp(MLPKind kind, const std::string& prefix, const ModelContext& ctx,
                                     ParamStore& store);

}  // namespace mt
