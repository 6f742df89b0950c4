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

#include <memory>

#include "runtime/parallel_state.h"
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

// Asynchronous halves for overlapping a column-parallel backward's communication with its GEMMs
// (parallel.tp_comm_overlap; model/linear.cpp ColumnParallelLinear::backward_overlapped). Each returns the
// handle to wait on (null when the tensor-parallel group has one rank):
//   gather_sp_rows_async:          full (N, C) <- all-gather of each TP rank's rows part (N/tp, C) (GatherFromSP)
//   reduce_column_input_grad_async: under sequence parallelism dx (N/tp, C) <- reduce-scatter(sum) of dx_full
//                                  (N, C); without it dx_full is all-reduced in place and dx must be dx_full.
std::unique_ptr<Work> gather_sp_rows_async(Tensor& full, const Tensor& part, const ParallelState& ps);
std::unique_ptr<Work> reduce_column_input_grad_async(Tensor& dx, Tensor& dx_full, const ParallelState& ps);

// Vocab-parallel cross-entropy: combines each TP rank's partial statistics per row (ops::cross_entropy_stats over its
// vocabulary slice: max, sumexp, target_logit, (N) each) into the global log-sum-exp, written over max, and each
// row's loss (N, fp64) = lse - target logit, on the statistics' device (nothing goes through the host):
// all-reduce(max) over TP, rescale sumexp to the global max, all-reduce(sum) of sumexp and target_logit.
void combine_vocab_parallel_ce(Tensor& max, Tensor& sumexp, Tensor& target_logit, Tensor& loss,
                               const ParallelState& ps);

}  // namespace mt
