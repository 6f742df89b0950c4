// Linear layers on CUDA through cuBLASLt (tensor/cpu/linear.cpp has the math):
//   forward:  out(N, OC) = inp(N, IC) @ W(OC, IC)^T + b(OC) [+ residual(N, OC)]   (bias fused: EPILOGUE_BIAS;
//             the residual is the GEMM's C operand with beta 1, D = out: one rounding, no add pass)
//   backward: dinp(N, IC) = dout(N, OC) @ W            (beta 0, or 1 with GradMode::Accumulate)
//             dW(OC, IC) (fp32) += dout^T @ inp         (beta 1: main grads accumulate; beta 0 for the
//                                                        first write of a step, see ParamStore::zero_grads)
//             db(OC)     (fp32) += column sums of dout  (deterministic two-pass reduction: per-chunk
//                                                        partials, then sum_rows_accumulate)
//             dW and db may be bf16 for 16-bit operands (G = mt::bf16). db: the fp32 sum rounded once. dW, bf16
//             operands: a bf16 C, where cuBLASLt rounds the product to bf16, then (+=) adds C and rounds again
//             (measured: test_cuda_ops.cpp [grad_bf16]); fp16 operands: the fp32 product in a scratch, then
//             added and rounded once (cuBLASLt has no fp16 x fp16 -> bf16 GEMM)
// Row-major onto cuBLAS's column-major: a row-major (r, c) matrix is a column-major (c, r) one, so
//   out^T(OC, N)  = W^T'(op T on the stored (IC, OC)) x inp^T (stored (IC, N))      m=OC n=N  k=IC
//   dinp^T(IC, N) = W (stored (IC, OC)) x dout^T (stored (OC, N))                   m=IC n=N  k=OC
//   dW^T(IC, OC)  = inp^T (stored (IC, N)) x dout (op T on the stored (OC, N))      m=IC n=OC k=N
// bf16 / fp16 operands accumulate in fp32 (CUBLAS_COMPUTE_32F); fp32 operands use CUBLAS_COMPUTE_32F too,
// which is plain fp32 (TF32 off, for parity runs). Matmul descriptors, layouts and the heuristic's
// algorithm are cached per (shape, types, transposes, epilogue, pointer alignment).
#include <algorithm>
#include <array>
#include <map>
#include <mutex>

#include "cuda/cublaslt_plan.h"
#include "cuda/cuda_ops.h"
#include "cuda/kernel_utils.cuh"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {

// ---------------------------------------------------------------- bias gradient: column sums
constexpr int kColThreads = 32, kRowThreads = 8;

// Block (32, 8): thread x owns VEC consecutive columns of a 32*VEC tile, thread y strides over the rows of
// the block's row chunk; the 8 row-partials are added in order y = 0..7. partial: (gridDim.y, C).
template <int VEC, typename D>
__global__ void column_sum_kernel_partials(float* partial, const D* x, int64_t N, int64_t C, int64_t rows_per) {
  __shared__ float red[kRowThreads][kColThreads * VEC];
  const int64_t c = (int64_t(blockIdx.x) * kColThreads + threadIdx.x) * VEC;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per, r1 = min(N, r0 + rows_per);
  float acc[VEC] = {};
  if (c < C) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowThreads) {
      D v[VEC];
      load_vec<VEC>(v, x + r * C + c);
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] += to_float(v[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < VEC; ++k) red[threadIdx.y][threadIdx.x * VEC + k] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      float s = 0.f;
      for (int y = 0; y < kRowThreads; ++y) s += red[y][threadIdx.x * VEC + k];
      partial[int64_t(blockIdx.y) * C + c + k] = s;
    }
  }
}


