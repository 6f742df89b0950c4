// Batched GEMMs through cuBLASLt: the heuristic's first answer for each exact shape, batch count and batch mode,
// cached with the call's descriptor and layouts.
//
// Why not cublasGemm{Strided,}BatchedEx: at the padded MoE layout's shapes (moe-64x-top8, 2,010 (rows, batch)
// shapes x 5 products, "[gemm-choice]" bench, session 12, H100) cuBLASLt's choices ran them in 146.1 ms where the
// cuBLAS batched calls took 164.6 ms (-11%, every product). Choosing once per class of shapes instead (rows and batch
// rounded down) cut the first calls' cost (heuristics, kernel loads: 628 -> 263-434 ms over the sweep) but ran
// 8-14% slower than the exact answers, so each shape gets its own (benchmarks/RESULTS.md, session 12).
#include "cuda/batched_gemm.h"

#include <array>
#include <map>
#include <mutex>

#include "cuda/cuda_check.h"
#include "cuda/cuda_context.h"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;  // false: cuBLASLt has no algorithm (the caller falls back)
};

// opa, opb, m, n, k, lda, ldb, ldc, sa, sb, sc, ab type, c type, pointer arrays, alignment, beta != 0, batch
using Key = std::array<int64_t, 17>;

Plan make_plan(const BatchedGemm& g) {
  const Context& ctx = context();
  Plan p;
  MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &g.opa, sizeof g.opa));
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &g.opb, sizeof g.opb));
  const bool ta = g.opa != CUBLAS_OP_N, tb = g.opb != CUBLAS_OP_N;
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, g.ab_type, ta ? g.k : g.m, ta ? g.m : g.k, g.lda));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, g.ab_type, tb ? g.n : g.k, tb ? g.k : g.n, g.ldb));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, g.c_type, g.m, g.n, g.ldc));
  const int32_t batch = g.batch;
  const uint32_t mode = g.ptrs ? CUBLASLT_BATCH_MODE_POINTER_ARRAY : CUBLASLT_BATCH_MODE_STRIDED;
  const std::array<std::pair<cublasLtMatrixLayout_t, int64_t>, 3> ls = {{{p.a, g.sa}, {p.b, g.sb}, {p.c, g.sc}}};
  for (const auto& [l, stride] : ls) {
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof mode));
    if (!g.ptrs)
      MT_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  cublasLtMatmulPreference_t pref = nullptr;
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &ctx.workspace_bytes, sizeof ctx.workspace_bytes));
  const uint32_t al = uint32_t(g.align);
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof al));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(ctx.lt, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  p.usable = st == CUBLAS_STATUS_SUCCESS && found > 0;
  p.algo = result.algo;
  return p;
}

}  // namespace

bool batched_gemm_lt(const BatchedGemm& g) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return true;
  static std::mutex mu;
  static std::map<Key, Plan> plans;
  const Key key = {int64_t(g.opa), int64_t(g.opb), g.m,     g.n,   g.k,        g.lda,     g.ldb,   g.ldc, g.sa,
                   g.sb,           g.sc,           int64_t(g.ab_type), int64_t(g.c_type), g.ptrs != nullptr,
                   g.align,        g.beta != 0.f,  g.batch};
  Plan plan;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = plans.find(key);
    if (it == plans.end()) it = plans.emplace(key, make_plan(g)).first;
    plan = it->second;
  }
  if (!plan.usable) return false;
  const Context& ctx = context();
  const float alpha = 1.f;
  const void* A = g.ptrs ? static_cast<const void*>(g.ptrs) : g.A;
  const void* B = g.ptrs ? static_cast<const void*>(g.ptrs + g.batch) : g.B;
  void* C = g.ptrs ? const_cast<void*>(static_cast<const void*>(g.ptrs + 2 * g.batch)) : g.C;
  MT_CUBLAS_CHECK(cublasLtMatmul(ctx.lt, plan.desc, &alpha, A, plan.a, B, plan.b, &g.beta, C, plan.c, C, plan.c,
                                 &plan.algo, ctx.workspace, ctx.workspace_bytes, current_stream()));
  return true;
}

}  // namespace mt::ops::cuda
