// Keys that act only when another key turns their feature on (training.recompute_method with recompute full, the
// FP8 recipe's parameters with training.fp8, fp16's loss-scaling keys with precision fp16, ...). One set while its
// feature is off would be silently ignored; validate_config refuses it by name, with the key that turns it on
// (nothing the user wrote is ignored). "Set" means "differs from the default": a key written at its default value
// changes nothing either way. The model's own such keys are checked where they are resolved (RoPE's in
// model_features.cpp, the MoE ones in config_validate_moe.cpp).
#pragma once

#include <string>

#include "config/config.h"

namespace mt {

// pre: the error prefix naming the config file.
void check_dependent_keys(const Config& cfg, const std::string& pre);

}  // namespace mt
