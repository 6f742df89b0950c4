#include "optim/adamw.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/cuda/cuda_runtime.h"

#include "tensor/master_halves_ops.h"
#include "tensor/ops.h"

namespace mt {

std::vector<OptimizerSegment> optimizer_segments(const ParamStore& store, const std::vector<ShardRange>& shard) {
  std::vector<OptimizerSegment> segs;
  const std::vector<Param*> params = store.params();  // ascending flat offsets
  int64_t state_offset = 0;
  size_t first = 0;
  for (const ShardRange& r : shard) {
    while (first < params.size() &&
           static_cast<int64_t>(params[first]->flat_offset) + params[first]->value.numel() <= r.begin)
      ++first;
    for (size_t i = first; i < params.size() && static_cast<int64_t>(params[i]->flat_offset) < r.end; ++i) {
      const int64_t b = static_cast<int64_t>(params[i]->flat_offset), e = b + params[i]->value.numel();
      const int64_t lo = std::max(b, r.begin), hi = std::min(e, r.end);
      if (lo < hi) segs.push_back({params[i], lo, hi - lo, state_offset + (lo - r.begin)});
    }
    state_offset += r.size();
  }
  return segs;
}

GradSquareSums grad_square_sums(const ParamStore& store, const ParallelState& ps, const std::vector<ShardRange>& shard) {
  Tensor flat = const_cast<ParamStore&>(store).flat_grads();
  const std::vector<OptimizerSegment> segs = optimizer_segments(store, shard);
  // This rank counts: TP-split parameters, TP-replicated ones on TP rank 0, never the tied embedding's copy.
  auto counted_here = [&](const ParamSpec& spec) {
    const bool split = spec.partition_dim >= 0 && ps.tp_size > 1;
    return !spec.tied_copy && (split || ps.tp_rank == 0);
  };
  // The ranges whose sums of squares the op that wrote them made (ParamStore::grad_squares), where nothing has
  // changed those gradients since: no data-parallel sum over them (a group of one) and no sequence-parallel sum
  // over TP, and this rank counts every element of the range.
  std::vector<const ParamStore::GradSquares*> made;
  for (const ParamStore::GradSquares& q : store.grad_squares()) {
    if (reduce_group(store, ps, q.begin).size > 1) continue;
    int64_t counted = 0;
    bool summed_over_tp = false;
    for (const OptimizerSegment& s : segs)
      if (s.flat_begin >= q.begin && s.flat_begin + s.length <= q.end) {
        const ParamSpec& spec = s.param->spec;
        if (!counted_here(spec)) continue;
        counted += s.length;
        summed_over_tp |= spec.sequence_parallel_grad && ps.tp_size > 1;
      }
    if (counted == q.end - q.begin && !summed_over_tp) made.push_back(&q);
  }
  // Adjacent segments that all count are summed in one reduction (few launches, one value each); the padding past
  // the last parameter holds zeros. A made range inside a run takes its place there (its parts summed instead).
  GradSquareSums out;
  struct Run {
    int64_t begin, end;
    bool expert;
  };
  std::vector<Run> runs;
  for (const OptimizerSegment& s : segs) {
    const ParamSpec& spec = s.param->spec;
    if (!counted_here(spec)) continue;
    if (!runs.empty() && runs.back().end == s.flat_begin && runs.back().expert == spec.expert_parallel)
      runs.back().end += s.length;
    else
      runs.push_back({s.flat_begin, s.flat_begin + s.length, spec.expert_parallel});
  }
  std::vector<std::array<int64_t, 2>> read;  // ranges summed from the gradients
  std::vector<Tensor> parts;                 // made ranges' parts
  std::vector<std::pair<bool, size_t>> order;  // out.sums[i]: (made, index into parts or read)
  for (const Run& r : runs) {
    int64_t at = r.begin;
    auto piece = [&](bool from_parts, size_t i) {
      order.emplace_back(from_parts, i);
      out.expert.push_back(r.expert);
    };
    for (const ParamStore::GradSquares* q : made) {
      if (q->begin < at || q->end > r.end) continue;
      if (q->begin > at) read.push_back({at, q->begin}), piece(false, read.size() - 1);
      parts.push_back(q->parts), piece(true, parts.size() - 1);
      at = q->end;
    }
    if (at < r.end) read.push_back({at, r.end}), piece(false, read.size() - 1);
  }
  Tensor values = Tensor::empty({static_cast<int64_t>(read.size() + parts.size())}, DType::F64, flat.device());
  const auto n_read = static_cast<int64_t>(read.size());
  for (int64_t i = 0; i < n_read; ++i) {
    Tensor slot = values.slice(i, 1);
    ops::sum_squares_into(slot, flat.slice(read[i][0], read[i][1] - read[i][0]));
  }
  Tensor made_values = values.slice(n_read, static_cast<int64_t>(parts.size()));
  ops::sum_each(made_values, parts);  // one launch for all of them
  for (const auto& [from_parts, i] : order)
    out.sums.push_back((from_parts ? made_values : values).slice(static_cast<int64_t>(i), 1));
  return out;
}

double global_grad_norm(const GradSquareSums& squares, std::span<const double> values, const ParamStore& store,
                        const ParallelState& ps, bool sharded) {
  MT_INTERNAL_ASSERT(values.size() == squares.sums.size(), "global_grad_norm: ", values.size(), " values for ",
                     squares.sums.size(), " sums");
  double total[2] = {0, 0};  // dense, expert parameters
  for (size_t i = 0; i < values.size(); ++i) total[squares.expert[i]] += values[i];
  if (sharded && ps.dp_size > 1) total[0] = ps.dp->all_reduce_scalar(total[0], ReduceOp::Sum);
  if (store.has_experts()) {
    // Expert parameters: sharded over expert data parallel; each expert-parallel rank holds other experts.
    // (Every rank of an expert group is on the same pipeline stage: the same store layout.)
    if (sharded && ps.expert_dp_size > 1) total[1] = ps.expert_dp->all_reduce_scalar(total[1], ReduceOp::Sum);
    if (ps.ep_size > 1) total[1] = ps.ep->all_reduce_scalar(total[1], ReduceOp::Sum);
    total[0] += total[1];
  }
  double sum = total[0];
  if (ps.tp_size > 1) sum = ps.tp->all_reduce_scalar(sum, ReduceOp::Sum);
  if (ps.pp_size > 1) sum = ps.pp->all_reduce_scalar(sum, ReduceOp::Sum);
  return std::sqrt(sum);
}

AdamW::AdamW(ParamStore& store, const OptimizerConfig& cfg, const ParallelState& ps, bool distributed)
    : store_(&store), cfg_(cfg), ps_(&ps), distributed_(distributed && ps.dp_size > 1) {
  shard_ = optimizer_shard(store, ps, distributed_);
  for (const ShardRange& r : shard_) shard_numel_ += r.size();
  const Tensor& flat = store.flat_master();
  state_dtype_ = flat.dtype();
  state_device_ = flat.device();
  for (Param* p : store.params()) {
    switch (p->spec.kind) {
      case ParamKind::Weight: p->weight_decay = true; break;
      case ParamKind::Bias:
      case ParamKind::Norm: p->weight_decay = cfg.weight_decay_norms_and_biases; break;
      case ParamKind::Embedding: p->weight_decay = cfg.weight_decay_embeddings; break;
    }
  }
#if defined(MEGATRAIN_HAVE_CUDA)
  // (Beside the forward, the update's blocks and the forward's share the SMs: on an H200 it gave -0.6 ms of an 83 ms
  // moe-8x-top2 step, not the update's 8.8 ms; capping its grid to leave SMs to the forward made it slower.)
  overlap_ = flat.device() == Device::CUDA && !distributed_;
#endif
  // Overlapped, a span ends at the first parameter boundary past kChunk elements: chunks the forward can wait for
  // one at a time (a layer's experts are a few of them).
  constexpr int64_t kChunk = int64_t{16} << 20;
  for (const OptimizerSegment& s : optimizer_segments(store, shard_)) {
    const uint8_t decay = s.param->weight_decay ? 1 : 0;
    UpdateSpan* span = spans_.empty() ? nullptr : &spans_.back();
    if (!span || s.flat_begin != span->flat_begin + span->length ||
        s.shard_begin != span->state_begin + span->length || (overlap_ && span->length >= kChunk))
      span = &spans_.emplace_back(UpdateSpan{s.flat_begin, s.shard_begin, 0, {}});
    if (span->decay.decay.empty() || span->decay.decay.back() != decay) {
      span->decay.starts.push_back(span->length);
      span->decay.decay.push_back(decay);
    }
    span->length += s.length;
  }
  mark_of_.assign(spans_.size(), -1);
  need_at_.assign(spans_.size(), -1);
}

void AdamW::params_needed(int64_t begin, int64_t end) {
  if (begin <= 0 && end >= store_->padded_numel()) wait_update();  // everything (the padding's copies too)
  for (size_t i = 0; i < spans_.size(); ++i) {
    const UpdateSpan& sp = spans_[i];
    if (sp.flat_begin >= end || begin >= sp.flat_begin + sp.length) continue;
    if (need_at_[i] < 0) need_at_[i] = needs_++;
#if defined(MEGATRAIN_HAVE_CUDA)
    if (mark_of_[i] >= 0) cuda::update_wait(mark_of_[i]);
#endif
    mark_of_[i] = -1;
  }
}

void AdamW::wait_update() {
#if defined(MEGATRAIN_HAVE_CUDA)
  if (all_mark_ >= 0) cuda::update_wait(all_mark_);
#endif
  all_mark_ = -1;
  std::fill(mark_of_.begin(), mark_of_.end(), -1);
}

void AdamW::moments_ready() const {
  if (m_.defined()) return;
  m_ = Tensor::zeros({shard_numel_}, state_dtype_, state_device_);
  v_ = Tensor::zeros({shard_numel_}, state_dtype_, state_device_);
  if (loaded_m_.defined()) {
    take_shard(m_, loaded_m_);
    take_shard(v_, loaded_v_);
    loaded_m_ = loaded_v_ = Tensor();
  }
}

bool AdamW::would_overflow(double grad_norm) {
  moments_ready();
  if (v_bound_ < 0) {
    // sqrt of the sum of squares (fp64) >= the largest element; Inf or NaN in v stays non-finite.
    double local = shard_numel_ > 0 ? std::sqrt(ops::sum_squares(v_)) : 0.0;
    if (!(local <= std::numeric_limits<double>::max())) local = std::numeric_limits<double>::infinity();
    v_bound_ = ps_->world && ps_->world_size > 1 ? ps_->world->all_reduce_scalar(local, ReduceOp::Max) : local;
  }
  const double next = cfg_.adam_beta2 * v_bound_ + (1.0 - cfg_.adam_beta2) * grad_norm * grad_norm;
  return !(next <= static_cast<double>(std::numeric_limits<float>::max()));
}

void AdamW::step(double lr, double grad_scale, double grad_norm) {
  take_master();  // (the trainer calls it before the first step; a no-op from then on)
  ++step_;
  if (grad_norm < 0 || v_bound_ < 0)
    v_bound_ = -1;
  else
    v_bound_ = cfg_.adam_beta2 * v_bound_ + (1.0 - cfg_.adam_beta2) * grad_norm * grad_norm;
  // The master weights: bf16's as halves (the store's values and lo_, at state offsets); else the store's (full-size,
  // at flat offsets) or, once sharded, master_ (at state offsets).
  const bool halves = lo_.defined();
  Tensor master = halves ? Tensor() : master_.defined() ? master_ : store_->flat_master();
  Tensor& grads = store_->flat_grads();
  // On the GPU the update also writes the compute copy (fp16) of the weights it changed, in the same pass
  // (as sync_values_from_master would: bit for bit); `written` collects those runs of the flat buffer.
  const bool fused_copy = !halves && store_->has_separate_master() && master.device() == Device::CUDA;
  std::vector<std::pair<int64_t, int64_t>> written;
  // One update per span (spans_): one launch on a GPU for a whole shard range.
  ops::AdamWArgs a;
  a.lr = lr;
  a.beta1 = cfg_.adam_beta1;
  a.beta2 = cfg_.adam_beta2;
  a.eps = cfg_.adam_eps;
  a.weight_decay = cfg_.weight_decay;
  a.step = step_;
  a.grad_scale = grad_scale;
  wait_update();  // (the last step's: every chunk a forward asked for has been waited for already)
  // Overlapped: on the side stream, the spans in the order the last forward first asked for them (the others last)
  std::vector<size_t> order(spans_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (overlap_) {
    auto key = [&](size_t i) { return need_at_[i] < 0 ? int64_t{1} << 62 : need_at_[i]; };
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  }
#if defined(MEGATRAIN_HAVE_CUDA)
  cuda::SideStreamScope side_stream(cuda::SideStreamScope::kUpdate, overlap_);
#endif
  std::fill(need_at_.begin(), need_at_.end(), -1);
  needs_ = 0;
  [[maybe_unused]] int marks = 0;
  for (size_t i : order) {
    const UpdateSpan& span = spans_[i];
    Tensor m = m_.slice(span.state_begin, span.length);
    Tensor v = v_.slice(span.state_begin, span.length);
    const Tensor g = grads.slice(span.flat_begin, span.length);
    if (halves) {
      Tensor hi = store_->flat_values().slice(span.flat_begin, span.length);
      Tensor lo = lo_.slice(span.state_begin, span.length);
      ops::adamw_step_halves(hi, lo, m, v, g, a, &span.decay);
#if defined(MEGATRAIN_HAVE_CUDA)
      if (overlap_) cuda::update_mark(mark_of_[i] = marks++);
#endif
      continue;
    }
    Tensor p = master.slice(master_.defined() ? span.state_begin : span.flat_begin, span.length);
    if (fused_copy) {
      Tensor copy = store_->flat_values().slice(span.flat_begin, span.length);
      ops::adamw_step(p, m, v, g, a, &copy, &span.decay);
      written.emplace_back(span.flat_begin, span.flat_begin + span.length);
    } else {
      ops::adamw_step(p, m, v, g, a, nullptr, &span.decay);
    }
#if defined(MEGATRAIN_HAVE_CUDA)
    if (overlap_) cuda::update_mark(mark_of_[i] = marks++);
#endif
  }
  // The compute copy of the rest of the shard (with the fused copy: only the padding between regions; with halves,
  // none: the values are the master weights' high halves, the padding's zero).
  std::sort(written.begin(), written.end());
  int64_t r_state = 0;
  for (const ShardRange& r : halves ? std::vector<ShardRange>{} : shard_) {
    int64_t at = r.begin;
    for (const auto& [b, e] : written) {
      if (e <= at || b >= r.end) continue;
      if (b > at) values_from_master(at, b - at, r, r_state);
      at = std::max(at, e);
    }
    if (at < r.end) values_from_master(at, r.end - at, r, r_state);
    r_state += r.size();
  }
#if defined(MEGATRAIN_HAVE_CUDA)
  if (overlap_) cuda::update_mark(all_mark_ = marks);
  side_stream.end();
#endif
}

void AdamW::full_moments(Tensor& m, Tensor& v) const {
  MT_INTERNAL_ASSERT(!distributed_, "full_moments: sharded moments are gathered by gather_state_to_host");
  moments_ready();
  m = m_;
  v = v_;
}

void AdamW::gather_state_to_host(Tensor& m, Tensor& v, Tensor& master,
                                 const std::function<bool(bool)>& keep) const {
  MT_INTERNAL_ASSERT(distributed_, "gather_state_to_host: the optimizer state is not sharded");
  moments_ready();
  MT_INTERNAL_ASSERT(master_.defined() || lo_.defined() || !store_->has_separate_master(),
                     "gather_state_to_host before take_master: the store's master weights are current only in this "
                     "rank's shard");
  // Host buffers only on a rank that saves some region (the others take part in the gathers only).
  bool any = false;
  for (const FlatRegion& r : store_->regions()) any = any || keep(r.expert);
  const int64_t N = store_->padded_numel();
  m = any ? Tensor::zeros({N}, m_.dtype()) : Tensor();
  v = any ? Tensor::zeros({N}, v_.dtype()) : Tensor();
  master = any && (master_.defined() || lo_.defined()) ? Tensor::zeros({N}, DType::F32) : Tensor();
  const std::vector<ShardRange> buckets = grad_buckets(*store_, ps_->dp_size, ps_->expert_dp_size);
  // This rank's state: the regions one after the other, in each its chunk of every bucket in bucket order.
  int64_t offset = 0;
  Tensor whole_buf;   // one bucket gathered, on the state's device
  Tensor joined_buf;  // this rank's chunk of a bucket's master weights joined from their halves
  for (const FlatRegion& r : store_->regions()) {
    const ReduceGroup g = reduce_group(*store_, *ps_, r.begin);
    const bool kept = keep(r.expert);
    for (const ShardRange& b : buckets) {
      if (b.begin < r.begin || b.begin >= r.end) continue;
      const int64_t n = b.size() / g.size;
      auto one = [&](const Tensor& mine, Tensor& host) {
        Tensor whole = mine;
        if (g.comm) {  // chunk q of the bucket from rank q: the bucket's flat range in order (bucket_chunk)
          if (!whole_buf.defined() || whole_buf.numel() < b.size())
            whole_buf = Tensor::empty({b.size()}, mine.dtype(), mine.device());
          whole = whole_buf.slice(0, b.size());
          g.comm->all_gather(whole, mine);
        }
        if (kept) host.slice(b.begin, b.size()).copy_from(whole);
      };
      one(m_.slice(offset, n), m);
      one(v_.slice(offset, n), v);
      if (master_.defined()) one(master_.slice(offset, n), master);
      if (lo_.defined()) {
        const ShardRange flat = bucket_chunk(b, g.size, g.rank);  // (this rank's values are current in its chunk)
        if (!joined_buf.defined() || joined_buf.numel() < n) joined_buf = Tensor::empty({n}, DType::F32, lo_.device());
        Tensor joined = joined_buf.slice(0, n);
        ops::join_master(joined, store_->flat_values().slice(flat.begin, n), lo_.slice(offset, n));
        one(joined, master);
      }
      offset += n;
    }
  }
}

void AdamW::take_master() {
  take_master_weights();
  moments_ready();  // after the master weights' full-size fp32 copy is gone (bf16, fp16 distributed)
}

void AdamW::take_master_weights() {
  if (!store_->has_separate_master() || master_.defined() || lo_.defined()) return;
  if (store_->flat_values().dtype() == DType::BF16) return take_master_halves();
  if (!distributed_) return;  // fp16: the store's fp32 master weights, updated where they are
  // Through host memory: the shard and the full-size copy are never on the device together (that would raise the
  // run's peak by the shard).
  const Tensor& full = store_->flat_master();
  const DType dtype = full.dtype();
  const Device device = full.device();
  Tensor host = Tensor::empty({shard_numel_}, dtype);
  take_shard(host, full);
  store_->release_master();
  master_ = Tensor::empty({shard_numel_}, dtype, device);
  master_.copy_from(host);
}

void AdamW::take_master_halves() {
  // The high halves are every value: outside this rank's shard (the distributed optimizer's other ranks' parts) from
  // the full master weights every rank holds (replicas round alike), in place; inside it with the low halves below.
  Tensor& values = store_->flat_values();
  Tensor full = store_->flat_master();  // (a handle, let go of below with the store's, before lo_ exists)
  const Device device = full.device();
  int64_t outside = 0;
  auto high_halves = [&](int64_t end) {
    if (end <= outside) return;
    Tensor hi = values.slice(outside, end - outside);
    ops::split_master(hi, nullptr, full.slice(outside, end - outside));
  };
  for (const ShardRange& r : shard_) {
    high_halves(r.begin);
    outside = std::max(outside, r.end);
  }
  high_halves(values.numel());
  // The low halves of this rank's shard (and its high halves), staged in host memory a piece at a time, so that the
  // full fp32 copy and the halves are never on the device together.
  Tensor host = Tensor::empty({shard_numel_}, DType::U16);
  Tensor piece_buf = Tensor::empty({std::min(kHostPiece, shard_numel_)}, DType::U16, device);
  int64_t offset = 0;
  for (const ShardRange& r : shard_)
    for (int64_t b = r.begin; b < r.end; b += kHostPiece) {
      const int64_t n = std::min(kHostPiece, r.end - b);
      Tensor hi = values.slice(b, n), lo = piece_buf.slice(0, n);
      ops::split_master(hi, &lo, full.slice(b, n));
      host.slice(offset, n).copy_from(lo);
      offset += n;
    }
  piece_buf = Tensor();
  full = Tensor();
  store_->release_master();
  lo_ = Tensor::empty({shard_numel_}, DType::U16, device);
  lo_.copy_from(host);
}

const Tensor& AdamW::master_low_halves() const {
  static const Tensor none;
  return lo_.defined() && !distributed_ ? lo_ : none;
}

void AdamW::values_from_master(int64_t begin, int64_t n, const ShardRange& r, int64_t r_state) {
  if (n == 0) return;
  if (!master_.defined()) return store_->sync_values_from_master(begin, n);
  Tensor values = store_->flat_values().slice(begin, n);
  ops::cast(values, master_.slice(r_state + (begin - r.begin), n));
}

void AdamW::take_shard(Tensor& state, const Tensor& full) const {
  int64_t offset = 0;
  for (const ShardRange& r : shard_) {
    state.slice(offset, r.size()).copy_from(full.slice(r.begin, r.size()));
    offset += r.size();
  }
}

void AdamW::set_full_moments(const Tensor& m, const Tensor& v) {
  v_bound_ = -1;  // recomputed from the loaded state by the next would_overflow
  if (!m_.defined()) {  // before take_master: kept (host buffers from a resume) until the moments exist
    loaded_m_ = m, loaded_v_ = v;
    return;
  }
  take_shard(m_, m);
  take_shard(v_, v);
}

}  // namespace mt
