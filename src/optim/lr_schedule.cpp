#include "optim/lr_schedule.h"

#include <cmath>
#include <numbers>

namespace mt {

double learning_rate(const OptimizerConfig& opt, DecayStyle style, int64_t decay_iters, int64_t it) {
  const int64_t warmup = opt.warmup_iters;
  if (warmup > 0 && it <= warmup) return opt.lr * static_cast<double>(it) / static_cast<double>(warmup);
  if (style == DecayStyle::Constant) return opt.lr;
  if (it > decay_iters) return opt.min_lr;
  const double r = decay_iters > warmup ? static_cast<double>(it - warmup) / static_cast<double>(decay_iters - warmup) : 1.0;
  const double f = style == DecayStyle::Linear ? 1.0 - r : 0.5 * (1.0 + std::cos(std::numbers::pi * r));
  return opt.min_lr + (opt.lr - opt.min_lr) * f;
}

}  // namespace mt
