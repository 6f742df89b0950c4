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

Tensor MoELayer::forward(Saved& s, const Tensor& x, const Tensor* residual) const {
  Tensor y;
  const bool shared_beside = shared_fc1_ && dispatcher_.exchanges();
  if (!dispatcher_.exchanges()) {  // EP 1: the router's choices; its losses queued while the counts come to the host
    router_.choose(s.router, x);
    y = local_forward(s, s.local, x, s.router.indices, s.router.weights, nullptr, residual,
                      [&] { router_.add_losses(s.router); });
    residual = nullptr;  // (added in the combine)
  } else {
    router_.forward(s.router, x);
    y = exchange_forward(s, x);  // (the shared expert's fc1 runs inside, while the first rows are in flight)
  }
  if (shared_fc1_) {
    if (!shared_beside) shared_forward_fc1(s, x);
    y = shared_fc2_->forward(s.shared_a, &y);
  }
  if (residual) ops::add_(y, *residual);
  return y;
}

Tensor MoELayer::exchange_forward(Saved& s, const Tensor& x) const {
  const ModelContext& c = *ctx_;
  const int64_t N = x.size(0), C = x.size(1), E = opt_.num_experts, k = opt_.topk;
  const int64_t P = dispatcher_.ep_size(), El = dispatcher_.local_experts(), nc = kExchangeChunks;
  // each chunk's send order (token, rank) and counts: slots per global expert, tokens per rank (one copy to the
  // host for every chunk, one count exchange)
  s.chunks.assign(static_cast<size_t>(nc), Chunk{});
  Tensor counts = Tensor::empty({nc * (E + P)}, DType::I32, x.device());
  Tensor counts_host = Tensor::empty({nc * (E + P)}, DType::I32);
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    Chunk& ch = s.chunks[i];
    const int64_t ci = static_cast<int64_t>(i);
    ch.begin = N * ci / nc;
    ch.rows = N * (ci + 1) / nc - ch.begin;
    const Tensor indices = s.router.indices.slice(ch.begin, ch.rows);
    Tensor dest = Tensor::empty({ch.rows, P}, DType::I32, x.device());
    ops::moe_dest_ranks(dest, indices, El);
    ch.send_slot = Tensor::empty({ch.rows * P}, DType::I32, x.device());
    ch.row_of_send = Tensor::empty({ch.rows * P}, DType::I32, x.device());
    Tensor expert_counts = counts.slice(ci * E, E), rank_counts = counts.slice(nc * E + ci * P, P);
    ops::moe_expert_counts(expert_counts, indices, E);
    ops::moe_routing_map(ch.send_slot, ch.row_of_send, rank_counts, dest, P);
  }
  counts_host.copy_from(counts);
  const int32_t* h = counts_host.data<int32_t>();
  s.counts.assign(static_cast<size_t>(E), 0);
  for (int64_t i = 0; i < nc * E; ++i) s.counts[static_cast<size_t>(i % E)] += h[i];
  std::vector<TokenDispatcher::Plan> plans(static_cast<size_t>(nc));
  dispatcher_.exchange_counts(plans, std::vector<int64_t>(h, h + nc * E),
                              std::vector<int64_t>(h + nc * E, h + nc * (E + P)));
  // every chunk's rows on their way: the choices on the destination rank, their weights, the tokens (buffers of
  // S or T rows, which change every layer and step, in a few allocation sizes: ops::moe_rows_empty)
  using Dir = TokenDispatcher::Direction;
  struct InFlight {
    TokenDispatcher::Exchange choices, weights, tokens, back;
  };
  std::vector<InFlight> fl(s.chunks.size());
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    Chunk& ch = s.chunks[i];
    ch.plan = std::move(plans[i]);
    const int64_t S = std::accumulate(ch.plan.send_rows.begin(), ch.plan.send_rows.end(), int64_t{0});
    const Tensor indices = s.router.indices.slice(ch.begin, ch.rows);
    Tensor choices = ops::moe_rows_empty({S, k}, DType::I32, x.device()),
           weights = ops::moe_rows_empty({S, k}, s.router.weights.dtype(), x.device()),
           sent = ops::moe_rows_empty({S, C}, c.dtype, x.device());
    ops::moe_local_choices(choices, indices, ch.send_slot, P, El);
    ops::moe_permute_forward(weights, s.router.weights.slice(ch.begin, ch.rows), ch.send_slot, P);
    ops::moe_permute_forward(sent, x.slice(ch.begin, ch.rows), ch.send_slot, P);
    fl[i].choices = dispatcher_.start(ch.plan, choices, Dir::ToExperts);
    fl[i].weights = dispatcher_.start(ch.plan, weights, Dir::ToExperts);
    fl[i].tokens = dispatcher_.start(ch.plan, sent, Dir::ToExperts);
  }
  if (shared_fc1_) shared_forward_fc1(s, x);
  // this rank's experts on each chunk as it arrives; their partial sums back to the tokens' ranks, added up there
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    Chunk& ch = s.chunks[i];
    const Tensor local_choices = dispatcher_.finish(fl[i].choices);
    ch.local_weights = dispatcher_.finish(fl[i].weights);
    ch.tokens = dispatcher_.finish(fl[i].tokens);
    const Tensor out =
        local_forward(s, ch.local, ch.tokens, local_choices, ch.local_weights, &ch.plan.local_counts, nullptr, {});
    fl[i].back = dispatcher_.start(ch.plan, out, Dir::Back);
  }
  Tensor y = c.empty({N, C});
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    const Chunk& ch = s.chunks[i];
    Tensor yc = y.slice(ch.begin, ch.rows);
    ops::moe_permute_backward(yc, dispatcher_.finish(fl[i].back), ch.row_of_send, P);
  }
  return y;
}

