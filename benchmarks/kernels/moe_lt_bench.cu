// Standalone timing of the expert GEMMs' possible cuBLAS paths at the MoE benchmark configs' shapes (one H100,
// bf16 operands, fp32 compute; the weight gradient in fp32 with beta 1, as the layer's). Not part of the build:
//   nvcc -O2 -std=c++17 -arch=sm_90 benchmarks/kernels/moe_lt_bench.cu -lcublasLt -lcublas -o moe_lt_bench
// Per product (fwd, dx, dW) of each projection, B experts of R rows each (the padded layout's equal regions):
//   batchedEx   cublasGemmStridedBatchedEx (the layer's padded path at the time of writing)
//   ptrBatchEx  cublasGemmBatchedEx on pointer arrays (the layer's path for unevenly spaced regions)
//   gemmEx x B  one cublasGemmEx per expert (the layer's per-group path)
//   lt-strided  cuBLASLt strided batch, heuristic's first algorithm / the fastest of its first 16 (timed)
//   lt-ptr      cuBLASLt pointer-array batch mode, heuristic's first
//   lt x B      one cuBLASLt call per expert, heuristic's first for R rows
//   dense       one cuBLASLt GEMM of B*R rows (fwd / dx) or k = B*R (dW): the dense linears' efficiency ceiling
// Then reuse: the fastest strided algorithm chosen at R rows applied at R-128 ... R/2 rows (cublasLtMatmulAlgoCheck
// and timing), to see whether one choice per row bucket serves every row count in it.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); std::exit(1); } } while (0)
#define BK(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { std::printf("cuBLAS %d at %d\n", int(s_), __LINE__); std::exit(1); } } while (0)

// Random operands (zeros would draw less power and run at higher clocks than training data).
__global__ void fill_bf16(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned x = unsigned(i) * 2654435761u ^ seed;
    x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15;
    p[i] = __float2bfloat16((float(x & 0xffff) / 65536.f - 0.5f) * 0.1f);
  }
}

static cublasHandle_t h;
static cublasLtHandle_t lt;
static void* ws;
static const size_t kWs = size_t(32) << 20;

template <class F>
float time_ms(F f, int reps = 20) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a));
  for (int i = 0; i < reps; ++i) f();
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  return ms / reps;
}

// Column-major problem: C(m, n) = op(A) op(B), batch of `batch` with strides.
struct Prob {
  cublasOperation_t ta, tb;
  int m, n, k, lda, ldb, ldc;
  long long sa, sb, sc;
  cudaDataType_t ct;
  float beta;
};

struct LtPlan {
  cublasLtMatmulDesc_t d;
  cublasLtMatrixLayout_t a, b, c;
  std::vector<cublasLtMatmulHeuristicResult_t> res;
};

static LtPlan lt_plan(const Prob& p, int batch, bool ptr_mode, int want) {
  LtPlan q{};
  BK(cublasLtMatmulDescCreate(&q.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  BK(cublasLtMatmulDescSetAttribute(q.d, CUBLASLT_MATMUL_DESC_TRANSA, &p.ta, sizeof p.ta));
  BK(cublasLtMatmulDescSetAttribute(q.d, CUBLASLT_MATMUL_DESC_TRANSB, &p.tb, sizeof p.tb));
  const bool TA = p.ta == CUBLAS_OP_T, TB = p.tb == CUBLAS_OP_T;
  BK(cublasLtMatrixLayoutCreate(&q.a, CUDA_R_16BF, TA ? p.k : p.m, TA ? p.m : p.k, p.lda));
  BK(cublasLtMatrixLayoutCreate(&q.b, CUDA_R_16BF, TB ? p.n : p.k, TB ? p.k : p.n, p.ldb));
  BK(cublasLtMatrixLayoutCreate(&q.c, p.ct, p.m, p.n, p.ldc));
  if (batch > 1) {
    cublasLtMatrixLayout_t ls[3] = {q.a, q.b, q.c};
    long long st[3] = {p.sa, p.sb, p.sc};
    for (int i = 0; i < 3; ++i) {
      BK(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
      if (ptr_mode) {
        int mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
        BK(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof mode));
      } else {
        BK(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &st[i], sizeof st[i]));
      }
    }
  }
  cublasLtMatmulPreference_t pref;
  BK(cublasLtMatmulPreferenceCreate(&pref));
  BK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWs, sizeof kWs));
  q.res.resize(want);
  int found = 0;
  cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt, q.d, q.a, q.b, q.c, q.c, pref, want, q.res.data(), &found);
  if (s != CUBLAS_STATUS_SUCCESS) found = 0;
  q.res.resize(found);
  cublasLtMatmulPreferenceDestroy(pref);
  return q;
}

static void lt_run(const LtPlan& q, const cublasLtMatmulAlgo_t* algo, const Prob& p, const void* A, const void* B,
                   void* C) {
  const float one = 1.f;
  BK(cublasLtMatmul(lt, q.d, &one, A, q.a, B, q.b, &p.beta, C, q.c, C, q.c, algo, ws, kWs, 0));
}

