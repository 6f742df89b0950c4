// The amax reductions of FP8 scaling (tensor/fp8/fp8_recipe.h): the one place FP8 bookkeeping communicates.
// A tensor split over the tensor-parallel ranks (a column-parallel weight, its output gradient, a row-parallel
// layer's input) must be scaled by the amax of the whole tensor, or every layout would round differently
// (a known divergence trap: amax reduced over the wrong group).
#pragma once

#include "runtime/parallel_state.h"
#include "tensor/tensor.h"

namespace mt {

// amax (F32, any numel) = elementwise max over the tensor-parallel group (no-op with tp 1).
void reduce_amax_over_tp(Tensor& amax, const ParallelState& ps);
// The delayed recipe's step end: max over every rank of this pipeline stage (tensor x context x data), so the
// history is the same on all of them and in every layout of the same global batch.
void reduce_amax_over_stage(Tensor& amax, const ParallelState& ps);

}  // namespace mt
