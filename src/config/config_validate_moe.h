// Cross-field checks of the mixture-of-experts keys (model.moe_*, model.num_experts, parallel.expert), called by
// validate_config; and which layers are MoE layers (model.moe_layer_freq).
#pragma once

#include <string>

#include "config/config.h"

namespace mt {

// pre: the error prefix naming the config file.
void validate_moe_config(const Config& cfg, const std::string& pre);
// Layer i (0-based, over the whole model) has an MoE MLP.
bool is_moe_layer(const ModelConfig& m, int layer);

}  // namespace mt
