// adamw_step against two hand-unrolled steps of the formula of ops.h.
#include "gradcheck.h"

using namespace mt;
using namespace mt::test;

TEST_CASE("adamw: two steps match the hand-unrolled formula", "[ops][adamw]") {
  const double p0[3] = {1.0, -2.0, 0.5}, g1[3] = {0.1, -0.2, 0.3}, g2[3] = {0.05, 0.4, -0.1};
  ops::AdamWArgs a;
  a.lr = 0.01;
  a.beta1 = 0.9;
  a.beta2 = 0.95;
  a.eps = 1e-8;
  a.weight_decay = 0.1;
  a.grad_scale = 0.5;
  Tensor p = Tensor::empty({3}, DType::F64), m = Tensor::zeros({3}, DType::F64), v = Tensor::zeros({3}, DType::F64);
  Tensor g = Tensor::empty({3}, DType::F64);
  std::copy(p0, p0 + 3, p.data<double>());
  std::copy(g1, g1 + 3, g.data<double>());
  a.step = 1;
  ops::adamw_step(p, m, v, g, a);
  std::copy(g2, g2 + 3, g.data<double>());
  a.step = 2;
  ops::adamw_step(p, m, v, g, a);
  for (int i = 0; i < 3; ++i) {
    // step 1
    const double s1 = g1[i] * 0.5;
    const double m1 = 0.1 * s1, v1 = 0.05 * s1 * s1;
    const double q1 = p0[i] - 0.01 * ((m1 / 0.1) / (std::sqrt(v1 / 0.05) + 1e-8) + 0.1 * p0[i]);
    // step 2: bias corrections 1 - 0.9^2 = 0.19, 1 - 0.95^2 = 0.0975
    const double s2 = g2[i] * 0.5;
    const double m2 = 0.9 * m1 + 0.1 * s2, v2 = 0.95 * v1 + 0.05 * s2 * s2;
    const double q2 = q1 - 0.01 * ((m2 / 0.19) / (std::sqrt(v2 / 0.0975) + 1e-8) + 0.1 * q1);
    CHECK(m.data<double>()[i] == Approx(m2).epsilon(1e-14));
    CHECK(v.data<double>()[i] == Approx(v2).epsilon(1e-14));
    CHECK(p.data<double>()[i] == Approx(q2).epsilon(1e-14));
  }
  // After step 1 with no decay, |update| = lr for every element (m_hat / sqrt(v_hat) = sign(g)).
  Tensor p1 = Tensor::zeros({3}, DType::F32), mf = Tensor::zeros({3}, DType::F32), vf = Tensor::zeros({3}, DType::F32);
  Tensor gf = to(g, DType::F32);
  a.step = 1;
  a.weight_decay = 0;
  ops::adamw_step(p1, mf, vf, gf, a);
  for (int i = 0; i < 3; ++i) CHECK(std::fabs(p1.data<float>()[i]) == Approx(0.01).epsilon(1e-5));
}

TEST_CASE("adamw checks its arguments", "[ops][adamw]") {
  Tensor p = Tensor::zeros({3}, DType::F64), m = Tensor::zeros({3}, DType::F64), v = Tensor::zeros({2}, DType::F64);
  ops::AdamWArgs a;
  CHECK_THROWS_AS(ops::adamw_step(p, m, v, p, a), InternalError);
  a.step = 0;
  CHECK_THROWS_AS(ops::adamw_step(p, m, m, p, a), InternalError);
}
