// layernorm / rmsnorm: known vectors, naive reference, finite differences, GradMode.
#include "gradcheck.h"

using namespace mt;
using namespace mt::test;

namespace {
const double kEps = 1e-5;

Tensor naive_layernorm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  const int64_t C = x.size(-1), N = x.numel() / C;
  Tensor y = Tensor::empty(x.shape(), DType::F64);
  for (int64_t n = 0; n < N; ++n) {
    const double* r = x.data<double>() + n * C;
    double mu = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mu += r[c] / C;
    for (int64_t c = 0; c < C; ++c) var += (r[c] - mu) * (r[c] - mu) / C;
    for (int64_t c = 0; c < C; ++c)
      y.data<double>()[n * C + c] = (r[c] - mu) / std::sqrt(var + eps) * w.data<double>()[c] + b.data<double>()[c];
  }
  return y;
}

Tensor naive_rmsnorm(const Tensor& x, const Tensor& w, double eps) {
  const int64_t C = x.size(-1), N = x.numel() / C;
  Tensor y = Tensor::empty(x.shape(), DType::F64);
  for (int64_t n = 0; n < N; ++n) {
    const double* r = x.data<double>() + n * C;
    double ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += r[c] * r[c] / C;
    for (int64_t c = 0; c < C; ++c) y.data<double>()[n * C + c] = r[c] / std::sqrt(ms + eps) * w.data<double>()[c];
  }
  return y;
}

Tensor from(std::initializer_list<double> v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::F64);
  std::copy(v.begin(), v.end(), t.data<double>());
  return t;
}
}  // namespace

TEST_CASE("rmsnorm of [1, 2, 3, 4] and layernorm of [1, 2, 3, 4]", "[ops][norm]") {
  Tensor x = from({1, 2, 3, 4}).view({1, 4}), ones = from({1, 1, 1, 1}), zeros = from({0, 0, 0, 0});
  Tensor y = Tensor::empty({1, 4}, DType::F64), mean = Tensor::empty({1}, DType::F64);
  Tensor rstd = Tensor::empty({1}, DType::F64);
  // mean(x^2) = 7.5: y = x / sqrt(7.5).
  ops::rmsnorm_forward(y, rstd, x, ones, 0.0);
  const double want_r[4] = {0.36514837167011072, 0.73029674334022144, 1.0954451150103322, 1.4605934866804429};
  for (int i = 0; i < 4; ++i) CHECK(y.data<double>()[i] == Approx(want_r[i]).epsilon(1e-14));
  CHECK(rstd.data<double>()[0] == Approx(1 / std::sqrt(7.5)).epsilon(1e-14));
  // mean 2.5, variance 1.25: y = (x - 2.5) / sqrt(1.25).
  ops::layernorm_forward(y, mean, rstd, x, ones, zeros, 0.0);
  const double want_l[4] = {-1.3416407864998738, -0.44721359549995793, 0.44721359549995793, 1.3416407864998738};
  for (int i = 0; i < 4; ++i) CHECK(y.data<double>()[i] == Approx(want_l[i]).epsilon(1e-14));
  CHECK(mean.data<double>()[0] == 2.5);
}

TEST_CASE("norm forwards match naive loops", "[ops][norm]") {
  Tensor x = randn({2, 3, 10}, 1, DType::F64, 3.0), w = randn({10}, 2), b = randn({10}, 3);
  Tensor y = Tensor::empty({2, 3, 10}, DType::F64), mean = Tensor::empty({6}, DType::F64);
  Tensor rstd = Tensor::empty({6}, DType::F64);
  ops::layernorm_forward(y, mean, rstd, x, w, b, kEps);
  CHECK(rel_err(y, naive_layernorm(x, w, b, kEps)) < 1e-13);
  ops::rmsnorm_forward(y, rstd, x, w, kEps);
  CHECK(rel_err(y, naive_rmsnorm(x, w, kEps)) < 1e-13);
}

TEST_CASE("layernorm backward matches finite differences", "[ops][norm]") {
  const int64_t N = 5, C = 7;
  Tensor x = randn({N, C}, 11), w = randn({C}, 12), b = randn({C}, 13), wts = randn({N, C}, 14);
  Tensor mean = Tensor::empty({N}, DType::F64), rstd = Tensor::empty({N}, DType::F64);
  auto L = [&] {
    Tensor y = Tensor::empty({N, C}, DType::F64);
    ops::layernorm_forward(y, mean, rstd, x, w, b, kEps);
    return dot(wts, y);
  };
  L();
  Tensor dx = Tensor::empty({N, C}, DType::F64), dw = Tensor::zeros({C}, DType::F64), db = Tensor::zeros({C}, DType::F64);
  ops::layernorm_backward(dx, dw, db, wts, x, w, mean, rstd);
  check_grad("dinp", dx, x, L);
  check_grad("dweight", dw, w, L);
  check_grad("dbias", db, b, L);
}

