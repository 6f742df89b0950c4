// The model's features resolved from the model section: model.arch is a preset that fills every
// feature key left unset, a key written in the config wins. The one place that turns arch into
// features; the model, the trainer and plan read DerivedConfig::features only.
//   gpt2:  layernorm, gelu, add_bias_linear, learned_absolute positions, tied output layer
//   llama: rmsnorm, swiglu, no biases, rope, untied output layer
#pragma once

#include <string>

#include "config/config.h"

namespace mt {

// Resolves and checks the features (throws mt::Error naming the file, the key and the fix).
ModelFeatures resolve_model_features(const Config& cfg);

// "preset (arch)" text of the schema's default column for a preset-filled key.
inline constexpr char kPresetDefault[] = "preset (arch)";

// Names of the enum values (the YAML spelling).
const char* normalization_name(Normalization n);
const char* activation_name(Activation a);
const char* position_embedding_name(PositionEmbedding p);
// One line per feature, "normalization: rmsnorm  # preset llama" style, for `megatrain config`.
std::string describe_model_features(const Config& cfg, const ModelFeatures& f);

}  // namespace mt
