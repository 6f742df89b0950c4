// The master weights of bf16 parameters between their fp32 form and their two 16-bit halves (core/master_halves.h):
// split when the optimizer takes the master weights from the parameter store (after initialization or a checkpoint
// load), join when a checkpoint saves them. Memory-bound, off the training step: one element a thread per stride.
#include "core/master_halves.h"
#include "cuda/cuda_ops.h"
#include "cuda/kernel_utils.cuh"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {

constexpr int kThreads = 256;

__global__ void split_master_kernel(uint16_t* hi, uint16_t* lo, const float* master, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint32_t u = float_bits(master[i]);
    hi[i] = master_halves::high_half(u);
    if (lo) lo[i] = master_halves::low_half(u);
  }
}

__global__ void join_master_kernel(float* master, const uint16_t* hi, const uint16_t* lo, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    master[i] = master_halves::join(hi[i], lo[i]);
}

}  // namespace

void split_master_cuda(uint16_t* hi, uint16_t* lo, const float* master, int64_t n) {
  if (n <= 0) return;
  split_master_kernel<<<grid_for(n, kThreads), kThreads, 0, current_stream()>>>(hi, lo, master, n);
  MT_CUDA_CHECK_LAUNCH("split_master_cuda");
}

void join_master_cuda(float* master, const uint16_t* hi, const uint16_t* lo, int64_t n) {
  if (n <= 0) return;
  join_master_kernel<<<grid_for(n, kThreads), kThreads, 0, current_stream()>>>(master, hi, lo, n);
  MT_CUDA_CHECK_LAUNCH("join_master_cuda");
}

}  // namespace mt::ops::cuda
