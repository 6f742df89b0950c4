// Tensor-parallel mappings (Megatron-Core's mappings.py): adjoint pairs of forward/backward
// communication at the borders of tensor-parallel regions. Model code calls these and never a
// communicator directly. Each is the identity when the tensor-parallel group has one rank.
//
//   CopyToTP      forward: identity            backward: all-reduce(sum)   (input of column-parallel)
//   ReduceFromTP  forward: all-reduce(sum)     backward: identity          (output of row-parallel)
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

// Vocab-parallel cross-entropy statistics: combines each TP rank's partial (max, sumexp,
// target_logit) per row into the global log-sum-exp and the target logit, in place:
// on return max holds lse = M + log(sum_r sumexp_r * exp(max_r - M)), target_logit the global one.
void combine_vocab_parallel_ce(Tensor& max, Tensor& sumexp, Tensor& target_logit, const ParallelState& ps);

}  // namespace mt
