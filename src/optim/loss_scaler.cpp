#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace mt {

LossScaler::LossScaler(const OptimizerConfig& cfg)
    : scale_(cfg.initial_loss_scale),
      min_scale_(cfg.min_loss_scale),
      window_(cfg.loss_scale_window),
      hysteresis_(cfg.hysteresis),
      hysteresis_tracker_(cfg.hysteresis) {
  MT_CHECK(scale_ > 0 && min_scale_ > 0 && window_ >= 1 && hysteresis_ >= 1,
           "optimizer: initial_loss_scale (", scale_, ") and min_loss_scale (", min_scale_,
           ") must be > 0, loss_scale_window (", window_, ") and hysteresis (", hysteresis_, ") >= 1");
}

void LossScaler::update(bool found_inf) {
  if (found_inf) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = std::max(hysteresis_tracker_ - 1, 0);
    if (hysteresis_tracker_ == 0) scale_ = std::max(scale_ * 0.5, min_scale_);
    return;
  }
  if (++growth_tracker_ >= window_) {  // >=: a resumed run may have a smaller window
    growth_tracker_ = 0;
    hysteresis_tracker_ = hysteresis_;
    scale_ *= 2.0;
  }
}

void LossScaler::save_state(nlohmann::json& state) const {
  state["loss_scale"] = scale_;
  state["loss_scale_growth_tracker"] = growth_tracker_;
  state["loss_scale_hysteresis_tracker"] = hysteresis_tracker_;
}

void LossScaler::load_state(const nlohmann::json& state) {
  if (!state.contains("loss_scale")) return;
  try {
    const double s = state.at("loss_scale").get<double>();
    const int g = state.at("loss_scale_growth_tracker").get<int>();
    const int h = state.at("loss_scale_hysteresis_tracker").get<int>();
    MT_CHECK(std::isfinite(s) && s > 0 && g >= 0 && h >= 0, "checkpoint state: loss_scale ", s,
             ", loss_scale_growth_tracker ", g, ", loss_scale_hysteresis_tracker ", h,
             " are out of range (the checkpoint is corrupt)");
    scale_ = s;
    growth_tracker_ = g;
    hysteresis_tracker_ = h;
  } catch (const nlohmann::json::exception& e) {
    MT_CHECK(false, "checkpoint state: loss_scale, loss_scale_growth_tracker and loss_scale_hysteresis_tracker ",
             "must all be present and numeric (", e.what(), ")");
  }
}

}  // namespace mt
