#include "parallel/token_dispatcher.h"

#include <numeric>
#include <utility>

#include "core/check.h"

namespace mt {

namespace {
// Copies blocks of rows from src to dst: block b has rows[b] rows; src holds the blocks in order `order`
// (src block i is block order[i]), dst holds them in natural order 0, 1, ...
void gather_blocks(Tensor& dst, const Tensor& src, const std::vector<int64_t>& rows, const std::vector<int64_t>& order) {
  std::vector<int64_t> dst_off(rows.size() + 1, 0);
  for (size_t b = 0; b < rows.size(); ++b) dst_off[b + 1] = dst_off[b] + rows[b];
  int64_t s = 0;
  for (int64_t b : order) {
    const int64_t n = rows[static_cast<size_t>(b)];
    if (n > 0) {
      Tensor d = dst.slice(dst_off[static_cast<size_t>(b)], n);
      d.copy_from(src.slice(s, n));
    }
    s += n;
  }
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

Tensor TokenDispatcher::finish(const Plan& plan, Exchange& x) const {
  if (!x.work) {
    x.sent = Tensor();
    return std::exchange(x.received, Tensor());
  }
  x.work->wait();
  x.work.reset();
  x.sent = Tensor();
  const int64_t El = local_experts_, P = ep_size_;
  // 3. reorder to [local expert][source]: block (e, r) of the result is block (r, e) of what came in
  std::vector<int64_t> rows(static_cast<size_t>(P * El)), order;
  for (int64_t e = 0; e < El; ++e)
    for (int64_t r = 0; r < P; ++r) rows[static_cast<size_t>(e * P + r)] = plan.recv_counts[static_cast<size_t>(r * El + e)];
  for (int64_t r = 0; r < P; ++r)
    for (int64_t e = 0; e < El; ++e) order.push_back(e * P + r);
  Tensor out = Tensor::empty(x.received.shape(), x.received.dtype(), x.received.device());
  gather_blocks(out, x.received, rows, order);
  x.received = Tensor();
  return out;
}

Tensor TokenDispatcher::combine(const Plan& plan, const Tensor& yl) const {
  if (ep_size_ == 1) return yl;
  const int64_t El = local_experts_, P = ep_size_;
  // [local expert][source] -> [source][local expert], then each block back to its source rank
  std::vector<int64_t> rows(static_cast<size_t>(P * El)), order;
  for (int64_t r = 0; r < P; ++r)
    for (int64_t e = 0; e < El; ++e) rows[static_cast<size_t>(r * El + e)] = plan.recv_counts[static_cast<size_t>(r * El + e)];
  for (int64_t e = 0; e < El; ++e)
    for (int64_t r = 0; r < P; ++r) order.push_back(r * El + e);
  Tensor staged = Tensor::empty(yl.shape(), yl.dtype(), yl.device());
  gather_blocks(staged, yl, rows, order);
  const int64_t M = std::accumulate(plan.send_rows.begin(), plan.send_rows.end(), int64_t{0});
  Shape s = yl.shape();
  s[0] = M;
  Tensor out = Tensor::empty(s, yl.dtype(), yl.device());
  ep_->all_to_all_v(out, staged, plan.recv_rows, plan.send_rows);
  return out;
}

}  // namespace mt
