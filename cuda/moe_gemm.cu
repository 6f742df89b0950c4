// Grouped expert GEMMs on CUDA: every local expert in ONE cublasGemmGroupedBatchedEx call per product (one
// group of one problem per expert with rows; the sizes are on the host, which the layer has anyway: the
// dispatcher's counts). Large experts (per_group, tensor/moe_ops.h moe_gemm_per_group) run one cublasGemmEx per
// expert instead: the grouped call reached 305-339 TFLOP/s at 4,096 x 1,024 x 7,168 per expert on an H100 where
// per-expert calls reached 390-614. Row-major onto cuBLAS's column-major as in gemm.cu, per expert e with m_e rows:
//   out_e^T (OC, m_e) = W_e (stored (IC, OC), op T) x x_e^T (stored (IC, m_e))         m=OC n=m_e k=IC
//   dx_e^T  (IC, m_e) = W_e (stored (IC, OC))       x dout_e^T (stored (OC, m_e))      m=IC n=m_e k=OC
//   dW_e^T  (IC, OC)  = x_e^T (stored (IC, m_e))    x dout_e (stored (OC, m_e), op T)  m=IC n=OC  k=m_e  (fp32 C)
// Compute in fp32 (CUBLAS_COMPUTE_32F: no TF32, as gemm.cu). The pointer arrays are written into scratch from the
// caching allocator by a kernel that takes them as parameters (stream-ordered: no host staging, no cudaMalloc).
// Groups of at most kMaxShapeBuckets distinct row counts (the padded layout of the MoE layer, tensor/moe_ops.h
// moe_padded_regions) run as ONE batched call per distinct count instead, strided when the experts are evenly
// spaced (all equal), else on pointer arrays; both near the dense rate, the fp32 weight gradients included (the
// batched calls have the mixed-type form the grouped one lacks). They go through cuBLASLt (cuda/batched_gemm.cu:
// 11% less GEMM time than cublasGemm{Strided,}BatchedEx over the H100 shape sweep, 0-2% of a training step), and
// through cublasGemm{Strided,}BatchedEx only where cuBLASLt has no algorithm.
// Why this and not cuBLASLt's grouped GEMM: that needs cuBLAS 13.4+ on Hopper; the GPU image ships libcublasLt 13.1.0.3 (seen 2026-11-23).
// On a Hopper GPU, bf16 products whose sizes our own grouped kernel takes (cuda/sm90/grouped_gemm.h: one launch
// per product whatever the counts, 700-750 TFLOP/s at the benchmark configs' shapes) run there instead; cuBLAS
// runs the rest.
#include <algorithm>
#include <array>
#include <vector>

#include "cuda/batched_gemm.h"
#include "cuda/cuda_check.h"
#include "cuda/kernel_utils.cuh"
#include "cuda/moe_cuda.h"
#include "cuda/sm90/grouped_gemm.h"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {

cublasHandle_t blas() {
  static cublasHandle_t h = [] {
    cublasHandle_t x = nullptr;
    MT_CUBLAS_CHECK(cublasCreate(&x));
    MT_CUBLAS_CHECK(cublasSetMathMode(x, CUBLAS_DEFAULT_MATH));
    return x;
  }();
  MT_CUBLAS_CHECK(cublasSetStream(h, current_stream()));
  return h;
}

template <typename T> cudaDataType_t cuda_type();
template <> cudaDataType_t cuda_type<float>() { return CUDA_R_32F; }
template <> cudaDataType_t cuda_type<mt::bf16>() { return CUDA_R_16BF; }
template <> cudaDataType_t cuda_type<mt::f16>() { return CUDA_R_16F; }

// Up to kMax device pointers passed by value (kernel parameters: 8 x 256 + 4 bytes, inside the 4 KiB limit).
struct PtrBatch {
  static constexpr int kMax = 256;
  const void* p[kMax];
  int n;
};
__global__ void fill_ptrs_kernel(void** dst, PtrBatch b) {
  if (int(threadIdx.x) < b.n) dst[threadIdx.x] = const_cast<void*>(b.p[threadIdx.x]);
}