// out(C) (fp32 or bf16) += sum over rows of x(N, C).
template <typename G, typename D>
void column_sum_accumulate(G* out, const D* x, int64_t N, int64_t C) {
  if (N == 0 || C == 0) return;
  constexpr int kVec = 16 / sizeof(D);
  const bool vec = C % kVec == 0 && aligned(x, 16);
  const int vw = vec ? kVec : 1;
  const int64_t col_blocks = ceil_div(C, int64_t(kColThreads) * vw);
  const int64_t want = std::max<int64_t>(1, int64_t(context().sm_count) * 4 / col_blocks);
  const int64_t rows_per = std::max<int64_t>(64, ceil_div(N, want));
  const int64_t splits = ceil_div(N, rows_per);
  Scratch partial(sizeof(float) * static_cast<size_t>(splits * C));
  cudaStream_t s = current_stream();
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(splits)), block(kColThreads, kRowThreads);
  if (vec)
    column_sum_kernel_partials<kVec><<<grid, block, 0, s>>>(partial.as<float>(), x, N, C, rows_per);
  else
    column_sum_kernel_partials<1><<<grid, block, 0, s>>>(partial.as<float>(), x, N, C, rows_per);
  MT_CUDA_CHECK_LAUNCH("column_sum_kernel_partials");
  sum_rows_accumulate(out, partial.as<float>(), static_cast<int>(splits), C, s);
  MT_CUDA_CHECK_LAUNCH("column_sum sum_rows_accumulate");
}

// ---------------------------------------------------------------- cuBLASLt wrapper
// Column-major D(m, n) = alpha op(A) op(B) + beta C (+ bias(m) per row when bias); D is C, or writes to C while
// reading c_in as the C operand when c_in is set (same layout).
struct GemmArgs {
  bool trans_a, trans_b;
  int64_t m, n, k;
  const void* A;
  int64_t lda;
  const void* B;
  int64_t ldb;
  void* C;
  int64_t ldc;
  cudaDataType_t ab_type, c_type;
  const void* bias;  // m elements of c_type, or null
  float beta;
  // GELU epilogues (bf16, fp16): kGeluAux: D = gelu(acc + bias), aux = acc + bias (the GELU input);
  // kDGelu: D = acc * gelu'(aux). aux is (m, n) column-major with leading dimension aux_ld.
  enum Epilogue { kPlain = 0, kGeluAux = 1, kDGelu = 2 } epilogue = kPlain;
  const void* aux = nullptr;
  int64_t aux_ld = 0;
  const void* c_in = nullptr;
  bool fp32_partials = false;  // split-K partials summed in fp32 (lt_choose_algorithm): bf16 weight gradients
};

using GemmKey = std::array<int64_t, 18>;

// usable false: cuBLASLt has no kernel for this epilogue (the caller falls back).
LtPlan make_plan(const char* what, const GemmArgs& g, const GemmKey& key) {
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  LtPlan p = lt_plan(ta, tb);
  cublasLtEpilogue_t epi = g.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (g.epilogue == GemmArgs::kGeluAux) epi = g.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  if (g.epilogue == GemmArgs::kDGelu) epi = CUBLASLT_EPILOGUE_DGELU;
  if (epi != CUBLASLT_EPILOGUE_DEFAULT)
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (g.bias) {
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &g.c_type,
                                                   sizeof g.c_type));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
  }
  if (g.epilogue != GemmArgs::kPlain) {
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux,
                                                   sizeof g.aux));
    MT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g.aux_ld, sizeof g.aux_ld));
  }
  lt_set_layouts(p, ta, tb, g.m, g.n, g.k, g.ab_type, g.lda, g.ab_type, g.ldb, g.c_type, g.ldc);
  lt_choose_algorithm(p, static_cast<uint32_t>(key[11]), static_cast<uint32_t>(key[12]),
                      static_cast<uint32_t>(key[13]), g.fp32_partials);
  if (g.epilogue != GemmArgs::kPlain && !p.usable) return p;  // no fused kernel for this epilogue
  MT_CUBLAS_CHECK(p.status);
  MT_CHECK(p.usable, what, ": cuBLASLt has no algorithm for the GEMM m=", g.m, " n=", g.n, " k=", g.k,
           " (types ", static_cast<int>(g.ab_type), "/", static_cast<int>(g.c_type), ", bias ", g.bias != nullptr, ")");
  return p;
}

