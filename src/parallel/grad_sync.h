// After the last micro-batch's backward, makes every rank's gradients the gradients of the whole
// global batch (Megatron's finalize_model_grads), in this order:
//   1. sequence-parallel partial gradients (norms, position embeddings): all-reduce over TP;
//   2. tied word embeddings on the first and last pipeline stage: all-reduce over the embedding group;
//   3. data parallel: all-reduce (sum) of the flat gradient buffer over DP, in buckets; or, with the
//      distributed optimizer, reduce-scatter so each DP rank ends with the sum of its shard.
// Losses are sums over local tokens scaled by 1/(tokens of the global batch), so sums (not means)
// over DP give the global mean.
#pragma once

#include "model/param_store.h"
#include "parallel/parallel_state.h"

namespace mt {

// Elements per DP communication bucket of the flat gradient buffer.
inline constexpr int64_t kGradBucketElements = int64_t(1) << 22;

// The [begin, end) element range of the flat buffers this DP rank owns under the distributed
// optimizer (the buffer is padded to a multiple of dp); the whole buffer otherwise.
struct ShardRange {
  int64_t begin = 0, end = 0;
};
ShardRange optimizer_shard(const ParamStore& store, const ParallelState& ps, bool distributed);

// tied_embeddings: the model ties its output layer to the word embeddings (gpt2).
void finalize_gradients(ParamStore& store, const ParallelState& ps, bool distributed_optimizer, bool tied_embeddings);

}  // namespace mt