static int tile_id(const cublasLtMatmulAlgo_t& a) {
  int tile = -1;
  size_t w = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
  return tile;
}

int main() {
  BK(cublasCreate(&h));
  BK(cublasLtCreate(&lt));
  CK(cudaMalloc(&ws, kWs));
  BK(cublasSetWorkspace(h, ws, kWs));
  struct Cfg { const char* name; int B, R, IC, OC; };
  const Cfg cfgs[] = {{"8x fc1", 8, 4096, 1024, 7168}, {"8x fc2", 8, 4096, 3584, 1024},
                      {"64x fc1", 64, 2048, 1024, 1024}, {"64x fc2", 64, 2048, 512, 1024},
                      {"64x fc1 R1920", 63, 1920, 1024, 1024}, {"8x fc1 R3072", 8, 3072, 1024, 7168}};
  size_t maxel = 0;
  for (auto& c : cfgs) maxel = std::max(maxel, size_t(c.B) * c.R * std::max(c.IC, c.OC) + size_t(c.B) * c.IC * c.OC);
  void *X, *Y, *W, *DW, *Z;
  CK(cudaMalloc(&X, maxel * 2));
  CK(cudaMalloc(&Y, maxel * 2));
  CK(cudaMalloc(&W, maxel * 2));
  CK(cudaMalloc(&DW, maxel * 4));
  CK(cudaMalloc(&Z, maxel * 2));
  fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(X), maxel, 1);
  fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(Y), maxel, 2);
  fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(W), maxel, 3);
  CK(cudaMemset(DW, 0, maxel * 4));
  void** ptrs;
  CK(cudaMalloc(&ptrs, 3 * 256 * sizeof(void*)));
  for (const Cfg& c : cfgs) {
    const long long RI = 1LL * c.R * c.IC, RO = 1LL * c.R * c.OC, W1 = 1LL * c.IC * c.OC;
    // fwd: out^T(OC,R) = W(op T, stored (IC,OC)) x^T(IC,R); dx: dx^T(IC,R) = W(IC,OC) dout^T(OC,R);
    // dW: dW^T(IC,OC) += x^T(IC,R) dout(op T, stored (OC,R))
    const Prob probs[3] = {{CUBLAS_OP_T, CUBLAS_OP_N, c.OC, c.R, c.IC, c.IC, c.IC, c.OC, W1, RI, RO, CUDA_R_16BF, 0.f},
                           {CUBLAS_OP_N, CUBLAS_OP_N, c.IC, c.R, c.OC, c.IC, c.OC, c.IC, W1, RO, RI, CUDA_R_16BF, 0.f},
                           {CUBLAS_OP_N, CUBLAS_OP_T, c.IC, c.OC, c.R, c.IC, c.OC, c.IC, RI, RO, W1, CUDA_R_32F, 1.f}};
    const char* pn[3] = {"fwd", "dx", "dW"};
    for (int pi = 0; pi < 3; ++pi) {
      const Prob& p = probs[pi];
      // operand bases: fwd A=W B=X C=Z; dx A=W B=Y C=Z; dW A=X B=Y C=DW
      const void* A = pi == 2 ? X : W;
      const void* Bm = pi == 0 ? X : Y;
      void* C = pi == 0 ? Z : pi == 1 ? Z : DW;  // outputs apart from the inputs
      const size_t cb = p.ct == CUDA_R_32F ? 4 : 2;
      const double fl = 2.0 * c.B * c.R * c.IC * c.OC;
      auto line = [&](const char* what, float ms, int tile = -1) {
        std::printf("LTB %-14s %-3s %-22s %8.3f ms %7.1f TFLOP/s", c.name, pn[pi], what, ms, fl / ms * 1e-9);
        if (tile >= 0) std::printf("  tile %d", tile);
        std::printf("\n");
      };
      const float one = 1.f;
      line("batchedEx", time_ms([&] {
             BK(cublasGemmStridedBatchedEx(h, p.ta, p.tb, p.m, p.n, p.k, &one, A, CUDA_R_16BF, p.lda, p.sa, Bm,
                                           CUDA_R_16BF, p.ldb, p.sb, &p.beta, C, p.ct, p.ldc, p.sc, c.B,
                                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
           }));
      std::vector<const void*> hp(3 * c.B);
      for (int e = 0; e < c.B; ++e) {
        hp[e] = static_cast<const char*>(A) + e * p.sa * 2;
        hp[c.B + e] = static_cast<const char*>(Bm) + e * p.sb * 2;
        hp[2 * c.B + e] = static_cast<const char*>(C) + e * p.sc * cb;
      }
      CK(cudaMemcpy(ptrs, hp.data(), hp.size() * sizeof(void*), cudaMemcpyHostToDevice));
      line("ptrBatchEx", time_ms([&] {
             BK(cublasGemmBatchedEx(h, p.ta, p.tb, p.m, p.n, p.k, &one, (const void* const*)ptrs, CUDA_R_16BF, p.lda,
                                    (const void* const*)(ptrs + c.B), CUDA_R_16BF, p.ldb, &p.beta, ptrs + 2 * c.B, p.ct,
                                    p.ldc, c.B, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
           }));
      line("gemmEx x B", time_ms([&] {
             for (int e = 0; e < c.B; ++e)
               BK(cublasGemmEx(h, p.ta, p.tb, p.m, p.n, p.k, &one, hp[e], CUDA_R_16BF, p.lda, hp[c.B + e],
                               CUDA_R_16BF, p.ldb, &p.beta, const_cast<void*>(hp[2 * c.B + e]), p.ct, p.ldc,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
           }));
      LtPlan s = lt_plan(p, c.B, false, 16);
      int best = -1;
      float best_ms = 1e30f;
      if (s.res.empty()) std::printf("LTB %-14s %-3s lt-strided: no algorithm\n", c.name, pn[pi]);
      for (size_t i = 0; i < s.res.size(); ++i) {
        const float ms = time_ms([&] { lt_run(s, &s.res[i].algo, p, A, Bm, C); }, 10);
        if (i == 0) line("lt-strided heur#0", ms, tile_id(s.res[0].algo));
        if (ms < best_ms) best_ms = ms, best = int(i);
      }
      if (best >= 0) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "lt-strided best(#%d/%zu)", best, s.res.size());
        line(buf, time_ms([&] { lt_run(s, &s.res[best].algo, p, A, Bm, C); }), tile_id(s.res[best].algo));
      }
      LtPlan pa = lt_plan(p, c.B, true, 1);
      if (!pa.res.empty())
        line("lt-ptr heur#0", time_ms([&] { lt_run(pa, &pa.res[0].algo, p, (const void*)ptrs, (const void*)(ptrs + c.B), ptrs + 2 * c.B); }),
             tile_id(pa.res[0].algo));
      else
        std::printf("LTB %-14s %-3s lt-ptr: no algorithm\n", c.name, pn[pi]);
      LtPlan one_e = lt_plan(p, 1, false, 1);
      if (!one_e.res.empty())
        line("lt x B heur#0", time_ms([&] {
               for (int e = 0; e < c.B; ++e) lt_run(one_e, &one_e.res[0].algo, p, hp[e], hp[c.B + e], const_cast<void*>(hp[2 * c.B + e]));
             }));
      Prob d = p;
      if (pi < 2) d.n = p.n * c.B; else d.k = p.k * c.B;
      LtPlan dn = lt_plan(d, 1, false, 16);
      if (!dn.res.empty()) {
        line("dense heur#0", time_ms([&] { lt_run(dn, &dn.res[0].algo, d, A, Bm, C); }), tile_id(dn.res[0].algo));
        float bm = 1e30f;
        for (auto& r : dn.res) bm = std::min(bm, time_ms([&] { lt_run(dn, &r.algo, d, A, Bm, C); }, 10));
        line("dense best-of-16", bm);
      }
      // reuse of the strided choice at fewer rows (the same bucket)
      if (best >= 0) {
        for (int dr : {128, 512, c.R / 2}) {
          Prob q = p;
          if (pi < 2) q.n = p.n - dr; else q.k = p.k - dr;
          LtPlan s2 = lt_plan(q, c.B, false, 1);
          cublasLtMatmulHeuristicResult_t chk{};
          const cublasStatus_t st = cublasLtMatmulAlgoCheck(lt, s2.d, s2.a, s2.b, s2.c, s2.c, &s.res[best].algo, &chk);
          char buf[80];
          if (st == CUBLAS_STATUS_SUCCESS) {
            std::snprintf(buf, sizeof buf, "R-%d reuse best", dr);
            const double f2 = fl * (c.R - dr) / c.R;
            const float ms = time_ms([&] { lt_run(s2, &s.res[best].algo, q, A, Bm, C); });
            std::printf("LTB %-14s %-3s %-22s %8.3f ms %7.1f TFLOP/s\n", c.name, pn[pi], buf, ms, f2 / ms * 1e-9);
          } else {
            std::printf("LTB %-14s %-3s R-%d reuse: AlgoCheck status %d\n", c.name, pn[pi], dr, int(st));
          }
          if (!s2.res.empty()) {
            const double f2 = fl * (c.R - dr) / c.R;
            const float ms = time_ms([&] { lt_run(s2, &s2.res[0].algo, q, A, Bm, C); });
            std::snprintf(buf, sizeof buf, "R-%d own heur#0", dr);
            std::printf("LTB %-14s %-3s %-22s %8.3f ms %7.1f TFLOP/s\n", c.name, pn[pi], buf, ms, f2 / ms * 1e-9);
          }
        }
      }
    }
  }
  CK(cudaDeviceSynchronize());
  std::printf("LTB done\n");
  return 0;
}
