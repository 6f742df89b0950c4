// Checked calls for the CUDA runtime, cuBLAS(Lt), cuDNN and NCCL: each failure throws mt::Error with
// the call's text, file:line and the library's own message. Plain header, usable from .cu files.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include "core/check.h"

#define MT_CUDA_CHECK(call)                                                                              \
  do {                                                                                                   \
    cudaError_t e_ = (call);                                                                             \
    if (e_ != cudaSuccess)                                                                               \
      ::mt::detail::throw_error(::mt::str_cat("CUDA error at ", __FILE__, ":", __LINE__, ": ", #call, ": ", \
                                              cudaGetErrorString(e_)));                                  \
  } while (0)

// After a kernel launch: reports launch errors naming the kernel/op.
#define MT_CUDA_CHECK_LAUNCH(what) MT_CUDA_CHECK_NAMED(cudaGetLastError(), what)
#define MT_CUDA_CHECK_NAMED(call, what)                                                                  \
  do {                                                                                                   \
    cudaError_t e_ = (call);                                                                             \
    if (e_ != cudaSuccess)                                                                               \
      ::mt::detail::throw_error(::mt::str_cat("CUDA error in ", what, " at ", __FILE__, ":", __LINE__, ": ", \
                                              cudaGetErrorString(e_)));                                  \
  } while (0)

#define MT_CUBLAS_CHECK(call)                                                                            \
  do {                                                                                                   \
    cublasStatus_t s_ = (call);                                                                          \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                                     \
      ::mt::detail::throw_error(::mt::str_cat("cuBLAS error at ", __FILE__, ":", __LINE__, ": ", #call, ": ", \
                                              cublasGetStatusString(s_)));                               \
  } while (0)

#define MT_CUDNN_CHECK(call)                                                                             \
  do {                                                                                                   \
    cudnnStatus_t s_ = (call);                                                                           \
    if (s_ != CUDNN_STATUS_SUCCESS)                                                                      \
      ::mt::detail::throw_error(::mt::str_cat("cuDNN error at ", __FILE__, ":", __LINE__, ": ", #call, ": ", \
                                              cudnnGetErrorString(s_)));                                 \
  } while (0)

#define MT_NCCL_CHECK(call)                                                                              \
  do {                                                                                                   \
    ncclResult_t r_ = (call);                                                                            \
    if (r_ != ncclSuccess)                                                                               \
      ::mt::detail::throw_error(::mt::str_cat("NCCL error at ", __FILE__, ":", __LINE__, ": ", #call, ": ", \
                                              ncclGetErrorString(r_)));                                  \
  } while (0)
