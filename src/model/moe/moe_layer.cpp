#include "model/moe/moe_layer.h"

#include <numeric>

#include "core/check.h"
#include "tensor/moe_ops.h"

namespace mt {

namespace {
double scalar(const Tensor& t) {
  if (!t.defined()) return 0.0;
  Tensor h = Tensor::empty({1}, t.dtype());
  h.copy_from(t);
  return t.dtype() == DType::F64 ? h.data<double>()[0] : static_cast<double>(h.data<float>()[0]);
}
}  // namespace

MoELayer::MoELayer(const std::string& prefix, const MoEOptions& opt, const ModelContext& ctx, ParamStore& store)
    : ctx_(&ctx),
      opt_(opt),
      router_(prefix + ".router", opt, ctx, store),
      dispatcher_(opt.num_experts, *ctx.ps),
      experts_(prefix + ".experts", dispatcher_.first_expert(), dispatcher_.local_experts(), opt.ffn_hidden_size,
               opt.swiglu, ctx, store) {
  MT_CHECK(ctx.ps->tp_size == 1 || ctx.ps->sequence_parallel,
           "an MoE layer with tensor parallelism needs parallel.sequence_parallel: true (as Megatron-Core)");
  if (opt.shared_ffn_hidden_size > 0) {
    const int64_t C = ctx.model->hidden_size, F = opt.shared_ffn_hidden_size;
    shared_fc1_ = std::make_unique<ColumnParallelLinear>(prefix + ".shared_experts.linear_fc1", C,
                                                         F * (opt.swiglu ? 2 : 1), !opt.swiglu, ParamInit::Normal, ctx,
                                                         store, opt.swiglu ? 2 : 1);
    shared_fc2_ = std::make_unique<RowParallelLinear>(prefix + ".shared_experts.linear_fc2", F, C, !opt.swiglu,
                                                      ParamInit::ScaledNormal, ctx, store);
  }
}

Tensor MoELayer::forward(Saved& s, const Tensor& x, const Tensor* residual, const RowKey& key) const {
  const ModelContext& c = *ctx_;
  const int64_t N = x.size(0), C = x.size(1), E = opt_.num_experts, k = opt_.topk;
  Tensor y;
  const bool shared_beside = shared_fc1_ && dispatcher_.exchanges();
  if (!dispatcher_.exchanges()) {  // EP 1: the router's choices; its losses queued while the counts come to the host
    router_.choose(s.router, x, key);
    y = local_forward(s, x, s.router.indices, s.router.weights, nullptr, residual,
                      [&] { router_.add_losses(s.router); });
    residual = nullptr;  // (added in the combine)
  } else {
    router_.forward(s.router, x, key);
    // the send order (token, rank) and the counts: slots per global expert, tokens per rank (one copy to the host)
    const int64_t P = dispatcher_.ep_size(), El = dispatcher_.local_experts();
    Tensor dest = Tensor::empty({N, P}, DType::I32, x.device());
    ops::moe_dest_ranks(dest, s.router.indices, El);
    s.send_slot = Tensor::empty({N * P}, DType::I32, x.device());
    s.row_of_send = Tensor::empty({N * P}, DType::I32, x.device());
    Tensor counts = Tensor::empty({E + P}, DType::I32, x.device()), counts_host = Tensor::empty({E + P}, DType::I32);
    Tensor expert_counts = counts.slice(0, E), rank_counts = counts.slice(E, P);
    ops::moe_expert_counts(expert_counts, s.router.indices, E);
    ops::moe_routing_map(s.send_slot, s.row_of_send, rank_counts, dest, P);
    dest = Tensor();
    counts_host.copy_from(counts);
    const int32_t* h = counts_host.data<int32_t>();
    s.counts.assign(h, h + E);
    dispatcher_.exchange_counts(s.plan, s.counts, std::vector<int64_t>(h + E, h + E + P));
    const int64_t S = std::accumulate(s.plan.send_rows.begin(), s.plan.send_rows.end(), int64_t{0});
    // each send row's choices on its rank and their weights, then the tokens (in flight beside the shared fc1)
    // (buffers of S or T rows, which change every layer and step, in a few allocation sizes: ops::moe_rows_empty)
    Tensor choices = ops::moe_rows_empty({S, k}, DType::I32, x.device()),
           weights = ops::moe_rows_empty({S, k}, s.router.weights.dtype(), x.device());
    ops::moe_local_choices(choices, s.router.indices, s.send_slot, P, El);
    ops::moe_permute_forward(weights, s.router.weights, s.send_slot, P);
    using Dir = TokenDispatcher::Direction;
    const Tensor local_choices = dispatcher_.exchange(s.plan, choices, Dir::ToExperts);
    s.local_weights = dispatcher_.exchange(s.plan, weights, Dir::ToExperts);
    choices = weights = Tensor();
    Tensor sent = ops::moe_rows_empty({S, C}, c.dtype, x.device());
    ops::moe_permute_forward(sent, x, s.send_slot, P);
    TokenDispatcher::Exchange rows = dispatcher_.start(s.plan, sent, Dir::ToExperts);
    sent = Tensor();
    if (shared_beside) shared_forward_fc1(s, x);
    s.tokens = dispatcher_.finish(rows);
    // this rank's experts on what arrived; their partial sums back to the tokens' ranks, added up there
    const Tensor out = local_forward(s, s.tokens, local_choices, s.local_weights, &s.plan.local_counts, nullptr, {});
    if (s.xp.defined()) s.tokens = Tensor();  // (the backward permutes nothing from them then)
    const Tensor back = dispatcher_.exchange(s.plan, out, Dir::Back);
    y = c.empty({N, C});
    ops::moe_permute_backward(y, back, s.row_of_send, P);
  }
  if (shared_fc1_) {
    if (!shared_beside) shared_forward_fc1(s, x);
    y = shared_fc2_->forward(s.shared_a, &y);
  }
  if (residual) ops::add_(y, *residual);
  return y;
}

Tensor MoELayer::local_forward(Saved& s, const Tensor& tokens, const Tensor& choices, const Tensor& weights,
                               const std::vector<int64_t>* known_counts, const Tensor* residual,
                               const std::function<void()>& while_counts_read) const {
  const ModelContext& c = *ctx_;
  const int64_t T = tokens.size(0), C = tokens.size(1), El = dispatcher_.local_experts(), k = opt_.topk;
  s.slot_of_row = ops::moe_rows_empty({T * k}, DType::I32, tokens.device());
  s.row_of_slot = ops::moe_rows_empty({T * k}, DType::I32, tokens.device());
  Tensor counts_dev = Tensor::empty({El}, DType::I32, tokens.device());
  ops::moe_routing_map(s.slot_of_row, s.row_of_slot, counts_dev, choices, El);
  if (!known_counts) {  // EP 1: the counts come to the host (the grouped GEMMs' sizes) and are the layer's
    PendingRead read(counts_dev);
    if (while_counts_read) while_counts_read();  // device work that covers the host's wait and its work after it
    const Tensor& h = read.wait();
    s.counts.assign(h.data<int32_t>(), h.data<int32_t>() + El);
  }
  const std::vector<int64_t>& counts = known_counts ? *known_counts : s.counts;
  int64_t M = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const std::vector<int64_t> regions = ops::moe_padded_regions(tokens.device(), tokens.dtype(), counts, C,
                                                               opt_.ffn_hidden_size * (opt_.swiglu ? 2 : 1));
  s.padded = !regions.empty();
  if (s.padded) {  // rows past the regions (up to moe_alloc_rows): padding too
    M = ops::moe_alloc_rows(std::accumulate(regions.begin(), regions.end(), int64_t{0}));
    Tensor pad = Tensor::empty({M}, DType::I32, tokens.device());
    ops::moe_pad_routing_map(pad, s.row_of_slot, s.slot_of_row, counts, regions);
    s.slot_of_row = pad;
  }
  Tensor xp = ops::moe_rows_empty({M, C}, c.dtype, tokens.device());
  ops::moe_permute_forward(xp, tokens, s.slot_of_row, k);
  s.yp = experts_.forward(s.experts, xp, s.padded ? regions : counts);
  if (!c.recompute.norm_act) s.xp = xp;  // (else permuted again in backward)
  xp = Tensor();
  Tensor out = ops::moe_rows_empty({T, C}, c.dtype, tokens.device());
  ops::moe_unpermute_forward(out, s.yp, weights, s.row_of_slot, residual);
  return out;
}

void MoELayer::permute_backward_into(Tensor& dx, const Tensor& rows, const Tensor& row_of_slot, int64_t k,
                                     const InputGrads& extra) const {
  const Tensor* shared = extra.shared.defined() ? &extra.shared : nullptr;
  if (extra.router)
    ops::moe_permute_backward(dx, rows, row_of_slot, k, &extra.dlogits, &router_.weight()->value, shared);
  else
    ops::moe_permute_backward(dx, rows, row_of_slot, k, nullptr, nullptr, shared);
}

Tensor MoELayer::local_backward(Saved& s, const Tensor& dout, const Tensor& tokens, const Tensor& weights,
                                Tensor& dweights, InputGrads* extra) const {
  const ModelContext& c = *ctx_;
  const int64_t k = opt_.topk;
  // buffers released as soon as read (fewer of them alive at once)
  const int64_t rows = s.yp.size(0);
  Tensor dyp = ops::moe_rows_empty(s.yp.shape(), c.dtype, dout.device());
  ops::moe_unpermute_backward(dyp, dweights, dout, s.yp, weights, s.row_of_slot);
  s.yp = Tensor();
  if (extra && extra->router) extra->dlogits = router_.logits_grad(s.router, dweights);
  if (s.padded) ops::moe_zero_unrouted_rows(dyp, s.slot_of_row);  // padding rows: no weight-gradient share
  Tensor dh = experts_.backward_fc2(dyp, s.experts);
  dyp = Tensor();
  Tensor xl = std::move(s.xp);
  if (!xl.defined()) {  // the experts' input rows again
    xl = ops::moe_rows_empty({rows, tokens.size(1)}, c.dtype, tokens.device());
    ops::moe_permute_forward(xl, tokens, s.slot_of_row, k);
  }
  Tensor dxl = experts_.backward_fc1(dh, s.experts, xl);
  dh = xl = Tensor();
  Tensor dtokens = ops::moe_rows_empty(dout.shape(), c.dtype, dout.device());  // (the tokens' shape)
  permute_backward_into(dtokens, dxl, s.row_of_slot, k, extra ? *extra : InputGrads{});
  return dtokens;
}

void MoELayer::shared_forward_fc1(Saved& s, const Tensor& x) const {
  if (opt_.swiglu) {
    s.shared_h = shared_fc1_->forward(x);
    s.shared_a = ctx_->empty({s.shared_h.size(0), s.shared_h.size(1) / 2});
    ops::swiglu_forward(s.shared_a, s.shared_h);
  } else {
    s.shared_a = shared_fc1_->forward_gelu(x, &s.shared_h);
  }
}

Tensor MoELayer::shared_backward(const Tensor& dy, const Saved& s, const Tensor& x) const {
  Tensor dh;
  if (opt_.swiglu) {
    Tensor da = shared_fc2_->backward(dy, s.shared_a);
    dh = ctx_->empty(s.shared_h.shape());
    ops::swiglu_backward(dh, da, s.shared_h);
  } else {
    dh = shared_fc2_->backward_gelu(dy, s.shared_a, s.shared_h);
  }
  return shared_fc1_->backward(dh, x);
}

Tensor MoELayer::backward(const Tensor& dy, Saved& s, const Tensor& x) const {
  const int64_t N = x.size(0), k = opt_.topk;
  // the shared expert: without expert parallelism first (before the routed buffers exist), with it while the
  // output gradients' rows are in flight to the experts
  const bool shared_beside = shared_fc1_ && dispatcher_.exchanges();
  InputGrads extra;  // the router's and the shared expert's input gradients, added in the permute's backward
  extra.router = opt_.num_experts <= ops::kRouterTermMaxE;
  if (shared_fc1_ && !shared_beside) extra.shared = shared_backward(dy, s, x);
  Tensor dweights = Tensor::empty({N, k}, router_.router_dtype(), x.device());
  Tensor dx;
  if (!dispatcher_.exchanges()) {
    dx = local_backward(s, dy, x, s.router.weights, dweights, &extra);
  } else {
    // dy goes the tokens' way; the experts' input gradients and routing-weight gradients come back and add up
    const int64_t P = dispatcher_.ep_size();
    using Dir = TokenDispatcher::Direction;
    const int64_t S = std::accumulate(s.plan.send_rows.begin(), s.plan.send_rows.end(), int64_t{0});
    Tensor sent = ops::moe_rows_empty({S, x.size(1)}, ctx_->dtype, x.device());
    ops::moe_permute_forward(sent, dy, s.send_slot, P);
    TokenDispatcher::Exchange grads = dispatcher_.start(s.plan, sent, Dir::ToExperts);
    sent = Tensor();
    if (shared_beside) extra.shared = shared_backward(dy, s, x);
    const Tensor dout = dispatcher_.finish(grads);
    Tensor dw_local = ops::moe_rows_empty({dout.size(0), k}, router_.router_dtype(), x.device());
    Tensor dtokens = local_backward(s, dout, s.tokens, s.local_weights, dw_local);
    s.tokens = s.local_weights = Tensor();
    const Tensor dw_back = dispatcher_.exchange(s.plan, dw_local, Dir::Back);
    const Tensor dx_back = dispatcher_.exchange(s.plan, dtokens, Dir::Back);
    dw_local = dtokens = Tensor();
    ops::moe_permute_backward(dweights, dw_back, s.row_of_send, P);
    if (extra.router) extra.dlogits = router_.logits_grad(s.router, dweights);
    dx = ctx_->empty(x.shape());
    permute_backward_into(dx, dx_back, s.row_of_send, P, extra);
  }
  if (extra.router)
    router_.grads_from(extra.dlogits, x, nullptr);  // its input gradient is in dx already
  else
    router_.backward(s.router, dweights, x, dx);
  s = Saved{};
  return dx;
}

double MoELayer::loss_value(const Tensor& loss) { return scalar(loss); }

}  // namespace mt
