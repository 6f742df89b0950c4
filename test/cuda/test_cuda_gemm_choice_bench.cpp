// Hidden experiment ("[.bench][gemm-choice]"): how the padded MoE layout's batched GEMMs should choose their cuBLASLt
// algorithm. The same shapes as "[moe-sweep]" (moe-64x-top8: C 1024, F 512; b experts of m rows, m a multiple of
// 128), through cuBLASLt with pointer arrays (strided for b = 1, as cuda/moe_gemm.cu), the algorithm chosen by
// policy MT_GEMM_CHOICE (one policy per process: a kernel loaded by one policy would be warm for the next):
//   exact     the heuristic's answer for each exact (rows, batch)
//   oct-b2    one answer per class: rows rounded down to a power of two, batch rounded down to a power of two
//   quarter-b2 rows rounded down to a quarter octave (their top 3 bits), batch to a power of two
//   oct-q4    rows to a power of two, every batch asked as 4 (one answer for all batch counts)
// Per shape: the first call's wall time (synchronized; heuristic and any kernel load included) and the median of the
// next 3 (events). Lines "CHOICE policy product m b first_ms median_ms"; the summary per product.
#include "catch.h"

#if defined(MEGATRAIN_HAVE_CUDA)
#include <cublasLt.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "cuda/cuda_context.h"
#include "test_cuda_util.h"

using namespace mt;
using namespace mt::gpu_test;

namespace {

#define LT_OK(x) REQUIRE((x) == CUBLAS_STATUS_SUCCESS)

struct Product {
  const char* name;
  cublasOperation_t opa, opb;
  int64_t m, n, k;  // one of n / k is the rows (-1 here)
  int64_t lda, ldb, ldc;
  bool f32_out;
};

int64_t floor_pow2(int64_t x) {
  int64_t p = 1;
  while (p * 2 <= x) p *= 2;
  return p;
}
int64_t floor_quarter(int64_t x) {  // x's top 3 bits
  const int64_t p = floor_pow2(x);
  return p < 4 ? x : x / (p / 4) * (p / 4);
}

struct Layouts {
  cublasLtMatmulDesc_t desc{};
  cublasLtMatrixLayout_t a{}, b{}, c{};
};

Layouts make(const Product& p, int64_t m, int64_t n, int64_t k, int batch, bool ptrs) {
  Layouts L;
  LT_OK(cublasLtMatmulDescCreate(&L.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LT_OK(cublasLtMatmulDescSetAttribute(L.desc, CUBLASLT_MATMUL_DESC_TRANSA, &p.opa, sizeof p.opa));
  LT_OK(cublasLtMatmulDescSetAttribute(L.desc, CUBLASLT_MATMUL_DESC_TRANSB, &p.opb, sizeof p.opb));
  const bool ta = p.opa != CUBLAS_OP_N, tb = p.opb != CUBLAS_OP_N;
  LT_OK(cublasLtMatrixLayoutCreate(&L.a, CUDA_R_16BF, ta ? k : m, ta ? m : k, p.lda));
  LT_OK(cublasLtMatrixLayoutCreate(&L.b, CUDA_R_16BF, tb ? n : k, tb ? k : n, p.ldb));
  LT_OK(cublasLtMatrixLayoutCreate(&L.c, p.f32_out ? CUDA_R_32F : CUDA_R_16BF, m, n, p.ldc));
  const int32_t bc = batch;
  const uint32_t mode = ptrs ? CUBLASLT_BATCH_MODE_POINTER_ARRAY : CUBLASLT_BATCH_MODE_STRIDED;
  const int64_t strides[3] = {p.lda * (ta ? m : k), p.ldb * (tb ? k : n), p.ldc * n};
  int i = 0;
  for (cublasLtMatrixLayout_t l : {L.a, L.b, L.c}) {
    LT_OK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
    LT_OK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof mode));
    if (!ptrs)
      LT_OK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i], sizeof strides[i]));
    ++i;
  }
  return L;
}
void destroy(Layouts& L) {
  cublasLtMatrixLayoutDestroy(L.a), cublasLtMatrixLayoutDestroy(L.b), cublasLtMatrixLayoutDestroy(L.c);
  cublasLtMatmulDescDestroy(L.desc);
}

