// Pipeline schedules as data: the ordered action list of one stage for one training iteration, in
// Megatron-Core's order (megatron/core/pipeline_parallel/schedules.py). Written from the algorithm;
// the list is what the executor runs, so the communication sits exactly where Megatron communicates.
//
// Notation: p stages, stage s, m micro-batches, v chunks; "[...]" is one batch_p2p. Inside a batch
// the messages keep Megatron's op order: SendBackward, RecvForward, SendForward, RecvBackward
// (send_prev, recv_prev, send_next, recv_next). A message the stage does not have is left out and an
// empty batch is dropped: the first virtual stage (stage 0, chunk 0) receives no activation and sends
// no gradient; the last one (stage p-1, chunk v-1) sends no activation and receives no gradient (the
// loss is computed there).
//
// 1F1B, v == 1 (forward_backward_pipelining_without_interleaving): W = min(p - s - 1, m), R = m - W.
//   warmup,   i = 0 .. W-1:  [RecvF i]  F i  [SendF i]                       (recv_forward, send_forward)
//   if R > 0:                [RecvF W]
//   steady,   i = 0 .. R-1:  F W+i  [SendF W+i, RecvB i]  B i                 (send_forward_recv_backward)
//                            then [SendB i, RecvF W+i+1]                      (send_backward_recv_forward)
//                            or, on the last steady step, [SendB i]           (send_backward)
//   cooldown, i = R .. m-1:  [RecvB i]  B i  [SendB i]                        (recv_backward, send_backward)
//   p == 1 has no messages: F0 B0 F1 B1 ... (plain gradient accumulation).
//
// Interleaved 1F1B, v > 1 (forward_backward_pipelining_with_interleaving with the default
// microbatch_group_size_per_vp_stage = p; needs m % p == 0). T = m*v forward steps k = 0 .. T-1:
// step k is micro-batch (k / (p*v)) * p + k % p on chunk (k / p) % v (get_schedule_table: a group of
// p micro-batches goes through chunk 0, then chunk 1, ...). Backward step k is the same micro-batch on
// chunk v-1 - (k / p) % v. W = min((p - s - 1) * 2 + (v - 1) * p, T) warmup forwards, R = T - W.
//   before warmup:                  [RecvF of forward step 0]
//   warmup, k = 0 .. W-1:           F k  [RecvF next, SendF k (, RecvB of backward step 0 on the last
//                                   warmup step when R > 0)]       (send_forward_recv_forward, or
//                                                                    send_forward_backward_recv_forward_backward)
//   steady, k = 0 .. R-1:           F W+k  B k  [SendB k, RecvF next, SendF W+k, RecvB next]
//                                                                   (send_forward_backward_recv_forward_backward)
//   if R == 0:                      [RecvB of backward step 0]     (recv_backward)
//   cooldown, k = R .. T-1:         B k  [SendB k, RecvB next]     (send_backward_recv_backward)
// "RecvF next" after forward step k: a stage s > 0 receives the input of its forward step k+1 from
// stage s-1. Stage 0 receives, from stage p-1, the output of stage p-1's forward step k-(p-1) (p-1
// is that many steps behind), which is the input of the next chunk on stage 0 -- none while
// k < p-1 or when that output came from chunk v-1 (the loss). Backward mirrors this with the last
// stage leading: a stage s < p-1 receives the output gradient of its backward step k+1 from s+1;
// stage p-1 receives from stage 0 the input gradient of stage 0's backward step k-(p-1), which
// belongs to the previous chunk on stage p-1 -- none while k < p-1 or when it came from chunk 0.
// Nothing is received after step T-1. Since groups have exactly p micro-batches, a stage 0 input
// arrives one step before its forward (and a stage p-1 gradient one step before its backward).
#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <cstdint>
#include <sstream>

#include "core/check.h"

namespace mt::pp {
namespace {

constexpr int kMaxTag = 32766;  // tags stay < 32767 (NCCL/MPI guarantee at least 32767 tags)

struct Slot {  // one message of a batch, or none (mb < 0)
  int mb = -1, chunk = 0;
  bool any() const { return mb >= 0; }
};

class Builder {
 public:
  void compute(ActionKind kind, int mb, int chunk) { out_.push_back(Action{kind, mb, chunk, -1}); }
  void batch(Slot send_bwd, Slot recv_fwd, Slot send_fwd, Slot recv_bwd) {
    const size_t before = out_.size();
    add(ActionKind::SendBackward, send_bwd);
    add(ActionKind::RecvForward, recv_fwd);
    add(ActionKind::SendForward, send_fwd);
    add(ActionKind::RecvBackward, recv_bwd);
    if (out_.size() != before) ++next_batch_;
  }
  std::vector<Action> take() { return std::move(out_); }

