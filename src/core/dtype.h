// Element types and devices. Plain header (usable from .cu).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace mt {

enum class DType : uint8_t { F32, F64, BF16, F16, I32, I64, U16, U8 };
inline constexpr int kNumDTypes = 8;

enum class Device : uint8_t {
  CPU,
  CUDA,
  Meta,  // shapes only, no data: `plan` builds the model on it to count bytes
};

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::BF16: case DType::F16: case DType::U16: return 2;
    case DType::U8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t);      // "fp32", "fp64", "bf16", "fp16", "int32", "int64", "uint16", "uint8"
bool dtype_from_name(const std::string& name, DType* out);
const char* device_name(Device d);    // "cpu", "cuda", "meta"

// bfloat16 storage type for host code: the upper 16 bits of an IEEE float, round-to-nearest-even.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) { bits = 0x7fc0; return; }  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    bits = static_cast<uint16_t>(u >> 16);
  }
  explicit operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// IEEE binary16 storage type for host code (1 sign, 5 exponent, 10 mantissa bits; largest finite
// 65504, subnormals down to 2^-24), round-to-nearest-even from float, overflow to inf.
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) { bits = static_cast<uint16_t>(sign | 0x7e00u); return; }  // NaN
    if (a >= 0x477ff000u) { bits = static_cast<uint16_t>(sign | 0x7c00u); return; }  // >= 65520: inf
    if (a >= 0x38800000u) {  // normal: rebias the exponent (127 -> 15), round 13 mantissa bits away
      uint32_t r = a - (112u << 23);
      r += 0xfffu + ((r >> 13) & 1u);
      bits = static_cast<uint16_t>(sign | (r >> 13));
      return;
    }
    if (a < 0x33000000u) { bits = static_cast<uint16_t>(sign); return; }  // <= 2^-25: rounds to 0
    // Subnormal: m = |f| 2^24 rounded; |f| = mant 2^(e - 150), so m = mant >> (126 - e).
    const uint32_t e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    uint32_t m = mant >> shift;
    if (rem > half || (rem == half && (m & 1u))) ++m;  // m = 0x400 is the smallest normal: still right
    bits = static_cast<uint16_t>(sign | m);
  }
  explicit operator float() const {
    const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
    uint32_t e = (bits >> 10) & 0x1fu, m = bits & 0x3ffu, u;
    if (e == 0x1f) u = sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0u);  // inf, NaN (quiet)
    else if (e != 0) u = sign | ((e + 112) << 23) | (m << 13);                 // normal
    else if (m == 0) u = sign;                                                  // zero
    else {                                                                      // subnormal: normalize
      e = 113;
      while (!(m & 0x400u)) { m <<= 1; --e; }
      u = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::F32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::F64; };
template <> struct DTypeOf<bf16> { static constexpr DType value = DType::BF16; };
template <> struct DTypeOf<f16> { static constexpr DType value = DType::F16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::I32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::I64; };
template <> struct DTypeOf<uint16_t> { static constexpr DType value = DType::U16; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::U8; };
template <typename T> inline constexpr DType dtype_of = DTypeOf<T>::value;

}  // namespace mt
