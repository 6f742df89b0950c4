// training.fp8 in the training loop: the recipe's state (tensor/fp8/fp8_recipe.h), its update at each step's end
// (delayed scaling), and its entry in the checkpoint's state.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "model/model_context.h"
#include "tensor/fp8/fp8_recipe.h"

namespace mt {

// The FP8 state of this rank's model (null with training.fp8: none), set into ctx.fp8 before the model is built;
// logs the recipe, and that TFLOP/s and MFU stay counted against the bf16 peak.
std::unique_ptr<Fp8Context> make_fp8_context(const Config& cfg, const DerivedConfig& d, ModelContext& ctx, bool log);
// Before a step's micro-batches: pending amaxes zeroed (evaluation forwards in between do not count).
void fp8_begin_step(Fp8Context* fp8);
// After the step's backward, before the update: the FP8 weight copies expire; delayed: the step's amaxes reduced over
// the stage's ranks, histories and scales updated.
void fp8_end_step(Fp8Context* fp8, const ParallelState& ps);
// state["fp8"] = {"<linear>.<role>": [scale, amax history...]} (delayed; nothing otherwise).
void fp8_save_state(const Fp8Context* fp8, nlohmann::json& state);
// Restores what fp8_save_state wrote (a checkpoint without it: the fresh state, logged).
void fp8_load_state(Fp8Context* fp8, const nlohmann::json& state);

}  // namespace mt