 private:
  void add(ActionKind kind, Slot s) {
    if (s.any()) out_.push_back(Action{kind, s.mb, s.chunk, next_batch_});
  }
  std::vector<Action> out_;
  int next_batch_ = 0;
};

std::vector<Action> one_f_one_b(int p, int s, int m) {
  const bool first = s == 0, last = s == p - 1;
  const int warmup = std::min(p - s - 1, m), remaining = m - warmup;
  auto at = [](bool present, int mb) { return present ? Slot{mb, 0} : Slot{}; };
  Builder b;
  for (int i = 0; i < warmup; ++i) {
    b.batch({}, at(!first, i), {}, {});
    b.compute(ActionKind::Forward, i, 0);
    b.batch({}, {}, at(!last, i), {});
  }
  if (remaining > 0) b.batch({}, at(!first, warmup), {}, {});
  for (int i = 0; i < remaining; ++i) {
    const int f = warmup + i;
    b.compute(ActionKind::Forward, f, 0);
    b.batch({}, {}, at(!last, f), at(!last, i));
    b.compute(ActionKind::Backward, i, 0);
    const bool last_step = i == remaining - 1;
    b.batch(at(!first, i), at(!first && !last_step, f + 1), {}, {});
  }
  for (int mb = remaining; mb < m; ++mb) {
    b.batch({}, {}, {}, at(!last, mb));
    b.compute(ActionKind::Backward, mb, 0);
    b.batch(at(!first, mb), {}, {}, {});
  }
  return b.take();
}

class Interleaved {
 public:
  Interleaved(int p, int s, int m, int v) : p_(p), s_(s), v_(v), total_(m * v) {}

  int total() const { return total_; }
  int mb(int k) const { return (k / (p_ * v_)) * p_ + k % p_; }
  int fwd_chunk(int k) const { return (k / p_) % v_; }
  int bwd_chunk(int k) const { return v_ - 1 - fwd_chunk(k); }
  bool first_virtual(int chunk) const { return s_ == 0 && chunk == 0; }
  bool last_virtual(int chunk) const { return s_ == p_ - 1 && chunk == v_ - 1; }
  int warmup() const { return std::min((p_ - s_ - 1) * 2 + (v_ - 1) * p_, total_); }

  // The activation this stage receives in the batch after forward step k (for a later forward).
  Slot recv_forward_after(int k) const {
    if (k + 1 >= total_) return {};
    if (s_ > 0) return {mb(k + 1), fwd_chunk(k + 1)};
    const int j = k - (p_ - 1);  // stage p-1's forward step that is arriving now
    if (j < 0 || fwd_chunk(j) == v_ - 1) return {};
    return {mb(j), fwd_chunk(j) + 1};
  }
  // The output gradient this stage receives in the batch after backward step k.
  Slot recv_backward_after(int k) const {
    if (k + 1 >= total_) return {};
    if (s_ < p_ - 1) return {mb(k + 1), bwd_chunk(k + 1)};
    const int j = k - (p_ - 1);  // stage 0's backward step that is arriving now
    if (j < 0 || bwd_chunk(j) == 0) return {};
    return {mb(j), bwd_chunk(j) - 1};
  }
  Slot send_forward_of(int k) const { return last_virtual(fwd_chunk(k)) ? Slot{} : Slot{mb(k), fwd_chunk(k)}; }
  Slot send_backward_of(int k) const { return first_virtual(bwd_chunk(k)) ? Slot{} : Slot{mb(k), bwd_chunk(k)}; }
  // The output gradient of backward step 0 (micro-batch 0, chunk v-1), if this stage receives one.
  Slot first_grad() const { return s_ < p_ - 1 ? Slot{mb(0), v_ - 1} : Slot{}; }

