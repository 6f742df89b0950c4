// Batched GEMMs through cuBLASLt (the padded MoE layout's expert GEMMs: cuda/moe_gemm.cu), the heuristic's algorithm
// cached per exact shape and batch count. Column-major, as cublasGemm{Strided,}BatchedEx: for i < batch,
//   C_i = op(A_i) (m, k) x op(B_i) (k, n) + beta C_i      fp32 compute (CUBLAS_COMPUTE_32F, no TF32)
// Strided (ptrs null): A_i = A + i sa, and so on (strides in elements). Pointer arrays: ptrs is a device array
// [A_0 .. A_{b-1}, B_0 .., C_0 ..] (3 x batch).
#pragma once

#include <cublas_v2.h>

#include <cstdint>

namespace mt::ops::cuda {

struct BatchedGemm {
  cublasOperation_t opa, opb;
  int64_t m, n, k;
  const void* A;
  int64_t lda, sa;
  const void* B;
  int64_t ldb, sb;
  void* C;
  int64_t ldc, sc;
  void* const* ptrs;  // null: strided
  float beta;
  int batch;
  cudaDataType_t ab_type, c_type;
  int align;  // the smallest alignment (bytes, <= 16) of every matrix's address
};

// Runs g on the current stream. False (nothing run) when cuBLASLt has no algorithm for it: the caller falls back.
bool batched_gemm_lt(const BatchedGemm& g);

}  // namespace mt::ops::cuda