// One batched call of `batch` problems of the same shape, strided when the operands are evenly spaced (sa, sb, sc:
// their strides), else on device pointer arrays (ptrs: [a; b; c], batch each); align: the smallest alignment of
// their addresses. Through cuBLASLt (batched_gemm.h), else cublasGemmStridedBatchedEx / cublasGemmBatchedEx. Near
// the dense GEMMs' rate, the fp32-output weight gradients included (the grouped call has no mixed-type form).
// Returns false (nothing run) when neither takes the type combination.
bool batched_call(cublasOperation_t opa, cublasOperation_t opb, int M, int N, int K, const void* A, int la, int64_t sa,
                  const void* B, int lb, int64_t sb, void* C, int lc, int64_t sc, void* const* ptrs, float beta,
                  int batch, cudaDataType_t ab_type, cudaDataType_t c_type, int align) {
  if (batched_gemm_lt({opa, opb, M, N, K, A, la, sa, B, lb, sb, C, lc, sc, ptrs, beta, batch, ab_type, c_type, align}))
    return true;
  const float alpha = 1.f;
  cublasStatus_t st;
  if (!ptrs)
    st = cublasGemmStridedBatchedEx(blas(), opa, opb, M, N, K, &alpha, A, ab_type, la, sa, B, ab_type, lb, sb, &beta,
                                    C, c_type, lc, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  else
    st = cublasGemmBatchedEx(blas(), opa, opb, M, N, K, &alpha, const_cast<const void* const*>(ptrs), ab_type, la,
                             const_cast<const void* const*>(ptrs + batch), ab_type, lb, &beta, ptrs + 2 * batch, c_type, lc,
                             batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  MT_CUBLAS_CHECK(st);
  return true;
}

// dst (device) = the host pointers, written by kernels that take them as parameters (no staging, no allocation)
void write_ptrs(void** dst, const std::vector<const void*>& host, const char* what) {
  cudaStream_t st = current_stream();
  for (size_t i = 0; i < host.size(); i += PtrBatch::kMax) {
    PtrBatch batch;
    batch.n = int(std::min(host.size() - i, size_t(PtrBatch::kMax)));
    for (int j = 0; j < batch.n; ++j) batch.p[j] = host[i + size_t(j)];
    fill_ptrs_kernel<<<1, PtrBatch::kMax, 0, st>>>(dst + i, batch);
    MT_CUDA_CHECK_LAUNCH(what);
  }
}

// One problem per group: the host-side arrays of a grouped call, and its device pointer arrays.
struct Grouped {
  std::vector<cublasOperation_t> ta, tb;
  std::vector<int> m, n, k, lda, ldb, ldc, size;
  std::vector<float> alpha, beta;
  std::vector<const void*> a, b;
  std::vector<void*> c;
  void add(cublasOperation_t opa, cublasOperation_t opb, int64_t M, int64_t N, int64_t K, const void* A, int64_t la,
           const void* B, int64_t lb, void* C, int64_t lc, float be) {
    ta.push_back(opa), tb.push_back(opb);
    m.push_back(int(M)), n.push_back(int(N)), k.push_back(int(K));
    a.push_back(A), b.push_back(B), c.push_back(C);
    lda.push_back(int(la)), ldb.push_back(int(lb)), ldc.push_back(int(lc));
    alpha.push_back(1.f), beta.push_back(be), size.push_back(1);
  }
  // Problems of at most kMaxShapeBuckets distinct (m, n, k): one batched call per shape. Every problem of a call
  // shares the operations, leading dimensions and beta (true of the expert GEMMs). False when not taken.
  bool run_buckets(cudaDataType_t ab_type, cudaDataType_t c_type, const char* what) {
    const int G = int(m.size());
    std::vector<std::array<int, 3>> shapes;
    for (int g = 0; g < G; ++g) {
      const std::array<int, 3> sh = {m[g], n[g], k[g]};
      if (std::find(shapes.begin(), shapes.end(), sh) == shapes.end()) shapes.push_back(sh);
      if (shapes.size() > size_t(kMaxShapeBuckets)) return false;
    }
    for (const auto& sh : shapes) {
      std::vector<int> idx;
      for (int g = 0; g < G; ++g)
        if (m[g] == sh[0] && n[g] == sh[1] && k[g] == sh[2]) idx.push_back(g);
      const int B = int(idx.size());
      // evenly spaced operands: the strided call, no pointer arrays
      auto stride = [&](auto get) -> int64_t {
        if (B == 1) return 0;
        const int64_t s0 = static_cast<const char*>(get(idx[1])) - static_cast<const char*>(get(idx[0]));
        for (int i = 2; i < B; ++i)
          if (static_cast<const char*>(get(idx[i])) - static_cast<const char*>(get(idx[i - 1])) != s0) return -1;
        return s0;
      };
      const int64_t sa = stride([&](int g) { return a[g]; }), sb = stride([&](int g) { return b[g]; }),
                    sc = stride([&](int g) { return static_cast<const void*>(c[g]); });
      const int g0 = idx[0];
      const size_t ab = ab_type == CUDA_R_32F ? 4 : 2, cb = c_type == CUDA_R_32F ? 4 : 2;
      bool ok;
      int align = 16;  // of every matrix's address
      for (int g : idx) align = std::min({align, alignment_of(a[g]), alignment_of(b[g]), alignment_of(c[g])});
      if (sa >= 0 && sb >= 0 && sc >= 0 && sa % ab == 0 && sb % ab == 0 && sc % cb == 0) {
        ok = batched_call(ta[g0], tb[g0], sh[0], sh[1], sh[2], a[g0], lda[g0], sa / int64_t(ab), b[g0], ldb[g0],
                          sb / int64_t(ab), c[g0], ldc[g0], sc / int64_t(cb), nullptr, beta[g0], B, ab_type, c_type,
                          align);
      } else {
        std::vector<const void*> host(size_t(3 * B));
        for (int i = 0; i < B; ++i) host[i] = a[idx[i]], host[B + i] = b[idx[i]], host[2 * B + i] = c[idx[i]];
        Scratch scratch(host.size() * sizeof(void*));
        write_ptrs(scratch.as<void*>(), host, what);
        ok = batched_call(ta[g0], tb[g0], sh[0], sh[1], sh[2], nullptr, lda[g0], 0, nullptr, ldb[g0], 0, nullptr,
                          ldc[g0], 0, scratch.as<void*>(), beta[g0], B, ab_type, c_type, align);
      }
      if (!ok)  // a type combination the batched calls refuse: one GEMM per problem of this shape
        for (int g : idx)
          MT_CUBLAS_CHECK(cublasGemmEx(blas(), ta[g], tb[g], m[g], n[g], k[g], &alpha[g], a[g], ab_type, lda[g], b[g],
                                       ab_type, ldb[g], &beta[g], c[g], c_type, ldc[g], CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT));
    }
    return true;
  }

  // Else per_group: one cublasGemmEx per problem (large experts: the grouped call ran them at half the rate).
  void run(cudaDataType_t ab_type, cudaDataType_t c_type, bool per_group, const char* what) {
    const int G = int(m.size());
    if (G == 0) return;
    if (run_buckets(ab_type, c_type, what)) return;
    if (ab_type != c_type || per_group) {
      // cublasGemmGroupedBatchedEx has no mixed-type form ("not supported" for bf16/fp16 inputs with an fp32
      // output, seen on an H100 with cuBLAS 13.1): the fp32 weight gradients run one cublasGemmEx per expert.
      for (int g = 0; g < G; ++g)
        MT_CUBLAS_CHECK(cublasGemmEx(blas(), ta[g], tb[g], m[g], n[g], k[g], &alpha[g], a[g], ab_type, lda[g], b[g],
                                     ab_type, ldb[g], &beta[g], c[g], c_type, ldc[g], CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT));
      return;
    }
    // the three pointer arrays [a; b; c] written on the device by kernels taking them as parameters: no host
    // staging copy, no allocation
    std::vector<const void*> host(size_t(3 * G));
    for (int g = 0; g < G; ++g) host[g] = a[g], host[G + g] = b[g], host[2 * G + g] = c[g];
    Scratch scratch(host.size() * sizeof(void*));
    void** ptrs = scratch.as<void*>();
    write_ptrs(ptrs, host, what);
    auto** p = const_cast<const void**>(ptrs);
    auto* const* cp = ptrs + 2 * G;
    MT_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(blas(), ta.data(), tb.data(), m.data(), n.data(), k.data(),
                                               alpha.data(), p, ab_type, lda.data(), p + G, ab_type, ldb.data(),
                                               beta.data(), cp,
                                               c_type, ldc.data(), G, size.data(), CUBLAS_COMPUTE_32F));
  }
};

}  // namespace

