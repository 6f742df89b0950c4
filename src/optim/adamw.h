// AdamW with decoupled weight decay over the parameter store's flat buffers, fp32 master weights
// (on the CPU backend the parameters are the master weights), global-norm gradient clipping, and
// the distributed optimizer (ZeRO-1): each DP rank keeps Adam moments and (bf16 / fp16) the fp32
// master weights for its shard of the flat buffers only (its chunk of every gradient bucket,
// parallel/grad_sync.h) and updates that shard; GradSync::gather_params then all-gathers the
// parameters over DP.
// Which parameters decay: weights yes; norms and biases only with
// optimizer.weight_decay_norms_and_biases; embedding/output tables only with
// optimizer.weight_decay_embeddings.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "config/config.h"
#include "params/param_store.h"
#include "parallel/grad_sync.h"
#include "runtime/parallel_state.h"
#include "tensor/ops.h"

namespace mt {

// A run of the flat buffers inside this rank's optimizer shard that belongs to one parameter.
struct OptimizerSegment {
  Param* param;
  int64_t flat_begin;   // element offset into the flat buffers
  int64_t length;
  int64_t shard_begin;  // element offset into this rank's optimizer state (the shard's ranges end to end)
};
std::vector<OptimizerSegment> optimizer_segments(const ParamStore& store, const std::vector<ShardRange>& shard);

// L2 norm of the whole model's gradient, every element counted once: TP-split parameters from
// every TP rank, TP-replicated ones from TP rank 0, the tied embedding copy of the last stage never;
// summed over TP and PP, and over DP when the gradients are sharded (distributed optimizer); expert parameters
// (ParamSpec::expert_parallel) summed over the expert-parallel ranks, and over expert data parallel when sharded.
// In two halves, so that the device works on the sums while the host waits for the step's other values:
// grad_square_sums queues this rank's sums of squares (one per run of adjacent counted segments, no wait; a range
// whose sums its producer already made, ParamStore::grad_squares, is summed from those instead of read again), and
// global_grad_norm takes their values (tensor/scalar_read.h) and reduces them over the ranks.
struct GradSquareSums {
  std::vector<Tensor> sums;  // one F64 element each, on the gradients' device
  std::vector<bool> expert;  // sums[i] is over expert parameters
};
GradSquareSums grad_square_sums(const ParamStore& store, const ParallelState& ps, const std::vector<ShardRange>& shard);
double global_grad_norm(const GradSquareSums& squares, std::span<const double> values, const ParamStore& store,
                        const ParallelState& ps, bool sharded);

class AdamW {
 public:
  AdamW(ParamStore& store, const OptimizerConfig& cfg, const ParallelState& ps, bool distributed);
  // One update of this rank's shard with learning rate lr; gradients are multiplied by grad_scale
  // first. With the distributed optimizer the other shards' parameters arrive by
  // GradSync::gather_params.
  // grad_norm: the global norm of the gradients after grad_scale (< 0: unknown; then the moment
  // bound below is no longer tracked until it is recomputed).
  void step(double lr, double grad_scale, double grad_norm = -1);
  // True when a step with gradients of global norm grad_norm (after scaling) could push an element
  // of the second moment past the largest float (stored as Inf it would freeze that weight for
  // good: every later update is m / sqrt(Inf) = 0). Uses a running upper bound of every rank's
  // v elements, B_t = beta2 * B_{t-1} + (1 - beta2) * norm_t^2 >= max v (each |g_i| <= norm), so it
  // costs nothing per step; after set_full_moments the bound is recomputed once from the state
  // (a reduction over all ranks: call it on every rank, as the trainer does each iteration).
  bool would_overflow(double grad_norm);
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t s) { step_ = s; }
  const std::vector<ShardRange>& shard() const { return shard_; }
  bool distributed() const { return distributed_; }
  // The moments as full-size flat buffers: the state itself (without the distributed optimizer only).
  void full_moments(Tensor& m, Tensor& v) const;
  // For checkpoints under the distributed optimizer: m, v and (once taken) the fp32 master weights as full-size flat
  // HOST buffers, gathered over the data (expert-data) groups one bucket at a time, so that the device holds one
  // bucket beyond the shards (full-size device copies of all three took 12 bytes a parameter at every save).
  // Only the regions for which keep(region.expert) holds are copied to the host (the rest stays zero: this rank
  // saves none of it; with none, nothing is allocated and all three stay undefined); master is left undefined when
  // the store's values are the master weights (fp32). A collective: call it on every rank.
  void gather_state_to_host(Tensor& m, Tensor& v, Tensor& master, const std::function<bool(bool)>& keep) const;
  // Whether this optimizer holds the master weights (take_master took them from the store): then the checkpoint
  // takes them from gather_state_to_host or, without the distributed optimizer, from the halves (bf16: the store's
  // values and master_low_halves).
  bool holds_master() const { return master_.defined() || lo_.defined(); }
  // Without the distributed optimizer, bf16: the master weights' low halves (U16), a full-size flat buffer (state
  // offsets are flat offsets); the fp32 master weights are ops::join_master(values, these). Undefined otherwise.
  const Tensor& master_low_halves() const;
  // Sets the moments from full-size flat buffers (keeping this rank's shard; before take_master, the buffers are
  // kept until it).
  void set_full_moments(const Tensor& m, const Tensor& v);
  // Takes the master weights from the parameter store when they are separate from the values (bf16 / fp16) and frees
  // the store's full-size fp32 copy; then allocates m and v. Call it once, after any checkpoint load and before the
  // first step (step calls it too; then it does nothing).
  // - bf16: as halves (core/master_halves.h). The values become the high halves (the fp32 weights rounded, ties away
  //   from zero), and this optimizer keeps the low halves of its shard (all of them without the distributed
  //   optimizer): 2 bytes a parameter, and the update moves 28 bytes an element instead of 30.
  // - fp16 with the distributed optimizer: this rank's shard of the fp32 master weights, beside m and v (each rank
  //   updates only its shard; the compute copies of the others arrive by GradSync::gather_params).
  // - fp16 without: nothing; the store's master weights stay where they are.
  void take_master();
  // On a GPU without the distributed optimizer the update runs on a side stream (runtime/cuda/cuda_runtime.h
  // update_*), chunk by chunk in the order the last forward asked for their parameters, so that the next forward
  // starts at once: params_needed (the forward's hook, through GradSync) makes the compute stream wait for the
  // chunks holding [begin, end) only; wait_update for all of it (before anything else reads the parameters or the
  // optimizer state: evaluation, checkpoints, the end of training).
  void params_needed(int64_t begin, int64_t end);
  void wait_update();

