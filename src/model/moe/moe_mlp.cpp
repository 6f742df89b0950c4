#include "model/moe/moe_mlp.h"

namespace mt {

namespace {
int64_t nb(const Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }
}  // namespace

MoEMLP::MoEMLP(int layer_number, const std::string& prefix, const MoEOptions& opt, const ModelContext& ctx,
               ParamStore& store)
    : layer_(layer_number), opt_(opt), layer_impl_(prefix, opt, ctx, store) {
  stats_.tokens_per_expert.assign(static_cast<size_t>(opt.num_experts), 0);
}

int64_t MoEMLP::State::nbytes() const {
  const Router::Saved& r = s.router;
  int64_t n = nb(r.logits) + nb(r.scores) + nb(r.choice) + nb(r.weights) + nb(r.aux_loss) + nb(r.z_loss);
  if (r.indices.defined() && r.indices.raw() != r.choice.raw()) n += nb(r.indices);
  return n + nb(s.send_slot) + nb(s.row_of_send) + nb(s.tokens) + nb(s.local_weights) + nb(s.slot_of_row) +
         nb(s.row_of_slot) + nb(s.experts.h) + nb(s.experts.a) + nb(s.yp) + nb(s.shared_h) + nb(s.shared_a);
}

Tensor MoEMLP::forward(std::shared_ptr<MLPState>& state, const Tensor& x, const RowKey& key,
                       const Tensor* residual) const {
  auto st = std::make_shared<State>();
  Tensor y = layer_impl_.forward(st->s, x, residual, key);
  state = std::move(st);
  return y;
}

Tensor MoEMLP::backward(const Tensor& dy, std::shared_ptr<MLPState>& state, const Tensor& x) const {
  auto* st = dynamic_cast<State*>(state.get());
  MT_INTERNAL_ASSERT(st != nullptr, "MoE layer ", layer_, ": backward without its forward's state");
  MoELayer::Saved& s = st->s;
  // The micro-batch's routing, counted once here (the forward may have run twice under full recompute).
  int64_t routed = 0;
  for (size_t e = 0; e < s.counts.size(); ++e) {
    stats_.tokens_per_expert[e] += s.counts[e];
    routed += s.counts[e];
  }
  const int64_t slots = x.size(0) * opt_.topk;
  stats_.slots += slots;
  stats_.dropped += slots - routed;
  // the loss values stay on the device until take_stats (no synchronization inside the step)
  if (s.router.aux_loss.defined()) pending_aux_.push_back(s.router.aux_loss);
  if (s.router.z_loss.defined()) pending_z_.push_back(s.router.z_loss);
  ++stats_.microbatches;
  if (opt_.expert_bias) {
    std::vector<int64_t>& load = layer_impl_.router().expert_load();
    for (size_t e = 0; e < s.counts.size(); ++e) load[e] += s.counts[e];
  }
  Tensor dx = layer_impl_.backward(dy, s, x);
  state.reset();
  return dx;
}

void MoEMLP::pending_losses(std::vector<Tensor>& out) const {
  out.insert(out.end(), pending_aux_.begin(), pending_aux_.end());
  out.insert(out.end(), pending_z_.begin(), pending_z_.end());
}

MoEStepStats MoEMLP::take_stats(std::span<const double>& values) {
  const size_t na = pending_aux_.size(), n = na + pending_z_.size();
  MT_INTERNAL_ASSERT(values.size() >= n, "MoE layer ", layer_, ": ", values.size(), " loss values for ", n);
  for (size_t i = 0; i < n; ++i) (i < na ? stats_.aux_loss : stats_.z_loss) += values[i];
  values = values.subspan(n);
  pending_aux_.clear();
  pending_z_.clear();
  MoEStepStats out = stats_;
  stats_ = MoEStepStats{};
  stats_.tokens_per_expert.assign(static_cast<size_t>(opt_.num_experts), 0);
  return out;
}

}  // namespace mt
