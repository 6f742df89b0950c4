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

}  // namespace mt::cuda