// Returns false (nothing run) only for a GELU epilogue cuBLASLt has no kernel for.
bool gemm(const char* what, const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return true;
  const GemmKey key{g.trans_a,  g.trans_b,  g.m,        g.n,   g.k,   g.lda, g.ldb, g.ldc, g.ab_type, g.c_type,
                    g.bias != nullptr, alignment_of(g.A), alignment_of(g.B), alignment_of(g.C), g.epilogue,
                    g.epilogue != GemmArgs::kPlain ? alignment_of(g.aux) * 1000000 + g.aux_ld : 0,
                    g.c_in ? alignment_of(g.c_in) : 0, g.fp32_partials};
  static std::mutex mu;
  static std::map<GemmKey, LtPlan> cache;
  LtPlan plan;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it == cache.end()) it = cache.emplace(key, make_plan(what, g, key)).first;
    plan = it->second;
    if (!plan.usable) return false;
    // The cached descriptor carries the last call's pointers.
    if (g.bias)
      MT_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
    if (g.epilogue != GemmArgs::kPlain)
      MT_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof g.aux));
  }
  const Context& ctx = context();
  const float alpha = 1.f;
  MT_CUBLAS_CHECK(cublasLtMatmul(ctx.lt, plan.desc, &alpha, g.A, plan.a, g.B, plan.b, &g.beta, g.c_in ? g.c_in : g.C,
                                 plan.c, g.C, plan.c, &plan.algo, ctx.workspace, ctx.workspace_bytes, ctx.stream));
  return true;
}

template <typename T>
constexpr cudaDataType_t cuda_type() {
  if constexpr (std::is_same_v<T, mt::bf16>) return CUDA_R_16BF;
  else if constexpr (std::is_same_v<T, mt::f16>) return CUDA_R_16F;
  else return CUDA_R_32F;
}

}  // namespace

// ---------------------------------------------------------------- launchers

template <typename T>
void linear_forward_cuda(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t IC, int64_t OC,
                         const T* residual) {
  if (N == 0 || OC == 0) return;
  if (IC == 0) {  // an empty sum: out = bias (or 0)
    MT_CHECK(bias == nullptr && residual == nullptr, "linear_forward_cuda: IC = 0 with a bias or residual is not supported");
    fill_cuda(out, N * OC, 0.0);
    return;
  }
  constexpr cudaDataType_t t = cuda_type<T>();
  GemmArgs g{true, false, OC, N, IC, weight, IC, inp, IC, out, OC, t, t, bias, residual ? 1.f : 0.f};
  g.c_in = residual;
  gemm("linear_forward_cuda", g);
}

template <typename T>
void linear_forward_f32out_cuda(float* out, const T* inp, const T* weight, int64_t N, int64_t IC, int64_t OC) {
  if (N == 0 || OC == 0) return;
  if (IC == 0) {
    fill_cuda(out, N * OC, 0.0);
    return;
  }
  constexpr cudaDataType_t t = cuda_type<T>();
  gemm("linear_forward_f32out_cuda", {true, false, OC, N, IC, weight, IC, inp, IC, out, OC, t, CUDA_R_32F, nullptr, 0.f});
}

// ---------------------------------------------------------------- fp32 gradients through 16-bit operands
namespace {

// parts (N, 3 OC) bf16: row n = [hi | mid | lo] of dout's row, hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi
// - mid). Each difference is exact in fp32 and each part takes the next 8 significant bits (bf16 has fp32's
// exponent range), so hi + mid + lo = x exactly for every fp32 x whose lo part is not below bf16's smallest
// subnormal (|x| > ~2^-117).
__global__ void split_bf16x3_kernel(__nv_bfloat16* parts, const float* x, int64_t N, int64_t OC) {
  const int64_t n = N * OC;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    const __nv_bfloat16 hi = __float2bfloat16_rn(v);
    const float r = v - __bfloat162float(hi);
    const __nv_bfloat16 mid = __float2bfloat16_rn(r);
    const __nv_bfloat16 lo = __float2bfloat16_rn(r - __bfloat162float(mid));
    __nv_bfloat16* row = parts + (i / OC) * 3 * OC + i % OC;
    row[0] = hi, row[OC] = mid, row[2 * OC] = lo;
  }
}

// out (n) = (((accumulate ? out : 0) + part[0]) + part[1]) ... + part[K - 1], part[j] = parts + j n: fp32 sums,
// rounded once to G (float or __nv_bfloat16)
template <int K, typename G>
__global__ void sum_parts_kernel(G* out, const float* parts, int64_t n, bool accumulate) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v = accumulate ? to_float(out[i]) + parts[i] : parts[i];
#pragma unroll
    for (int j = 1; j < K; ++j) v += parts[j * n + i];
    out[i] = from_float<G>(v);
  }
}
template <int K, typename G>
void sum_parts(G* out, const float* parts, int64_t n, bool accumulate) {
  sum_parts_kernel<K><<<grid_for(n, 256), 256, 0, current_stream()>>>(dev(out), parts, n, accumulate);
  MT_CUDA_CHECK_LAUNCH("sum_parts_kernel");
}

}  // namespace

