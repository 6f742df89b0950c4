#include "train/moe_step.h"

#include <algorithm>
#include <span>

#include "core/check.h"
#include "parallel/moe_sync.h"

namespace mt {

MoEStepDriver::MoEStepDriver(const std::vector<const GPTModel*>& chunks, const ModelConfig& m,
                             const DerivedConfig& d, const ParallelState& ps)
    : ps_(&ps), num_experts_(m.num_experts), num_layers_(m.num_layers), microbatches_(d.num_microbatches) {
  for (const GPTModel* c : chunks)
    for (MoEMLP* l : c->moe_layers()) layers_.push_back(l);
  if (enabled()) acc_.assign(stride() * static_cast<size_t>(num_layers_), 0.0);
}

void MoEStepDriver::before_iteration(double loss_scale) {
  // (tensor ranks under sequence parallelism hold shares of one micro-batch's losses: model/moe/router.h)
  const double micro = static_cast<double>(microbatches_) * ps_->dp_size * ps_->cp_size;
  for (MoEMLP* l : layers_) l->router().set_loss_grad_scale(loss_scale / micro);
}

std::vector<Tensor> MoEStepDriver::pending_values() const {
  std::vector<Tensor> pending;
  for (MoEMLP* l : layers_) l->pending_losses(pending);
  return pending;
}

void MoEStepDriver::after_backward(std::span<const double> values) {
  std::span<const double> rest = values;
  for (MoEMLP* l : layers_) {
    if (l->options().expert_bias) {
      std::vector<int64_t> load = l->router().expert_load();
      sum_over_routing_ranks(load, *ps_);
      l->router().update_expert_bias(load);
    }
    const MoEStepStats s = l->take_stats(rest);
    double* a = acc_.data() + stride() * static_cast<size_t>(l->layer_number());
    for (int64_t e = 0; e < num_experts_; ++e) a[e] += static_cast<double>(s.tokens_per_expert[static_cast<size_t>(e)]);
    double* t = a + num_experts_;
    t[0] += static_cast<double>(s.dropped);
    t[1] += static_cast<double>(s.slots);
    t[2] += s.aux_loss;
    t[3] += s.z_loss;
    t[4] += static_cast<double>(s.microbatches);
    t[5] = 1;
  }
  MT_INTERNAL_ASSERT(rest.empty(), "MoE step: ", rest.size(), " loss values left over");
}

std::vector<StateBuffer> MoEStepDriver::state_buffers() const {
  std::vector<StateBuffer> out;
  for (MoEMLP* l : layers_)
    if (l->options().expert_bias) out.push_back({l->router().expert_bias_name(), &l->router().expert_bias()});
  return out;
}

std::vector<MoELayerMetrics> MoEStepDriver::take_interval() {
  std::vector<MoELayerMetrics> out;
  if (!enabled()) return out;
  Tensor t = Tensor::empty({static_cast<int64_t>(acc_.size())}, DType::F64);
  std::copy(acc_.begin(), acc_.end(), t.data<double>());
  if (ps_->world_size > 1) ps_->world->all_reduce(t, ReduceOp::Sum);
  std::fill(acc_.begin(), acc_.end(), 0.0);
  const double* all = t.data<double>();
  for (int64_t layer = 0; layer < num_layers_; ++layer) {
    const double* a = all + stride() * static_cast<size_t>(layer);
    const double* x = a + num_experts_;
    if (x[5] == 0) continue;  // a dense layer
    MoELayerMetrics m;
    m.layer = static_cast<int>(layer);
    double sum = 0;
    for (int64_t e = 0; e < num_experts_; ++e) {
      m.tokens_max = std::max(m.tokens_max, a[e]);
      sum += a[e];
    }
    m.tokens_mean = sum / static_cast<double>(num_experts_);
    m.dropped = static_cast<int64_t>(x[0]);
    m.slots = static_cast<int64_t>(x[1]);
    // each split rank's aux value is its share of the micro-batch's loss; its z value is its rows' mean
    m.aux_loss = x[4] > 0 ? x[2] * sequence_split_ranks(*ps_) / x[4] : 0.0;
    m.z_loss = x[4] > 0 ? x[3] / x[4] : 0.0;
    out.push_back(m);
  }
  return out;
}

}  // namespace mt
