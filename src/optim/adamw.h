// AdamW with decoupled weight decay over the parameter store, fp32 master weights (on the CPU
// backend the parameters are the master weights), global-norm gradient clipping.
// Which parameters decay: weights yes; norms and biases only with
// optimizer.weight_decay_norms_and_biases; embedding/output tables only with
// optimizer.weight_decay_embeddings.
#pragma once

#include <cstdint>

#include "config/config.h"
#include "model/param_store.h"
#include "parallel/parallel_state.h"

namespace mt {

// Sum of squares of all gradients of the model counted once: TP-split parameters from every TP
// rank, replicated ones from TP rank 0 only; summed over the TP and PP groups.
double global_grad_norm(ParamStore& store, const ParallelState& ps);

class AdamW {
 public:
  AdamW(ParamStore& store, const OptimizerConfig& cfg);
  // One update with learning rate lr; gradients are multiplied by grad_scale first.
  void step(double lr, double grad_scale);
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t s) { step_ = s; }
  // Moment buffers of one parameter (views into the flat buffers), for checkpoints.
  Tensor exp_avg(const Param& p) const;
  Tensor exp_avg_sq(const Param& p) const;

 private:
  ParamStore* store_;
  OptimizerConfig cfg_;
  Tensor m_, v_;  // flat, like the store's buffers
  int64_t step_ = 0;
};

}  // namespace mt
