#include "parallel/token_dispatcher.h"

#include <numeric>
#include <utility>

#include "core/check.h"
#include "tensor/moe_ops.h"

namespace mt {

TokenDispatcher::TokenDispatcher(int64_t num_experts, const ParallelState& ps)
    : num_experts_(num_experts), ep_size_(ps.ep_size), ep_(ps.ep) {
  MT_CHECK(num_experts % ps.ep_size == 0, "model.num_experts (", num_experts,
           ") must be divisible by parallel.expert (", ps.ep_size, ")");
  MT_INTERNAL_ASSERT(ps.ep_size == 1 || (ep_ && ep_->size() == ps.ep_size), "expert-parallel group missing");
  local_experts_ = num_experts / ps.ep_size;
  first_expert_ = static_cast<int64_t>(ps.ep_rank) * local_experts_;
}

void TokenDispatcher::exchange_counts(Plan& plan, const std::vector<int64_t>& expert_counts,
                                      const std::vector<int64_t>& send_rows) const {
  const int64_t El = local_experts_, P = ep_size_;
  MT_INTERNAL_ASSERT(static_cast<int64_t>(expert_counts.size()) == num_experts_ &&
                         static_cast<int64_t>(send_rows.size()) == P,
                     "exchange_counts: ", expert_counts.size(), " expert counts, ", send_rows.size(), " row counts");
  plan.send_rows = send_rows;
  if (P == 1) {
    plan.recv_rows = send_rows;
    plan.local_counts = expert_counts;
    return;
  }
  // chunk r (rank r's El expert counts, then the token rows for rank r) goes to rank r
  Tensor send = Tensor::empty({P * (El + 1)}, DType::I64), recv = Tensor::empty({P * (El + 1)}, DType::I64);
  for (int64_t r = 0; r < P; ++r) {
    std::copy(expert_counts.begin() + r * El, expert_counts.begin() + (r + 1) * El, send.data<int64_t>() + r * (El + 1));
    send.data<int64_t>()[r * (El + 1) + El] = send_rows[static_cast<size_t>(r)];
  }
  ep_->all_to_all(recv, send);
  plan.recv_rows.assign(static_cast<size_t>(P), 0);
  plan.local_counts.assign(static_cast<size_t>(El), 0);
  for (int64_t r = 0; r < P; ++r) {
    const int64_t* c = recv.data<int64_t>() + r * (El + 1);
    for (int64_t e = 0; e < El; ++e) plan.local_counts[static_cast<size_t>(e)] += c[e];
    plan.recv_rows[static_cast<size_t>(r)] = c[El];
  }
}

TokenDispatcher::Exchange TokenDispatcher::start(const Plan& plan, const Tensor& rows, Direction dir) const {
  Exchange x;
  x.sent = rows;
  if (ep_size_ == 1) {
    x.received = rows;
    return x;
  }
  const std::vector<int64_t>& send = dir == Direction::ToExperts ? plan.send_rows : plan.recv_rows;
  const std::vector<int64_t>& recv = dir == Direction::ToExperts ? plan.recv_rows : plan.send_rows;
  Shape s = rows.shape();
  s[0] = std::accumulate(recv.begin(), recv.end(), int64_t{0});
  x.received = ops::moe_rows_empty(s, rows.dtype(), rows.device());  // its row count changes every step
  x.work = ep_->all_to_all_v_async(x.received, rows, send, recv);
  return x;
}

Tensor TokenDispatcher::finish(Exchange& x) const {
  if (x.work) {
    x.work->wait();
    x.work.reset();
  }
  x.sent = Tensor();
  return std::exchange(x.received, Tensor());
}

}  // namespace mt
