// Token embedding, vocab-parallel ready. tokens int32 (N); table (Vl, C) holds the global rows
// [vocab_start, vocab_start + Vl) (this rank's vocab slice).
//   forward:  out[n, :] = table[tok[n] - vocab_start, :] if the token is in the slice, else 0
//             (summing the outputs of all slices gives the full lookup).
//   backward: out is a row gather, so its adjoint is a scatter-add:
//             dtable[tok[n] - vocab_start, :] += dout[n, :] for tokens in the slice.
// The scatter runs in parallel over blocks of columns; each block adds rows in order n = 0..N-1,
// so repeated tokens are summed in a fixed order whatever the thread count.
#include <algorithm>

#include "tensor/cpu/cpu_ops.h"

namespace mt::ops::cpu {

namespace {
constexpr int64_t kColBlock = 64;
}

template <typename T>
void embedding_forward_cpu(T* out, const int32_t* tokens, const T* table, int64_t N, int64_t Vl, int64_t C,
                           int64_t vocab_start) {
#pragma omp parallel for schedule(static) if (N * C > (1 << 15))
  for (int64_t n = 0; n < N; ++n) {
    const int64_t r = static_cast<int64_t>(tokens[n]) - vocab_start;
    T* o = out + n * C;
    if (r >= 0 && r < Vl)
      std::copy(table + r * C, table + (r + 1) * C, o);
    else
      std::fill(o, o + C, T(0));
  }
}

template <typename T>
void embedding_backward_cpu(T* dtable, const T* dout, const int32_t* tokens, int64_t N, int64_t Vl, int64_t C,
                            int64_t vocab_start) {
  const int64_t blocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (N * C > (1 << 15))
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kColBlock, c1 = std::min(C, c0 + kColBlock);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t r = static_cast<int64_t>(tokens[n]) - vocab_start;
      if (r < 0 || r >= Vl) continue;
      T* d = dtable + r * C;
      const T* g = dout + n * C;
      for (int64_t c = c0; c < c1; ++c) d[c] += g[c];
    }
  }
}

#define MT_INSTANTIATE(T)                                                                                       \
  template void embedding_forward_cpu<T>(T*, const int32_t*, const T*, int64_t, int64_t, int64_t, int64_t); \
  template void embedding_backward_cpu<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t);
MT_INSTANTIATE(float)
MT_INSTANTIATE(double)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cpu
