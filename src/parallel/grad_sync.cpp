#include "parallel/grad_sync.h"

#include <algorithm>

namespace mt {

ShardRange optimizer_shard(const ParamStore& store, const ParallelState& ps, bool distributed) {
  const int64_t n = store.padded_numel();
  if (!distributed || ps.dp_size == 1) return {0, n};
  const int64_t per = n / ps.dp_size;
  return {ps.dp_rank * per, (ps.dp_rank + 1) * per};
}

void finalize_gradients(ParamStore& store, const ParallelState& ps, bool distributed, bool tied_embeddings) {
  for (Param* p : store.params()) {
    if (p->spec.sequence_parallel_grad && ps.tp_size > 1) ps.tp->all_reduce(p->grad, ReduceOp::Sum);
    if (tied_embeddings && ps.embedding && ps.embedding->size() > 1 && p->spec.name == "embedding.word_embeddings.weight")
      ps.embedding->all_reduce(p->grad, ReduceOp::Sum);
  }
  if (ps.dp_size == 1) return;
  Tensor& flat = store.flat_grads();
  const int64_t n = flat.numel();
  if (!distributed) {
    for (int64_t b = 0; b < n; b += kGradBucketElements) {
      Tensor bucket = flat.slice(b, std::min(kGradBucketElements, n - b));
      ps.dp->all_reduce(bucket, ReduceOp::Sum);
    }
    return;
  }
  // Reduce-scatter: the result for this rank's shard lands in place in its range of the buffer.
  const ShardRange r = optimizer_shard(store, ps, true);
  Tensor shard = Tensor::empty({r.end - r.begin}, flat.dtype(), flat.device());
  ps.dp->reduce_scatter(shard, flat, ReduceOp::Sum);
  Tensor mine = flat.slice(r.begin, r.end - r.begin);
  mine.copy_from(shard);
}

}  // namespace mt
