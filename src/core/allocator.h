// Where device memory comes from: one allocator per device, installed by the backend (the CUDA runtime
// installs its caching allocator, src/runtime/cuda/cuda_runtime.cu). Tensor storage and the kernels'
// scratch memory (cuda/kernel_utils.cuh) both take it from here, so neither calls cudaMalloc in a step.
#pragma once

#include <cstddef>

#include "core/dtype.h"

namespace mt {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
};

// The allocator used for new tensors on a device. CPU: aligned malloc; Meta: none (no data).
Allocator* allocator_for(Device d);
void set_allocator(Device d, Allocator* a);  // the CUDA backend installs its caching allocator

}  // namespace mt