TEST_CASE("rmsnorm backward matches finite differences", "[ops][norm]") {
  const int64_t N = 5, C = 7;
  Tensor x = randn({N, C}, 21), w = randn({C}, 22), wts = randn({N, C}, 23);
  Tensor rstd = Tensor::empty({N}, DType::F64);
  auto L = [&] {
    Tensor y = Tensor::empty({N, C}, DType::F64);
    ops::rmsnorm_forward(y, rstd, x, w, kEps);
    return dot(wts, y);
  };
  L();
  Tensor dx = Tensor::empty({N, C}, DType::F64), dw = Tensor::zeros({C}, DType::F64);
  ops::rmsnorm_backward(dx, dw, wts, x, w, rstd);
  check_grad("dinp", dx, x, L);
  check_grad("dweight", dw, w, L);
}

TEST_CASE("norm backward: Accumulate adds onto dinp, parameter grads always accumulate", "[ops][norm]") {
  const int64_t N = 4, C = 6;
  Tensor x = randn({N, C}, 31), w = randn({C}, 32), b = randn({C}, 33), dy = randn({N, C}, 34);
  Tensor mean = Tensor::empty({N}, DType::F64), rstd = Tensor::empty({N}, DType::F64);
  Tensor y = Tensor::empty({N, C}, DType::F64);
  const Tensor px = randn({N, C}, 35), pw = randn({C}, 36), pb = randn({C}, 37);
  auto plus = [](const Tensor& a, const Tensor& c) {
    Tensor o = Tensor::empty(a.shape(), DType::F64);
    ops::add(o, a, c);
    return o;
  };
  SECTION("layernorm") {
    ops::layernorm_forward(y, mean, rstd, x, w, b, kEps);
    Tensor dx0 = Tensor::empty({N, C}, DType::F64), dw0 = Tensor::zeros({C}, DType::F64);
    Tensor db0 = Tensor::zeros({C}, DType::F64);
    ops::layernorm_backward(dx0, dw0, db0, dy, x, w, mean, rstd);
    Tensor dx = px.clone(), dw = pw.clone(), db = pb.clone();
    ops::layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, ops::GradMode::Accumulate);
    CHECK(max_abs_diff(dx, plus(px, dx0)) < 1e-14);
    CHECK(max_abs_diff(dw, plus(pw, dw0)) < 1e-14);
    CHECK(max_abs_diff(db, plus(pb, db0)) < 1e-14);
    dx = px.clone();
    ops::layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, ops::GradMode::Overwrite);
    CHECK(max_abs_diff(dx, dx0) < 1e-14);
  }
  SECTION("rmsnorm") {
    ops::rmsnorm_forward(y, rstd, x, w, kEps);
    Tensor dx0 = Tensor::empty({N, C}, DType::F64), dw0 = Tensor::zeros({C}, DType::F64);
    ops::rmsnorm_backward(dx0, dw0, dy, x, w, rstd);
    Tensor dx = px.clone(), dw = pw.clone();
    ops::rmsnorm_backward(dx, dw, dy, x, w, rstd, ops::GradMode::Accumulate);
    CHECK(max_abs_diff(dx, plus(px, dx0)) < 1e-14);
    CHECK(max_abs_diff(dw, plus(pw, dw0)) < 1e-14);
    dx = px.clone();
    ops::rmsnorm_backward(dx, dw, dy, x, w, rstd, ops::GradMode::Overwrite);
    CHECK(max_abs_diff(dx, dx0) < 1e-14);
  }
}

TEST_CASE("norm statistics must have the statistics dtype", "[ops][norm]") {
  Tensor x = randn({3, 4}, 41), w = randn({4}, 42), y = Tensor::empty({3, 4}, DType::F64);
  Tensor rstd32 = Tensor::empty({3}, DType::F32), rstd_short = Tensor::empty({2}, DType::F64);
  CHECK_THROWS_AS(ops::rmsnorm_forward(y, rstd32, x, w, kEps), InternalError);
  CHECK_THROWS_AS(ops::rmsnorm_forward(y, rstd_short, x, w, kEps), InternalError);
}
