// CUDA runtime glue: device discovery and the caching allocator.
//
// Caching allocator: sizes are rounded up (512 B granules below 1 MiB, 2 MiB granules above) and
// freed blocks are kept in per-size free lists for reuse, so that after the first training step no
// cudaMalloc/cudaFree happens. A request of 1 MiB or more with no free block of its exact size takes
// the smallest free block of at most 1/8 more (kReuseSlack) before calling cudaMalloc: buffers whose
// size follows the data (the MoE layer's padded rows change with the routing every layer and step)
// then reuse a few blocks instead of growing one free list per size until the device is full and the
// whole cache is released (which stalled the moe-8x-top2 steps by 20-50 ms every 3-6 iterations).
// Sizes that repeat (every dense buffer after the first step) always find their exact size first.
// Blocks keep their own size (live_: pointer -> block bytes); `allocated` counts block bytes.
// On out-of-memory the cache is released and the allocation retried once; if it still fails, the
// error names the request, the free and total memory, and what the allocator holds.
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/cuda_context.h"
#include "runtime/cuda/cuda_runtime.h"
#include "tensor/tensor.h"

namespace mt::cuda {

namespace {

size_t round_size(size_t bytes) {
  const size_t small = 512, large = 2u << 20;
  if (bytes < (1u << 20)) return (bytes + small - 1) / small * small;
  return (bytes + large - 1) / large * large;
}

class CachingAllocator final : public Allocator {
 public:
  static constexpr size_t kReuseMin = size_t(1) << 20, kReuseSlack = 8;  // blocks >= 1 MiB: up to size + size/8

  void* allocate(size_t bytes) override {
    size_t size = round_size(bytes == 0 ? 1 : bytes);
    std::lock_guard<std::mutex> lock(mu_);
    void* p = nullptr;
    auto it = free_.find(size);
    if ((it == free_.end() || it->second.empty()) && size >= kReuseMin) {
      // the smallest non-empty free list of at most size + size/8
      for (it = free_.upper_bound(size); it != free_.end() && it->first <= size + size / kReuseSlack; ++it)
        if (!it->second.empty()) break;
      if (it != free_.end() && it->first > size + size / kReuseSlack) it = free_.end();
    }
    if (it != free_.end() && !it->second.empty()) {
      size = it->first;
      p = it->second.back();
      it->second.pop_back();
    } else {
      p = cuda_malloc(size);
    }
    if (size >= kReuseMin) live_[p] = size;
    stats_.allocated += size;
    if (stats_.allocated > stats_.peak_allocated) stats_.peak_allocated = stats_.allocated;
    return p;
  }
  void deallocate(void* ptr, size_t bytes) override {
    size_t size = round_size(bytes == 0 ? 1 : bytes);
    std::lock_guard<std::mutex> lock(mu_);
    if (size >= kReuseMin) {  // the block's own size (it may be larger than this request's)
      auto it = live_.find(ptr);
      if (it != live_.end()) {
        size = it->second;
        live_.erase(it);
      }
    }
    free_[size].push_back(ptr);
    stats_.allocated -= size;
  }
  AllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_allocated = stats_.allocated;
  }
  void release_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    release_locked();
  }

 private:
  void release_locked() {
    for (auto& [size, list] : free_) {
      for (void* p : list) {
        cudaFree(p);
        stats_.reserved -= size;
      }
      list.clear();
    }
  }
  void* cuda_malloc(size_t size) {
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      release_locked();
      e = cudaMalloc(&p, size);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      MT_CHECK(false, "CUDA out of memory: asked for ", size / 1048576.0, " MiB; the GPU has ", free_b / 1048576.0,
               " MiB free of ", total_b / 1048576.0, " MiB; megatrain holds ", stats_.reserved / 1048576.0,
               " MiB (", stats_.allocated / 1048576.0, " MiB in use). Run 'megatrain plan' for the estimate of "
               "this layout, and lower training.micro_batch_size or enable training.recompute");
    }
    stats_.reserved += size;
    ++stats_.num_cuda_mallocs;
    return p;
  }

  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
  std::unordered_map<void*, size_t> live_;  // blocks >= kReuseMin in use -> their size
  AllocatorStats stats_;
};

CachingAllocator* g_allocator = nullptr;

void copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  cudaMemcpyKind kind = cudaMemcpyDefault;
  if (dst_dev == Device::CPU && src_dev == Device::CPU) kind = cudaMemcpyHostToHost;
  MT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind));
}

void zero(void* dst, size_t bytes) { MT_CUDA_CHECK(cudaMemset(dst, 0, bytes)); }

