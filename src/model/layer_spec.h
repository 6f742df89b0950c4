// A decoder layer's spec (Megatron-Core's TransformerLayerSubmodules): what fills each slot of layer N.
// One decision point per slot: the layer asks for its spec and builds from it; nothing else tests features.
#pragma once

#include <memory>
#include <string>

#include "model/attention.h"
#include "model/mlp.h"

namespace mt {

// The MLP slot's module: the dense MLP, or a mixture of experts (model/moe/moe_mlp.h) in the layers
// model.num_experts / model.moe_layer_freq make MoE layers (ModelFeatures::moe_layers).
enum class MLPKind { Dense, MoE };

struct TransformerLayerSpec {
  Normalization norm = Normalization::RMSNorm;  // input_layernorm and pre_mlp_layernorm
  SelfAttentionSpec self_attention;
  MLPKind mlp = MLPKind::Dense;
};

// The module in layer `layer_number`'s MLP slot (global layer number, 0-based).
MLPKind mlp_kind_for_layer(const ModelFeatures& features, int layer_number);
TransformerLayerSpec layer_spec(const ModelFeatures& features, int layer_number);
// Builds the module of `kind` for layer `layer_number` with parameters under `prefix` (decoder.layers.N.mlp).
std::unique_ptr<MLPModule> build_mlp(MLPKind kind, int layer_number, const std::string& prefix,
                                     const ModelContext& ctx, ParamStore& store);

}  // namespace mt
