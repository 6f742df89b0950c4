// The CUDA runtime side of the backend: device discovery, the caching device allocator (no
// cudaMalloc/cudaFree inside a training step), host<->device copies for Tensor, library versions.
// Plain header (no CUDA types), so .cpp files of src/ can include it.
#pragma once

#include <cstddef>
#include <string>

namespace mt::cuda {

// Number of usable GPUs; 0 (and *why set) when there is no driver or device.
int device_count(std::string* why = nullptr);
// "NVIDIA H100 80GB HBM3, sm_90, 79.1 GiB" for the current device.
std::string device_description();
// Versions of the runtime and libraries this binary was built against / runs with.
std::string library_versions();

// Selects the device and installs the caching allocator and the copy hook for Device::CUDA tensors.
void initialize(int device);

struct AllocatorStats {
  size_t allocated = 0;       // bytes in live tensors
  size_t peak_allocated = 0;  // high-water mark of `allocated`
  size_t reserved = 0;        // bytes held from cudaMalloc (allocated + cached)
  size_t num_cuda_mallocs = 0;
};
AllocatorStats allocator_stats();
void reset_peak_allocated();
// Returns cached blocks to the driver.
void empty_cache();
// Free and total bytes of the current device (cudaMemGetInfo); false when the query fails.
bool device_memory(size_t* free_bytes, size_t* total_bytes);

// checkpoint.async_save's device->host snapshot (train/checkpoint_snapshot.h): page-locked host memory and one
// side stream for the copies, ordered against the compute stream by two events:
//   snapshot_begin   the side stream waits for everything enqueued on the compute stream so far (the optimizer
//                    step that produced the values); kernel launches go to the side stream until snapshot_end
//                    (what a snapshot computes before copying: the master weights joined from their halves);
//   snapshot_copy    a device->pinned-host copy on the side stream (the compute stream runs on meanwhile);
//   snapshot_end     records "copies done"; launches go to the compute stream again;
//   snapshot_wait_on_compute  the compute stream waits (on the device, the host does not block) for "copies
//                    done": called before anything overwrites a snapshot's source;
//   snapshot_wait_host        the calling thread (the checkpoint writer) blocks until "copies done".
// The side stream is non-blocking, so Tensor::copy_from's cudaMemcpy on the legacy stream never waits for it.
void* pinned_alloc(size_t bytes);
void pinned_free(void* p);
void snapshot_begin();
void snapshot_copy(void* host_dst, const void* device_src, size_t bytes);
void snapshot_end();
void snapshot_wait_on_compute();
void snapshot_wait_host();

// The optimizer update's side stream (optim/adamw.h): the update of one step runs there in chunks while the next
// forward starts on the compute stream, which waits for each chunk only where it reads that chunk's parameters.
//   update_begin      the side stream waits for everything enqueued on the compute stream so far (the gradients,
//                     the norm, a snapshot's copies); launches go to the side stream until update_end
//   update_mark(i)    records event i (a pool, grown on demand) on the side stream: the chunks so far
//   update_end        launches go to the compute stream again
//   update_wait(i)    the compute stream waits (on the device) for event i
// Non-blocking (Tensor::copy_from's cudaMemcpy on the legacy stream does not wait for it: whoever reads updated
// parameters first makes the compute stream wait, AdamW::wait_update).
void update_begin();
void update_mark(int i);
void update_end();
void update_wait(int i);

// One of the two scopes above as an object: begun by the constructor (when on); end() ends it as snapshot_end /
// update_end do; a scope left without end() (an exception between) sends launches to the compute stream again in its
// destructor, recording nothing (it cannot fail).
class SideStreamScope {
 public:
  enum Kind { kSnapshot, kUpdate };
  SideStreamScope(Kind kind, bool on);
  ~SideStreamScope();
  void end();
  SideStreamScope(const SideStreamScope&) = delete;
  SideStreamScope& operator=(const SideStreamScope&) = delete;

 private:
  Kind kind_;
  bool on_;
};

}  // namespace mt::cuda
