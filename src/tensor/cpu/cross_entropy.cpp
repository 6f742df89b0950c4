// Vocab-parallel cross-entropy, CPU reference. logits (N, Vl): columns are global vocab ids
// [vocab_start, vocab_start + Vl), only the first n_valid are real (the rest is padding and never
// enters the softmax); targets int32 (N).
// Stats (per row, over this slice's valid columns):
//   max = max_v z_v,  sumexp = sum_v exp(z_v - max),  target_logit = z_t if t is in the slice, else 0.
//   Slices combine as M = max_k m_k, S = sum_k s_k exp(m_k - M), lse = M + log S, and the row's loss
//   is lse - sum_k target_logit_k. With no valid column, max = -inf and sumexp = 0 (neutral).
// Combine (cross_entropy_rescale, then the sums over slices, then cross_entropy_finish):
//   sumexp_k *= exp(m_k - M) (0 for a slice with no valid column), lse = M + log(sum_k sumexp_k),
//   loss = lse - sum_k target_logit_k (in fp64).
// Backward of loss_n = lse_n - z_{n,t}:  d loss_n / d z_v = softmax_v - [v == t] = exp(z_v - lse_n) - [v == t],
//   scaled by dloss[n]; padding columns get 0. Elementwise per row, so dlogits may alias logits.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/cpu/cpu_ops.h"

namespace mt::ops::cpu {

template <typename T>
void cross_entropy_stats_cpu(T* max, T* sumexp, T* target_logit, const T* logits, const int32_t* targets, int64_t N,
                             int64_t Vl, int64_t vocab_start, int64_t n_valid) {
#pragma omp parallel for schedule(static) if (N * n_valid > (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    const T* z = logits + n * Vl;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t v = 0; v < n_valid; ++v) m = std::max(m, static_cast<double>(z[v]));
    double s = 0;
    const T mt = static_cast<T>(m);
    for (int64_t v = 0; v < n_valid; ++v) s += static_cast<double>(std::exp(z[v] - mt));  // exp in T, sum in fp64
    const int64_t t = static_cast<int64_t>(targets[n]) - vocab_start;
    max[n] = static_cast<T>(m);
    sumexp[n] = static_cast<T>(s);
    target_logit[n] = (t >= 0 && t < n_valid) ? z[t] : T(0);
  }
}

template <typename T, typename U>
void cross_entropy_backward_cpu(T* dlogits, const T* logits, const int32_t* targets, const T* lse, const U* dloss,
                                int64_t N, int64_t Vl, int64_t vocab_start, int64_t n_valid) {
#pragma omp parallel for schedule(static) if (N * Vl > (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    const T* z = logits + n * Vl;
    T* dz = dlogits + n * Vl;  // may be z: each element is read before it is written
    const T l = lse[n];
    const double g = static_cast<double>(dloss[n]);
    const int64_t t = static_cast<int64_t>(targets[n]) - vocab_start;
    for (int64_t v = 0; v < n_valid; ++v) {
      const double p = static_cast<double>(std::exp(z[v] - l));
      dz[v] = static_cast<T>((p - (v == t ? 1.0 : 0.0)) * g);
    }
    for (int64_t v = n_valid; v < Vl; ++v) dz[v] = T(0);
  }
}

// The combine of the slices' statistics (the reductions over the tensor-parallel ranks between the two steps are
// src/parallel's): M = gmax, the max over the slices.
template <typename T>
void cross_entropy_rescale_cpu(T* sumexp, const T* max, const T* gmax, int64_t N) {
  for (int64_t n = 0; n < N; ++n) sumexp[n] = std::isinf(max[n]) ? T(0) : sumexp[n] * std::exp(max[n] - gmax[n]);
}

template <typename T>
void cross_entropy_finish_cpu(T* lse, double* loss, const T* gmax, const T* sumexp, const T* target_logit, int64_t N) {
  for (int64_t n = 0; n < N; ++n) {
    lse[n] = gmax[n] + std::log(sumexp[n]);
    loss[n] = static_cast<double>(lse[n]) - static_cast<double>(target_logit[n]);
  }
}

double sum_cpu(const double* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i];  // in order: the same bits every run
  return s;
}

#define MT_INSTANTIATE(T)                                                                                      \
  template void cross_entropy_stats_cpu<T>(T*, T*, T*, const T*, const int32_t*, int64_t, int64_t, int64_t,    \
                                           int64_t);                                                          \
  template void cross_entropy_rescale_cpu<T>(T*, const T*, const T*, int64_t);                                 \
  template void cross_entropy_finish_cpu<T>(T*, double*, const T*, const T*, const T*, int64_t);               \
  template void cross_entropy_backward_cpu<T, float>(T*, const T*, const int32_t*, const T*, const float*,     \
                                                     int64_t, int64_t, int64_t, int64_t);                     \
  template void cross_entropy_backward_cpu<T, double>(T*, const T*, const int32_t*, const T*, const double*,   \
                                                      int64_t, int64_t, int64_t, int64_t);
MT_INSTANTIATE(float)
MT_INSTANTIATE(double)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cpu