 private:
  int p_, s_, v_, total_;
};

std::vector<Action> interleaved(int p, int s, int m, int v) {
  const Interleaved I(p, s, m, v);
  const int total = I.total(), warmup = I.warmup(), remaining = total - warmup;
  Builder b;
  b.batch({}, I.first_virtual(0) ? Slot{} : Slot{I.mb(0), 0}, {}, {});
  for (int k = 0; k < warmup; ++k) {
    b.compute(ActionKind::Forward, I.mb(k), I.fwd_chunk(k));
    const bool join_grad = k == warmup - 1 && remaining > 0;
    b.batch({}, I.recv_forward_after(k), I.send_forward_of(k), join_grad ? I.first_grad() : Slot{});
  }
  for (int k = 0; k < remaining; ++k) {
    const int f = warmup + k;
    b.compute(ActionKind::Forward, I.mb(f), I.fwd_chunk(f));
    b.compute(ActionKind::Backward, I.mb(k), I.bwd_chunk(k));
    b.batch(I.send_backward_of(k), I.recv_forward_after(f), I.send_forward_of(f), I.recv_backward_after(k));
  }
  if (remaining == 0) b.batch({}, {}, {}, I.first_grad());
  for (int k = remaining; k < total; ++k) {
    b.compute(ActionKind::Backward, I.mb(k), I.bwd_chunk(k));
    b.batch(I.send_backward_of(k), {}, {}, I.recv_backward_after(k));
  }
  return b.take();
}

void validate(int p, int m, int v) {
  MT_CHECK(p >= 1, "parallel.pipeline (", p, ") must be >= 1");
  MT_CHECK(v >= 1, "parallel.virtual_pipeline (", v, ") must be >= 1");
  MT_CHECK(m >= 1, "the pipeline schedule needs at least one micro-batch (got ", m,
           "): change training.global_batch_size or micro_batch_size");
  if (v > 1) {
    MT_CHECK(p > 1, "parallel.virtual_pipeline (", v, ") > 1 needs parallel.pipeline > 1 (it interleaves chunks of the "
             "pipeline stages); set virtual_pipeline: 1 or pipeline > 1");
    MT_CHECK(m % p == 0, "the interleaved schedule needs the number of micro-batches (", m,
             ") to be a multiple of parallel.pipeline (", p, "): change training.global_batch_size or micro_batch_size");
  }
  if (p > 1) {
    const int64_t mv = int64_t{m} * v;
    MT_CHECK(2 * mv - 1 <= kMaxTag, "the pipeline schedule needs micro-batches (", m, ") x parallel.virtual_pipeline (",
             v, ") = ", mv, " <= ", (kMaxTag + 1) / 2, " (its message tags must stay below 32767): raise "
             "training.micro_batch_size or lower training.global_batch_size");
  }
}

int warmup_forwards(int p, int s, int m, int v) {
  if (v == 1) return std::min(p - s - 1, m);
  return std::min((p - s - 1) * 2 + (v - 1) * p, m * v);
}

}  // namespace

std::vector<Action> pipeline_schedule(int stages, int stage, int microbatches, int virtual_stages) {
  validate(stages, microbatches, virtual_stages);
  MT_INTERNAL_ASSERT(stage >= 0 && stage < stages, "stage ", stage, " of ", stages);
  if (virtual_stages == 1) return one_f_one_b(stages, stage, microbatches);
  return interleaved(stages, stage, microbatches, virtual_stages);
}

int max_in_flight(int stages, int stage, int microbatches, int virtual_stages) {
  validate(stages, microbatches, virtual_stages);
  MT_INTERNAL_ASSERT(stage >= 0 && stage < stages, "stage ", stage, " of ", stages);
  return std::min(warmup_forwards(stages, stage, microbatches, virtual_stages) + 1, microbatches * virtual_stages);
}

int peer_of(const Action& a, int stages, int stage) {
  switch (a.kind) {
    case ActionKind::SendForward:
    case ActionKind::RecvBackward:
      return (stage + 1) % stages;
    case ActionKind::RecvForward:
    case ActionKind::SendBackward:
      return (stage + stages - 1) % stages;
    case ActionKind::Forward:
    case ActionKind::Backward:
      break;
  }
  MT_INTERNAL_ASSERT(false, "peer_of a compute action ", to_string(a));
  return -1;
}

// tag = (2 * microbatch + direction) * v + chunk of the sending side. On one link (stage pair and
// direction of travel) the sender's chunk names the virtual-stage boundary crossed, so distinct
// messages of an iteration get distinct tags, and both sides compute the same one.
int message_tag(const Action& a, int stages, int stage, int virtual_stages) {
  MT_INTERNAL_ASSERT(stages > 1, "message_tag with a single pipeline stage (no messages)");
  int direction = 0, sender_chunk = a.chunk;
  switch (a.kind) {
    case ActionKind::SendForward: break;
    case ActionKind::RecvForward: sender_chunk = stage == 0 ? a.chunk - 1 : a.chunk; break;
    case ActionKind::SendBackward: direction = 1; break;
    case ActionKind::RecvBackward:
      direction = 1;
      sender_chunk = stage == stages - 1 ? a.chunk + 1 : a.chunk;
      break;
    case ActionKind::Forward:
    case ActionKind::Backward: MT_INTERNAL_ASSERT(false, "message_tag of a compute action ", to_string(a));
  }
  MT_INTERNAL_ASSERT(sender_chunk >= 0 && sender_chunk < virtual_stages && a.microbatch >= 0,
                     "no such message: ", to_string(a), " on stage ", stage, " of ", stages);
  const int64_t tag = (int64_t{a.microbatch} * 2 + direction) * virtual_stages + sender_chunk;
  MT_CHECK(tag <= kMaxTag, "pipeline message tag ", tag, " of ", to_string(a), " exceeds ", kMaxTag,
           ": too many micro-batches x parallel.virtual_pipeline; raise training.micro_batch_size or lower "
           "training.global_batch_size");
  return static_cast<int>(tag);
}

double bubble_fraction(int stages, int microbatches, int virtual_stages) {
  validate(stages, microbatches, virtual_stages);
  return double(stages - 1) / (double(virtual_stages) * microbatches + stages - 1);
}

std::string to_string(const Action& a) {
  static const char* const names[] = {"F", "B", "SF", "RF", "SB", "RB"};
  return str_cat(names[static_cast<int>(a.kind)], a.microbatch, ".", a.chunk);
}

std::string format_schedule(int stages, int microbatches, int virtual_stages) {
  std::ostringstream os;
  for (int s = 0; s < stages; ++s) {
    os << "stage " << s << ":";
    for (const Action& a : pipeline_schedule(stages, s, microbatches, virtual_stages))
      if (a.kind == ActionKind::Forward || a.kind == ActionKind::Backward) os << ' ' << to_string(a);
    os << '\n';
  }
  return os.str();
}

}  // namespace mt::pp
