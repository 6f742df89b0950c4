// cuBLASLt plan set-up shared by the GEMM launchers (see cublaslt_plan.h).
#include "cuda/cublaslt_plan.h"

#include "cuda/cuda_check.h"
#include "cuda/cuda_context.h"

namespace mt::ops::cuda {

LtPlan lt_plan(cublasOperation_t opa, cublasOperation_t opb) {
  LtPlan p;
  MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  return p;
}

void lt_set_layouts(LtPlan& p, cublasOperation_t opa, cublasOperation_t opb, int64_t m, int64_t n, int64_t k,
                    cudaDataType_t a_type, int64_t lda, cudaDataType_t b_type, int64_t ldb, cudaDataType_t c_type,
                    int64_t ldc) {
  const bool ta = opa != CUBLAS_OP_N, tb = opb != CUBLAS_OP_N;
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, a_type, ta ? k : m, ta ? m : k, lda));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, b_type, tb ? n : k, tb ? k : n, ldb));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, c_type, m, n, ldc));
}

void lt_choose_algorithm(LtPlan& p, uint32_t align_a, uint32_t align_b, uint32_t align_cd, bool fp32_partials) {
  const ::mt::cuda::Context& ctx = ::mt::cuda::context();
  cublasLtMatmulPreference_t pref = nullptr;
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &ctx.workspace_bytes, sizeof ctx.workspace_bytes));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_cd},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_cd}};
  for (const auto& [attr, bytes] : aligns)
    if (bytes > 0) MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof bytes));
  if (fp32_partials) {
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                                         sizeof schemes));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  p.status = cublasLtMatmulAlgoGetHeuristic(ctx.lt, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  p.usable = p.status == CUBLAS_STATUS_SUCCESS && found > 0;
  p.algo = result.algo;
}

}  // namespace mt::ops::cuda
