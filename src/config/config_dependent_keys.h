// Keys that act only when another key turns their feature on (model.rope_scaling_factor with model.rope_scaling,
// parallel.cp_comm_type with context > 1, training.recompute_method with recompute full, the FP8 recipe's parameters with training.fp8, fp16's loss-scaling
// keys with precision fp16, ...). One set while its feature is off would be silently ignored: validate_config
// refuses it by name, with the key that turns it on (nothing the user wrote is ignored). "Set" means "differs from
// the default": a key written at its default value changes nothing either way. A checkpoint's stored config (saved
// by a version that accepted such a key: it acted on nothing in that run) has them reset to their defaults instead
// (load_stored_config), so its checkpoint still converts and generates.
#pragma once

#include <string>

#include "config/config.h"

namespace mt {

// pre: the error prefix naming the config file; f: the model's resolved features.
void check_dependent_keys(const Config& cfg, const ModelFeatures& f, const std::string& pre);
// Sets every key that check_dependent_keys would refuse back to its default.
void reset_inactive_dependent_keys(Config& cfg);

}  // namespace mt
