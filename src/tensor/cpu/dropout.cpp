// Dropout with a counter-based mask (nothing saved between forward and backward). Any shape, n elements.
//   keep[i] = uniform01(seed, kDropoutStream, offset + i) >= p   (counter_rng.h: SplitMix64 hash)
//   forward:  out[i] = keep[i] ? inp[i] / (1 - p) : 0
//   backward: the map is linear and diagonal, so dinp[i] = keep[i] ? dout[i] / (1 - p) : 0 with the same
//             (seed, offset) regenerating the same mask. p = 1 drops everything (out = 0).
// Callers derive offset from global element coordinates so every parallel layout drops the same elements.
#include "core/counter_rng.h"
#include "tensor/cpu/cpu_ops.h"

namespace mt::ops::cpu {

namespace {
template <typename T>
void apply_mask(T* out, const T* inp, int64_t n, double p, uint64_t seed, uint64_t offset) {
  const double keep_scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
#pragma omp parallel for schedule(static) if (n > (1 << 14))
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = rng::uniform01(seed, rng::kDropoutStream, offset + static_cast<uint64_t>(i)) >= p;
    out[i] = keep ? static_cast<T>(static_cast<double>(inp[i]) * keep_scale) : T(0);
  }
}
}  // namespace

template <typename T>
void dropout_forward_cpu(T* out, const T* inp, int64_t n, double p, uint64_t seed, uint64_t offset) {
  apply_mask(out, inp, n, p, seed, offset);
}

template <typename T>
void dropout_backward_cpu(T* dinp, const T* dout, int64_t n, double p, uint64_t seed, uint64_t offset) {
  apply_mask(dinp, dout, n, p, seed, offset);
}

#define MT_INSTANTIATE(T)                                                                  \
  template void dropout_forward_cpu<T>(T*, const T*, int64_t, double, uint64_t, uint64_t); \
  template void dropout_backward_cpu<T>(T*, const T*, int64_t, double, uint64_t, uint64_t);
MT_INSTANTIATE(float)
MT_INSTANTIATE(double)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cpu
