// linear_forward / linear_backward: naive reference, finite differences, GradMode, fp32 vs fp64.
#include "gradcheck.h"

using namespace mt;
using namespace mt::test;

namespace {
// out[n, o] = sum_i x[n, i] w[o, i] + b[o], plain loops in fp64.
Tensor naive_linear(const Tensor& x, const Tensor& w, const Tensor* b) {
  const int64_t OC = w.size(0), IC = w.size(1), N = x.numel() / IC;
  Tensor y = Tensor::empty({N, OC}, DType::F64);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double s = b ? b->data<double>()[o] : 0.0;
      for (int64_t i = 0; i < IC; ++i) s += x.data<double>()[n * IC + i] * w.data<double>()[o * IC + i];
      y.data<double>()[n * OC + o] = s;
    }
  return y;
}
}  // namespace

TEST_CASE("linear forward matches a naive loop, with and without bias", "[ops][linear]") {
  Tensor x = randn({2, 3, 5}, 1), w = randn({6, 5}, 2), b = randn({6}, 3);
  Tensor y = Tensor::empty({2, 3, 6}, DType::F64);
  ops::linear_forward(y, x, w, &b);
  CHECK(rel_err(y, naive_linear(x, w, &b)) < 1e-14);
  ops::linear_forward(y, x, w, nullptr);
  CHECK(rel_err(y, naive_linear(x, w, nullptr)) < 1e-14);
}

TEST_CASE("linear backward matches finite differences", "[ops][linear]") {
  const int64_t N = 7, IC = 5, OC = 4;
  Tensor x = randn({N, IC}, 11), w = randn({OC, IC}, 12), b = randn({OC}, 13), wts = randn({N, OC}, 14);
  auto L = [&] {
    Tensor y = Tensor::empty({N, OC}, DType::F64);
    ops::linear_forward(y, x, w, &b);
    return dot(wts, y);
  };
  Tensor dx = Tensor::zeros({N, IC}, DType::F64), dw = Tensor::zeros({OC, IC}, DType::F64);
  Tensor db = Tensor::zeros({OC}, DType::F64);
  ops::linear_backward(&dx, &dw, &db, wts, x, w);
  check_grad("dinp", dx, x, L);
  check_grad("dweight", dw, w, L);
  check_grad("dbias", db, b, L);
}

TEST_CASE("linear backward: parameter grads accumulate, dinp follows GradMode, null outputs skipped",
          "[ops][linear]") {
  const int64_t N = 6, IC = 3, OC = 5;
  Tensor x = randn({N, IC}, 21), w = randn({OC, IC}, 22), dy = randn({N, OC}, 23);
  Tensor dx0 = Tensor::zeros({N, IC}, DType::F64), dw0 = Tensor::zeros({OC, IC}, DType::F64);
  Tensor db0 = Tensor::zeros({OC}, DType::F64);
  ops::linear_backward(&dx0, &dw0, &db0, dy, x, w);

  const Tensor px = randn({N, IC}, 24), pw = randn({OC, IC}, 25), pb = randn({OC}, 26);
  auto sum = [](const Tensor& a, const Tensor& b) {
    Tensor o = Tensor::empty(a.shape(), DType::F64);
    ops::add(o, a, b);
    return o;
  };
  Tensor dx = px.clone(), dw = pw.clone(), db = pb.clone();
  SECTION("overwrite") {
    ops::linear_backward(&dx, &dw, &db, dy, x, w, ops::GradMode::Overwrite);
    CHECK(max_abs_diff(dx, dx0) < 1e-14);
    CHECK(max_abs_diff(dw, sum(pw, dw0)) < 1e-14);
    CHECK(max_abs_diff(db, sum(pb, db0)) < 1e-14);
  }
  SECTION("accumulate") {
    ops::linear_backward(&dx, &dw, &db, dy, x, w, ops::GradMode::Accumulate);
    CHECK(max_abs_diff(dx, sum(px, dx0)) < 1e-14);
    CHECK(max_abs_diff(dw, sum(pw, dw0)) < 1e-14);
  }
  SECTION("only dbias, without inp and weight") {
    ops::linear_backward(nullptr, nullptr, &db, dy, Tensor(), Tensor());
    CHECK(max_abs_diff(db, sum(pb, db0)) < 1e-14);
    CHECK(bitwise_equal(dx, px));
    CHECK(bitwise_equal(dw, pw));
  }
  SECTION("only dweight") {
    ops::linear_backward(nullptr, &dw, nullptr, dy, x, w);
    CHECK(max_abs_diff(dw, sum(pw, dw0)) < 1e-14);
    CHECK(bitwise_equal(dx, px));
    CHECK(bitwise_equal(db, pb));
  }
}

