#include "parallel/grad_sync.h"

#include <algorithm>

namespace mt {

ReduceGroup reduce_group(const ParamStore& store, const ParallelState& ps, int64_t flat_begin) {
  const std::vector<FlatRegion>& regions = store.regions();
  const bool expert = regions.size() > 1 && flat_begin >= regions.back().begin;
  ReduceGroup g;
  g.size = expert ? ps.expert_dp_size : ps.dp_size;
  g.rank = expert ? ps.expert_dp_rank : ps.dp_rank;
  if (g.size > 1) g.comm = expert ? ps.expert_dp : ps.dp;
  return g;
}

std::vector<ShardRange> grad_buckets(const ParamStore& store, int dp, int expert_dp) {
  std::vector<ShardRange> out;
  for (const FlatRegion& r : store.regions()) {
    const int g = r.expert ? expert_dp : dp;
    MT_INTERNAL_ASSERT((r.end - r.begin) % g == 0, "flat buffer region of ", r.end - r.begin,
                       " elements is not padded to a multiple of its group size ", g);
    const int64_t size = std::max<int64_t>(store.grad_bucket_elements() / g, 1) * g;
    for (int64_t b = r.begin; b < r.end; b += size) out.push_back({b, std::min(r.end, b + size)});
  }
  return out;
}

std::vector<ShardRange> optimizer_shard(const ParamStore& store, const ParallelState& ps, bool distributed) {
  const int64_t n = store.padded_numel();
  if (!distributed || ps.dp_size == 1) return {{0, n}};
  std::vector<ShardRange> out;
  for (const ShardRange& b : grad_buckets(store, ps.dp_size, ps.expert_dp_size)) {
    const ReduceGroup g = reduce_group(store, ps, b.begin);
    out.push_back(bucket_chunk(b, g.size, g.rank));
  }
  return out;
}

GradSync::GradSync(ParamStore& store, const ParallelState& ps, const GradSyncOptions& opt)
    : store_(&store), ps_(&ps), opt_(opt), reduce_dp_(ps.dp_size > 1) {
  opt_.distributed_optimizer = opt.distributed_optimizer && reduce_dp_;
  const bool dist = opt_.distributed_optimizer;
  for (const ShardRange& r : grad_buckets(store, dist ? ps.dp_size : 1, dist ? ps.expert_dp_size : 1)) {
    buckets_.emplace_back();
    buckets_.back().range = r;
    buckets_.back().group = reduce_group(store, ps, r.begin);
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
  // The padding past the last parameter of a region never receives gradients: final from the start.
  for (Bucket& b : buckets_) {
    b.launched = false;
    b.grad_work.reset();
    int64_t used = 0;
    for (const FlatRegion& r : store_->regions())
      if (b.range.begin >= r.begin && b.range.begin < r.end) used = r.used_end;
    b.final_elements = std::max<int64_t>(0, b.range.end - std::max(b.range.begin, used));
  }
}

void GradSync::launch_grad(Bucket& b) {
  b.launched = true;
  launch_order_.push_back(&b);
  if (!b.group.comm) return;  // a group of one (experts with expert parallel = data parallel): nothing to sum
  Tensor& flat = store_->flat_grads();
  Tensor whole = flat.slice(b.range.begin, b.range.size());
  if (!opt_.distributed_optimizer) {
    b.grad_work = b.group.comm->all_reduce_async(whole, ReduceOp::Sum);
    return;
  }
  // In place: this rank's chunk of the bucket receives the sum of everyone's chunk.
  const ShardRange c = bucket_chunk(b.range, b.group.size, b.group.rank);
  Tensor mine = flat.slice(c.begin, c.size());
  b.grad_work = b.group.comm->reduce_scatter_async(mine, whole, ReduceOp::Sum);
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
      if (!b->grad_work) continue;
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
    if (!b.group.comm) continue;
    const ShardRange c = bucket_chunk(b.range, b.group.size, b.group.rank);
    Tensor whole = values.slice(b.range.begin, b.range.size());
    Tensor mine = values.slice(c.begin, c.size());
    b.param_work = b.group.comm->all_gather_async(whole, mine);
    ++pending_param_gathers_;
  }
  if (!opt_.overlap_param_gather) wait_params();
}

void GradSync::params_needed(int64_t begin, int64_t end) {
  if (update_waiter_) update_waiter_(begin, end);
  if (pending_param_gathers_ == 0) return;
  for (Bucket& b : buckets_) {
    if (!b.param_work || b.range.begin >= end || begin >= b.range.end) continue;
    b.param_work->wait();
    b.param_work.reset();
    --pending_param_gathers_;
  }
}

void GradSync::wait_params() {
  params_needed(0, store_->padded_numel());
}

}  // namespace mt
