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

#include "cuda/cublaslt_plan.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_context.h"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {

// opa, opb, m, n, k, lda, ldb, ldc, sa, sb, sc, ab type, c type, pointer arrays, alignment, beta != 0, batch
using Key = std::array<int64_t, 17>;

// usable false: cuBLASLt has no algorithm (the caller falls back).
LtPlan make_plan(const BatchedGemm& g) {
  LtPlan p = lt_plan(g.opa, g.opb);
  lt_set_layouts(p, g.opa, g.opb, g.m, g.n, g.k, g.ab_type, g.lda, g.ab_type, g.ldb, g.c_type, g.ldc);
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
  const auto al = static_cast<uint32_t>(g.align);
  lt_choose_algorithm(p, al, al, al);
  return p;
}

}  // namespace

bool batched_gemm_lt(const BatchedGemm& g) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return true;
  static std::mutex mu;
  static std::map<Key, LtPlan> plans;
  const Key key = {int64_t(g.opa), int64_t(g.opb), g.m,     g.n,   g.k,        g.lda,     g.ldb,   g.ldc, g.sa,
                   g.sb,           g.sc,           int64_t(g.ab_type), int64_t(g.c_type), g.ptrs != nullptr,
                   g.align,        g.beta != 0.f,  g.batch};
  LtPlan plan;
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
