// Rotary position embedding, rotate-half convention (HF / Megatron default), in place on
// x (B, T, heads, D), D even. For position p = positions(t) (offset + t, or two chunks' offsets) and i < D/2, the pair
// (x1, x2) = (x[i], x[i + D/2]) is rotated by a = p * inv_freq_i, inv_freq_i = theta^(-2i/D) (Llama-3
// rescaled when rope.scaling: tensor/rope_params.h):
//   x1' = x1 cos a - x2 sin a,   x2' = x2 cos a + x1 sin a      (= x cos + rotate_half(x) sin).
// The map is a rotation R(a), so its Jacobian transpose is R(-a): backward rotates the gradient by -a:
//   g1 = g1' cos a + g2' sin a,  g2 = g2' cos a - g1' sin a.
// Angles, cos and sin are computed in fp64 (a (T, D/2) table), then applied in T.
#include <cmath>
#include <vector>

#include "tensor/cpu/cpu_ops.h"

namespace mt::ops::cpu {

namespace {
template <typename T>
void rope_apply(T* x, int64_t B, int64_t T_, int64_t heads, int64_t D, const RopeParams& rope, RopePositions positions,
                double sign) {
  const int64_t half = D / 2;
  std::vector<T> cos_t(static_cast<size_t>(T_ * half)), sin_t(cos_t.size());
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq =
        rope_scale_inv_freq(std::pow(rope.theta, -2.0 * static_cast<double>(i) / static_cast<double>(D)), rope);
    for (int64_t t = 0; t < T_; ++t) {
      const double a = static_cast<double>(positions(t)) * inv_freq;
      cos_t[static_cast<size_t>(t * half + i)] = static_cast<T>(std::cos(a));
      sin_t[static_cast<size_t>(t * half + i)] = static_cast<T>(sign * std::sin(a));
    }
  }
#pragma omp parallel for schedule(static) if (B * T_ * heads * D > (1 << 14))
  for (int64_t bt = 0; bt < B * T_; ++bt) {
    const int64_t t = bt % T_;
    const T* c = cos_t.data() + t * half;
    const T* s = sin_t.data() + t * half;
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + (bt * heads + h) * D;
      for (int64_t i = 0; i < half; ++i) {
        const T x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c[i] - x2 * s[i];
        v[i + half] = x2 * c[i] + x1 * s[i];
      }
    }
  }
}
}  // namespace

template <typename T>
void rope_forward_cpu(T* x, int64_t B, int64_t T_, int64_t heads, int64_t D, const RopeParams& rope, RopePositions positions) {
  rope_apply(x, B, T_, heads, D, rope, positions, 1.0);
}

template <typename T>
void rope_backward_cpu(T* dx, int64_t B, int64_t T_, int64_t heads, int64_t D, const RopeParams& rope,
                       RopePositions positions) {
  rope_apply(dx, B, T_, heads, D, rope, positions, -1.0);
}

#define MT_INSTANTIATE(T)                                                                    \
  template void rope_forward_cpu<T>(T*, int64_t, int64_t, int64_t, int64_t, const RopeParams&, RopePositions); \
  template void rope_backward_cpu<T>(T*, int64_t, int64_t, int64_t, int64_t, const RopeParams&, RopePositions);
MT_INSTANTIATE(float)
MT_INSTANTIATE(double)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cpu
