// fill_normal: every element equal to normal01(seed, stream, offset + i) (fp64 exactly, fp32 its rounding), any
// shape by its flat index, a later offset continuing the same sequence; mean 0 and variance 1 over 1e5 values.
#include "gradcheck.h"
#include "core/counter_rng.h"

using namespace mt;
using namespace mt::test;

namespace {
Tensor normals(const Shape& s, DType dt, uint64_t seed, uint64_t stream, uint64_t offset) {
  Tensor t = Tensor::empty(s, dt);
  ops::fill_normal(t, seed, stream, offset);
  return t;
}
}  // namespace

TEST_CASE("fill_normal: each element is normal01 of its counter", "[ops][fill_normal]") {
  const uint64_t seed = 0x1234, stream = rng::kRouterLogitsStream, offset = 987654321;
  const Tensor d = normals({37, 11}, DType::F64, seed, stream, offset);
  const Tensor f = normals({37, 11}, DType::F32, seed, stream, offset);
  int64_t differ = 0;
  for (int64_t i = 0; i < d.numel(); ++i) {
    const double z = rng::normal01(seed, stream, offset + static_cast<uint64_t>(i));
    differ += d.data<double>()[i] != z;
    differ += f.data<float>()[i] != static_cast<float>(z);
  }
  CHECK(differ == 0);
  // a later offset continues the sequence: elements [100, 407) of the same draw
  const Tensor tail = normals({307}, DType::F64, seed, stream, offset + 100);
  CHECK(std::memcmp(tail.data<double>(), d.data<double>() + 100, 307 * sizeof(double)) == 0);
  // another seed or stream draws other numbers
  CHECK(max_abs_diff(normals({37, 11}, DType::F64, seed + 1, stream, offset), d) > 0.5);
  CHECK(max_abs_diff(normals({37, 11}, DType::F64, seed, rng::kDropoutStream, offset), d) > 0.5);
}

TEST_CASE("fill_normal: standard normal statistics over 1e5 values", "[ops][fill_normal]") {
  const int64_t n = 100000;
  const Tensor t = normals({n}, DType::F64, 7, rng::kRouterLogitsStream, 0);
  double s = 0, s2 = 0, s4 = 0;
  int64_t above2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double z = t.data<double>()[i];
    REQUIRE(std::isfinite(z));
    s += z;
    s2 += z * z;
    s4 += z * z * z * z;
    above2 += std::fabs(z) > 2.0;
  }
  const double mean = s / n, var = s2 / n - mean * mean;
  // standard errors: mean 1/sqrt(n) = 0.0032, variance sqrt(2/n) = 0.0045, fourth moment sqrt(96/n) = 0.031
  CHECK(std::fabs(mean) < 0.015);
  CHECK(std::fabs(var - 1.0) < 0.02);
  CHECK(std::fabs(s4 / n - 3.0) < 0.15);
  CHECK(std::fabs(static_cast<double>(above2) / n - 0.0455) < 0.004);  // P(|z| > 2) = 4.55%
}
