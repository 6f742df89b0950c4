// Bridges the model/optimizer state and the sharded checkpoint format: which tensors a rank
// saves (every parameter box it holds: value, exp_avg, exp_avg_sq) and how it restores them.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "model/param_store.h"
#include "optim/adamw.h"
#include "parallel/parallel_state.h"

namespace mt {

std::string save_training_checkpoint(const std::string& dir, int64_t iteration, int keep_last, ParamStore& store,
                                     const AdamW& opt, const ParallelState& ps, const nlohmann::json& state,
                                     const std::string& config_yaml);

// Restores only the parameter values (inference, conversion).
void load_model_weights(const ckpt::LoadedCheckpoint& ck, ParamStore& store);

// Restores values and moments of every local parameter from `ck` (any layout that saved it).
void load_training_checkpoint(const ckpt::LoadedCheckpoint& ck, ParamStore& store, AdamW& opt);

}  // namespace mt
