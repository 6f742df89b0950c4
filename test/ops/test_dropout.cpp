// dropout and the counter-based generator: identity at p = 0, reproducible masks, kept fraction,
// backward with the same mask, finite differences; uniform01 / normal01 moments.
#include "gradcheck.h"
#include "core/counter_rng.h"

using namespace mt;
using namespace mt::test;

namespace {
Tensor drop(const Tensor& x, double p, uint64_t seed, uint64_t offset) {
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  ops::dropout_forward(out, x, p, seed, offset);
  return out;
}
}  // namespace

TEST_CASE("counter rng: uniform01 in [0, 1) with the right moments, normal01 standard", "[ops][dropout]") {
  const int n = 100000;
  double su = 0, su2 = 0, sn = 0, sn2 = 0;
  for (int i = 0; i < n; ++i) {
    const double u = rng::uniform01(7, 1, static_cast<uint64_t>(i));
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    su += u;
    su2 += u * u;
    const double z = rng::normal01(7, 1, static_cast<uint64_t>(i));
    sn += z;
    sn2 += z * z;
  }
  CHECK(std::fabs(su / n - 0.5) < 0.005);
  CHECK(std::fabs(su2 / n - 1.0 / 3) < 0.005);
  CHECK(std::fabs(sn / n) < 0.02);
  CHECK(std::fabs(sn2 / n - 1.0) < 0.02);
  // Pure functions of (seed, stream, index); seeds and streams give different values.
  CHECK(rng::uniform01(7, 1, 5) == rng::uniform01(7, 1, 5));
  CHECK(rng::uniform01(7, 1, 5) != rng::uniform01(8, 1, 5));
  CHECK(rng::uniform01(7, 1, 5) != rng::uniform01(7, 2, 5));
  CHECK(rng::mix64(0) != rng::mix64(1));
}

TEST_CASE("dropout: p = 0 is the identity", "[ops][dropout]") {
  Tensor x = randn({50, 20}, 1);
  CHECK(bitwise_equal(drop(x, 0.0, 3, 0), x));
}

TEST_CASE("dropout: masks are reproducible by (seed, offset) and keep about 1 - p", "[ops][dropout]") {
  const double p = 0.3;
  const int64_t n = 100000;
  Tensor x = Tensor::empty({n}, DType::F64);
  ops::fill_(x, 1.0);
  Tensor a = drop(x, p, 42, 1000), b = drop(x, p, 42, 1000), c = drop(x, p, 42, 1001), d = drop(x, p, 43, 1000);
  CHECK(bitwise_equal(a, b));
  CHECK(max_abs_diff(a, c) > 0);
  CHECK(max_abs_diff(a, d) > 0);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = a.data<double>()[i];
    REQUIRE((v == 0.0 || v == Approx(1.0 / (1.0 - p)).epsilon(1e-15)));
    kept += v != 0.0;
  }
  CHECK(std::fabs(static_cast<double>(kept) / n - (1 - p)) < 0.01);
  // Offsets address global elements: the tail of a mask equals the mask of the tail.
  Tensor tail = drop(x.slice(0, 500), p, 42, 1000 + 700);
  CHECK(bitwise_equal(tail, a.slice(700, 500)));
  // p = 1 drops everything.
  CHECK(max_abs_diff(drop(x.slice(0, 100), 1.0, 42, 0), Tensor::zeros({100}, DType::F64)) == 0.0);
}

TEST_CASE("dropout backward uses the same mask and matches finite differences", "[ops][dropout]") {
  const double p = 0.25;
  Tensor x = randn({6, 7}, 11), wts = randn({6, 7}, 12);
  auto L = [&] { return dot(wts, drop(x, p, 9, 77)); };
  Tensor dx = Tensor::empty({6, 7}, DType::F64);
  ops::dropout_backward(dx, wts, p, 9, 77);
  check_grad("dinp", dx, x, L);
  Tensor y = drop(x, p, 9, 77);
  for (int64_t i = 0; i < x.numel(); ++i) CHECK((y.data<double>()[i] == 0.0) == (dx.data<double>()[i] == 0.0));
  // fp32 drops the same elements.
  Tensor yf = drop(to(x, DType::F32), p, 9, 77);
  for (int64_t i = 0; i < x.numel(); ++i) CHECK((yf.data<float>()[i] == 0.0f) == (y.data<double>()[i] == 0.0));
}
