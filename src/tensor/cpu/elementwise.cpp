// Elementwise CPU references: fill, add, scale, cast, sum_squares. Any shape; n = numel.
//   fill:  x[i] = value            add: out[i] = a[i] + b[i] (out may alias a or b)
//   scale: x[i] *= s               cast: out[i] = convert(in[i])
//   sum_squares = sum_i x[i]^2, accumulated in fp64 in a fixed order: the input is cut into
//   fixed-size chunks (independent of the thread count), each chunk is summed sequentially, and the
//   chunk sums are added in chunk order, so the result is bit-identical for any number of threads.
// Casting double -> bf16 / fp16 rounds once (to nearest even) by going through a round-to-odd float.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "tensor/cpu/cpu_ops.h"
#include "core/dtype.h"

namespace mt::ops::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 15;  // below this, loops run on one thread
constexpr int64_t kChunk = 1 << 14;        // sum_squares chunk (elements)

template <typename T> constexpr bool is_half_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

// Converts between the element types. bf16 / fp16 from double: double -> float with round-to-odd
// (truncate, then set the lowest mantissa bit if inexact), then float -> bf16 / fp16
// round-to-nearest-even; float keeps at least 13 more bits, so the two steps round like one.
template <typename To, typename From>
To convert(From x) {
  if constexpr (is_half_v<To>) {
    if constexpr (std::is_same_v<From, double>) {
      if (std::isnan(x) || std::isinf(x)) return To(static_cast<float>(x));
      // Beyond FLT_MAX, FLT_MAX with the sticky bit rounds to inf like x itself (no UB cast).
      float f = std::fabs(x) > FLT_MAX ? (x > 0 ? FLT_MAX : -FLT_MAX) : static_cast<float>(x);
      if (static_cast<double>(f) != x) {
        if (std::fabs(static_cast<double>(f)) > std::fabs(x)) f = std::nextafter(f, 0.0f);  // truncate
        uint32_t u;
        std::memcpy(&u, &f, 4);
        u |= 1u;  // sticky: inexact
        std::memcpy(&f, &u, 4);
      }
      return To(f);
    } else {
      return To(static_cast<float>(x));
    }
  } else if constexpr (is_half_v<From>) {
    return static_cast<To>(static_cast<float>(x));
  } else {
    return static_cast<To>(x);
  }
}
}  // namespace

template <typename T>
void fill_cpu(T* x, int64_t n, double value) {
  const T v = static_cast<T>(value);
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) x[i] = v;
}

template <typename T>
void add_inplace_cpu(T* a, const T* b, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
}

template <typename T>
void add_cpu(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void scale_cpu(T* x, int64_t n, double s) {
  const T st = static_cast<T>(s);
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) x[i] *= st;
}

template <typename To, typename From>
void cast_cpu(To* out, const From* in, int64_t n) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = convert<To>(in[i]);
}

template <typename T>
double sum_squares_cpu(const T* x, int64_t n) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    double s = 0;
    for (int64_t i = c * kChunk; i < end; ++i) {
      const double v = static_cast<double>(x[i]);
      s += v * v;
    }
    part[static_cast<size_t>(c)] = s;
  }
  double total = 0;
  for (double s : part) total += s;
  return total;
}

#define MT_INSTANTIATE(T)                                          \
  template void fill_cpu<T>(T*, int64_t, double);                  \
  template void add_inplace_cpu<T>(T*, const T*, int64_t);         \
  template void add_cpu<T>(T*, const T*, const T*, int64_t);       \
  template void scale_cpu<T>(T*, int64_t, double);                 \
  template double sum_squares_cpu<T>(const T*, int64_t);
MT_INSTANTIATE(float)
MT_INSTANTIATE(double)
#undef MT_INSTANTIATE

template void cast_cpu<float, double>(float*, const double*, int64_t);
template void cast_cpu<double, float>(double*, const float*, int64_t);
template void cast_cpu<bf16, float>(bf16*, const float*, int64_t);
template void cast_cpu<bf16, double>(bf16*, const double*, int64_t);
template void cast_cpu<float, bf16>(float*, const bf16*, int64_t);
template void cast_cpu<double, bf16>(double*, const bf16*, int64_t);
template void cast_cpu<f16, float>(f16*, const float*, int64_t);
template void cast_cpu<f16, double>(f16*, const double*, int64_t);
template void cast_cpu<float, f16>(float*, const f16*, int64_t);
template void cast_cpu<double, f16>(double*, const f16*, int64_t);
template void cast_cpu<int32_t, int64_t>(int32_t*, const int64_t*, int64_t);
template void cast_cpu<int64_t, int32_t>(int64_t*, const int32_t*, int64_t);

}  // namespace mt::ops::cpu
