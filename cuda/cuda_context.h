// The CUDA backend's context: the stream every op launches on, the cuBLASLt handle with its
// workspace, and the device properties the launchers size their grids from. Created lazily, once per
// process, on the device current at first use (mt::cuda::initialize selects it). Only cuda/ uses
// it; model code never sees a stream or a handle.
//
// The stream is a blocking stream (cudaStreamDefault), so it stays ordered with the legacy default stream that
// Tensor::copy_from's cudaMemcpy uses: host code reading a result through copy_from always sees the finished op.
// Its priority is one level above the default priority of the side streams (runtime/cuda/cuda_runtime.h: the
// optimizer update beside the forward, the snapshot copies), below NCCL's (the greatest).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace mt::cuda {

struct Context {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;  // cuBLASLt workspace
  size_t workspace_bytes = 0;
  int sm_count = 0;
  size_t smem_optin = 0;  // largest dynamic shared memory a block may opt into
};

inline constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;

// The process's context (created on first call).
Context& context();
// The stream ops launch on.
inline cudaStream_t current_stream() { return context().stream; }
// Replaces the stream ops launch on (nullptr restores the context's own); the caller keeps ownership.
void set_current_stream(cudaStream_t stream);

}  // namespace mt::cuda
