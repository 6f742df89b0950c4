// LayerNorm and RMSNorm over the last dim C of (N, C), CPU reference. Row statistics in fp64.
//
// LayerNorm: mu = mean_c x, var = mean_c (x - mu)^2, r = 1 / sqrt(var + eps), xh = (x - mu) r,
//   y = xh * w + b. Saves mean = mu, rstd = r (N).
//   Backward, with gh = dy * w (the gradient wrt xh): d xh_j / d x_i = r (delta_ij - 1/C - xh_i xh_j / C), so
//     dx = r * (gh - mean_c(gh) - xh * mean_c(gh * xh)),   dw += sum_n dy * xh,   db += sum_n dy.
// RMSNorm: r = 1 / sqrt(mean_c x^2 + eps), xh = x r, y = xh * w. Saves rstd = r (N).
//   Backward: d r / d x_i = -r^3 x_i / C, so with gh = dy * w:
//     dx = r * (gh - xh * mean_c(gh * xh)),   dw += sum_n dy * xh.
// Rows run in parallel (each row reduced by one thread). The parameter gradients are column sums over
// n: each task owns a block of columns and adds rows in order, so they do not depend on the thread
// count. The parameter pass runs before dinp is written, so dinp may alias dout (Overwrite mode).
#include <algorithm>
#include <cmath>

#include "tensor/cpu/cpu_ops.h"

namespace mt::ops::cpu {

namespace {
constexpr int64_t kColBlock = 128;

// dw[c] += sum_n dout[n,c] * xh[n,c] (and db[c] += sum_n dout[n,c] when db), xh from (mean, rstd);
// mean == nullptr means RMSNorm (xh = x * rstd).
template <typename T>
void norm_param_grads(T* dw, T* db, const T* dout, const T* inp, const T* mean, const T* rstd, int64_t N, int64_t C) {
  const int64_t blocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (N * C > (1 << 14))
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kColBlock, c1 = std::min(C, c0 + kColBlock);
    double aw[kColBlock] = {}, ab[kColBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      const double mu = mean ? static_cast<double>(mean[n]) : 0.0, r = static_cast<double>(rstd[n]);
      const T* x = inp + n * C;
      const T* g = dout + n * C;
      for (int64_t c = c0; c < c1; ++c) {
        const double gc = static_cast<double>(g[c]);
        aw[c - c0] += gc * (static_cast<double>(x[c]) - mu) * r;
        ab[c - c0] += gc;
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      dw[c] += static_cast<T>(aw[c - c0]);
      if (db) db[c] += static_cast<T>(ab[c - c0]);
    }
  }
}
}  // namespace

template <typename T>
void layernorm_forward_cpu(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int64_t N,
                           int64_t C, double eps) {
#pragma omp parallel for schedule(static) if (N * C > (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    double mu = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mu += static_cast<double>(x[c]);
    mu /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) {
      const double d = static_cast<double>(x[c]) - mu;
      var += d * d;
    }
    var /= static_cast<double>(C);
    const double r = 1.0 / std::sqrt(var + eps);
    T* y = out + n * C;
    for (int64_t c = 0; c < C; ++c)
      y[c] = static_cast<T>((static_cast<double>(x[c]) - mu) * r * static_cast<double>(weight[c]) +
                            static_cast<double>(bias[c]));
    mean[n] = static_cast<T>(mu);
    rstd[n] = static_cast<T>(r);
  }
}

template <typename T>
void layernorm_backward_cpu(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                            const T* mean, const T* rstd, int64_t N, int64_t C, bool accumulate_dinp) {
  norm_param_grads(dweight, dbias, dout, inp, mean, rstd, N, C);
#pragma omp parallel for schedule(static) if (N * C > (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    const T* g = dout + n * C;
    const double mu = static_cast<double>(mean[n]), r = static_cast<double>(rstd[n]);
    double sum_gh = 0, sum_gh_xh = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double gh = static_cast<double>(g[c]) * static_cast<double>(weight[c]);
      sum_gh += gh;
      sum_gh_xh += gh * (static_cast<double>(x[c]) - mu) * r;
    }
    const double m1 = sum_gh / static_cast<double>(C), m2 = sum_gh_xh / static_cast<double>(C);
    T* dx = dinp + n * C;
    for (int64_t c = 0; c < C; ++c) {
      const double gh = static_cast<double>(g[c]) * static_cast<double>(weight[c]);
      const double xh = (static_cast<double>(x[c]) - mu) * r;
      const double v = r * (gh - m1 - xh * m2);
      dx[c] = accumulate_dinp ? static_cast<T>(static_cast<double>(dx[c]) + v) : static_cast<T>(v);
    }
  }
}

template <typename T>
void rmsnorm_forward_cpu(T* out, T* rstd, const T* inp, const T* weight, int64_t N, int64_t C, double eps) {
#pragma omp parallel for schedule(static) if (N * C > (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(x[c]) * static_cast<double>(x[c]);
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(C) + eps);
    T* y = out + n * C;
    for (int64_t c = 0; c < C; ++c) y[c] = static_cast<T>(static_cast<double>(x[c]) * r * static_cast<double>(weight[c]));
    rstd[n] = static_cast<T>(r);
  }
}

template <typename T>
void rmsnorm_backward_cpu(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd,
                          int64_t N, int64_t C, bool accumulate_dinp) {
  norm_param_grads<T>(dweight, nullptr, dout, inp, nullptr, rstd, N, C);
#pragma omp parallel for schedule(static) if (N * C > (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    const T* g = dout + n * C;
    const double r = static_cast<double>(rstd[n]);
    double sum_gh_xh = 0;
    for (int64_t c = 0; c < C; ++c)
      sum_gh_xh += static_cast<double>(g[c]) * static_cast<double>(weight[c]) * static_cast<double>(x[c]) * r;
    const double m2 = sum_gh_xh / static_cast<double>(C);
    T* dx = dinp + n * C;
    for (int64_t c = 0; c < C; ++c) {
      const double gh = static_cast<double>(g[c]) * static_cast<double>(weight[c]);
      const double v = r * (gh - static_cast<double>(x[c]) * r * m2);
      dx[c] = accumulate_dinp ? static_cast<T>(static_cast<double>(dx[c]) + v) : static_cast<T>(v);
    }
  }
}

#define MT_INSTANTIATE(T)                                                                                       \
  template void layernorm_forward_cpu<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t, double); \
  template void layernorm_backward_cpu<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int64_t, \
                                          int64_t, bool);                                                     \
  template void rmsnorm_forward_cpu<T>(T*, T*, const T*, const T*, int64_t, int64_t, double);                 \
  template void rmsnorm_backward_cpu<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, int64_t, bool);
MT_INSTANTIATE(float)
MT_INSTANTIATE(double)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cpu