Tensor MoELayer::local_forward(Saved& s, Local& l, const Tensor& tokens, const Tensor& choices, const Tensor& weights,
                               const std::vector<int64_t>* known_counts, const Tensor* residual,
                               const std::function<void()>& while_counts_read) const {
  const ModelContext& c = *ctx_;
  const int64_t T = tokens.size(0), C = tokens.size(1), El = dispatcher_.local_experts(), k = opt_.topk;
  l.slot_of_row = ops::moe_rows_empty({T * k}, DType::I32, tokens.device());
  l.row_of_slot = ops::moe_rows_empty({T * k}, DType::I32, tokens.device());
  Tensor counts_dev = Tensor::empty({El}, DType::I32, tokens.device());
  ops::moe_routing_map(l.slot_of_row, l.row_of_slot, counts_dev, choices, El);
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
  l.padded = !regions.empty();
  if (l.padded) {  // rows past the regions (up to moe_alloc_rows): padding too
    M = ops::moe_alloc_rows(std::accumulate(regions.begin(), regions.end(), int64_t{0}));
    Tensor pad = Tensor::empty({M}, DType::I32, tokens.device());
    ops::moe_pad_routing_map(pad, l.row_of_slot, l.slot_of_row, counts, regions);
    l.slot_of_row = pad;
  }
  Tensor xp = ops::moe_rows_empty({M, C}, c.dtype, tokens.device());
  ops::moe_permute_forward(xp, tokens, l.slot_of_row, k);
  l.yp = experts_.forward(l.experts, xp, l.padded ? regions : counts);  // xp: permuted again in backward (memory)
  xp = Tensor();
  Tensor out = ops::moe_rows_empty({T, C}, c.dtype, tokens.device());
  ops::moe_unpermute_forward(out, l.yp, weights, l.row_of_slot, residual);
  return out;
}