TEST_CASE("linear fp32 agrees with fp64", "[ops][linear]") {
  const int64_t N = 33, IC = 40, OC = 24;
  Tensor x = randn({N, IC}, 31), w = randn({OC, IC}, 32), b = randn({OC}, 33), dy = randn({N, OC}, 34);
  Tensor y = Tensor::empty({N, OC}, DType::F64), dx = Tensor::zeros({N, IC}, DType::F64);
  Tensor dw = Tensor::zeros({OC, IC}, DType::F64), db = Tensor::zeros({OC}, DType::F64);
  ops::linear_forward(y, x, w, &b);
  ops::linear_backward(&dx, &dw, &db, dy, x, w);

  const DType F = DType::F32;
  Tensor xf = to(x, F), wf = to(w, F), bf = to(b, F), dyf = to(dy, F);
  Tensor yf = Tensor::empty({N, OC}, F), dxf = Tensor::zeros({N, IC}, F), dwf = Tensor::zeros({OC, IC}, F);
  Tensor dbf = Tensor::zeros({OC}, F);
  ops::linear_forward(yf, xf, wf, &bf);
  ops::linear_backward(&dxf, &dwf, &dbf, dyf, xf, wf);
  CHECK(rel_err(yf, y) < 1e-5);
  CHECK(rel_err(dxf, dx) < 1e-5);
  CHECK(rel_err(dwf, dw) < 1e-5);
  CHECK(rel_err(dbf, db) < 1e-5);
}

TEST_CASE("linear rejects mismatched shapes and unsupported dtypes", "[ops][linear]") {
  Tensor x = randn({4, 3}, 41), w = randn({5, 3}, 42);
  Tensor bad = Tensor::empty({4, 6}, DType::F64);
  CHECK_THROWS_AS(ops::linear_forward(bad, x, w, nullptr), InternalError);
  Tensor mixed = Tensor::empty({4, 5}, DType::F32);
  CHECK_THROWS_AS(ops::linear_forward(mixed, x, w, nullptr), InternalError);
  Tensor xb = to(x, DType::BF16), wb = to(w, DType::BF16), yb = Tensor::empty({4, 5}, DType::BF16);
  CHECK_THROWS_WITH(ops::linear_forward(yb, xb, wb, nullptr),
                    "op linear_forward is not supported on device cpu for bf16");
}

TEST_CASE("linear: multi-block parallel GEMMs match naive loops", "[ops][linear]") {
  // Several 128-row blocks of the output and of dweight, large enough to run on all threads.
  const int64_t N = 300, IC = 48, OC = 150;
  Tensor x = randn({N, IC}, 51), w = randn({OC, IC}, 52), b = randn({OC}, 53), dy = randn({N, OC}, 54);
  Tensor y = Tensor::empty({N, OC}, DType::F64);
  ops::linear_forward(y, x, w, &b);
  CHECK(rel_err(y, naive_linear(x, w, &b)) < 1e-14);

  Tensor dx = Tensor::empty({N, IC}, DType::F64), dw = Tensor::zeros({OC, IC}, DType::F64);
  Tensor db = Tensor::zeros({OC}, DType::F64);
  ops::linear_backward(&dx, &dw, &db, dy, x, w);
  Tensor want_dx = Tensor::zeros({N, IC}, DType::F64), want_dw = Tensor::zeros({OC, IC}, DType::F64);
  Tensor want_db = Tensor::zeros({OC}, DType::F64);
  const double* X = x.data<double>();
  const double* W = w.data<double>();
  const double* G = dy.data<double>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      want_db.data<double>()[o] += G[n * OC + o];
      for (int64_t i = 0; i < IC; ++i) {
        want_dx.data<double>()[n * IC + i] += G[n * OC + o] * W[o * IC + i];
        want_dw.data<double>()[o * IC + i] += G[n * OC + o] * X[n * IC + i];
      }
    }
  CHECK(rel_err(dx, want_dx) < 1e-13);
  CHECK(rel_err(dw, want_dw) < 1e-13);
  CHECK(rel_err(db, want_db) < 1e-13);
}

