// Tensor-parallel mappings (Megatron-Core's mappings.py): adjoint pairs of forward/backward
// communication at the borders of tensor-parallel regions. Model code calls these and never a
// communicator directly. Each is the identity when the tensor-parallel group has one rank.
//
//   CopyToTP            forward: identity                backward: all-reduce(sum)
//   ReduceFromTP        forward: all-reduce(sum)         backward: identity
//   GatherFromSP        forward: all-gather rows         backward: reduce-scatter rows (sum)
//   ReduceScatterToSP   forward: reduce-scatter rows     backward: all-gather rows
//
// Sequence parallelism splits the rows of an activation (B*T, C) into tp equal contiguous blocks;
// the ops inside a sequence-parallel region (norms, dropout, residual adds) are row-wise, so any row
// partition is exact. TPIn/TPOut pick the pair a linear layer needs: with sequence parallelism the
// all-gather/reduce-scatter pair, without it copy/all-reduce.
#pragma once

#include "parallel/parallel_state.h"
#include "tensor/tensor.h"

namespace mt {

struct CopyToTP {
  static void forward(Tensor&, const ParallelState&) {}
  static void backward(Tensor& grad, const ParallelState& ps);
};

struct ReduceFromTP {
  static void forward(Tensor& x, const ParallelState& ps);
  static void backward(Tensor&, const ParallelState&) {}
};

struct GatherFromSP {
  static Tensor forward(const Tensor& x_part, const ParallelState& ps);   // (N/tp, C) -> (N, C)
  static Tensor backward(const Tensor& g_full, const ParallelState& ps);  // (N, C) -> (N/tp, C)
};

struct ReduceScatterToSP {
  static Tensor forward(const Tensor& x_full, const ParallelState& ps);   // (N, C) partial -> (N/tp, C)
  static Tensor backward(const Tensor& g_part, const ParallelState& ps);  // (N/tp, C) -> (N, C)
};

// Vocab-parallel cross-entropy statistics: combines each TP rank's partial (max, sumexp,
// target_logit) per row into the global log-sum-exp and the target logit, in place:
// on return max holds lse = M + log(sum_r sumexp_r * exp(max_r - M)), target_logit the global one.
void combine_vocab_parallel_ce(Tensor& max, Tensor& sumexp, Tensor& target_logit, const ParallelState& ps);

}  // namespace mt
