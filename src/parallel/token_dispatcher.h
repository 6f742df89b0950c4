// The MoE token dispatcher over the expert-parallel group (the communication of Megatron-Core's
// MoEAlltoAllTokenDispatcher; what the rows are is the layer's business, model/moe/moe_layer.h). Experts are laid out
// contiguously: EP rank r holds global experts [r * El, (r + 1) * El), El = E / EP.
//
// Rows travel token-level: a token goes once to each rank holding one of its experts, with its choices on that rank
// (DeepEP's and Megatron-Core's flex dispatcher do the same), so that a token whose k experts share a rank crosses
// the link once instead of once per expert. The counts come first (exchange_counts, blocking: the sizes of every
// buffer are needed on the host), then any number of row exchanges with those counts: towards the experts (each
// rank's send rows, grouped by destination rank, arrive grouped by source rank, sources ascending) or back (the
// inverse). Every rank issues the same collectives in the same order whatever the routing (a rank or expert with no
// rows included): no data-dependent deadlock. EP 1: no communication, the exchanges are the identity.
//
// An exchange also comes in two halves, start and finish, so that work that does not need it (the shared experts)
// runs while the rows are in flight (NCCL: on the expert group's stream; the CPU's MPI exchange completes inside
// start).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/parallel_state.h"
#include "tensor/tensor.h"

namespace mt {

class TokenDispatcher {
 public:
  TokenDispatcher(int64_t num_experts, const ParallelState& ps);
  int64_t num_experts() const { return num_experts_; }
  int64_t local_experts() const { return local_experts_; }
  int64_t first_expert() const { return first_expert_; }  // global index of this rank's first expert
  int ep_size() const { return ep_size_; }
  bool exchanges() const { return ep_size_ > 1; }  // expert parallelism: rows cross ranks

  // What one count exchange gave; every row exchange of the layer's forward and backward reuses it.
  struct Plan {
    std::vector<int64_t> send_rows, recv_rows;  // (EP): token rows to / from each EP rank
    std::vector<int64_t> local_counts;          // (El): routed slots of each local expert, from every rank
  };
  // expert_counts (E): the slots this rank routes to each global expert; send_rows (EP): the token rows it sends to
  // each rank. Exchanges them (blocking) and fills plan.
  void exchange_counts(Plan& plan, const std::vector<int64_t>& expert_counts,
                       const std::vector<int64_t>& send_rows) const;

  enum class Direction { ToExperts, Back };
  // A row exchange in flight. It holds both buffers, so that neither returns to the allocator while the transfer
  // may still read or write it.
  struct Exchange {
    Tensor sent, received;
    std::unique_ptr<Work> work;  // null: nothing in flight (EP 1, or MPI: done in start)
  };
  // rows (sum of the sending side's counts, ...) -> (sum of the receiving side's, ...): ToExperts sends
  // plan.send_rows and receives plan.recv_rows, Back the inverse. Any dtype and row shape.
  Exchange start(const Plan& plan, const Tensor& rows, Direction dir) const;
  Tensor finish(Exchange& x) const;
  Tensor exchange(const Plan& plan, const Tensor& rows, Direction dir) const {
    Exchange x = start(plan, rows, dir);
    return finish(x);
  }

 private:
  int64_t num_experts_, local_experts_, first_expert_;
  int ep_size_;
  Communicator* ep_;
};

}  // namespace mt
