// QKV split and causal grouped-query attention, CPU reference (the oracle of the CUDA kernels).
// Shapes (legend of ops.h): qkv (B, T, G*(R+2)*D), R = H / G; q, out (B, T, H, D); k, v (B, T, G, D);
// lse (B, H, T). Query head h reads key/value head g = h / R.
//
// qkv split: per token, group g holds R query heads, then its key head, then its value head, so
//   q[h = g R + r] = qkv[g (R+2) D + r D + :], k[g] = qkv[g (R+2) D + R D + :], v[g] = ... + (R+1) D.
//   The backward is the inverse gather (every qkv element is exactly one q/k/v element).
// Attention, per (b, h), scale c = 1/sqrt(D), rows i, keys j <= i (causal), or all Tk keys (non-causal: a block of
// context-parallel attention, whose queries and keys may differ in length):
//   s_ij = c q_i . k_j,  lse_i = log sum_{j<=i} exp(s_ij),  p_ij = exp(s_ij - lse_i),  o_i = sum_j p_ij v_j.
// Backward (p recomputed from q, k and the saved lse; the T x T matrix is never kept):
//   dv_j += sum_i p_ij do_i;   dp_ij = do_i . v_j;
//   ds_ij = p_ij (dp_ij - D_i) with D_i = sum_j p_ij dp_ij = do_i . o_i   (softmax Jacobian);
//   dq_i = c sum_j ds_ij k_j;  dk_j += c sum_i ds_ij q_i   (dk, dv summed over the R heads of a group).
// GEMMs run through CBLAS on the strided (B, T, heads, D) layout (ld = heads * D), by blocks of kBlock
// query rows: a causal block only needs keys [0, i1), which skips the masked upper triangle. A temporary
// kBlock x T score buffer per thread holds s / p / ds. Forward parallel over (b, h); backward over
// (b, g), so each dk/dv slice has one owner and sums its heads in a fixed order.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <omp.h>

#include "tensor/cpu/cpu_ops.h"

namespace mt::ops::cpu {

namespace {
constexpr int64_t kBlock = 64;             // query rows per GEMM block
constexpr int64_t kParallelWork = 1 << 18;  // B*H*T*T*D below this runs on one thread

// Turns the scores of row i (keys 0..cols-1, valid j <= i) into probabilities in place and returns
// the lse: with the saved lse (backward) p = exp(s - lse); without (forward) e = exp(s - max),
// p = e / sum e (one exp per score; exp in T, sums in fp64).
template <typename T>
double softmax_row(T* row, int64_t i, int64_t cols, const T* lse_in) {
  double lse;
  if (lse_in) {
    lse = static_cast<double>(*lse_in);
    const T l = *lse_in;
    for (int64_t j = 0; j <= i; ++j) row[j] = std::exp(row[j] - l);
  } else {
    T m = row[0];
    for (int64_t j = 1; j <= i; ++j) m = std::max(m, row[j]);
    double sum = 0;
    for (int64_t j = 0; j <= i; ++j) {
      row[j] = std::exp(row[j] - m);
      sum += static_cast<double>(row[j]);
    }
    const T inv = static_cast<T>(1.0 / sum);
    for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
    lse = static_cast<double>(m) + std::log(sum);
  }
  for (int64_t j = i + 1; j < cols; ++j) row[j] = T(0);
  return lse;
}
}  // namespace

template <typename T>
void qkv_split_forward_cpu(T* q, T* k, T* v, const T* qkv, const AttnShape& s) {
  const int64_t R = s.H / s.G, D = s.D, W = s.G * (R + 2) * D;
#pragma omp parallel for schedule(static) if (s.B * s.T * W > (1 << 15))
  for (int64_t bt = 0; bt < s.B * s.T; ++bt) {
    const T* row = qkv + bt * W;
    for (int64_t g = 0; g < s.G; ++g) {
      const T* grp = row + g * (R + 2) * D;
      std::memcpy(q + (bt * s.H + g * R) * D, grp, sizeof(T) * R * D);
      std::memcpy(k + (bt * s.G + g) * D, grp + R * D, sizeof(T) * D);
      std::memcpy(v + (bt * s.G + g) * D, grp + (R + 1) * D, sizeof(T) * D);
    }
  }
}

template <typename T>
void qkv_split_backward_cpu(T* dqkv, const T* dq, const T* dk, const T* dv, const AttnShape& s) {
  const int64_t R = s.H / s.G, D = s.D, W = s.G * (R + 2) * D;
#pragma omp parallel for schedule(static) if (s.B * s.T * W > (1 << 15))
  for (int64_t bt = 0; bt < s.B * s.T; ++bt) {
    T* row = dqkv + bt * W;
    for (int64_t g = 0; g < s.G; ++g) {
      T* grp = row + g * (R + 2) * D;
      std::memcpy(grp, dq + (bt * s.H + g * R) * D, sizeof(T) * R * D);
      std::memcpy(grp + R * D, dk + (bt * s.G + g) * D, sizeof(T) * D);
      std::memcpy(grp + (R + 1) * D, dv + (bt * s.G + g) * D, sizeof(T) * D);
    }
  }
}

template <typename T>
void attention_forward_cpu(T* out, T* lse, const T* q, const T* k, const T* v, const AttnShape& s) {
  const int64_t B = s.B, Tn = s.T, Tk = s.keys(), H = s.H, D = s.D, R = s.H / s.G;
  const int64_t ldq = H * D, ldk = s.G * D;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(D)));
  const bool parallel = B * H * Tn * Tk * D > kParallelWork && omp_get_max_threads() > 1;
  SerialBlasScope serial_blas(parallel);