template <typename T>
void moe_grouped_linear_forward_cuda(T* out, const T* x, const T* weight, const int64_t* counts, int64_t El,
                                     int64_t IC, int64_t OC, bool per_group) {
  if constexpr (std::is_same_v<T, mt::bf16>)
    if (sm90::grouped_forward(out, x, weight, counts, El, IC, OC)) return;
  Grouped g;
  int64_t r0 = 0;
  for (int64_t e = 0; e < El; ++e) {
    if (counts[e] > 0)
      g.add(CUBLAS_OP_T, CUBLAS_OP_N, OC, counts[e], IC, weight + e * OC * IC, IC, x + r0 * IC, IC, out + r0 * OC, OC,
            0.f);
    r0 += counts[e];
  }
  g.run(cuda_type<T>(), cuda_type<T>(), per_group, "moe_grouped_linear_forward");
}

template <typename T>
void moe_grouped_linear_backward_cuda(T* dx, void* dweight, bool dweight_bf16, const T* dout, const T* x,
                                      const T* weight,
                                      const int64_t* counts, int64_t El, int64_t IC, int64_t OC, bool accumulate,
                                      bool per_group, double* dw_squares, int64_t* n_squares) {
  if (n_squares) *n_squares = -1;
  const bool bf16 = std::is_same_v<T, mt::bf16>;
  if (dx && !(bf16 && sm90::grouped_dx(reinterpret_cast<mt::bf16*>(dx), reinterpret_cast<const mt::bf16*>(dout),
                                       reinterpret_cast<const mt::bf16*>(weight), counts, El, IC, OC))) {
    Grouped g;
    int64_t r0 = 0;
    for (int64_t e = 0; e < El; ++e) {
      if (counts[e] > 0)
        g.add(CUBLAS_OP_N, CUBLAS_OP_N, IC, counts[e], OC, weight + e * OC * IC, IC, dout + r0 * OC, OC, dx + r0 * IC,
              IC, 0.f);
      r0 += counts[e];
    }
    g.run(cuda_type<T>(), cuda_type<T>(), per_group, "moe_grouped_linear_backward (dx)");
  }
  const size_t gsize = dweight_bf16 ? sizeof(mt::bf16) : sizeof(float);  // bytes of a gradient element
  auto expert_dw = [&](int64_t e) { return static_cast<char*>(dweight) + size_t(e * OC * IC) * gsize; };
  if (dweight && bf16 &&
      sm90::grouped_dweight(dweight, dweight_bf16, reinterpret_cast<const mt::bf16*>(dout),
                            reinterpret_cast<const mt::bf16*>(x), counts, El, IC, OC, accumulate,
                            n_squares ? dw_squares : nullptr)) {
    if (n_squares) *n_squares = sm90::grouped_dweight_square_partials(counts, El, IC, OC);
    for (int64_t e = 0; e < El; ++e)  // (a first write) the experts without rows: no tiles
      if (counts[e] == 0) MT_CUDA_CHECK(cudaMemsetAsync(expert_dw(e), 0, size_t(OC * IC) * gsize, current_stream()));
  } else if (dweight) {
    Grouped g;
    int64_t r0 = 0;
    for (int64_t e = 0; e < El; ++e) {
      if (counts[e] > 0)
        g.add(CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, counts[e], x + r0 * IC, IC, dout + r0 * OC, OC, expert_dw(e), IC,
              accumulate ? 1.f : 0.f);
      else if (!accumulate)
        MT_CUDA_CHECK(cudaMemsetAsync(expert_dw(e), 0, size_t(OC * IC) * gsize, current_stream()));
      r0 += counts[e];
    }
    g.run(cuda_type<T>(), dweight_bf16 ? CUDA_R_16BF : CUDA_R_32F, per_group, "moe_grouped_linear_backward (dweight)");
  }
}

#define MT_INSTANTIATE(T)                                                                                          \
  template void moe_grouped_linear_forward_cuda<T>(T*, const T*, const T*, const int64_t*, int64_t, int64_t,      \
                                                   int64_t, bool);                                                 \
  template void moe_grouped_linear_backward_cuda<T>(T*, void*, bool, const T*, const T*, const T*, const int64_t*, \
                                                    int64_t, int64_t, int64_t, bool, bool, double*, int64_t*);
MT_INSTANTIATE(float)
MT_INSTANTIATE(mt::bf16)
MT_INSTANTIATE(mt::f16)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cuda
