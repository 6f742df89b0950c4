// Linear (fully connected) layer, CPU reference through CBLAS.
//   forward:  out(N, OC) = inp(N, IC) @ W(OC, IC)^T + b(OC)
//   backward: with g = dL/dout (N, OC), out[n,o] = sum_i inp[n,i] W[o,i] + b[o] gives
//     dL/dinp[n,i] = sum_o g[n,o] W[o,i]      -> dinp = g @ W          (=, or += when accumulating)
//     dL/dW[o,i]   = sum_n g[n,o] inp[n,i]    -> dW  += g^T @ inp
//     dL/db[o]     = sum_n g[n,o]             -> db  += column sums of g (fixed order over n)
// Legend of ops.h: N rows, IC/OC in/out features.
#include <cblas.h>

#include <algorithm>
#include <climits>

#include <omp.h>

#include "core/check.h"
#include "tensor/cpu/cpu_ops.h"

namespace mt::ops::cpu {

namespace {
constexpr int64_t kColBlock = 256;  // columns per task in the column sums

blasint to_blas(int64_t x) {
  MT_INTERNAL_ASSERT(x >= 0 && x <= INT_MAX, "GEMM dimension ", x, " does not fit a BLAS int");
  return static_cast<blasint>(x);
}

void gemm_dispatch(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint M, blasint N, blasint K, float alpha,
                   const float* A, blasint lda, const float* B, blasint ldb, float beta, float* C, blasint ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void gemm_dispatch(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint M, blasint N, blasint K, double alpha,
                   const double* A, blasint lda, const double* B, blasint ldb, double beta, double* C, blasint ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
}  // namespace

void init_cpu_threads() {
  if (openblas_get_parallel() == 1) openblas_set_num_threads(1);
}

SerialBlasScope::SerialBlasScope(bool active) {
  if (!active || openblas_get_parallel() != 1) return;  // 1: the pthreads build
  const int n = openblas_get_num_threads();
  if (n > 1) {
    openblas_set_num_threads(1);
    saved_threads_ = n;
  }
}

SerialBlasScope::~SerialBlasScope() {
  if (saved_threads_ > 0) openblas_set_num_threads(saved_threads_);
}

template <typename T>
void gemm_cpu(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
              const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // C = beta * C (BLAS would do the same, but some reject lda = 0)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
    return;
  }
  gemm_dispatch(trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, to_blas(M), to_blas(N),
                to_blas(K), alpha, A, to_blas(lda), B, to_blas(ldb), beta, C, to_blas(ldc));
}

namespace {
// The GEMMs are cut into fixed blocks of rows (of the output, or of dweight), one block per task of a
// static OpenMP loop with single-threaded BLAS inside: all CPU parallelism is OpenMP (no second thread
// pool competing for the cores), and the split does not depend on the thread count.
constexpr int64_t kRowBlock = 128;
constexpr int64_t kParallelFlops = 1 << 18;  // M * N * K at most this: one GEMM (OpenBLAS runs it on one thread too)

bool use_threads(int64_t M, int64_t N, int64_t K) { return M * N * K > kParallelFlops && omp_get_max_threads() > 1; }
}  // namespace

template <typename T>
void linear_forward_cpu(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t IC, int64_t OC) {
  const bool par = use_threads(N, OC, IC);
  SerialBlasScope serial(par);
  const int64_t blocks = (N + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t n0 = blk * kRowBlock, rows = std::min(N, n0 + kRowBlock) - n0;
    if (bias)
      for (int64_t n = n0; n < n0 + rows; ++n) std::copy(bias, bias + OC, out + n * OC);
    gemm_cpu<T>(false, true, rows, OC, IC, T(1), inp + n0 * IC, IC, weight, IC, bias ? T(1) : T(0), out + n0 * OC,
                OC);
  }
}

template <typename T>
void linear_backward_cpu(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int64_t N,
                         int64_t IC, int64_t OC, bool accumulate_dinp, bool accumulate_dweight) {
  const bool par = use_threads(N, OC, IC);
  SerialBlasScope serial(par);
  if (dinp) {  // dinp[rows] = dout[rows] @ W
    const int64_t blocks = (N + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t n0 = blk * kRowBlock, rows = std::min(N, n0 + kRowBlock) - n0;
      gemm_cpu<T>(false, false, rows, IC, OC, T(1), dout + n0 * OC, OC, weight, IC, accumulate_dinp ? T(1) : T(0),
                  dinp + n0 * IC, IC);
    }
  }
  if (dweight) {  // dW[o rows] (+)= dout[:, o rows]^T @ inp
    const int64_t blocks = (OC + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t o0 = blk * kRowBlock, rows = std::min(OC, o0 + kRowBlock) - o0;
      gemm_cpu<T>(true, false, rows, IC, N, T(1), dout + o0, OC, inp, IC, accumulate_dweight ? T(1) : T(0),
                  dweight + o0 * IC, IC);
    }
  }
  if (dbias) {
    // Each task owns a block of columns and sums its rows in order n = 0..N-1: deterministic.
    const int64_t blocks = (OC + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (N * OC > (1 << 15))
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t c0 = blk * kColBlock, c1 = std::min(OC, c0 + kColBlock);
      double acc[kColBlock] = {};
      for (int64_t n = 0; n < N; ++n) {
        const T* row = dout + n * OC;
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += static_cast<double>(row[c]);
      }
      for (int64_t c = c0; c < c1; ++c) dbias[c] += static_cast<T>(acc[c - c0]);
    }
  }
}

#define MT_INSTANTIATE(T)                                                                                       \
  template void gemm_cpu<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*, int64_t, T, \
                            T*, int64_t);                                                                       \
  template void linear_forward_cpu<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t);            \
  template void linear_backward_cpu<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, bool, \
                                       bool);
MT_INSTANTIATE(float)
MT_INSTANTIATE(double)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cpu