 private:
  ParamStore* store_;
  OptimizerConfig cfg_;
  const ParallelState* ps_;
  bool distributed_;
  std::vector<ShardRange> shard_;
  int64_t shard_numel_ = 0;
  // The update's spans: runs of adjacent segments contiguous in the flat buffers and in the state (one update
  // each), the weight decay by element range inside (matrices decay; norms and biases as configured). Built once.
  struct UpdateSpan {
    int64_t flat_begin = 0, state_begin = 0, length = 0;
    ops::DecayRuns decay;
  };
  std::vector<UpdateSpan> spans_;
  bool overlap_ = false;          // the update on the side stream (spans cut at parameters into chunks)
  std::vector<int> mark_of_;      // span i's event on the side stream, -1 once waited for (or none)
  std::vector<int64_t> need_at_;  // the order of the last forward's first request of span i (-1: none)
  int64_t needs_ = 0;             // requests counted this step
  int all_mark_ = -1;             // the whole update's event, -1 when waited for
  // (shard_numel_): the shard's ranges end to end. Allocated by moments_ready, from take_master on (or earlier if
  // asked for), so that they and the store's full-size fp32 master weights are never on the device together (bf16:
  // 18 bytes a parameter at start-up against 16 in training); moments a resume set before that wait in loaded_m_ /
  // loaded_v_ (host buffers).
  mutable Tensor m_, v_, loaded_m_, loaded_v_;
  DType state_dtype_ = DType::F32;
  Device state_device_ = Device::CPU;
  void moments_ready() const;
  void take_master_weights();
  Tensor master_;  // the same for the fp32 master weights (fp16, distributed), once take_master took them
  Tensor lo_;      // the same for the master weights' low halves (bf16), once take_master took them
  void take_master_halves();
  // Elements a piece when take_master_halves stages the low halves through host memory: the device holds one piece
  // beside the state (16M elements: 32 MiB).
  static constexpr int64_t kHostPiece = int64_t{16} << 20;
  // values = master (cast) over the flat range [begin, begin + n) inside shard range r, which starts at state
  // offset r_state (from the store's master weights until take_master, then from master_)
  void values_from_master(int64_t begin, int64_t n, const ShardRange& r, int64_t r_state);
  // state (shard_numel_ elements: the shard's ranges end to end) = this rank's ranges of the full-size `full`
  void take_shard(Tensor& state, const Tensor& full) const;
  int64_t step_ = 0;
  double v_bound_ = 0;  // >= every element of v on every rank; < 0 = unknown (recompute)
};

}  // namespace mt
