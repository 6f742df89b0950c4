// Dynamic loss scaling for fp16 training (Megatron's DynamicGradScaler, growth factor 2, backoff 1/2).
// The backward starts from dloss * scale so that small gradients survive fp16; the gradients are
// divided by the scale again before the update (through AdamW's grad_scale). After each iteration:
//   overflow (a non-finite gradient): the update is skipped, the growth counter restarts, and the
//     hysteresis counter drops by one; once it is at 0, every overflow halves the scale, never
//     below optimizer.min_loss_scale.
//   no overflow: the growth counter counts up; at optimizer.loss_scale_window it restarts, the
//     scale doubles and the hysteresis counter is refilled to optimizer.hysteresis.
// The scale starts at optimizer.initial_loss_scale. Scale and counters are part of a checkpoint's
// state, so a resumed run scales exactly as the uninterrupted one.
#pragma once

#include <nlohmann/json.hpp>

#include "config/config.h"

namespace mt {

class LossScaler {
 public:
  explicit LossScaler(const OptimizerConfig& cfg);

  double scale() const { return scale_; }
  // Records one iteration's outcome; found_inf: the scaled gradients had a non-finite element.
  void update(bool found_inf);

  int growth_tracker() const { return growth_tracker_; }
  int hysteresis_tracker() const { return hysteresis_tracker_; }

  // Adds "loss_scale", "loss_scale_growth_tracker" and "loss_scale_hysteresis_tracker" to state.
  void save_state(nlohmann::json& state) const;
  // Restores them from a checkpoint's state; a state without them (a bf16/fp32 checkpoint) keeps the
  // fresh scaler. A malformed value is an error naming the key.
  void load_state(const nlohmann::json& state);

 private:
  double scale_, min_scale_;
  int window_, hysteresis_;
  int growth_tracker_ = 0, hysteresis_tracker_;
};

}  // namespace mt
