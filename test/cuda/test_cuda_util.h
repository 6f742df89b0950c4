// Helpers of the CUDA op tests: every CUDA op is checked against the CPU reference (run in fp64 on
// the same, dtype-rounded inputs) by the relative error ||gpu - ref|| / ||ref||.
//
// Tolerances, one per dtype:
//   fp32: 1e-5. fp32 kernels round each operation to 2^-24 (6e-8); a sum of K terms grows that by at
//         most ~sqrt(K) in norm (K <= 4096 here: 4e-6).
//   bf16: 1e-2. Outputs are rounded to bf16 (2^-9 = 2e-3 relative, i.e. ~1.1e-3 in norm for uniform
//         rounding), and tensor-core kernels feed bf16-rounded intermediates (attention's P and dS) into
//         a second product: a few such roundings stay under 1e-2.
//   fp16: 1.25e-3, the bf16 bound scaled by fp16's 8x finer rounding (2^-12 vs 2^-9 relative, 3 more
//         mantissa bits), the same kernels and the same number of roundings: the same headroom.
// Outputs are poisoned (NaN) before each run and every element must be finite afterwards: an element a
// kernel forgot to write stays NaN and fails the check.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "catch.h"
#include "cuda/cuda_context.h"
#include "runtime/cuda/cuda_runtime.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace mt::gpu_test {

inline constexpr double kTolF32 = 1e-5;
inline constexpr double kTolBF16 = 1e-2;
inline constexpr double kTolF16 = kTolBF16 / 8;
inline double tol(DType dt) { return dt == DType::BF16 ? kTolBF16 : dt == DType::F16 ? kTolF16 : kTolF32; }

inline void init() {
  static const bool once = [] {
    mt::cuda::initialize(0);
    return true;
  }();
  (void)once;
}

// ---------------------------------------------------------------- host tensors (fp64)
inline Tensor randn64(const Shape& s, uint64_t seed, double scale = 1.0) {
  Tensor t = Tensor::empty(s, DType::F64);
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = dist(gen);
  return t;
}
inline Tensor randint32(const Shape& s, uint64_t seed, int32_t lo, int32_t hi) {
  Tensor t = Tensor::empty(s, DType::I32);
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = dist(gen);
  return t;
}
inline Tensor cast_host(const Tensor& t, DType dt) {
  Tensor o = Tensor::empty(t.shape(), dt);
  ops::cast(o, t);
  return o;
}
// x rounded to dt and back to fp64: the exact values the GPU sees.
inline Tensor rounded(const Tensor& x64, DType dt) {
  return dt == DType::F64 ? x64.clone() : cast_host(cast_host(x64, dt), DType::F64);
}

// ---------------------------------------------------------------- device tensors
inline Tensor to_device(const Tensor& host, DType dt) {
  const Tensor h = host.dtype() == dt ? host : cast_host(host, dt);
  Tensor d = Tensor::empty(h.shape(), dt, Device::CUDA);
  d.copy_from(h);
  return d;
}
// Device tensor of dt (any dtype) -> host fp64.
inline Tensor to_host64(const Tensor& d) {
  Tensor h = Tensor::empty(d.shape(), d.dtype());
  h.copy_from(d);
  return h.dtype() == DType::F64 ? h : cast_host(h, DType::F64);
}
inline Tensor to_host(const Tensor& d) {
  Tensor h = Tensor::empty(d.shape(), d.dtype());
  h.copy_from(d);
  return h;
}
// An uninitialized device tensor filled with NaN.
inline Tensor poisoned(const Shape& s, DType dt) {
  Tensor t = Tensor::empty(s, dt, Device::CUDA);
  ops::fill_(t, std::nan(""));
  return t;
}
// A device tensor whose data starts `shift` elements past an allocation boundary (defeats 16-byte
// vector paths), filled from host.
inline Tensor to_device_shifted(const Tensor& host, DType dt, int64_t shift) {
  Tensor base = Tensor::empty({host.numel() + shift}, dt, Device::CUDA);
  Tensor d = base.slice(shift, host.numel()).view(host.shape());
  d.copy_from(host.dtype() == dt ? host : cast_host(host, dt));
  return d;
}

// ---------------------------------------------------------------- comparisons
inline bool all_finite(const Tensor& x64) {
  for (int64_t i = 0; i < x64.numel(); ++i)
    if (!std::isfinite(x64.data<double>()[i])) return false;
  return true;
}
// ||a - b|| / ||b|| (a NaN anywhere gives NaN); a zero reference compares absolutely.
inline double rel_err(const Tensor& a64, const Tensor& b64) {
  REQUIRE(a64.numel() == b64.numel());
  double num = 0, den = 0;
  for (int64_t i = 0; i < a64.numel(); ++i) {
    const double d = a64.data<double>()[i] - b64.data<double>()[i];
    num += d * d;
    den += b64.data<double>()[i] * b64.data<double>()[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}
// AdamW's weight decay by runs over n elements: runs of 333 (the first 334), every third one without decay.
inline ops::DecayRuns decay_runs_of(int64_t n) {
  ops::DecayRuns r;
  for (int64_t i = 0; i < 300 && i * 333 + (i ? 1 : 0) < n; ++i) {
    r.starts.push_back(i * 333 + (i ? 1 : 0));
    r.decay.push_back(i % 3 != 1);
  }
  return r;
}
inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const Tensor x = to_host(a), y = to_host(b);
  return x.nbytes() == y.nbytes() && std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
}

// The largest error seen per (op, dtype), printed when the test program exits.
class ErrorTable {
 public:
  static ErrorTable& get() {
    static ErrorTable t;
    return t;
  }
  void record(const std::string& op, DType dt, double err) {
    double& e = max_[op + " " + dtype_name(dt)];
    if (!(err <= e)) e = err;  // NaN sticks
  }
  ~ErrorTable() {
    if (max_.empty()) return;
    std::printf("\nmax relative error per op and dtype (vs the CPU reference in fp64):\n");
    for (const auto& [k, v] : max_) std::printf("  %-40s %.3e\n", k.c_str(), v);
  }

 private:
  std::map<std::string, double> max_;
};

// Checks a device output against an fp64 reference: all written (finite) and within the dtype's tolerance.
inline void check_close(const std::string& op, const Tensor& gpu, const Tensor& ref64, DType dt, double tolerance) {
  const Tensor g = to_host64(gpu);
  INFO(op << " " << dtype_name(dt) << " " << gpu.str());
  CHECK(all_finite(g));
  const double e = rel_err(g, ref64);
  ErrorTable::get().record(op, dt, e);
  INFO("relative error " << e << " (tolerance " << tolerance << ")");
  CHECK(e <= tolerance);
}
inline void check_close(const std::string& op, const Tensor& gpu, const Tensor& ref64, DType dt) {
  check_close(op, gpu, ref64, dt, tol(dt));
}

// ---------------------------------------------------------------- timing
// Median time of fn over `reps` runs (device events on the ops' stream, after a warm-up run).
template <typename F>
double median_ms(F&& fn, int reps) {
  cudaStream_t s = mt::cuda::current_stream();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  fn();
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, s);
    fn();
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace mt::gpu_test
