// The FP8 GEMM through cuBLASLt (semantics: tensor/fp8/fp8_ops.h fp8_gemm; the only code that knows cuBLASLt's FP8
// scale attributes). Row-major out (M, N) = a (M, K) b (N, K)^T is column-major out^T (N, M) = b' x a, where the
// stored row-major (N, K) b is a column-major (K, N) matrix taken transposed and a a column-major (K, M) one taken
// as is: the "TN" layout, the only one Hopper's FP8 tensor cores run (both operands K-major). So cuBLASLt's A is
// our b, its B our a; m = N, n = M, k = K; fp32 accumulation, out bf16 or fp32 (C = D; beta 1 accumulates).
// Scales: cuBLASLt multiplies by A/B "scale" pointers, our scale_inv (value = code * scale_inv):
//   tensor:  CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, one float each.
//   blocks:  VEC128_32F (1x128 tiles) and BLK128x128_32F (cuBLAS 12.9+, Hopper), our compact scale tensors rewritten
//            into cuBLASLt's layout first (Note [FP8 block scale layout]); no fast accumulation with them. If cuBLASLt has no fp32-output
//            kernel for a scaling pair, the product goes through a bf16 scratch added in fp32.
// fast_accum (CUBLASLT_MATMUL_DESC_FAST_ACCUM, tensor scaling only): TransformerEngine's choice for the forward GEMM.
// A residual is cuBLASLt's C (beta 1, D = out): added in fp32 before the rounding to out's type.
#include <array>
#include <map>
#include <mutex>

#include "cuda/cublaslt_plan.h"
#include "cuda/fp8_cuda.h"
#include "cuda/kernel_utils.cuh"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {

// Note [FP8 block scale layout]
// Our scale tensors are "compact": tiles (R, ceil(K/128)) and blocks (ceil(R/128), ceil(K/128)), row-major. cuBLASLt
// reads 1x128 tile scales MN-major, (ceil(K/128), roundup(R, 4)) row-major (for each K block, the scales of all rows),
// and 128x128 block scales K-major, (ceil(R/128), roundup(ceil(K/128), 4)) row-major (TransformerEngine's GEMM-ready
// layouts): layout 0, what fp8_gemm_scale_kernel writes before each block-scaled GEMM. Measured on an H100 (cuBLASLt
// 13.1): handing over the compact tile scales gives errors of order 1; layout 0 matches the reference to 2e-4.
// The other candidates stay selectable only so that test/cuda can show its check tells them apart.
struct ScaleLayout {
  bool compact = false;                            // no rewrite (tiles K-major, unpadded)
  bool tile_mn_major = true, tile_pad4 = true;     // tiles: (kb, R4) if mn_major else (R, kb)
  bool block_k_major = true, block_pad4 = true;    // blocks: (rb, kb4) if k_major else (kb, rb4)
};
ScaleLayout layout_variant(int v) {
  switch (v) {
    case 1: return {true, false, false, true, false};   // compact
    case 2: return {false, true, false, false, false};  // blocks transposed
    case 3: return {false, true, true, false, true};    // blocks transposed, padded
    default: return {};
  }
}
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t pad4(int64_t x, bool on) { return on ? (x + 3) / 4 * 4 : x; }

// dst (zero-padded) from the compact src (rows_s, cols_s): dst[i * ld + j] = src[j * cols_s + i] when transposed.
__global__ void fp8_gemm_scale_kernel(float* dst, const float* src, int64_t rows_s, int64_t cols_s, bool transposed,
                                      int64_t dst_rows, int64_t dst_ld) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= dst_rows * dst_ld) return;
  const int64_t r = i / dst_ld, c = i % dst_ld;
  const int64_t sr = transposed ? c : r, sc = transposed ? r : c;
  dst[i] = (sr < rows_s && sc < cols_s) ? src[sr * cols_s + sc] : 0.0f;
}

