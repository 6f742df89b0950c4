// The MoE token dispatcher over the expert-parallel group (Megatron-Core's MoEAlltoAllTokenDispatcher, only the
// communication: permuting tokens by expert and combining them is the layer's). Experts are laid out
// contiguously: EP rank r holds global experts [r * El, (r + 1) * El), El = E / EP.
//
// dispatch: this rank's routed rows, grouped by global expert (counts on the host, from the routing map), go to
// the ranks of their experts: an all-to-all of the E counts, then an all-to-all-v of the rows, then a local
// reorder from [source rank][local expert] to [local expert][source rank] so that each local expert's rows are
// contiguous for the grouped GEMM (optionally each expert's rows padded to a region: Plan::regions). combine is the
// exact inverse. Both reorders are one launch on the GPU (ops::moe_copy_row_segments). Every rank issues the same collectives in the
// same order whatever the routing (a rank or expert with no rows included): no data-dependent deadlock.
// EP 1: no communication, dispatch and combine are the identity.
//
// The rows' exchange towards the experts (dispatch, and combine's backward) also comes in two halves, start and
// finish, so that work that does not need it (the shared experts) runs while the rows are in flight (NCCL: on the
// expert group's stream; the CPU's MPI exchange completes inside start).
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
  bool exchanges() const { return ep_size_ > 1; }          // expert parallelism: rows cross ranks

  // What one dispatch exchanged; combine and the backward passes reuse it (no second count exchange).
  struct Plan {
    std::vector<int64_t> send_rows, recv_rows;  // (EP): rows to / from each EP rank
    std::vector<int64_t> recv_counts;           // (EP x El): rows received from rank r for local expert e
    std::vector<int64_t> local_counts;          // (El): rows of each local expert after the exchange
    // The padded layout of the experts' rows (expert parallelism only; empty: packed). The caller sets it between
    // dispatch_start and finish (pad): local expert e's rows start its region of regions[e] >= local_counts[e]
    // rows, the rest of the region is zeros, and finish's output has padded_rows >= sum(regions) rows (zeros past
    // the regions too). combine and dispatch_backward read that layout back; finish pads combine_backward's rows.
    std::vector<int64_t> regions;
    int64_t padded_rows = 0;
  };
  // xp (M, C) grouped by global expert, counts (E) rows per expert (sum M) -> (sum local_counts, C) grouped by
  // local expert, source ranks ascending inside an expert. Fills plan.
  Tensor dispatch(Plan& plan, const Tensor& xp, const std::vector<int64_t>& counts) const;
  // The inverse: yl (sum local_counts, C) grouped by local expert -> (M, C) in xp's order.
  Tensor combine(const Plan& plan, const Tensor& yl) const;
  // Gradients go the other way: dispatch's backward is combine, combine's backward is dispatch (same plan).
  Tensor dispatch_backward(const Plan& plan, const Tensor& dxl) const { return combine(plan, dxl); }
  Tensor combine_backward(const Plan& plan, const Tensor& dyp) const;

  // A rows' exchange towards the experts in flight. It holds both buffers, so that neither returns to the
  // allocator while the transfer may still read or write it.
  struct Exchange {
    Tensor sent, received;
    std::unique_ptr<Work> work;  // null: nothing in flight (EP 1)
  };
  // dispatch's first half: exchanges the counts (blocking: the sizes are needed on the host), fills plan, starts
  // the rows' all-to-all-v.
  Exchange dispatch_start(Plan& plan, const Tensor& xp, const std::vector<int64_t>& counts) const;
  // combine_backward's first half (the plan known).
  Exchange combine_backward_start(const Plan& plan, const Tensor& dyp) const;
  // Both second halves: waits for the exchange, returns its rows grouped by local expert (as dispatch does).
  Tensor finish(const Plan& plan, Exchange& x) const;
  // The padded layout for the local experts (Plan::regions); only with expert parallelism, after dispatch_start.
  void pad(Plan& plan, std::vector<int64_t> regions, int64_t padded_rows) const;

 private:
  // The rows' all-to-all-v towards the experts with known counts (both starts).
  Exchange start_exchange(const Plan& plan, const Tensor& xp) const;

  int64_t num_experts_, local_experts_, first_expert_;
  int ep_size_;
  Communicator* ep_;
};

}  // namespace mt
