// Learning-rate schedule (Megatron's OptimizerParamScheduler, iteration-based):
//   it <= warmup:            lr * it / warmup                                 (it = 1-based iteration)
//   warmup < it <= decay:    min_lr + (lr - min_lr) * f(r),  r = (it - warmup) / (decay - warmup)
//                            cosine f = 0.5 (1 + cos(pi r));  linear f = 1 - r;  constant f = 1
//   it > decay:              min_lr (constant: lr)
#pragma once

#include <cstdint>

#include "config/config.h"

namespace mt {

// style: optimizer.decay_style as resolved by derive_config.
double learning_rate(const OptimizerConfig& opt, DecayStyle style, int64_t lr_decay_iters, int64_t iteration);

}  // namespace mt
