// A cuBLASLt matmul set up once and reused for every call of its shape (cuda/gemm.cu, batched_gemm.cu, fp8_gemm.cu):
// the operation descriptor (fp32 compute and scale: no TF32), the layouts of A, B and C (C doubles as D), and the
// heuristic's first algorithm. Column-major, as cuBLAS: op(A) is (m, k), op(B) is (k, n), C is (m, n).
#pragma once

#include <cublasLt.h>

#include <cstdint>

namespace mt::ops::cuda {

struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;                            // the heuristic gave an algorithm
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;  // the heuristic query's
};

// A plan with its descriptor (fp32 compute, op(A) = opa, op(B) = opb); the caller adds its attributes (epilogue,
// bias, scales), then the layouts and the algorithm.
LtPlan lt_plan(cublasOperation_t opa, cublasOperation_t opb);
// The layouts of op(A) (m, k), op(B) (k, n) and C (m, n), each stored with its leading dimension (A and B transposed
// as the descriptor says).
void lt_set_layouts(LtPlan& p, cublasOperation_t opa, cublasOperation_t opb, int64_t m, int64_t n, int64_t k,
                    cudaDataType_t a_type, int64_t lda, cudaDataType_t b_type, int64_t ldb, cudaDataType_t c_type,
                    int64_t ldc);
// The heuristic's first algorithm for the plan within the context's cuBLASLt workspace, for operands whose addresses
// are aligned to align_a, align_b and align_cd bytes (0: not stated, cuBLASLt assumes 256). Sets algo, usable and
// status. fp32_partials: only algorithms that sum split-K partials in the compute type (fp32) or not at all, for a
// 16-bit D whose in-place (output-type) reduction would round every partial (bf16 weight gradients: K = tokens).
void lt_choose_algorithm(LtPlan& p, uint32_t align_a = 0, uint32_t align_b = 0, uint32_t align_cd = 0,
                         bool fp32_partials = false);

}  // namespace mt::ops::cuda
