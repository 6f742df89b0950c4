// CPU reference of the pieces context-parallel attention adds (ops.h): the log-sum-exp merge of attention over two
// sets of keys, and copies of sequence ranges. Per (b, t, h) of the merged rows, in fp64:
//   m = max(a, p), l = m + log(exp(a - m) + exp(p - m)), out = out exp(a - l) + part exp(p - l)
// (a = lse, p = part_lse; both -inf leaves the row as it is).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "tensor/cpu/cpu_ops.h"

namespace mt::ops::cpu {

template <typename T>
void attention_merge_cpu(T* out, T* lse, const T* part_out, const T* part_lse, int64_t B, int64_t T_, int64_t Tb,
                         int64_t H, int64_t D, int64_t t0) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tb; ++t)
      for (int64_t h = 0; h < H; ++h) {
        T& l = lse[(b * H + h) * T_ + t0 + t];
        const double a = static_cast<double>(l), p = static_cast<double>(part_lse[(b * H + h) * Tb + t]);
        const double m = std::max(a, p);
        if (m == -std::numeric_limits<double>::infinity()) continue;
        const double merged = m + std::log(std::exp(a - m) + std::exp(p - m));
        const double wa = std::exp(a - merged), wp = std::exp(p - merged);
        T* o = out + ((b * T_ + t0 + t) * H + h) * D;
        const T* po = part_out + ((b * Tb + t) * H + h) * D;
        for (int64_t d = 0; d < D; ++d)
          o[d] = static_cast<T>(static_cast<double>(o[d]) * wa + static_cast<double>(po[d]) * wp);
        l = static_cast<T>(merged);
      }
}

template <typename T>
void seq_copy_cpu(T* dst, int64_t Td, int64_t dst_t, const T* src, int64_t Ts, int64_t src_t, int64_t B, int64_t len,
                  int64_t row, bool accumulate) {
  const int64_t n = len * row;
  for (int64_t b = 0; b < B; ++b) {
    T* d = dst + (b * Td + dst_t) * row;
    const T* s = src + (b * Ts + src_t) * row;
    if (accumulate)
      for (int64_t i = 0; i < n; ++i) d[i] += s[i];
    else if (n > 0)
      std::memcpy(d, s, sizeof(T) * static_cast<size_t>(n));
  }
}

#define MT_INSTANTIATE(T)                                                                                         \
  template void attention_merge_cpu<T>(T*, T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t,  \
                                       int64_t);                                                                 \
  template void seq_copy_cpu<T>(T*, int64_t, int64_t, const T*, int64_t, int64_t, int64_t, int64_t, int64_t, bool);
MT_INSTANTIATE(float)
MT_INSTANTIATE(double)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cpu
