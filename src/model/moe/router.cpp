#include "model/moe/router.h"

#include "core/check.h"
#include "core/counter_rng.h"
#include "parallel/moe_sync.h"

namespace mt {

Router::Router(const std::string& prefix, const MoEOptions& opt, const ModelContext& ctx, ParamStore& store)
    : ctx_(&ctx), opt_(opt), rdt_(ctx.dtype == DType::F64 ? DType::F64 : DType::F32) {
  MT_CHECK(opt.num_experts >= 1 && opt.topk >= 1 && opt.topk <= opt.num_experts,
           "model.moe_router_topk (", opt.topk, ") must be in [1, model.num_experts = ", opt.num_experts, "]");
  MT_CHECK(opt.load_balancing == "aux_loss" || opt.load_balancing == "seq_aux_loss" || opt.load_balancing == "none",
           "model.moe_router_load_balancing_type: '", opt.load_balancing, "' is not aux_loss, seq_aux_loss or none");
  MT_CHECK(!(opt.sigmoid && opt.pre_softmax), "model.moe_router_pre_softmax applies to the softmax score function only");
  spec_.topk = opt.topk;
  spec_.sigmoid = opt.sigmoid;
  spec_.pre_softmax = opt.pre_softmax;
  spec_.scaling = opt.topk_scaling;
  ParamSpec ps;
  ps.name = prefix + ".weight";
  ps.global_shape = {opt.num_experts, ctx.model->hidden_size};
  ps.init = ParamInit::Normal;
  ps.sequence_parallel_grad = ctx.ps->sequence_parallel;
  weight_ = store.add(ps);
  if (opt.expert_bias) bias_ = Tensor::zeros({opt.num_experts}, rdt_, ctx.device);
  bias_name_ = prefix + ".expert_bias";
  split_ranks_ = sequence_split_ranks(*ctx.ps);
  load_.assign(static_cast<size_t>(opt.num_experts), 0);
}

Tensor Router::to_router(const Tensor& t) const {
  if (t.dtype() == rdt_) return t;
  Tensor o = Tensor::empty(t.shape(), rdt_, t.device());
  ops::cast(o, t);
  return o;
}

void Router::forward(Saved& s, const Tensor& x, const RowKey& key) const {
  choose(s, x, key);
  add_losses(s);
}

void Router::choose(Saved& s, const Tensor& x, const RowKey& key) const {
  const int64_t N = x.size(0), E = opt_.num_experts, k = opt_.topk;
  const Device dev = x.device();
  // logits in the router dtype from the activations as they are (16-bit: exact products, fp32 sums in the GEMM)
  s.logits = Tensor::empty({N, E}, rdt_, dev);
  if (x.dtype() == weight_->value.dtype())
    ops::linear_forward_wide(s.logits, x, weight_->value);
  else
    ops::linear_forward(s.logits, to_router(x), to_router(weight_->value), nullptr);
  if (opt_.force_load_balancing)  // random logits, row n numbered key.first_row + n (see the header)
    ops::fill_normal(s.logits, key.seed, rng::kRouterLogitsStream, static_cast<uint64_t>(key.first_row * E));
  s.scores = Tensor::empty({N, E}, rdt_, dev);
  s.choice = Tensor::empty({N, k}, DType::I32, dev);
  s.weights = Tensor::empty({N, k}, rdt_, dev);
  ops::moe_router_forward(s.choice, s.weights, s.scores, s.logits, bias_.defined() ? &bias_ : nullptr, spec_);
  s.indices = s.choice;
  if (opt_.capacity_factor > 0.0) {
    s.indices = s.choice.clone();
    ops::moe_apply_capacity(s.indices, s.weights, E, ops::moe_capacity(N, k, E, opt_.capacity_factor));
  }
}

void Router::add_losses(Saved& s) const {
  const int64_t N = s.choice.size(0), E = opt_.num_experts;
  const Device dev = s.choice.device();
  // the losses count the choice before any capacity drop (as Megatron)
  if (opt_.load_balancing != "none" && opt_.aux_loss_coeff != 0.0) {
    s.aux_loss = Tensor::empty({1}, rdt_, dev);
    if (split_ranks_ > 1) {  // the micro-batch's tokens per expert over all its rows (a collective over TP)
      Tensor counts = Tensor::empty({E}, DType::I32, dev), host = Tensor::empty({E}, DType::I32);
      ops::moe_expert_counts(counts, s.choice, E);
      host.copy_from(counts);
      s.aux_group.counts.assign(host.data<int32_t>(), host.data<int32_t>() + E);
      sum_over_sequence_split(s.aux_group.counts, *ctx_->ps);
      s.aux_group.rows = N * split_ranks_;
    }
    ops::moe_aux_loss_forward(s.aux_loss, s.scores, s.choice, aux_groups(N), opt_.aux_loss_coeff, opt_.sigmoid,
                              split_ranks_ > 1 ? &s.aux_group : nullptr);
  }
  if (opt_.z_loss_coeff != 0.0) {
    s.z_loss = Tensor::empty({1}, rdt_, dev);
    ops::moe_z_loss_forward(s.z_loss, s.logits, opt_.z_loss_coeff);
  }
}

int64_t Router::aux_groups(int64_t N) const {
  if (opt_.load_balancing != "seq_aux_loss") return 1;
  MT_CHECK(opt_.seq_length > 0 && N % opt_.seq_length == 0, "model.moe_router_load_balancing_type seq_aux_loss: the ",
           N, " rows of an MoE layer do not hold whole sequences of ", opt_.seq_length, " tokens");
  return N / opt_.seq_length;
}

void Router::backward(Saved& s, const Tensor& dweights, const Tensor& x, Tensor& dx) const {
  grads_from(logits_grad(s, dweights), x, &dx);
}

Tensor Router::logits_grad(Saved& s, const Tensor& dweights) const {
  const int64_t N = dweights.size(0), E = opt_.num_experts;
  Tensor dlogits = Tensor::empty({N, E}, rdt_, dweights.device());
  // through the weights of the choice before the drop (a dropped slot's weight gradient is 0, but the weights
  // were normalized together with it)
  ops::moe_router_backward(dlogits, dweights, s.scores, s.choice, spec_);
  if (s.aux_loss.defined())
    ops::moe_aux_loss_backward(dlogits, s.scores, s.choice, aux_groups(N), opt_.aux_loss_coeff, opt_.sigmoid,
                               loss_grad_scale_, split_ranks_ > 1 ? &s.aux_group : nullptr);
  // the micro-batch's z-loss is the mean of the split ranks' means
  if (s.z_loss.defined())
    ops::moe_z_loss_backward(dlogits, s.logits, opt_.z_loss_coeff, loss_grad_scale_ / split_ranks_);
  s = Saved{};
  return dlogits;
}

void Router::grads_from(const Tensor& dlogits, const Tensor& x, Tensor* dx) const {
  const ops::GradMode wmode = grad_write_mode(*weight_);
  if (x.dtype() == weight_->value.dtype()) {  // as the forward: from the activations as they are
    ops::linear_backward_wide(dx, &weight_->grad, dlogits, x, weight_->value, wmode, ops::GradMode::Accumulate);
    return;
  }
  const Tensor xr = to_router(x), wr = to_router(weight_->value);
  if (xr.dtype() == x.dtype()) {
    ops::linear_backward(dx, &weight_->grad, nullptr, dlogits, xr, wr, ops::GradMode::Accumulate, wmode);
    return;
  }
  Tensor dxr = dx ? Tensor::empty(xr.shape(), rdt_, x.device()) : Tensor();
  ops::linear_backward(dx ? &dxr : nullptr, &weight_->grad, nullptr, dlogits, xr, wr, ops::GradMode::Overwrite, wmode);
  if (!dx) return;
  Tensor d = Tensor::empty(x.shape(), x.dtype(), x.device());
  ops::cast(d, dxr);
  ops::add_(*dx, d);
}

void Router::update_expert_bias(const std::vector<int64_t>& load) {
  MT_INTERNAL_ASSERT(bias_.defined(), "update_expert_bias without model.moe_router_enable_expert_bias");
  Tensor l = Tensor::empty({opt_.num_experts}, DType::I64);
  std::copy(load.begin(), load.end(), l.data<int64_t>());
  if (bias_.device() == Device::CPU) {
    ops::moe_expert_bias_update(bias_, l, opt_.bias_update_rate);
  } else {  // tiny: on the host, then back
    Tensor b = Tensor::empty(bias_.shape(), bias_.dtype());
    b.copy_from(bias_);
    ops::moe_expert_bias_update(b, l, opt_.bias_update_rate);
    bias_.copy_from(b);
  }
  std::fill(load_.begin(), load_.end(), 0);
}

}  // namespace mt
