// The trainer's side of the mixture-of-experts layers (nothing when the model has none):
//   - the routers' loss-gradient scale: the balancing losses are per micro-batch means, so that their
//     gradients average over the global batch's micro-batches as the language-model loss does (Megatron's
//     MoEAuxLossAutoScaler: loss scale / micro-batches, then the mean over data parallel): each is scaled by
//     loss_scale / (micro-batches x data x context ranks) (the TP ranks of sequence parallelism hold shares);
//   - the expert-bias update after each step (DeepSeek-V3): tokens per expert summed over every rank that
//     routed tokens this step (parallel/moe_sync.h), then bias += rate * sign(mean - load);
//   - the routing metrics of the log interval (MoELayerMetrics), summed over all ranks when a line is logged.
#pragma once

#include <span>
#include <vector>

#include "model/gpt_model.h"
#include "train/metrics.h"
#include "train/train_checkpoint.h"

namespace mt {

class MoEStepDriver {
 public:
  MoEStepDriver(const std::vector<const GPTModel*>& chunks, const ModelConfig& m, const DerivedConfig& d,
                const ParallelState& ps);
  bool enabled() const { return num_experts_ > 0; }
  // Before an iteration's micro-batches (loss_scale: fp16's, else 1).
  void before_iteration(double loss_scale);
  // The layers' loss values of this iteration (one-element device tensors), for the step's one device read
  // (tensor/scalar_read.h) at the end of the backward.
  std::vector<Tensor> pending_values() const;
  // After the iteration's backward, before its optimizer step (every iteration, the skipped ones too:
  // collective), with pending_values()' values: updates the expert biases (not parameters: the optimizer never
  // touches them; the next forward uses them), adds the routing metrics.
  void after_backward(std::span<const double> values);
  // The metrics since the last call, one per MoE layer of the whole model (collective over the world).
  std::vector<MoELayerMetrics> take_interval();
  // The routers' expert biases (checkpoints).
  std::vector<StateBuffer> state_buffers() const;

 private:
  const ParallelState* ps_;
  int64_t num_experts_, num_layers_, microbatches_;
  std::vector<MoEMLP*> layers_;  // this rank's
  // per global layer: E tokens per expert, then dropped, slots, aux sum, z sum, micro-batches, present
  std::vector<double> acc_;
  size_t stride() const { return static_cast<size_t>(num_experts_) + 6; }
};

}  // namespace mt
