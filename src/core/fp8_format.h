// The two FP8 formats of Hopper's tensor cores (OCP FP8, "fn" e4m3), their exact casts, and the scale rule every
// recipe shares. Plain header: the same inline functions run on the host (CPU emulation, recipe bookkeeping) and
// on the device (cuda/fp8_*.cu), so both backends round and scale identically.
//
//   e4m3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, NaN = S.1111.111; largest 448 (S.1111.110);
//         subnormals m/8 * 2^-6 (smallest 2^-9).
//   e5m2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; inf = S.11111.00, NaN = S.11111.{01,10,11}; largest 57344;
//         subnormals m/4 * 2^-14 (smallest 2^-16).
// Casts from float round to nearest, ties to even, and saturate (finite values and infinities beyond the largest
// finite value become +-max; NaN stays NaN): CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...).
// A quantized value is code = cast(x * scale); it stands for decode(code) * scale_inv, scale_inv = 1 / scale.
#pragma once

#include <cstdint>

#include "core/float_bits.h"

#if defined(__CUDACC__)
#define MT_FP8_HD __host__ __device__ __forceinline__
#else
#define MT_FP8_HD inline
#endif

namespace mt::fp8 {

enum class Fp8Dtype : uint8_t { E4M3, E5M2 };

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;

MT_FP8_HD float fp8_max(Fp8Dtype t) { return t == Fp8Dtype::E4M3 ? 448.0f : 57344.0f; }

// float -> code, round to nearest even, saturating. E exponent bits, M mantissa bits, bias B = 2^(E-1) - 1;
// max_code: the largest finite magnitude's code; nan_code: the NaN magnitude.
template <int E, int M>
MT_FP8_HD uint8_t encode_fp8(float x, uint32_t max_code, uint32_t nan_code) {
  constexpr int B = (1 << (E - 1)) - 1;
  const uint32_t u = float_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | nan_code);
  const int fe = static_cast<int>(a >> 23) - 127;  // the float's exponent (-127 for zero / float subnormals)
  uint32_t code;
  if (fe >= 1 - B) {
    // Normal range of the target: rebias the exponent, round away 23 - M mantissa bits (a carry moves into the
    // exponent, which is right); compare in the rebiased domain so huge floats cannot wrap.
    if (fe > B + 1) return static_cast<uint8_t>(sign | max_code);
    constexpr int shift = 23 - M;
    uint32_t r = a - (static_cast<uint32_t>(127 - B) << 23);
    r += (1u << (shift - 1)) - 1u + ((r >> shift) & 1u);
    code = r >> shift;
  } else {
    // Subnormal range: value = mant 2^(fe-23); the unit is 2^(1-B-M), so code = mant >> s rounded.
    if (a < 0x00800000u) return static_cast<uint8_t>(sign);  // float zero or subnormal: far below 2^(-B-M-1)
    const int s = 23 + 1 - B - M - fe;
    if (s > 24) return static_cast<uint8_t>(sign);  // below half the smallest subnormal
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const uint32_t rem = mant & ((1u << s) - 1u), half = 1u << (s - 1);
    code = mant >> s;
    if (rem > half || (rem == half && (code & 1u))) ++code;  // code 2^M is the smallest normal: still right
  }
  if (code > max_code) code = max_code;
  return static_cast<uint8_t>(sign | code);
}

// code -> float (exact: every FP8 value is a float).
template <int E, int M>
MT_FP8_HD float decode_fp8(uint8_t c, bool has_inf) {
  constexpr int B = (1 << (E - 1)) - 1;
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t e = (c >> M) & ((1u << E) - 1u), m = c & ((1u << M) - 1u);
  if (e == (1u << E) - 1u) {
    if (has_inf) return bits_float(sign | (m == 0 ? 0x7f800000u : 0x7fc00000u));
    if (m == (1u << M) - 1u) return bits_float(sign | 0x7fc00000u);
  }
  if (e == 0) {  // m * 2^(1-B-M), exact in float
    const float v = static_cast<float>(m) * bits_float(static_cast<uint32_t>(127 + 1 - B - M) << 23);
    return bits_float(sign | float_bits(v));
  }
  return bits_float(sign | ((e + 127 - B) << 23) | (m << (23 - M)));
}

MT_FP8_HD uint8_t float_to_e4m3(float x) { return encode_fp8<4, 3>(x, 0x7eu, 0x7fu); }
MT_FP8_HD uint8_t float_to_e5m2(float x) { return encode_fp8<5, 2>(x, 0x7bu, 0x7fu); }
MT_FP8_HD float e4m3_to_float(uint8_t c) { return decode_fp8<4, 3>(c, false); }
MT_FP8_HD float e5m2_to_float(uint8_t c) { return decode_fp8<5, 2>(c, true); }
MT_FP8_HD uint8_t float_to_fp8(float x, Fp8Dtype t) { return t == Fp8Dtype::E4M3 ? float_to_e4m3(x) : float_to_e5m2(x); }
MT_FP8_HD float fp8_to_float(uint8_t c, Fp8Dtype t) { return t == Fp8Dtype::E4M3 ? e4m3_to_float(c) : e5m2_to_float(c); }

// 2^-margin (margin >= 0), exact.
MT_FP8_HD float pow2_neg(int margin) {
  return margin >= 126 ? 0.0f : bits_float(static_cast<uint32_t>(127 - margin) << 23);
}

// The scale of a tensor (or block) whose largest magnitude is amax: fp8_max / amax / 2^margin, so that amax maps
// to the format's largest value. amax 0 (or not finite): scale 1. A scale that overflows float is clamped to the
// largest float. pow2: rounded down to a power of two (blockwise: dequantization is then exact).
MT_FP8_HD float scale_from_amax(float amax, float fmax, int margin, bool pow2) {
  if (!(amax > 0.0f) || float_bits(amax) >= 0x7f800000u) return 1.0f;
  float s = fmax / amax * pow2_neg(margin);
  if (float_bits(s) >= 0x7f800000u) s = bits_float(0x7f7fffffu);
  if (pow2) s = bits_float(float_bits(s) & 0xff800000u);  // keep sign and exponent (s is a normal float here)
  return s;
}

}  // namespace mt::fp8