// Staging for PendingRead and upload: a page-locked buffer and an event each, reused (cudaMallocHost costs
// milliseconds).
struct StagingSlot {
  void* host = nullptr;
  size_t capacity = 0;
  cudaEvent_t done = nullptr;
};
std::mutex g_staging_mu;  // both users' slots (the read free list, the upload ring)
std::vector<StagingSlot*> g_read_free;     // never freed: a few per process
std::vector<StagingSlot*> g_upload_slots;  // upload's, reused in turn once their copy is done

StagingSlot* slot_of(StagingSlot* s, size_t bytes) {
  if (!s) {
    s = new StagingSlot;
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming));
  }
  if (s->capacity < bytes) {
    if (s->host) MT_CUDA_CHECK(cudaFreeHost(s->host));
    s->capacity = std::max<size_t>(bytes, 4096);
    MT_CUDA_CHECK(cudaMallocHost(&s->host, s->capacity));
  }
  return s;
}

void* read_start(const void* src, size_t bytes) {
  StagingSlot* s = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_staging_mu);
    if (!g_read_free.empty()) {
      s = g_read_free.back();
      g_read_free.pop_back();
    }
  }
  s = slot_of(s, bytes);
  MT_CUDA_CHECK(cudaMemcpyAsync(s->host, src, bytes, cudaMemcpyDeviceToHost, current_stream()));
  MT_CUDA_CHECK(cudaEventRecord(s->done, current_stream()));
  return s;
}

void read_finish(void* handle, void* dst, size_t bytes) {
  auto* s = static_cast<StagingSlot*>(handle);
  MT_CUDA_CHECK(cudaEventSynchronize(s->done));
  std::memcpy(dst, s->host, bytes);
  std::lock_guard<std::mutex> lock(g_staging_mu);
  g_read_free.push_back(s);
}

// Through one of kUploadSlots staging buffers in turn; a slot is refilled only after its last copy is done (long
// done by then: a step's uploads are a few).
void upload(void* dst, const void* src, size_t bytes) {
  constexpr size_t kUploadSlots = 8;
  static size_t next = 0;
  std::lock_guard<std::mutex> lock(g_staging_mu);
  if (g_upload_slots.empty()) g_upload_slots.assign(kUploadSlots, nullptr);
  StagingSlot*& s = g_upload_slots[next++ % kUploadSlots];
  if (s) MT_CUDA_CHECK(cudaEventSynchronize(s->done));
  s = slot_of(s, bytes);
  std::memcpy(s->host, src, bytes);
  MT_CUDA_CHECK(cudaMemcpyAsync(dst, s->host, bytes, cudaMemcpyHostToDevice, current_stream()));
  MT_CUDA_CHECK(cudaEventRecord(s->done, current_stream()));
}

}  // namespace

int device_count(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = cudaGetErrorString(e);
    cudaGetLastError();
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device found";
  return n;
}

std::string device_description() {
  int dev = 0;
  MT_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  MT_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s, sm_%d%d, %.1f GiB, %d SMs", p.name, p.major, p.minor,
                p.totalGlobalMem / 1073741824.0, p.multiProcessorCount);
  return buf;
}

std::string library_versions() {
  int rt = 0, drv = 0, nccl = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  ncclGetVersion(&nccl);
  char buf[256];
  std::snprintf(buf, sizeof buf, "CUDA runtime %d.%d, driver %d.%d, cuDNN %zu, NCCL %d", rt / 1000, (rt % 1000) / 10,
                drv / 1000, (drv % 1000) / 10, cudnnGetVersion(), nccl);
  return buf;
}

void initialize(int device) {
  MT_CUDA_CHECK(cudaSetDevice(device));
  if (!g_allocator) g_allocator = new CachingAllocator();  // lives for the process
  set_allocator(Device::CUDA, g_allocator);
  set_device_copy(copy);
  set_device_zero(zero);
  set_device_read(read_start, read_finish);
  set_device_upload(upload);
}

AllocatorStats allocator_stats() { return g_allocator ? g_allocator->stats() : AllocatorStats{}; }
void reset_peak_allocated() {
  if (g_allocator) g_allocator->reset_peak();
}
void empty_cache() {
  if (g_allocator) g_allocator->release_cache();
}
bool device_memory(size_t* free_bytes, size_t* total_bytes) {
  if (cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess) return true;
  cudaGetLastError();
  return false;
}