bool heuristic(const Layouts& L, cublasLtMatmulAlgo_t* algo) {
  const auto& ctx = mt::cuda::context();
  cublasLtMatmulPreference_t pref{};
  LT_OK(cublasLtMatmulPreferenceCreate(&pref));
  LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ctx.workspace_bytes,
                                             sizeof ctx.workspace_bytes));
  cublasLtMatmulHeuristicResult_t r{};
  int found = 0;
  const auto st = cublasLtMatmulAlgoGetHeuristic(ctx.lt, L.desc, L.a, L.b, L.c, L.c, pref, 1, &r, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  *algo = r.algo;
  return true;
}

}  // namespace

TEST_CASE("cuda batched GEMM algorithm choice (one policy per process: MT_GEMM_CHOICE)", "[.bench][gemm-choice]") {
  init();
  const char* env = std::getenv("MT_GEMM_CHOICE");
  const std::string policy = env ? env : "exact";
  REQUIRE((policy == "exact" || policy == "oct-b2" || policy == "quarter-b2" || policy == "oct-q4"));
  const auto& ctx = mt::cuda::context();
  const int64_t E = 64, C = 1024, F = 512, maxb = 13, maxm = 16384;
  const Product products[] = {
      {"fc1_fwd", CUBLAS_OP_T, CUBLAS_OP_N, 2 * F, -1, C, C, C, 2 * F, false},
      {"fc2_fwd", CUBLAS_OP_T, CUBLAS_OP_N, C, -1, F, F, F, C, false},
      {"fc1_dx", CUBLAS_OP_N, CUBLAS_OP_N, C, -1, 2 * F, C, 2 * F, C, false},
      {"fc1_dw", CUBLAS_OP_N, CUBLAS_OP_T, C, 2 * F, -1, C, 2 * F, C, true},
      {"fc2_dw", CUBLAS_OP_N, CUBLAS_OP_T, F, C, -1, F, C, F, true},
  };
  // operands: weights (E, 1024 x 1024 max) bf16, rows (maxb * maxm, 1024) bf16 twice, fp32 gradients (E, 1024 x 1024)
  const Tensor w = to_device(randn64({E, C * C}, 3, 0.02), DType::BF16);
  const Tensor xa = to_device(randn64({maxb * maxm, C}, 1), DType::BF16), xb = to_device(randn64({maxb * maxm, C}, 2), DType::BF16);
  Tensor out = Tensor::empty({maxb * maxm, C}, DType::BF16, Device::CUDA), dw = Tensor::zeros({E, C * C}, DType::F32, Device::CUDA);
  Tensor ptrs = Tensor::empty({3 * maxb}, DType::I64, Device::CUDA);
  std::vector<int64_t> ms;
  for (int64_t m = 128; m <= 8192; m += 128) ms.push_back(m);
  for (int64_t m : {10240, 12288, 16384}) ms.push_back(m);
  std::map<std::array<int64_t, 3>, cublasLtMatmulAlgo_t> classes;  // (product, rows rep, batch rep)
  std::map<std::string, std::array<double, 3>> summary;             // medians, first-call excess, firsts over 1 ms
  int fallbacks = 0;
  for (int64_t b : {1, 2, 3, 5, 8, 13}) {
    for (int64_t m : ms) {
      for (int pi = 0; pi < 5; ++pi) {
        const Product& p = products[pi];
        const int64_t n = p.n < 0 ? m : p.n, k = p.k < 0 ? m : p.k;
        const bool use_ptrs = b > 1;
        // pointer arrays: experts (i * 37 + i * i) % E, rows back to back
        std::vector<const void*> host(size_t(3 * b));
        const bool dwp = p.f32_out;
        for (int64_t i = 0; i < b; ++i) {
          const int64_t e = (i * 37 + i * i) % E;
          const char* wbase = static_cast<const char*>(w.raw()) + e * C * C * 2;
          const char* r0 = static_cast<const char*>(xa.raw()) + i * m * C * 2;
          const char* r1 = static_cast<const char*>(xb.raw()) + i * m * C * 2;
          char* o = static_cast<char*>(out.raw()) + i * m * C * 2;
          char* g = static_cast<char*>(dw.raw()) + e * C * C * 4;
          host[size_t(i)] = dwp ? r0 : wbase;
          host[size_t(b + i)] = r1;
          host[size_t(2 * b + i)] = dwp ? static_cast<void*>(g) : static_cast<void*>(o);
        }
        REQUIRE(cudaMemcpy(ptrs.raw(), host.data(), host.size() * sizeof(void*), cudaMemcpyHostToDevice) == cudaSuccess);
        const int64_t rows_rep = policy == "exact" ? m : policy == "quarter-b2" ? floor_quarter(m) : floor_pow2(m);
        const int64_t b_rep = policy == "exact" ? b : policy == "oct-q4" ? 4 : floor_pow2(b);
        Layouts L = make(p, p.m, n, k, int(b), use_ptrs);
        cublasLtMatmulAlgo_t algo{};
        auto run = [&] {
          const float alpha = 1.f, beta = dwp ? 1.f : 0.f;
          const void* A = use_ptrs ? ptrs.raw() : host[0];
          const void* B = use_ptrs ? static_cast<const void*>(static_cast<const char*>(ptrs.raw()) + b * 8) : host[1];
          void* Cp = use_ptrs ? static_cast<void*>(static_cast<char*>(ptrs.raw()) + 2 * b * 8) : const_cast<void*>(host[2]);
          LT_OK(cublasLtMatmul(ctx.lt, L.desc, &alpha, A, L.a, B, L.b, &beta, Cp, L.c, Cp, L.c, &algo, ctx.workspace,
                               ctx.workspace_bytes, mt::cuda::current_stream()));
        };
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        const auto t0 = std::chrono::steady_clock::now();
        const std::array<int64_t, 3> key = {pi, rows_rep, b_rep * 2 + use_ptrs};
        auto it = classes.find(key);
        if (it == classes.end()) {
          const int64_t rn = p.n < 0 ? rows_rep : n, rk = p.k < 0 ? rows_rep : k;
          Layouts Q = make(p, p.m, rn, rk, int(b_rep), use_ptrs);
          cublasLtMatmulAlgo_t a{};
          REQUIRE(heuristic(Q, &a));
          destroy(Q);
          it = classes.emplace(key, a).first;
        }
        algo = it->second;
        cublasLtMatmulHeuristicResult_t check{};
        if (cublasLtMatmulAlgoCheck(ctx.lt, L.desc, L.a, L.b, L.c, L.c, &algo, &check) != CUBLAS_STATUS_SUCCESS ||
            check.workspaceSize > ctx.workspace_bytes) {
          ++fallbacks;
          REQUIRE(heuristic(L, &algo));
        }
        run();
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        const double first = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        const double med = median_ms(run, 3);
        destroy(L);
        auto& s = summary[p.name];
        s[0] += med, s[1] += first - med, s[2] += first - med > 1.0;
        std::printf("CHOICE %-10s %-8s %6lld %3lld %8.3f %8.3f\n", policy.c_str(), p.name, (long long)m, (long long)b,
                    first, med);
      }
    }
  }
  double total = 0, excess = 0, slow = 0;
  for (const auto& [name, s] : summary) {
    std::printf("CHOICE summary %-10s %-8s medians %8.2f ms, first calls +%7.1f ms, %3.0f over 1 ms\n", policy.c_str(),
                name.c_str(), s[0], s[1], s[2]);
    total += s[0], excess += s[1], slow += s[2];
  }
  std::printf("CHOICE summary %-10s all      medians %8.2f ms, first calls +%7.1f ms, %3.0f over 1 ms; %zu classes, %d fallbacks\n",
              policy.c_str(), total, excess, slow, classes.size(), fallbacks);
}

#endif
