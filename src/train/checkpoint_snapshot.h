// checkpoint.async_save's snapshot: a host copy of what a rank saves, taken while training goes on.
//
// Host buffers are allocated once (page-locked on a GPU, so that device->host copies run at the link's speed and
// asynchronously) and reused by every later save. On a GPU the copies run on a side stream (runtime/cuda):
//   - take() enqueues them after the compute stream's work so far (the optimizer step and parameter gather that
//     produced the saved values) and returns at once; the compute stream goes on with the next iterations'
//     forward and backward, which only read the weights and never touch the Adam moments. bf16's master weights,
//     held as halves (SavedBox::lo), are joined into fp32 on the side stream too, a piece at a time through one
//     device buffer, each piece copied out before the next is joined;
//   - before_update() must be called before anything overwrites a saved value, i.e. before every optimizer step:
//     it makes the compute stream wait (on the device; the host is not blocked) until the copies are done, so
//     that the step cannot overwrite master weights or moments that are still being copied. A snapshot of ~15 GB
//     copies in well under the forward+backward of one llama-1b iteration, so this wait normally costs nothing;
//   - the request's wait_ready (run by the checkpoint writer thread) blocks until the copies are done, then the
//     thread hashes and writes the host buffers.
// The buffers are reused only after the previous save was committed (the trainer finishes one save before it
// takes the next), so a write never reads a buffer that a newer snapshot is filling.
// On the CPU backend take() copies with memcpy before it returns (training then runs on while the thread writes).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "optim/adamw.h"
#include "params/param_store.h"
#include "runtime/parallel_state.h"
#include "train/train_checkpoint.h"

namespace mt {

class CheckpointSnapshot {
 public:
  CheckpointSnapshot() = default;
  ~CheckpointSnapshot();  // waits for copies in flight, frees the host buffers
  CheckpointSnapshot(const CheckpointSnapshot&) = delete;
  CheckpointSnapshot& operator=(const CheckpointSnapshot&) = delete;

  // Allocates the host buffers now (at the start of training, so that the first save does not pay for pinning
  // them); returns the bytes. take() does it otherwise.
  size_t reserve(ParamStore& store, const AdamW& opt, const ParallelState& ps,
                 const std::vector<StateBuffer>& buffers = {});
  // The save request of iteration `iteration` with host copies of saved_boxes (train_checkpoint.h), in flight on
  // a GPU (see above). The previous request's save must be finished.
  ckpt::SaveRequest take(const std::string& dir, int64_t iteration, int keep_last, ParamStore& store, const AdamW& opt,
                         const ParallelState& ps, const nlohmann::json& state, const std::string& config_yaml,
                         const std::vector<StateBuffer>& buffers = {});
  // Orders every later write of the saved tensors after the copies in flight (call before each optimizer step).
  void before_update();
  size_t bytes() const { return capacity_; }
  bool pinned() const { return pinned_; }

 private:
  void ensure(size_t bytes, Device device);
  void release();

  void* host_ = nullptr;
  size_t capacity_ = 0;
  bool pinned_ = false;
  bool in_flight_ = false;     // copies enqueued that the compute stream is not yet ordered after
  std::vector<Tensor> keep_;  // device tensors the copies read (gathered moments), alive until the next take()
};

}  // namespace mt
