#include "parallel/token_dispatcher.h"

#include <numeric>
#include <utility>

#include "core/check.h"
#include "tensor/moe_ops.h"

namespace mt {

namespace {
// The first row of each (source rank r, local expert e) block in the two layouts of the exchanged rows: `arrived`
// (index r * El + e) the order the all-to-all-v delivers them in, [source][local expert]; `grouped` (index
// e * P + r) the experts' order, [local expert][source], each expert's blocks at the start of its region when
// padded.
struct BlockStarts {
  std::vector<int64_t> arrived, grouped;
};
BlockStarts block_starts(const TokenDispatcher::Plan& plan, int64_t P, int64_t El) {
  BlockStarts b;
  b.arrived.resize(static_cast<size_t>(P * El));
  b.grouped.resize(static_cast<size_t>(P * El));
  int64_t at = 0;
  for (int64_t i = 0; i < P * El; ++i) b.arrived[static_cast<size_t>(i)] = at, at += plan.recv_counts[static_cast<size_t>(i)];
  at = 0;
  for (int64_t e = 0; e < El; ++e) {
    const int64_t start = at;
    for (int64_t r = 0; r < P; ++r)
      b.grouped[static_cast<size_t>(e * P + r)] = at, at += plan.recv_counts[static_cast<size_t>(r * El + e)];
    if (!plan.regions.empty()) at = start + plan.regions[static_cast<size_t>(e)];
  }
  return b;
}
}  // namespace

TokenDispatcher::TokenDispatcher(int64_t num_experts, const ParallelState& ps)
    : num_experts_(num_experts), ep_size_(ps.ep_size), ep_(ps.ep) {
  MT_CHECK(num_experts % ps.ep_size == 0, "model.num_experts (", num_experts,
           ") must be divisible by parallel.expert (", ps.ep_size, ")");
  MT_INTERNAL_ASSERT(ps.ep_size == 1 || (ep_ && ep_->size() == ps.ep_size), "expert-parallel group missing");
  local_experts_ = num_experts / ps.ep_size;
  first_expert_ = static_cast<int64_t>(ps.ep_rank) * local_experts_;
}

Tensor TokenDispatcher::dispatch(Plan& plan, const Tensor& xp, const std::vector<int64_t>& counts) const {
  Exchange x = dispatch_start(plan, xp, counts);
  return finish(plan, x);
}

Tensor TokenDispatcher::combine_backward(const Plan& plan, const Tensor& dyp) const {
  Exchange x = combine_backward_start(plan, dyp);
  return finish(plan, x);
}

TokenDispatcher::Exchange TokenDispatcher::dispatch_start(Plan& plan, const Tensor& xp,
                                                          const std::vector<int64_t>& counts) const {
  MT_INTERNAL_ASSERT(static_cast<int64_t>(counts.size()) == num_experts_, "dispatch: ", counts.size(), " counts for ",
                     num_experts_, " experts");
  const int64_t El = local_experts_, P = ep_size_;
  plan.send_rows.assign(static_cast<size_t>(P), 0);
  for (int64_t e = 0; e < num_experts_; ++e) plan.send_rows[static_cast<size_t>(e / El)] += counts[e];
  if (P == 1) {
    plan.recv_rows = plan.send_rows;
    plan.recv_counts = counts;
    plan.local_counts = counts;
    return start_exchange(plan, xp);
  }
  // 1. counts: chunk r (El counts for rank r's experts) goes to rank r
  Tensor send = Tensor::empty({num_experts_}, DType::I64), recv = Tensor::empty({num_experts_}, DType::I64);
  std::copy(counts.begin(), counts.end(), send.data<int64_t>());
  ep_->all_to_all(recv, send);
  plan.recv_counts.assign(recv.data<int64_t>(), recv.data<int64_t>() + num_experts_);
  plan.recv_rows.assign(static_cast<size_t>(P), 0);
  plan.local_counts.assign(static_cast<size_t>(El), 0);
  for (int64_t r = 0; r < P; ++r)
    for (int64_t e = 0; e < El; ++e) {
      plan.recv_rows[static_cast<size_t>(r)] += plan.recv_counts[static_cast<size_t>(r * El + e)];
      plan.local_counts[static_cast<size_t>(e)] += plan.recv_counts[static_cast<size_t>(r * El + e)];
    }
  return start_exchange(plan, xp);
}

TokenDispatcher::Exchange TokenDispatcher::combine_backward_start(const Plan& plan, const Tensor& dyp) const {
  return start_exchange(plan, dyp);
}

// xp: dispatch's routed rows, or combine's output gradients, grouped by global expert
TokenDispatcher::Exchange TokenDispatcher::start_exchange(const Plan& plan, const Tensor& xp) const {
  Exchange x;
  x.sent = xp;
  if (ep_size_ == 1) {
    x.received = xp;
    return x;
  }
  // 2. the rows: block r of xp (rank r's experts) goes to rank r; received blocks are [source][local expert]
  const int64_t R = std::accumulate(plan.recv_rows.begin(), plan.recv_rows.end(), int64_t{0});
  Shape s = xp.shape();
  s[0] = R;
  x.received = Tensor::empty(s, xp.dtype(), xp.device());
  x.work = ep_->all_to_all_v_async(x.received, xp, plan.send_rows, plan.recv_rows);
  return x;
}

void TokenDispatcher::pad(Plan& plan, std::vector<int64_t> regions, int64_t padded_rows) const {
  MT_INTERNAL_ASSERT(ep_size_ > 1 && static_cast<int64_t>(regions.size()) == local_experts_,
                     "pad: expert parallelism and one region per local expert");
  int64_t total = 0;
  for (int64_t e = 0; e < local_experts_; ++e) {
    MT_INTERNAL_ASSERT(regions[static_cast<size_t>(e)] >= plan.local_counts[static_cast<size_t>(e)], "pad: region ",
                       regions[static_cast<size_t>(e)], " < ", plan.local_counts[static_cast<size_t>(e)], " rows");
    total += regions[static_cast<size_t>(e)];
  }
  MT_INTERNAL_ASSERT(padded_rows >= total, "pad: ", padded_rows, " rows for regions of ", total);
  plan.regions = std::move(regions);
  plan.padded_rows = padded_rows;
}

Tensor TokenDispatcher::finish(const Plan& plan, Exchange& x) const {
  if (!x.work) {
    x.sent = Tensor();
    return std::exchange(x.received, Tensor());
  }
  x.work->wait();
  x.work.reset();
  x.sent = Tensor();
  const int64_t El = local_experts_, P = ep_size_;
  // 3. reorder to [local expert][source]: block (e, r) of the result is block (r, e) of what came in; when padded,
  // each region's rows past its expert's, and the rows past the regions, are zeros
  const BlockStarts b = block_starts(plan, P, El);
  std::vector<ops::RowSegment> segs;
  for (int64_t e = 0; e < El; ++e)
    for (int64_t r = 0; r < P; ++r)
      segs.push_back({b.grouped[static_cast<size_t>(e * P + r)], b.arrived[static_cast<size_t>(r * El + e)],
                      plan.recv_counts[static_cast<size_t>(r * El + e)]});
  Shape s = x.received.shape();
  if (!plan.regions.empty()) {
    int64_t at = 0;
    for (int64_t e = 0; e < El; ++e) {
      const int64_t n = plan.local_counts[static_cast<size_t>(e)], region = plan.regions[static_cast<size_t>(e)];
      segs.push_back({at + n, -1, region - n});
      at += region;
    }
    segs.push_back({at, -1, plan.padded_rows - at});
    s[0] = plan.padded_rows;
  }
  Tensor out = Tensor::empty(s, x.received.dtype(), x.received.device());
  ops::moe_copy_row_segments(out, x.received, segs);
  x.received = Tensor();
  return out;
}

Tensor TokenDispatcher::combine(const Plan& plan, const Tensor& yl) const {
  if (ep_size_ == 1) return yl;
  const int64_t El = local_experts_, P = ep_size_;
  // [local expert][source] (padded or not) -> [source][local expert], then each block back to its source rank
  const BlockStarts b = block_starts(plan, P, El);
  std::vector<ops::RowSegment> segs;
  for (int64_t r = 0; r < P; ++r)
    for (int64_t e = 0; e < El; ++e)
      segs.push_back({b.arrived[static_cast<size_t>(r * El + e)], b.grouped[static_cast<size_t>(e * P + r)],
                      plan.recv_counts[static_cast<size_t>(r * El + e)]});
  Shape s = yl.shape();
  s[0] = std::accumulate(plan.recv_rows.begin(), plan.recv_rows.end(), int64_t{0});
  Tensor staged = Tensor::empty(s, yl.dtype(), yl.device());
  ops::moe_copy_row_segments(staged, yl, segs);
  s[0] = std::accumulate(plan.send_rows.begin(), plan.send_rows.end(), int64_t{0});
  Tensor out = Tensor::empty(s, yl.dtype(), yl.device());
  ep_->all_to_all_v(out, staged, plan.recv_rows, plan.send_rows);
  return out;
}

}  // namespace mt
