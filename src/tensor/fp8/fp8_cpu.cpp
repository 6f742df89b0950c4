// CPU reference of the FP8 casts (fp8_cpu.h). Plain loops: the oracle the CUDA kernels are tested against.
#include "tensor/fp8/fp8_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace mt::ops::fp8cpu {

namespace {
constexpr int64_t kB = 128;
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
float abs_f(float v) { return std::fabs(v); }
// max that propagates NaN (as the CUDA amax does)
float nan_max(float a, float b) { return (std::isnan(a) || std::isnan(b)) ? NAN : std::max(a, b); }
}  // namespace

template <typename T>
float amax_cpu(const T* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = nan_max(m, abs_f(static_cast<float>(x[i])));
  return m;
}

template <typename T>
void quantize_tensor_cpu(uint8_t* out, uint8_t* out_t, const T* x, int64_t R, int64_t C, float scale,
                         fp8::Fp8Dtype t) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const uint8_t q = fp8::float_to_fp8(static_cast<float>(x[r * C + c]) * scale, t);
      if (out) out[r * C + c] = q;
      if (out_t) out_t[c * R + r] = q;
    }
}

template <typename T>
void quantize_tiles_cpu(uint8_t* out, float* scale_inv, const T* x, int64_t R, int64_t C, bool transpose,
                        fp8::Fp8Dtype t) {
  // The output is (Ro, Co) = (R, C) or (C, R); element (i, j) of it reads x[i, j] or x[j, i].
  const int64_t Ro = transpose ? C : R, Co = transpose ? R : C, tiles = ceil_div(Co, kB);
  auto at = [&](int64_t i, int64_t j) { return static_cast<float>(transpose ? x[j * C + i] : x[i * C + j]); };
  const float fmax = fp8::fp8_max(t);
  for (int64_t i = 0; i < Ro; ++i)
    for (int64_t b = 0; b < tiles; ++b) {
      const int64_t j0 = b * kB, j1 = std::min(Co, j0 + kB);
      float m = 0.0f;
      for (int64_t j = j0; j < j1; ++j) m = nan_max(m, abs_f(at(i, j)));
      const float s = fp8::scale_from_amax(m, fmax, 0, true);
      scale_inv[i * tiles + b] = 1.0f / s;
      for (int64_t j = j0; j < j1; ++j) out[i * Co + j] = fp8::float_to_fp8(at(i, j) * s, t);
    }
}

template <typename T>
void quantize_blocks_cpu(uint8_t* out, uint8_t* out_t, float* scale_inv, float* scale_inv_t, const T* x, int64_t R,
                         int64_t C, fp8::Fp8Dtype t) {
  const int64_t br = ceil_div(R, kB), bc = ceil_div(C, kB);
  const float fmax = fp8::fp8_max(t);
  for (int64_t bi = 0; bi < br; ++bi)
    for (int64_t bj = 0; bj < bc; ++bj) {
      const int64_t r0 = bi * kB, r1 = std::min(R, r0 + kB), c0 = bj * kB, c1 = std::min(C, c0 + kB);
      float m = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) m = nan_max(m, abs_f(static_cast<float>(x[r * C + c])));
      const float s = fp8::scale_from_amax(m, fmax, 0, true);
      if (scale_inv) scale_inv[bi * bc + bj] = 1.0f / s;
      if (scale_inv_t) scale_inv_t[bj * br + bi] = 1.0f / s;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          const uint8_t q = fp8::float_to_fp8(static_cast<float>(x[r * C + c]) * s, t);
          if (out) out[r * C + c] = q;
          if (out_t) out_t[c * R + r] = q;
        }
    }
}

template <typename T>
void dequantize_cpu(T* out, const uint8_t* codes, const float* scale_inv, int64_t R, int64_t K, int64_t block_rows,
                    int64_t block_cols, fp8::Fp8Dtype t) {
  const int64_t bc = ceil_div(K, block_cols);
  float lut[256];
  for (int c = 0; c < 256; ++c) lut[c] = fp8::fp8_to_float(static_cast<uint8_t>(c), t);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k)
      out[r * K + k] = static_cast<T>(lut[codes[r * K + k]] * scale_inv[(r / block_rows) * bc + k / block_cols]);
}

#define MT_INSTANTIATE(T)                                                                                         \
  template float amax_cpu<T>(const T*, int64_t);                                                                  \
  template void quantize_tensor_cpu<T>(uint8_t*, uint8_t*, const T*, int64_t, int64_t, float, fp8::Fp8Dtype);     \
  template void quantize_tiles_cpu<T>(uint8_t*, float*, const T*, int64_t, int64_t, bool, fp8::Fp8Dtype);         \
  template void quantize_blocks_cpu<T>(uint8_t*, uint8_t*, float*, float*, const T*, int64_t, int64_t,            \
                                       fp8::Fp8Dtype);                                                            \
  template void dequantize_cpu<T>(T*, const uint8_t*, const float*, int64_t, int64_t, int64_t, int64_t, fp8::Fp8Dtype);
MT_INSTANTIATE(float)
MT_INSTANTIATE(double)
#undef MT_INSTANTIATE

}  // namespace mt::ops::fp8cpu
