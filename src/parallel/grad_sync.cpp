#include "parallel/grad_sync.h"

#include <algorithm>

namespace mt {

std::vector<ShardRange> grad_buckets(const ParamStore& store, int dp) {
  const int64_t n = store.padded_numel();
  MT_INTERNAL_ASSERT(n % dp == 0, "flat buffer of ", n, " elements is not padded to a multiple of dp ", dp);
  const int64_t size = std::max<int64_t>(store.grad_bucket_elements() / dp, 1) * dp;
  std::vector<ShardRange> out;
  for (int64_t b = 0; b < n; b += size) out.push_back({b, std::min(n, b + size)});
  return out;
}

std::vector<ShardRange> optimizer_shard(const ParamStore& store, const ParallelState& ps, bool distributed) {
  const int64_t n = store.padded_numel();
  if (!distributed || ps.dp_size == 1) return {{0, n}};
  std::vector<ShardRange> out;
  for (const ShardRange& b : grad_buckets(store, ps.dp_size)) out.push_back(bucket_chunk(b, ps.dp_size, ps.dp_rank));
  return out;
}

GradSync::GradSync(ParamStore& store, const ParallelState& ps, const GradSyncOptions& opt)
    : store_(&store), ps_(&ps), opt_(opt), reduce_dp_(ps.dp_size > 1) {
  opt_.distributed_optimizer = opt.distributed_optimizer && reduce_dp_;
  for (const ShardRange& r : grad_buckets(store, opt_.distributed_optimizer ? ps.dp_size : 1)) {
    buckets_.emplace_back();
    buckets_.back().range = r;
  }
  for (Param* p : store.params()) {
    if (p->spec.sequence_parallel_grad && ps.tp_size > 1) sequence_parallel_params_.push_back(p);
    if (opt.tied_embeddings && ps.embedding && ps.embedding->size() > 1 &&
        p->spec.name == "embedding.word_embeddings.weight")
      tied_ = p;
  }
  if (tied_) {
    const int64_t b = static_cast<int64_t>(tied_->flat_offset), e = b + tied_->value.numel();
    for (Bucket& k : buckets_) k.deferred = k.range.begin < e && b < k.range.end;
  }
}

void GradSync::start_iteration() {
  microbatches_seen_.clear();
  launch_order_.clear();
  // The padding past the last parameter never receives gradients: final from the start.
  const int64_t used = store_->local_numel();
  for (Bucket& b : buckets_) {
    b.launched = false;
    b.grad_work.reset();
    b.final_elements = std::max<int64_t>(0, b.range.end - std::max(b.range.begin, used));
  }
}

void GradSync::launch_grad(Bucket& b) {
  b.launched = true;
  launch_order_.push_back(&b);
  Tensor& flat = store_->flat_grads();
  Tensor whole = flat.slice(b.range.begin, b.range.size());
  if (!opt_.distributed_optimizer) {
    b.grad_work = ps_->dp->all_reduce_async(whole, ReduceOp::Sum);
    return;
  }
  // In place: this rank's chunk of the bucket receives the sum of everyone's chunk.
  const ShardRange c = bucket_chunk(b.range, ps_->dp_size, ps_->dp_rank);
  Tensor mine = flat.slice(c.begin, c.size());
  b.grad_work = ps_->dp->reduce_scatter_async(mine, whole, ReduceOp::Sum);
}

void GradSync::mark_final(int64_t begin, int64_t end) {
  // Buckets complete from the back of the buffer (backward runs the layers in reverse); launch in
  // descending order so that every DP rank issues the same sequence.
  for (size_t i = buckets_.size(); i-- > 0;) {
    Bucket& b = buckets_[i];
    const int64_t lo = std::max(begin, b.range.begin), hi = std::min(end, b.range.end);
    if (lo >= hi) continue;
    b.final_elements += hi - lo;
    MT_INTERNAL_ASSERT(b.final_elements <= b.range.size(), "bucket [", b.range.begin, ", ", b.range.end,
                       ") reported final twice");
    if (b.final_elements == b.range.size() && !b.deferred) launch_grad(b);
  }
}

void GradSync::grads_accumulated(int64_t begin, int64_t end) {
  if (!reduce_dp_ || !opt_.overlap_grad_reduce) return;
  if (++microbatches_seen_[begin] == opt_.num_microbatches) mark_final(begin, end);
}

void GradSync::finish() {
  if (tied_) ps_->embedding->all_reduce(tied_->grad, ReduceOp::Sum);
  if (reduce_dp_) {
    for (size_t i = buckets_.size(); i-- > 0;)
      if (!buckets_[i].launched) launch_grad(buckets_[i]);
    for (Bucket* b : launch_order_) {
      b->grad_work->wait();
      b->grad_work.reset();
    }
    launch_order_.clear();
  }
  for (Param* p : sequence_parallel_params_) ps_->tp->all_reduce(p->grad, ReduceOp::Sum);
}

void GradSync::gather_params() {
  if (!opt_.distributed_optimizer) return;
  wait_params();
  Tensor& values = store_->flat_values();
  for (Bucket& b : buckets_) {
    const ShardRange c = bucket_chunk(b.range, ps_->dp_size, ps_->dp_rank);
    Tensor whole = values.slice(b.range.begin, b.range.size());
    Tensor mine = values.slice(c.begin, c.size());
    b.param_work = ps_->dp->all_gather_async(whole, mine);
    ++pending_param_gathers_;
  }
  if (!opt_.overlap_param_gather) wait_params();
}

void GradSync::params_needed(int64_t begin, int64_t end) {
  if (pending_param_gathers_ == 0) return;
  for (Bucket& b : buckets_) {
    if (!b.param_work || b.range.begin >= end || begin >= b.range.end) continue;
    b.param_work->wait();
    b.param_work.reset();
    --pending_param_gathers_;
  }
}

void GradSync::wait_params() {
  if (pending_param_gathers_ > 0) params_needed(0, store_->padded_numel());
}

}  // namespace mt
