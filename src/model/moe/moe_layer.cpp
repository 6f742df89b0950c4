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
  const ModelContext& c = *ctx_;
  const int64_t N = x.size(0), C = x.size(1), E = opt_.num_experts, k = opt_.topk;
  router_.forward(s.router, x);
  // routing map; the counts come to the host (sizes of the exchange and of the grouped GEMMs)
  s.slot_of_row = Tensor::empty({N * k}, DType::I32, x.device());
  s.row_of_slot = Tensor::empty({N * k}, DType::I32, x.device());
  Tensor counts = Tensor::empty({E}, DType::I32, x.device()), counts_host = Tensor::empty({E}, DType::I32);
  ops::moe_routing_map(s.slot_of_row, s.row_of_slot, counts, s.router.indices, E);
  counts_host.copy_from(counts);
  s.counts.assign(counts_host.data<int32_t>(), counts_host.data<int32_t>() + E);
  int64_t M = 0;
  for (int64_t n : s.counts) M += n;
  // padded batched experts: only with every expert on this rank (the dispatch is then the identity)
  const std::vector<int64_t> regions =
      dispatcher_.local_experts() == E
          ? ops::moe_padded_regions(x.device(), x.dtype(), s.counts, C, opt_.ffn_hidden_size * (opt_.swiglu ? 2 : 1))
          : std::vector<int64_t>{};
  s.padded = !regions.empty();
  if (s.padded) {  // rows past the regions (up to moe_alloc_rows): padding too
    M = ops::moe_alloc_rows(std::accumulate(regions.begin(), regions.end(), int64_t{0}));
    Tensor pad = Tensor::empty({M}, DType::I32, x.device());
    ops::moe_pad_routing_map(pad, s.row_of_slot, s.slot_of_row, s.counts, regions);
    s.slot_of_row = pad;
  }
  Tensor xp = c.empty({M, C});
  ops::moe_permute_forward(xp, x, s.slot_of_row, k);
  TokenDispatcher::Exchange rows = dispatcher_.dispatch_start(s.plan, xp, s.counts);
  xp = Tensor();
  // with expert parallelism the padded layout is laid out on arrival (the received rows' counts known now)
  std::vector<int64_t> expert_rows = s.padded ? regions : s.plan.local_counts;
  if (dispatcher_.exchanges()) {
    std::vector<int64_t> r = ops::moe_padded_regions(x.device(), x.dtype(), s.plan.local_counts, C,
                                                     opt_.ffn_hidden_size * (opt_.swiglu ? 2 : 1));
    if (!r.empty()) {
      expert_rows = r;
      dispatcher_.pad(s.plan, std::move(r),
                      ops::moe_alloc_rows(std::accumulate(expert_rows.begin(), expert_rows.end(), int64_t{0})));
    }
  }
  // with expert parallelism the shared expert's fc1 runs while the rows are in flight; without it after the routed
  // experts, whose buffers are freed by then (a lower peak)
  const bool shared_beside = shared_fc1_ && dispatcher_.exchanges();
  if (shared_beside) shared_forward_fc1(s, x);
  s.xl = dispatcher_.finish(s.plan, rows);
  Tensor yl = experts_.forward(s.experts, s.xl, expert_rows);
  s.yp = dispatcher_.combine(s.plan, yl);
  if (dispatcher_.local_experts() == E) s.xl = Tensor();  // EP 1: permuted again from x in backward (memory)
  Tensor y = c.empty({N, C});
  ops::moe_unpermute_forward(y, s.yp, s.router.weights, s.row_of_slot);
  if (shared_fc1_) {
    if (!shared_beside) shared_forward_fc1(s, x);
    y = shared_fc2_->forward(s.shared_a, &y);
  }
  if (residual) ops::add_(y, *residual);
  return y;
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
  const ModelContext& c = *ctx_;
  const int64_t N = x.size(0), k = opt_.topk;
  // the shared expert: without expert parallelism first (before the routed buffers exist), with it while the
  // output gradients' rows are in flight to the experts
  const bool shared_beside = shared_fc1_ && dispatcher_.exchanges();
  Tensor dx_shared;
  if (shared_fc1_ && !shared_beside) dx_shared = shared_backward(dy, s, x);
  // buffers released as soon as read (fewer of them alive at once)
  const int64_t rows = s.yp.size(0);
  Tensor dyp = c.empty(s.yp.shape());
  Tensor dweights = Tensor::empty({N, k}, router_.router_dtype(), x.device());
  ops::moe_unpermute_backward(dyp, dweights, dy, s.yp, s.router.weights, s.row_of_slot);
  s.yp = Tensor();
  if (s.padded) ops::moe_zero_unrouted_rows(dyp, s.slot_of_row);  // padding rows (EP 1): no weight-gradient share
  TokenDispatcher::Exchange grads = dispatcher_.combine_backward_start(s.plan, dyp);
  dyp = Tensor();
  if (shared_beside) dx_shared = shared_backward(dy, s, x);
  Tensor dh = experts_.backward_fc2(dispatcher_.finish(s.plan, grads), s.experts);
  Tensor xl = std::move(s.xl);
  if (!xl.defined()) {  // EP 1: the experts' input rows again
    xl = c.empty({rows, x.size(1)});
    ops::moe_permute_forward(xl, x, s.slot_of_row, k);
  }
  Tensor dxl = experts_.backward_fc1(dh, s.experts, xl);
  dh = Tensor();
  xl = Tensor();
  Tensor dxp = dispatcher_.dispatch_backward(s.plan, dxl);
  Tensor dx = c.empty(x.shape());
  ops::moe_permute_backward(dx, dxp, s.row_of_slot, k);
  ops::add_(dx, router_.backward(s.router, dweights, x));
  if (dx_shared.defined()) ops::add_(dx, dx_shared);
  s = Saved{};
  return dx;
}

double MoELayer::loss_value(const Tensor& loss) { return scalar(loss); }

}  // namespace mt
