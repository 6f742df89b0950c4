// Helpers of the op tests: seeded random tensors (std::mt19937_64), fp64 conversions, norms, relative
// errors and central finite differences of a scalar functional L = sum(w * f(x)).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>

#include "catch.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace mt::test {

// Normal(0, scale^2) entries, generated in fp64 then cast to dt.
inline Tensor randn(const Shape& s, uint64_t seed, DType dt = DType::F64, double scale = 1.0) {
  Tensor t = Tensor::empty(s, DType::F64);
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, scale);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(gen);
  if (dt == DType::F64) return t;
  Tensor o = Tensor::empty(s, dt);
  ops::cast(o, t);
  return o;
}

// Uniform [lo, hi) entries in fp64.
inline Tensor uniform(const Shape& s, uint64_t seed, double lo, double hi) {
  Tensor t = Tensor::empty(s, DType::F64);
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = dist(gen);
  return t;
}

// int32 entries uniform in [lo, hi].
inline Tensor randint(const Shape& s, uint64_t seed, int32_t lo, int32_t hi) {
  Tensor t = Tensor::empty(s, DType::I32);
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = dist(gen);
  return t;
}

inline Tensor to(const Tensor& t, DType dt) {
  Tensor o = Tensor::empty(t.shape(), dt);
  ops::cast(o, t);
  return o;
}
inline Tensor f64(const Tensor& t) { return to(t, DType::F64); }

inline double dot(const Tensor& a, const Tensor& b) {
  REQUIRE(a.numel() == b.numel());
  const Tensor x = f64(a), y = f64(b);
  double s = 0;
  for (int64_t i = 0; i < x.numel(); ++i) s += x.data<double>()[i] * y.data<double>()[i];
  return s;
}
inline double norm(const Tensor& a) { return std::sqrt(dot(a, a)); }

// ||a - b|| / max(||b||, tiny), both read as fp64.
inline double rel_err(const Tensor& a, const Tensor& b) {
  REQUIRE(a.numel() == b.numel());
  const Tensor x = f64(a), y = f64(b);
  double d = 0, n = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double e = x.data<double>()[i] - y.data<double>()[i];
    d += e * e;
    n += y.data<double>()[i] * y.data<double>()[i];
  }
  return std::sqrt(d) / std::max(std::sqrt(n), 1e-300);
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.numel() == b.numel());
  const Tensor x = f64(a), y = f64(b);
  double m = 0;
  for (int64_t i = 0; i < x.numel(); ++i) m = std::max(m, std::fabs(x.data<double>()[i] - y.data<double>()[i]));
  return m;
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// dL/dx by central differences (fp64 x, perturbed in place and restored): (L(x+h) - L(x-h)) / 2h.
inline Tensor numeric_grad(Tensor& x, const std::function<double()>& L, double h = 1e-6) {
  REQUIRE(x.dtype() == DType::F64);
  Tensor g = Tensor::zeros(x.shape(), DType::F64);
  double* p = x.data<double>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double x0 = p[i];
    p[i] = x0 + h;
    const double lp = L();
    p[i] = x0 - h;
    const double lm = L();
    p[i] = x0;
    g.data<double>()[i] = (lp - lm) / (2 * h);
  }
  return g;
}

// Checks an analytic gradient against finite differences of L wrt x: relative error < tol.
inline void check_grad(const char* what, const Tensor& analytic, Tensor& x, const std::function<double()>& L,
                       double tol = 1e-6) {
  const Tensor num = numeric_grad(x, L);
  const double err = rel_err(analytic, num);
  INFO(what << ": relative error " << err << " (|numeric| = " << norm(num) << ")");
  CHECK(norm(num) > 0);
  CHECK(err < tol);
}

}  // namespace mt::test