#pragma omp parallel if (parallel)
  {
    std::vector<T> P(static_cast<size_t>(std::min(kBlock, Tn) * Tk));
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H, g = h / R;
      const T* Q = q + b * Tn * ldq + h * D;
      const T* K = k + b * Tk * ldk + g * D;
      const T* V = v + b * Tk * ldk + g * D;
      T* O = out + b * Tn * ldq + h * D;
      for (int64_t i0 = 0; i0 < Tn; i0 += kBlock) {
        const int64_t i1 = std::min(Tn, i0 + kBlock), rows = i1 - i0, cols = s.causal ? i1 : Tk;
        gemm_cpu<T>(false, true, rows, cols, D, scale, Q + i0 * ldq, ldq, K, ldk, T(0), P.data(), cols);
        for (int64_t r = 0; r < rows; ++r)
          lse[bh * Tn + i0 + r] =
              static_cast<T>(softmax_row<T>(P.data() + r * cols, s.causal ? i0 + r : Tk - 1, cols, nullptr));
        gemm_cpu<T>(false, false, rows, D, cols, T(1), P.data(), cols, V, ldk, T(0), O + i0 * ldq, ldq);
      }
    }
  }
}

template <typename T>
void attention_backward_cpu(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                            const T* lse, const AttnShape& s) {
  const int64_t B = s.B, Tn = s.T, Tk = s.keys(), H = s.H, G = s.G, D = s.D, R = s.H / s.G;
  const int64_t ldq = H * D, ldk = G * D;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(D)));
  const bool parallel = B * H * Tn * Tk * D > kParallelWork && omp_get_max_threads() > 1;
  SerialBlasScope serial_blas(parallel);
#pragma omp parallel if (parallel)
  {
    const size_t buf = static_cast<size_t>(std::min(kBlock, Tn) * Tk);
    std::vector<T> P(buf), dP(buf);
#pragma omp for schedule(static)
    for (int64_t bg = 0; bg < B * G; ++bg) {
      const int64_t b = bg / G, g = bg % G;
      const T* K = k + b * Tk * ldk + g * D;
      const T* V = v + b * Tk * ldk + g * D;
      T* dK = dk + b * Tk * ldk + g * D;
      T* dV = dv + b * Tk * ldk + g * D;
      for (int64_t t = 0; t < Tk; ++t) {
        std::fill(dK + t * ldk, dK + t * ldk + D, T(0));
        std::fill(dV + t * ldk, dV + t * ldk + D, T(0));
      }
      for (int64_t h = g * R; h < (g + 1) * R; ++h) {
        const T* Q = q + b * Tn * ldq + h * D;
        const T* O = out + b * Tn * ldq + h * D;
        const T* dO = dout + b * Tn * ldq + h * D;
        T* dQ = dq + b * Tn * ldq + h * D;
        const T* L = lse + (b * H + h) * Tn;
        for (int64_t i0 = 0; i0 < Tn; i0 += kBlock) {
          const int64_t i1 = std::min(Tn, i0 + kBlock), rows = i1 - i0, cols = s.causal ? i1 : Tk;
          // P = softmax(c Q K^T) from the saved lse; dP = dO V^T.
          gemm_cpu<T>(false, true, rows, cols, D, scale, Q + i0 * ldq, ldq, K, ldk, T(0), P.data(), cols);
          for (int64_t r = 0; r < rows; ++r)
            softmax_row<T>(P.data() + r * cols, s.causal ? i0 + r : Tk - 1, cols, L + i0 + r);
          gemm_cpu<T>(false, true, rows, cols, D, T(1), dO + i0 * ldq, ldq, V, ldk, T(0), dP.data(), cols);
          // dS = P * (dP - D_i), D_i = dO_i . O_i (masked entries have P = 0).
          for (int64_t r = 0; r < rows; ++r) {
            const T* o = O + (i0 + r) * ldq;
            const T* g_o = dO + (i0 + r) * ldq;
            double di = 0;
            for (int64_t d = 0; d < D; ++d) di += static_cast<double>(o[d]) * static_cast<double>(g_o[d]);
            const T dit = static_cast<T>(di);
            T* p = P.data() + r * cols;
            T* ds = dP.data() + r * cols;
            for (int64_t j = 0; j < cols; ++j) ds[j] = p[j] * (ds[j] - dit);
          }
          gemm_cpu<T>(true, false, cols, D, rows, T(1), P.data(), cols, dO + i0 * ldq, ldq, T(1), dV, ldk);
          gemm_cpu<T>(false, false, rows, D, cols, scale, dP.data(), cols, K, ldk, T(0), dQ + i0 * ldq, ldq);
          gemm_cpu<T>(true, false, cols, D, rows, scale, dP.data(), cols, Q + i0 * ldq, ldq, T(1), dK, ldk);
        }
      }
    }
  }
}

#define MT_INSTANTIATE(T)                                                                                        \
  template void qkv_split_forward_cpu<T>(T*, T*, T*, const T*, const AttnShape&);                                \
  template void qkv_split_backward_cpu<T>(T*, const T*, const T*, const T*, const AttnShape&);                   \
  template void attention_forward_cpu<T>(T*, T*, const T*, const T*, const T*, const AttnShape&);                \
  template void attention_backward_cpu<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, const T*, \
                                          const AttnShape&);
MT_INSTANTIATE(float)
MT_INSTANTIATE(double)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cpu
