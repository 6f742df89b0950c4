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

template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::F32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::F64; };
template <> struct DTypeOf<bf16> { static constexpr DType value = DType::BF16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::I32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::I64; };
template <> struct DTypeOf<uint16_t> { static constexpr DType value = DType::U16; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::U8; };
template <typename T> inline constexpr DType dtype_of = DTypeOf<T>::value;

}  // namespace mt