template <typename G>
void linear_backward_wide_cuda(mt::bf16* dinp, G* dweight, const float* dout, const mt::bf16* inp,
                               const mt::bf16* weight, int64_t N, int64_t IC, int64_t OC, bool accumulate_dweight,
                               bool accumulate_dinp) {
  if (N == 0 || OC == 0 || IC == 0) {
    linear_backward_cuda<mt::bf16, G>(dinp, dweight, nullptr, nullptr, inp, weight, N, IC, OC, accumulate_dinp,
                                      accumulate_dweight);
    return;
  }
  cudaStream_t s = current_stream();
  // dout as three bf16 parts side by side, K = 3 OC: both products sum every part's exact products in fp32
  Scratch parts(sizeof(mt::bf16) * size_t(N * 3 * OC));
  split_bf16x3_kernel<<<grid_for(N * OC, 256), 256, 0, s>>>(parts.as<__nv_bfloat16>(), dout, N, OC);
  MT_CUDA_CHECK_LAUNCH("split_bf16x3_kernel");
  Scratch w3(dinp ? sizeof(mt::bf16) * size_t(3 * OC * IC) : 1);  // weight stacked 3 times (3 OC, IC)
  if (dinp)
    for (int j = 0; j < 3; ++j)
      MT_CUDA_CHECK(cudaMemcpyAsync(w3.as<mt::bf16>() + j * OC * IC, weight, sizeof(mt::bf16) * size_t(OC * IC),
                                    cudaMemcpyDeviceToDevice, s));
  Scratch dw3(dweight ? sizeof(float) * size_t(3 * OC * IC) : 1);  // the parts' weight gradients (3 OC, IC)
  linear_backward_cuda<mt::bf16, float>(dinp, dweight ? dw3.as<float>() : nullptr, nullptr, parts.as<mt::bf16>(),
                                        inp, w3.as<mt::bf16>(), N, IC, 3 * OC, accumulate_dinp, false);
  if (dweight) sum_parts<3>(dweight, dw3.as<float>(), OC * IC, accumulate_dweight);
}

template <typename T, typename G>
void linear_backward_cuda(T* dinp, G* dweight, G* dbias, const T* dout, const T* inp, const T* weight, int64_t N,
                          int64_t IC, int64_t OC, bool accumulate_dinp, bool accumulate_dweight) {
  constexpr cudaDataType_t t = cuda_type<T>();
  if (dinp && N > 0 && IC > 0) {
    if (OC == 0) {
      if (!accumulate_dinp) fill_cuda(dinp, N * IC, 0.0);
    } else {
      gemm("linear_backward_cuda dinp",
           {false, false, IC, N, OC, weight, IC, dout, OC, dinp, IC, t, t, nullptr, accumulate_dinp ? 1.f : 0.f});
    }
  }
  if (dweight && IC > 0 && OC > 0) {
    if (N == 0) {
      if (!accumulate_dweight) fill_cuda(dweight, OC * IC, 0.0);
    } else {
      GemmArgs g{false, true, IC, OC, N, inp, IC, dout, OC, dweight, IC, t, cuda_type<G>(), nullptr,
                 accumulate_dweight ? 1.f : 0.f};
      g.fp32_partials = !std::is_same_v<G, float>;  // (K = N tokens: no partial sums rounded to bf16)
      if constexpr (std::is_same_v<G, float> || std::is_same_v<G, T>) {
        gemm("linear_backward_cuda dweight", g);
      } else {  // a bf16 C with fp16 operands: no such cuBLASLt GEMM; the fp32 product, then one rounding add
        Scratch r(sizeof(float) * static_cast<size_t>(OC * IC));
        g.C = r.as<float>(), g.c_type = CUDA_R_32F, g.beta = 0.f, g.fp32_partials = false;
        gemm("linear_backward_cuda dweight", g);
        sum_parts<1>(dweight, r.as<float>(), OC * IC, accumulate_dweight);
      }
    }
  }
  if (dbias) column_sum_accumulate(dbias, dev(dout), N, OC);
}

