// A float's bits and back, the same on the host and the device (plain header for .cpp and .cu files).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MT_BITS_HD __host__ __device__ __forceinline__
#else
#define MT_BITS_HD inline
#endif

namespace mt {

MT_BITS_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

MT_BITS_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

}  // namespace mt
