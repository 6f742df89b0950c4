// gelu / swiglu: known values, naive formulas, finite differences, fp32.
#include "gradcheck.h"

using namespace mt;
using namespace mt::test;

namespace {
double gelu_ref(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
double silu_ref(double x) { return x / (1 + std::exp(-x)); }
}  // namespace

TEST_CASE("gelu forward: known values and the formula", "[ops][activation]") {
  Tensor x = Tensor::empty({4}, DType::F64);
  const double in[4] = {1.0, -1.0, 0.0, 3.0};
  std::copy(in, in + 4, x.data<double>());
  Tensor y = Tensor::empty({4}, DType::F64);
  ops::gelu_forward(y, x);
  CHECK(y.data<double>()[0] == Approx(0.8411919906082768).epsilon(1e-15));
  CHECK(y.data<double>()[1] == Approx(0.8411919906082768 - 1.0).epsilon(1e-14));  // gelu(-x) = gelu(x) - x
  CHECK(y.data<double>()[2] == 0.0);
  CHECK(y.data<double>()[3] == Approx(gelu_ref(3.0)).epsilon(1e-15));

  // Far tails: no overflow to NaN, y -> 0 and y -> x, y' -> 0 and y' -> 1.
  Tensor tails = Tensor::empty({2}, DType::F64), ty = Tensor::empty({2}, DType::F64);
  Tensor tg = Tensor::empty({2}, DType::F64), ones = Tensor::empty({2}, DType::F64);
  tails.data<double>()[0] = -40.0;
  tails.data<double>()[1] = 40.0;
  ops::fill_(ones, 1.0);
  ops::gelu_forward(ty, tails);
  ops::gelu_backward(tg, ones, tails);
  CHECK(ty.data<double>()[0] == 0.0);
  CHECK(ty.data<double>()[1] == 40.0);
  CHECK(tg.data<double>()[0] == 0.0);
  CHECK(tg.data<double>()[1] == 1.0);

  Tensor r = randn({3, 50}, 1, DType::F64, 3.0), yr = Tensor::empty({3, 50}, DType::F64);
  ops::gelu_forward(yr, r);
  Tensor want = Tensor::empty({3, 50}, DType::F64);
  for (int64_t i = 0; i < r.numel(); ++i) want.data<double>()[i] = gelu_ref(r.data<double>()[i]);
  CHECK(rel_err(yr, want) < 1e-14);
}

TEST_CASE("gelu backward matches finite differences, and may alias dout", "[ops][activation]") {
  Tensor x = randn({4, 9}, 11, DType::F64, 2.0), wts = randn({4, 9}, 12);
  auto L = [&] {
    Tensor y = Tensor::empty(x.shape(), DType::F64);
    ops::gelu_forward(y, x);
    return dot(wts, y);
  };
  Tensor dx = Tensor::empty(x.shape(), DType::F64);
  ops::gelu_backward(dx, wts, x);
  check_grad("dinp", dx, x, L);
  Tensor g = wts.clone();
  ops::gelu_backward(g, g, x);
  CHECK(bitwise_equal(g, dx));
}

TEST_CASE("swiglu forward: known value and the formula", "[ops][activation]") {
  const int64_t N = 3, F = 5;
  Tensor x = randn({N, 2 * F}, 21, DType::F64, 3.0), y = Tensor::empty({N, F}, DType::F64);
  x.data<double>()[0] = 1.0;  // gate of row 0, column 0
  x.data<double>()[F] = 2.0;  // its up
  ops::swiglu_forward(y, x);
  CHECK(y.data<double>()[0] == Approx(2.0 / (1 + std::exp(-1.0))).epsilon(1e-15));
  Tensor want = Tensor::empty({N, F}, DType::F64);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f)
      want.data<double>()[n * F + f] =
          silu_ref(x.data<double>()[n * 2 * F + f]) * x.data<double>()[n * 2 * F + F + f];
  CHECK(rel_err(y, want) < 1e-14);
}

TEST_CASE("swiglu backward matches finite differences", "[ops][activation]") {
  const int64_t N = 4, F = 6;
  Tensor x = randn({N, 2 * F}, 31, DType::F64, 2.0), wts = randn({N, F}, 32);
  auto L = [&] {
    Tensor y = Tensor::empty({N, F}, DType::F64);
    ops::swiglu_forward(y, x);
    return dot(wts, y);
  };
  Tensor dx = Tensor::empty({N, 2 * F}, DType::F64);
  ops::swiglu_backward(dx, wts, x);
  check_grad("dinp", dx, x, L);
}

TEST_CASE("activations in fp32 agree with fp64", "[ops][activation]") {
  Tensor x = randn({8, 16}, 41, DType::F64, 3.0), dy = randn({8, 8}, 42);
  Tensor y = Tensor::empty({8, 8}, DType::F64), dx = Tensor::empty({8, 16}, DType::F64);
  ops::swiglu_forward(y, x);
  ops::swiglu_backward(dx, dy, x);
  Tensor xf = to(x, DType::F32), dyf = to(dy, DType::F32);
  Tensor yf = Tensor::empty({8, 8}, DType::F32), dxf = Tensor::empty({8, 16}, DType::F32);
  ops::swiglu_forward(yf, xf);
  ops::swiglu_backward(dxf, dyf, xf);
  CHECK(rel_err(yf, y) < 1e-6);
  CHECK(rel_err(dxf, dx) < 1e-6);
}