// The scale tensor cuBLASLt reads for an operand, in `buf` (or the operand's own for tensor scaling).
const float* gemm_scales(const Fp8GemmOperand& o, const ScaleLayout& L, Scratch*& buf, cudaStream_t s) {
  if (o.scaling == 0 || L.compact) return o.scale_inv;
  const int64_t kb = cdiv(o.k, 128);
  int64_t rows_s, cols_s, dst_rows, dst_ld;
  bool transposed;
  if (o.scaling == 1) {
    rows_s = o.rows, cols_s = kb, transposed = L.tile_mn_major;
    dst_rows = transposed ? kb : o.rows;
    dst_ld = transposed ? pad4(o.rows, L.tile_pad4) : kb;
  } else {
    const int64_t rb = cdiv(o.rows, 128);
    rows_s = rb, cols_s = kb, transposed = !L.block_k_major;
    dst_rows = transposed ? kb : rb;
    dst_ld = transposed ? pad4(rb, L.block_pad4) : pad4(kb, L.block_pad4);
  }
  buf = new Scratch(sizeof(float) * static_cast<size_t>(dst_rows * dst_ld));
  const int64_t n = dst_rows * dst_ld;
  fp8_gemm_scale_kernel<<<static_cast<unsigned>(cdiv(n, 256)), 256, 0, s>>>(buf->as<float>(), o.scale_inv, rows_s,
                                                                           cols_s, transposed, dst_rows, dst_ld);
  MT_CUDA_CHECK_LAUNCH("fp8_gemm_scale_kernel");
  return buf->as<float>();
}

cudaDataType_t fp8_type(fp8::Fp8Dtype t) { return t == fp8::Fp8Dtype::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }
cublasLtMatmulMatrixScale_t scale_mode(int scaling) {
  return scaling == 0 ? CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F
                      : scaling == 1 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                     : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}

using Key = std::array<int64_t, 12>;

// cuBLASLt's A = our b (N, K), its B = our a (M, K); D (N, M) column-major.
// Block scale modes need the scale pointers set before the heuristic is asked (null ones are an invalid value).
// usable false: cuBLASLt has no algorithm (the caller may try another output type).
LtPlan make_plan(const Fp8GemmOperand& a, const Fp8GemmOperand& b, const float* scale_a, const float* scale_b,
               cudaDataType_t out_type, bool bias, bool fast_accum) {
  const int64_t M = a.rows, N = b.rows, K = a.k;
  LtPlan p = lt_plan(CUBLAS_OP_T, CUBLAS_OP_N);
  if (b.scaling != 0 || a.scaling != 0) {
    const cublasLtMatmulMatrixScale_t ma = scale_mode(b.scaling), mb = scale_mode(a.scaling);
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb));
  }
  MT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_a, sizeof scale_a));
  MT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_b, sizeof scale_b));
  if (fast_accum) {
    const int8_t on = 1;
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof on));
  }
  if (bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    MT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &out_type, sizeof out_type));
  }
  // op(A) = b^T (N, K) stored (K, N); B = a^T stored (K, M); D (N, M)
  lt_set_layouts(p, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, fp8_type(b.dtype), K, fp8_type(a.dtype), K, out_type, N);
  lt_choose_algorithm(p);
  return p;
}

// out (M, N) of cuda type out_type (= or += with beta 1; residual: C = residual, beta 1), through a cached plan;
// false: no algorithm.
bool run_gemm(void* out, cudaDataType_t out_type, const Fp8GemmOperand& a, const Fp8GemmOperand& b, const void* bias,
              bool accumulate, bool fast_accum, const float* scale_a, const float* scale_b,
              const void* residual = nullptr) {
  const Key key{a.rows, b.rows, a.k, static_cast<int64_t>(a.dtype), static_cast<int64_t>(b.dtype), a.scaling,
                b.scaling, out_type, bias != nullptr, fast_accum, 0, 0};
  static std::mutex mu;
  static std::map<Key, LtPlan> cache;
  LtPlan plan;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it == cache.end())
      it = cache.emplace(key, make_plan(a, b, scale_a, scale_b, out_type, bias != nullptr, fast_accum)).first;
    plan = it->second;
    if (!plan.usable) return false;
    // The cached descriptor carries the last call's pointers.
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_a,
                                                   sizeof scale_a));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_b,
                                                   sizeof scale_b));
    if (bias)
      MT_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  }
  const Context& ctx = context();
  const float alpha = 1.f, beta = (accumulate || residual) ? 1.f : 0.f;
  const void* c = residual ? residual : out;
  MT_CUBLAS_CHECK(cublasLtMatmul(ctx.lt, plan.desc, &alpha, b.data, plan.a, a.data, plan.b, &beta, c, plan.c, out,
                                 plan.c, &plan.algo, ctx.workspace, ctx.workspace_bytes, ctx.stream));
  return true;
}

