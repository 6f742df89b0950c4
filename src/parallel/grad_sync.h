// Data-parallel gradient reduction and the distributed optimizer's parameter all-gather, bucketed
// and overlapped with computation (Megatron-Core's DistributedDataParallel + param_and_grad_buffer).
//
// The flat gradient buffer of the parameter store is cut into buckets: fixed element ranges, each a
// multiple of the data-parallel size. The expert region of the buffers (mixture-of-experts models: each
// expert-parallel rank holds other experts) is cut separately and reduced over the expert-data-parallel group. The model reports, per layer, when its gradients received one
// more micro-batch (ParamSyncHooks::grads_accumulated); after the last micro-batch of the
// iteration the layer's range is final, and a bucket whose whole range is final is reduced over DP
// at once, asynchronously (NCCL: on the DP group's stream, overlapping the rest of the backward):
// an all-reduce (sum), or with the distributed optimizer a reduce-scatter that leaves each rank the
// sum of its 1/dp chunk of every bucket — the chunks it owns in the optimizer (optimizer_shard).
// After the optimizer step each rank's updated chunks are all-gathered, bucket by bucket, and the
// next forward waits for a bucket only when a layer inside it is about to run (params_needed).
//
// finish() completes the gradients of the global batch (Megatron's finalize_model_grads):
//   1. tied word embeddings (first and last pipeline stage): all-reduce over the embedding group,
//      before the buckets holding them are reduced over DP (their offsets differ between stages);
//   2. the remaining buckets, then waits for all of them;
//   3. sequence-parallel partial gradients (norms, position embeddings): all-reduce over TP; sums
//      commute, and TP ranks share the bucket layout, so after DP is as good as before.
// Losses are sums over local tokens scaled by 1/(tokens of the global batch), so sums (not means)
// over DP give the global mean. Without overlap everything happens in finish(), in the same order.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "params/param_store.h"
#include "params/param_sync_hooks.h"
#include "runtime/parallel_state.h"

namespace mt {

// An element range [begin, end) of the flat buffers.
struct ShardRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// The group that reduces a range of the flat buffers (and, under the distributed optimizer, shards it): expert
// data parallel in the store's expert region (ParamSpec::expert_parallel), data parallel elsewhere.
struct ReduceGroup {
  Communicator* comm = nullptr;  // null when size is 1
  int size = 1, rank = 0;
};
ReduceGroup reduce_group(const ParamStore& store, const ParallelState& ps, int64_t flat_begin);

// The buckets of the store's flat buffers, region by region (ParamStore::regions): consecutive ranges of
// grad_bucket_elements rounded down to a multiple of the region's group size (dp_size for the dense region,
// expert_dp_size for the expert one; each region is padded to a multiple of it), the last of a region shorter.
std::vector<ShardRange> grad_buckets(const ParamStore& store, int dp_size, int expert_dp_size = 1);
// Chunk `rank` of the `size` equal chunks of `bucket`: what that rank of the bucket's group owns of it in the
// optimizer.
inline ShardRange bucket_chunk(const ShardRange& bucket, int size, int rank) {
  const int64_t chunk = bucket.size() / size;
  return {bucket.begin + rank * chunk, bucket.begin + (rank + 1) * chunk};
}

// The element ranges of the flat buffers this rank owns in the optimizer: its chunk of every bucket (over the
// bucket's group) under the distributed optimizer, the whole buffer otherwise.
std::vector<ShardRange> optimizer_shard(const ParamStore& store, const ParallelState& ps, bool distributed);

struct GradSyncOptions {
  bool distributed_optimizer = false;
  bool tied_embeddings = false;        // gpt2: output layer tied to the word embeddings
  bool overlap_grad_reduce = true;     // reduce buckets during backward
  bool overlap_param_gather = true;    // all-gather parameters during the next forward
  int num_microbatches = 1;            // per iteration and model chunk
};

class GradSync final : public ParamSyncHooks {
 public:
  GradSync(ParamStore& store, const ParallelState& ps, const GradSyncOptions& opt);

  // Before the first micro-batch of an iteration.
  void start_iteration();
  void params_needed(int64_t begin, int64_t end) override;
  void grads_accumulated(int64_t begin, int64_t end) override;
  // After the last micro-batch's backward: the gradients of the global batch (see above).
  void finish();
  // After the optimizer step (distributed optimizer): starts the all-gather of the updated chunks.
  void gather_params();
  // Waits for every pending parameter all-gather (before reading all parameters: save, evaluate).
  void wait_params();
  // Also waits, in params_needed and wait_params, for an optimizer update still running beside the compute stream
  // (optim/adamw.h AdamW::params_needed; wait_params passes the whole buffer).
  void set_update_waiter(std::function<void(int64_t, int64_t)> wait) { update_waiter_ = std::move(wait); }

 private:
  struct Bucket {
    ShardRange range;
    ReduceGroup group;
    int64_t final_elements = 0;
    bool deferred = false;  // holds a tied embedding: reduced in finish() only
    bool launched = false;
    std::unique_ptr<Work> grad_work, param_work;
  };
  void launch_grad(Bucket& b);
  void mark_final(int64_t begin, int64_t end);

  std::function<void(int64_t, int64_t)> update_waiter_;
  ParamStore* store_;
  const ParallelState* ps_;
  GradSyncOptions opt_;
  bool reduce_dp_;  // dp > 1 (expert data parallel is 1 when data parallel is)
  std::vector<Bucket> buckets_;
  std::vector<Param*> sequence_parallel_params_;
  Param* tied_ = nullptr;  // the word embeddings (or their copy) when tied over >1 stage
  std::map<int64_t, int> microbatches_seen_;  // range begin -> backward calls this iteration
  std::vector<Bucket*> launch_order_;
  int pending_param_gathers_ = 0;
};

}  // namespace mt