TEST_CASE("linear + GELU: forward is linear then gelu, backward matches finite differences", "[ops][linear]") {
  const int64_t N = 6, IC = 5, OC = 4, C = 3;
  Tensor x = randn({N, IC}, 21), w = randn({OC, IC}, 22), b = randn({OC}, 23);
  Tensor out = Tensor::empty({N, OC}, DType::F64), pre = Tensor::empty({N, OC}, DType::F64);
  ops::linear_gelu_forward(out, pre, x, w, &b);
  Tensor pre_ref = Tensor::empty({N, OC}, DType::F64), out_ref = Tensor::empty({N, OC}, DType::F64);
  ops::linear_forward(pre_ref, x, w, &b);
  ops::gelu_forward(out_ref, pre_ref);
  CHECK(bitwise_equal(pre, pre_ref));
  CHECK(bitwise_equal(out, out_ref));
  // L = <wts, gelu(pre) w2^T + b2> as a function of pre: dL/dpre through the second linear and the GELU.
  Tensor w2 = randn({C, OC}, 24), b2 = randn({C}, 25), wts = randn({N, C}, 26);
  auto L = [&] {
    Tensor a = Tensor::empty({N, OC}, DType::F64), y = Tensor::empty({N, C}, DType::F64);
    ops::gelu_forward(a, pre);
    ops::linear_forward(y, a, w2, &b2);
    return dot(wts, y);
  };
  Tensor dpre = Tensor::empty({N, OC}, DType::F64), dw2 = Tensor::zeros({C, OC}, DType::F64),
         db2 = Tensor::zeros({C}, DType::F64);
  ops::linear_backward_gelu(dpre, &dw2, &db2, wts, out, w2, pre);
  check_grad("dpre", dpre, pre, L);
  Tensor dw2_ref = Tensor::zeros({C, OC}, DType::F64), db2_ref = Tensor::zeros({C}, DType::F64);
  ops::linear_backward(nullptr, &dw2_ref, &db2_ref, wts, out, w2);
  CHECK(bitwise_equal(dw2, dw2_ref));
  CHECK(bitwise_equal(db2, db2_ref));
}

TEST_CASE("linear + SwiGLU backward recomputes swiglu(h): linear then swiglu backward, in place too", "[ops][linear]") {
  const int64_t N = 6, F = 5, C = 3;
  const Tensor h = randn({N, 2 * F}, 31), w2 = randn({C, F}, 32), wts = randn({N, C}, 33);
  const Tensor dw0 = randn({C, F}, 34), db0 = randn({C}, 35);
  // The reference: keep a = swiglu(h), linear backward with it, then the SwiGLU's backward.
  Tensor a = Tensor::empty({N, F}, DType::F64), da = Tensor::empty({N, F}, DType::F64);
  Tensor dh_ref = Tensor::empty({N, 2 * F}, DType::F64), dw_ref = dw0.clone(), db_ref = db0.clone();
  ops::swiglu_forward(a, h);
  ops::linear_backward(&da, &dw_ref, &db_ref, wts, a, w2);
  ops::swiglu_backward(dh_ref, da, h);
  Tensor dh = Tensor::empty({N, 2 * F}, DType::F64), dw = dw0.clone(), db = db0.clone();
  ops::linear_backward_swiglu(dh, &dw, &db, wts, w2, h);
  CHECK(bitwise_equal(dh, dh_ref));
  CHECK(bitwise_equal(dw, dw_ref));  // accumulated onto dw0
  CHECK(bitwise_equal(db, db_ref));
  // dh written over h
  Tensor hh = h.clone();
  ops::linear_backward_swiglu(hh, nullptr, nullptr, wts, w2, hh);
  CHECK(bitwise_equal(hh, dh_ref));
  // and against finite differences of L = <wts, swiglu(h) w2^T>
  Tensor hx = h.clone();
  auto L = [&] {
    Tensor ax = Tensor::empty({N, F}, DType::F64), y = Tensor::empty({N, C}, DType::F64);
    ops::swiglu_forward(ax, hx);
    ops::linear_forward(y, ax, w2, nullptr);
    return dot(wts, y);
  };
  check_grad("dh", dh, hx, L);
}