template <typename T>
void linear_gelu_forward_cuda(T* out, T* pre, const T* inp, const T* weight, const T* bias, int64_t N, int64_t IC,
                              int64_t OC) {
  if (N == 0 || OC == 0) return;
  if constexpr (!std::is_same_v<T, float>) {
    // out^T and pre^T are (OC, N) column-major, leading dimension OC.
    if (IC > 0 && OC % 8 == 0 && aligned(pre, 16)) {
      constexpr cudaDataType_t t = cuda_type<T>();
      GemmArgs g{true, false, OC, N, IC, weight, IC, inp, IC, out, OC, t, t, bias, 0.f};
      g.epilogue = GemmArgs::kGeluAux;
      g.aux = pre;
      g.aux_ld = OC;
      if (gemm("linear_gelu_forward_cuda", g)) return;
    }
  }
  linear_forward_cuda(pre, inp, weight, bias, N, IC, OC);
  gelu_forward_cuda(out, static_cast<const T*>(pre), N * OC);
}

template <typename T, typename G>
void linear_backward_gelu_cuda(T* dpre, G* dweight, G* dbias, const T* dout, const T* inp, const T* weight,
                               const T* pre, int64_t N, int64_t IC, int64_t OC, bool accumulate_dweight) {
  linear_backward_cuda<T, G>(nullptr, dweight, dbias, dout, inp, weight, N, IC, OC, false, accumulate_dweight);
  if (N == 0 || IC == 0) return;
  if constexpr (!std::is_same_v<T, float>) {
    // dpre^T (IC, N) = W (stored (IC, OC)) x dout^T, then * gelu'(pre^T) (IC, N), leading dimension IC.
    if (OC > 0 && IC % 8 == 0 && aligned(pre, 16)) {
      constexpr cudaDataType_t t = cuda_type<T>();
      GemmArgs g{false, false, IC, N, OC, weight, IC, dout, OC, dpre, IC, t, t, nullptr, 0.f};
      g.epilogue = GemmArgs::kDGelu;
      g.aux = pre;
      g.aux_ld = IC;
      if (gemm("linear_backward_gelu_cuda", g)) return;
    }
  }
  Scratch dinp(sizeof(T) * static_cast<size_t>(N * IC));
  linear_backward_cuda<T, float>(dinp.as<T>(), nullptr, nullptr, dout, inp, weight, N, IC, OC, false);
  gelu_backward_cuda(dpre, static_cast<const T*>(dinp.as<T>()), pre, N * IC);
}

#define MT_INSTANTIATE(T)                                                                                        \
  template void linear_gelu_forward_cuda<T>(T*, T*, const T*, const T*, const T*, int64_t, int64_t, int64_t);      \
  template void linear_forward_cuda<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, const T*);
#define MT_INSTANTIATE_GRAD(T, G)                                                                                \
  template void linear_backward_gelu_cuda<T, G>(T*, G*, G*, const T*, const T*, const T*, const T*, int64_t,       \
                                                int64_t, int64_t, bool);                                         \
  template void linear_backward_cuda<T, G>(T*, G*, G*, const T*, const T*, const T*, int64_t, int64_t, int64_t,    \
                                           bool, bool);
MT_INSTANTIATE(float)
MT_INSTANTIATE(mt::bf16)
MT_INSTANTIATE(mt::f16)
MT_CUDA_GRAD_TYPES(MT_INSTANTIATE_GRAD)
#undef MT_INSTANTIATE
#undef MT_INSTANTIATE_GRAD
template void linear_forward_f32out_cuda<mt::bf16>(float*, const mt::bf16*, const mt::bf16*, int64_t, int64_t, int64_t);
template void linear_forward_f32out_cuda<mt::f16>(float*, const mt::f16*, const mt::f16*, int64_t, int64_t, int64_t);
template void linear_backward_wide_cuda<float>(mt::bf16*, float*, const float*, const mt::bf16*, const mt::bf16*,
                                               int64_t, int64_t, int64_t, bool, bool);
template void linear_backward_wide_cuda<mt::bf16>(mt::bf16*, mt::bf16*, const float*, const mt::bf16*,
                                                  const mt::bf16*, int64_t, int64_t, int64_t, bool, bool);

}  // namespace mt::ops::cuda