// The snapshot's side stream and its two events, created on first use (on the device current then, the
// one initialize selected). "done" blocks the waiting thread instead of spinning: the checkpoint writer waits
// on it while the training thread needs the CPU.
namespace {
struct SnapshotStream {
  cudaStream_t stream = nullptr, compute = nullptr;
  cudaEvent_t compute_mark = nullptr, done = nullptr;
  bool recorded = false;  // "done" was recorded at least once
  int device = 0;
};
SnapshotStream& snapshot_stream() {
  static SnapshotStream* s = [] {
    auto* p = new SnapshotStream();  // lives for the process, like the context
    MT_CUDA_CHECK(cudaGetDevice(&p->device));
    MT_CUDA_CHECK(cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking));
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&p->compute_mark, cudaEventDisableTiming));
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming | cudaEventBlockingSync));
    return p;
  }();
  return *s;
}
}  // namespace

void* pinned_alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();
    MT_CHECK(false, "checkpoint.async_save: cannot allocate ", bytes / 1073741824.0, " GiB of page-locked host memory ",
             "for the checkpoint snapshot (", cudaGetErrorString(e), "); free host memory or set checkpoint.async_save: false");
  }
  return p;
}

void pinned_free(void* p) {
  if (p) MT_CUDA_CHECK(cudaFreeHost(p));
}

namespace {
struct UpdateStream {
  cudaStream_t stream = nullptr, compute = nullptr;
  cudaEvent_t compute_mark = nullptr;
  std::vector<cudaEvent_t> marks;
};
UpdateStream& update_stream() {
  static UpdateStream* s = [] {
    auto* p = new UpdateStream();  // lives for the process, like the context
    MT_CUDA_CHECK(cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking));
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&p->compute_mark, cudaEventDisableTiming));
    return p;
  }();
  return *s;
}
}  // namespace

void update_begin() {
  UpdateStream& s = update_stream();
  s.compute = current_stream();
  MT_CUDA_CHECK(cudaEventRecord(s.compute_mark, s.compute));
  MT_CUDA_CHECK(cudaStreamWaitEvent(s.stream, s.compute_mark, 0));
  set_current_stream(s.stream);
}

void update_mark(int i) {
  UpdateStream& s = update_stream();
  while (static_cast<int>(s.marks.size()) <= i) {
    cudaEvent_t e = nullptr;
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    s.marks.push_back(e);
  }
  MT_CUDA_CHECK(cudaEventRecord(s.marks[static_cast<size_t>(i)], s.stream));
}

void update_end() { set_current_stream(update_stream().compute); }

void update_wait(int i) {
  UpdateStream& s = update_stream();
  MT_CUDA_CHECK(cudaStreamWaitEvent(current_stream(), s.marks[static_cast<size_t>(i)], 0));
}

void snapshot_begin() {
  SnapshotStream& s = snapshot_stream();
  s.compute = current_stream();
  MT_CUDA_CHECK(cudaEventRecord(s.compute_mark, s.compute));
  MT_CUDA_CHECK(cudaStreamWaitEvent(s.stream, s.compute_mark, 0));
  set_current_stream(s.stream);
}

void snapshot_copy(void* host_dst, const void* device_src, size_t bytes) {
  MT_CUDA_CHECK(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, snapshot_stream().stream));
}

void snapshot_end() {
  SnapshotStream& s = snapshot_stream();
  MT_CUDA_CHECK(cudaEventRecord(s.done, s.stream));
  s.recorded = true;
  set_current_stream(s.compute);
}

SideStreamScope::SideStreamScope(Kind kind, bool on) : kind_(kind), on_(on) {
  if (on_ && kind_ == kSnapshot) snapshot_begin();
  if (on_ && kind_ == kUpdate) update_begin();
}

void SideStreamScope::end() {
  if (!on_) return;
  on_ = false;
  if (kind_ == kSnapshot) snapshot_end();
  else update_end();
}

SideStreamScope::~SideStreamScope() {
  if (on_) set_current_stream(kind_ == kSnapshot ? snapshot_stream().compute : update_stream().compute);
}

void snapshot_wait_on_compute() {
  SnapshotStream& s = snapshot_stream();
  if (s.recorded) MT_CUDA_CHECK(cudaStreamWaitEvent(current_stream(), s.done, 0));
}

void snapshot_wait_host() {
  SnapshotStream& s = snapshot_stream();
  if (!s.recorded) return;
  MT_CUDA_CHECK(cudaSetDevice(s.device));  // the writer thread's device (a new thread starts on device 0)
  MT_CUDA_CHECK(cudaEventSynchronize(s.done));
}

}  // namespace mt::cuda