// out (=, or += when accumulate) in: 8 elements a thread (16-byte loads of in, two float4 of out) when vec (n % 8
// == 0, both 16-byte aligned), else one.
__global__ void fp8_gemm_add_bf16_kernel(float* out, const __nv_bfloat16* in, int64_t n, bool accumulate, bool vec) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (!vec) {
    if (i < n) out[i] = (accumulate ? out[i] : 0.0f) + __bfloat162float(in[i]);
    return;
  }
  if (i * 8 >= n) return;
  const uint4 raw = reinterpret_cast<const uint4*>(in)[i];
  const __nv_bfloat16* v = reinterpret_cast<const __nv_bfloat16*>(&raw);
  float4* o = reinterpret_cast<float4*>(out) + i * 2;
  float4 lo = accumulate ? o[0] : make_float4(0.f, 0.f, 0.f, 0.f);
  float4 hi = accumulate ? o[1] : make_float4(0.f, 0.f, 0.f, 0.f);
  lo.x += __bfloat162float(v[0]), lo.y += __bfloat162float(v[1]), lo.z += __bfloat162float(v[2]);
  lo.w += __bfloat162float(v[3]), hi.x += __bfloat162float(v[4]), hi.y += __bfloat162float(v[5]);
  hi.z += __bfloat162float(v[6]), hi.w += __bfloat162float(v[7]);
  o[0] = lo;
  o[1] = hi;
}

template <typename T>
void fp8_gemm_impl(T* out, const Fp8GemmOperand& a, const Fp8GemmOperand& b, const T* bias, bool accumulate,
                   bool fast_accum, int layout, const T* residual = nullptr) {
  const int64_t M = a.rows, N = b.rows;
  if (M == 0 || N == 0) return;
  constexpr cudaDataType_t out_type = std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;
  const Context& ctx = context();
  const ScaleLayout L = layout_variant(layout);
  Scratch *sa = nullptr, *sb = nullptr;
  const float* scale_a = gemm_scales(b, L, sa, ctx.stream);  // cuBLASLt's A is our b
  const float* scale_b = gemm_scales(a, L, sb, ctx.stream);
  bool done = run_gemm(out, out_type, a, b, bias, accumulate, fast_accum, scale_a, scale_b, residual);
  if (!done && out_type == CUDA_R_32F && !bias && !residual) {
    // No fp32-output kernel for these scalings: the product in bf16, added (or written) in fp32.
    Scratch tmp(sizeof(mt::bf16) * static_cast<size_t>(M * N));
    done = run_gemm(tmp.as<void>(), CUDA_R_16BF, a, b, nullptr, false, fast_accum, scale_a, scale_b);
    if (done) {
      const bool vec = (M * N) % 8 == 0 && aligned(out, 16) && aligned(tmp.as<void>(), 16);
      const int64_t threads = vec ? M * N / 8 : M * N;
      fp8_gemm_add_bf16_kernel<<<static_cast<unsigned>(cdiv(threads, 256)), 256, 0, ctx.stream>>>(
          reinterpret_cast<float*>(out), tmp.as<__nv_bfloat16>(), M * N, accumulate, vec);
      MT_CUDA_CHECK_LAUNCH("fp8_gemm_add_bf16_kernel");
    }
  }
  delete sa;  // stream-ordered reuse (kernel_utils.cuh Scratch)
  delete sb;
  MT_CHECK(done, "fp8_gemm_cuda: cuBLASLt has no FP8 algorithm for M=", M, " N=", N, " K=", a.k, " (scalings a ",
           a.scaling, " b ", b.scaling, ", dtypes a ", static_cast<int>(a.dtype), " b ", static_cast<int>(b.dtype),
           ", output ", out_type == CUDA_R_32F ? "fp32" : "bf16", ", bias ", bias != nullptr,
           "); FP8 GEMMs need K and the leading dimensions multiples of 16 (blockwise: of 128)");
}

}  // namespace

template <typename T>
void fp8_gemm_cuda(T* out, const Fp8GemmOperand& a, const Fp8GemmOperand& b, const T* bias, bool accumulate,
                   bool fast_accum, const T* residual) {
  fp8_gemm_impl(out, a, b, bias, accumulate, fast_accum, 0, residual);
}

template <typename T>
void fp8_gemm_cuda_scale_layout(T* out, const Fp8GemmOperand& a, const Fp8GemmOperand& b, bool accumulate,
                                int layout) {
  fp8_gemm_impl<T>(out, a, b, nullptr, accumulate, false, layout);
}

template void fp8_gemm_cuda<float>(float*, const Fp8GemmOperand&, const Fp8GemmOperand&, const float*, bool, bool,
                                   const float*);
template void fp8_gemm_cuda<mt::bf16>(mt::bf16*, const Fp8GemmOperand&, const Fp8GemmOperand&, const mt::bf16*, bool,
                                      bool, const mt::bf16*);
template void fp8_gemm_cuda_scale_layout<float>(float*, const Fp8GemmOperand&, const Fp8GemmOperand&, bool, int);

}  // namespace mt::ops::cuda