Tensor MoELayer::local_backward(Local& l, const Tensor& dout, const Tensor& tokens, const Tensor& weights,
                                Tensor& dweights) const {
  const ModelContext& c = *ctx_;
  const int64_t k = opt_.topk;
  // buffers released as soon as read (fewer of them alive at once)
  const int64_t rows = l.yp.size(0);
  Tensor dyp = ops::moe_rows_empty(l.yp.shape(), c.dtype, tokens.device());
  ops::moe_unpermute_backward(dyp, dweights, dout, l.yp, weights, l.row_of_slot);
  l.yp = Tensor();
  if (l.padded) ops::moe_zero_unrouted_rows(dyp, l.slot_of_row);  // padding rows: no weight-gradient share
  Tensor dh = experts_.backward_fc2(dyp, l.experts);
  dyp = Tensor();
  Tensor xl = ops::moe_rows_empty({rows, tokens.size(1)}, c.dtype, tokens.device());  // the experts' input rows again
  ops::moe_permute_forward(xl, tokens, l.slot_of_row, k);
  Tensor dxl = experts_.backward_fc1(dh, l.experts, xl);
  dh = xl = Tensor();
  Tensor dtokens = ops::moe_rows_empty(tokens.shape(), c.dtype, tokens.device());
  ops::moe_permute_backward(dtokens, dxl, l.row_of_slot, k);
  l = Local{};
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
  // first output gradients' rows are in flight to the experts
  Tensor dx_shared;
  Tensor dweights = Tensor::empty({N, k}, router_.router_dtype(), x.device());
  Tensor dx;
  if (!dispatcher_.exchanges()) {
    if (shared_fc1_) dx_shared = shared_backward(dy, s, x);
    dx = local_backward(s.local, dy, x, s.router.weights, dweights);
  } else {
    dx = exchange_backward(dy, s, x, dweights, shared_fc1_ ? &dx_shared : nullptr);
  }
  router_.backward(s.router, dweights, x, dx);
  if (dx_shared.defined()) ops::add_(dx, dx_shared);
  s = Saved{};
  return dx;
}

Tensor MoELayer::exchange_backward(const Tensor& dy, Saved& s, const Tensor& x, Tensor& dweights,
                                   Tensor* dx_shared) const {
  const int64_t k = opt_.topk, P = dispatcher_.ep_size();
  // each chunk's dy goes the tokens' way; the experts' input gradients and routing-weight gradients come back and
  // add up, chunk by chunk
  using Dir = TokenDispatcher::Direction;
  struct InFlight {
    TokenDispatcher::Exchange grads, dweights, dx;
  };
  std::vector<InFlight> fl(s.chunks.size());
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    const Chunk& ch = s.chunks[i];
    const int64_t S = std::accumulate(ch.plan.send_rows.begin(), ch.plan.send_rows.end(), int64_t{0});
    Tensor sent = ops::moe_rows_empty({S, x.size(1)}, ctx_->dtype, x.device());
    ops::moe_permute_forward(sent, dy.slice(ch.begin, ch.rows), ch.send_slot, P);
    fl[i].grads = dispatcher_.start(ch.plan, sent, Dir::ToExperts);
  }
  if (dx_shared) *dx_shared = shared_backward(dy, s, x);
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    Chunk& ch = s.chunks[i];
    const Tensor dout = dispatcher_.finish(fl[i].grads);
    Tensor dw_local = ops::moe_rows_empty({dout.size(0), k}, router_.router_dtype(), x.device());
    const Tensor dtokens = local_backward(ch.local, dout, ch.tokens, ch.local_weights, dw_local);
    ch.tokens = ch.local_weights = Tensor();
    fl[i].dweights = dispatcher_.start(ch.plan, dw_local, Dir::Back);
    fl[i].dx = dispatcher_.start(ch.plan, dtokens, Dir::Back);
  }
  Tensor dx = ctx_->empty(x.shape());
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    const Chunk& ch = s.chunks[i];
    Tensor dwc = dweights.slice(ch.begin, ch.rows), dxc = dx.slice(ch.begin, ch.rows);
    ops::moe_permute_backward(dwc, dispatcher_.finish(fl[i].dweights), ch.row_of_send, P);
    ops::moe_permute_backward(dxc, dispatcher_.finish(fl[i].dx), ch.row_of_send, P);
  }
  return dx;
}

double MoELayer::loss_value(const Tensor& loss) { return scalar(loss); }

}  // namespace mt
