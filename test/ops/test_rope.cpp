// rope: complex-rotation reference, position offset, finite differences, round trip.
#include <complex>

#include "gradcheck.h"

using namespace mt;
using namespace mt::test;

namespace {
// Rotate-half convention as complex multiplication: z = x[i] + i x[i + D/2], z' = z e^{i p theta^(-2i/D)}.
Tensor naive_rope(const Tensor& x, double theta, int64_t offset) {
  const int64_t B = x.size(0), T = x.size(1), Hh = x.size(2), D = x.size(3), half = D / 2;
  Tensor y = x.clone();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < Hh; ++h) {
        double* v = y.data<double>() + ((b * T + t) * Hh + h) * D;
        for (int64_t i = 0; i < half; ++i) {
          const double angle = static_cast<double>(offset + t) / std::pow(theta, 2.0 * i / D);
          const std::complex<double> z = std::complex<double>(v[i], v[i + half]) * std::polar(1.0, angle);
          v[i] = z.real();
          v[i + half] = z.imag();
        }
      }
  return y;
}
}  // namespace

TEST_CASE("rope forward matches a complex rotation, with position offsets", "[ops][rope]") {
  const double theta = 10000.0;
  Tensor x = randn({2, 5, 3, 8}, 1);
  Tensor y = x.clone();
  ops::rope_forward(y, theta, 0);
  CHECK(rel_err(y, naive_rope(x, theta, 0)) < 1e-14);
  // Position 0 is the identity.
  for (int64_t i = 0; i < 3 * 8; ++i) CHECK(y.data<double>()[i] == x.data<double>()[i]);
  y = x.clone();
  ops::rope_forward(y, 500.0, 7);
  CHECK(rel_err(y, naive_rope(x, 500.0, 7)) < 1e-14);
  CHECK(rel_err(y, naive_rope(x, theta, 7)) > 1e-3);
}

TEST_CASE("rope backward matches finite differences and inverts forward", "[ops][rope]") {
  Tensor x = randn({2, 4, 2, 6}, 11), wts = randn({2, 4, 2, 6}, 12);
  auto L = [&] {
    Tensor y = x.clone();
    ops::rope_forward(y, 100.0, 3);
    return dot(wts, y);
  };
  Tensor dx = wts.clone();
  ops::rope_backward(dx, 100.0, 3);
  check_grad("dx", dx, x, L);

  Tensor y = x.clone();
  ops::rope_forward(y, 100.0, 3);
  ops::rope_backward(y, 100.0, 3);
  CHECK(max_abs_diff(y, x) < 1e-14);
}

TEST_CASE("rope fp32 agrees with fp64 at long positions", "[ops][rope]") {
  Tensor x = randn({1, 4, 2, 16}, 21);
  Tensor y = x.clone(), yf = to(x, DType::F32);
  ops::rope_forward(y, 10000.0, 4000);
  ops::rope_forward(yf, 10000.0, 4000);
  CHECK(rel_err(yf, y) < 1e-6);
  Tensor odd = randn({1, 2, 1, 5}, 22);
  CHECK_THROWS_AS(ops::rope_forward(odd, 10000.0, 0), InternalError);
}
