#include "train/checkpoint_snapshot.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "runtime/cuda/cuda_runtime.h"
#include "tensor/master_halves_ops.h"
#include "train/train_checkpoint.h"

namespace mt {

namespace {
constexpr size_t kAlign = 256;  // each box starts on a 256-byte boundary of the host buffer
size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Bytes of what box b saves: its source's, or fp32 for master weights joined from their halves.
size_t saved_bytes(const SavedBox& b) {
  return b.lo.defined() ? static_cast<size_t>(b.source.numel()) * sizeof(float) : b.source.nbytes();
}

size_t total_bytes(const std::vector<SavedBox>& boxes) {
  size_t n = 0;
  for (const SavedBox& b : boxes) n += aligned(saved_bytes(b));
  return n;
}

// CUDA when any box is on the GPU (the host buffers are then page-locked and its boxes copied asynchronously; the
// boxes already in host memory, as the distributed optimizer's gathered state, are copied at once).
Device device_of(const std::vector<SavedBox>& boxes) {
  for (const SavedBox& b : boxes)
    if (b.source.device() != Device::CPU) return b.source.device();
  return Device::CPU;
}
}  // namespace

CheckpointSnapshot::~CheckpointSnapshot() { release(); }

void CheckpointSnapshot::release() {
  if (!host_) return;
#if defined(MEGATRAIN_HAVE_CUDA)
  if (pinned_) {
    try {
      cuda::snapshot_wait_host();
      cuda::pinned_free(host_);
    } catch (const std::exception&) {
      // at exit after a device error: the memory goes with the process
    }
    host_ = nullptr;
    return;
  }
#endif
  std::free(host_);
  host_ = nullptr;
}

void CheckpointSnapshot::ensure(size_t bytes, Device device) {
  if (host_ && capacity_ >= bytes) return;
  release();
  capacity_ = 0;
  pinned_ = false;
#if defined(MEGATRAIN_HAVE_CUDA)
  if (device == Device::CUDA) {
    host_ = cuda::pinned_alloc(bytes);
    pinned_ = true;
  }
#endif
  if (!host_) {
    (void)device;
    host_ = std::aligned_alloc(kAlign, aligned(bytes ? bytes : 1));
    MT_CHECK(host_, "checkpoint.async_save: cannot allocate ", bytes / 1073741824.0,
             " GiB of host memory for the checkpoint snapshot; free host memory or set checkpoint.async_save: false");
  }
  capacity_ = bytes;
}

size_t CheckpointSnapshot::reserve(ParamStore& store, const AdamW& opt, const ParallelState& ps,
                                   const std::vector<StateBuffer>& buffers) {
  // The sizes only (gathering the state here would cost a whole save's device-to-host traffic at start-up); the
  // buffers are page-locked when the model is on a GPU.
  const std::vector<SavedBox> boxes = saved_boxes(store, opt, ps, nullptr, buffers, /*shapes_only=*/true);
  ensure(total_bytes(boxes), store.flat_values().device());
  return capacity_;
}

ckpt::SaveRequest CheckpointSnapshot::take(const std::string& dir, int64_t iteration, int keep_last, ParamStore& store,
                                           const AdamW& opt, const ParallelState& ps, const nlohmann::json& state,
                                           const std::string& config_yaml, const std::vector<StateBuffer>& buffers) {
  ckpt::SaveRequest req{.dir = dir, .iteration = iteration, .keep_last = keep_last, .tensors = {}, .state = state,
                        .config_yaml = config_yaml, .wait_ready = {}};
  // The previous snapshot's copies are done (its save was finished), so its kept tensors can go.
  keep_.clear();
  std::vector<SavedBox> boxes = saved_boxes(store, opt, ps, &keep_, buffers);
  const Device device = device_of(boxes);
  ensure(total_bytes(boxes), device);
  const bool gpu = device != Device::CPU;
#if defined(MEGATRAIN_HAVE_CUDA)
  cuda::SideStreamScope side_stream(cuda::SideStreamScope::kSnapshot, gpu);
#endif
  // The master weights held as halves (SavedBox::lo): joined on the device a piece at a time into one buffer, each
  // piece copied out on the side stream before the next overwrites it (the stream orders them), kept until the next
  // take(); on the CPU, joined straight into the host buffer.
  int64_t join_rows = 0;
  for (const SavedBox& b : boxes)
    if (b.lo.defined() && b.source.device() != Device::CPU) join_rows = std::max(join_rows, b.source.numel());
  const Tensor join_buf = join_rows ? Tensor::empty({std::min(kJoinPiece, join_rows)}, DType::F32, device) : Tensor();
  size_t pos = 0;
  for (SavedBox& b : boxes) {
    const bool on_host = b.source.device() == Device::CPU;
    MT_INTERNAL_ASSERT(on_host || b.source.device() == device, "checkpoint tensor '", b.name, "' on another device");
    void* dst = static_cast<char*>(host_) + pos;
    const size_t n = saved_bytes(b);
    const DType dtype = b.lo.defined() ? DType::F32 : b.source.dtype();
    if (b.lo.defined()) {
      if (on_host) {
        const int64_t count = b.source.numel();
        Tensor out = Tensor::from_blob(dst, {count}, DType::F32);
        ops::join_master(out, b.source.view({count}), b.lo.view({count}));
      }
#if defined(MEGATRAIN_HAVE_CUDA)
      if (!on_host)  // joined and copied out on the side stream (snapshot_begin)
        join_box_pieces(b, join_buf, [&](int64_t i, const Tensor& piece) {
          cuda::snapshot_copy(static_cast<float*>(dst) + i, piece.raw(), piece.nbytes());
        });
#endif
    } else if (n) {
#if defined(MEGATRAIN_HAVE_CUDA)
      if (!on_host) cuda::snapshot_copy(dst, b.source.raw(), n);
#endif
      if (on_host) std::memcpy(dst, b.source.raw(), n);
    }
    ckpt::ShardTensor st;
    st.name = std::move(b.name);
    st.global_shape = std::move(b.global_shape);
    st.offset = std::move(b.offset);
    st.owner = true;
    st.data = Tensor::from_blob(dst, b.source.shape(), dtype);
    req.tensors.push_back(std::move(st));
    pos += aligned(n);
  }
#if defined(MEGATRAIN_HAVE_CUDA)
  if (gpu) {
    side_stream.end();
    in_flight_ = true;
    req.wait_ready = [] { cuda::snapshot_wait_host(); };
  }
#endif
  if (join_buf.defined()) keep_.push_back(join_buf);
  if (!gpu) keep_.clear();  // copied already
  std::erase_if(keep_, [](const Tensor& t) { return t.device() == Device::CPU; });  // so were the boxes in host memory
  return req;
}

void CheckpointSnapshot::before_update() {
  if (!in_flight_) return;
#if defined(MEGATRAIN_HAVE_CUDA)
  cuda::snapshot_wait_on_compute();
#endif
  in_flight_ = false;
}

}  // namespace mt
