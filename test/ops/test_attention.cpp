// qkv_split and causal GQA attention: naive references, finite differences, causality, fp32 vs fp64.
#include <omp.h>

#include <vector>

#include "gradcheck.h"

using namespace mt;
using namespace mt::test;

namespace {
struct Qkv {
  Tensor q, k, v;
};
Qkv make_qkv(int64_t B, int64_t T, int64_t H, int64_t G, int64_t D, uint64_t seed) {
  return {randn({B, T, H, D}, seed), randn({B, T, G, D}, seed + 1), randn({B, T, G, D}, seed + 2)};
}

// Plain loops: out[b,i,h] = sum_{j<=i} softmax_j(q_i . k_j / sqrt(D)) v_j with k, v of head h / (H/G).
Tensor naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor* lse) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3), G = k.size(2), R = H / G;
  Tensor out = Tensor::zeros(q.shape(), DType::F64);
  const double* Q = q.data<double>();
  const double* K = k.data<double>();
  const double* V = v.data<double>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t g = h / R;
        std::vector<double> s(static_cast<size_t>(i + 1));
        double m = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (int64_t c = 0; c < D; ++c) d += Q[((b * T + i) * H + h) * D + c] * K[((b * T + j) * G + g) * D + c];
          s[j] = d / std::sqrt(static_cast<double>(D));
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (double x : s) sum += std::exp(x - m);
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t c = 0; c < D; ++c)
            out.data<double>()[((b * T + i) * H + h) * D + c] +=
                std::exp(s[j] - m) / sum * V[((b * T + j) * G + g) * D + c];
        if (lse) lse->data<double>()[(b * H + h) * T + i] = m + std::log(sum);
      }
  return out;
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor* lse_out = nullptr) {
  const DType st = q.dtype();
  Tensor out = Tensor::empty(q.shape(), q.dtype());
  Tensor lse = Tensor::empty({q.size(0), q.size(2), q.size(1)}, st);
  ops::attention_forward(out, lse, q, k, v);
  if (lse_out) *lse_out = lse;
  return out;
}
}  // namespace

TEST_CASE("qkv_split follows the grouped layout and its backward is the inverse", "[ops][attention]") {
  const int64_t B = 2, T = 3, H = 4, G = 2, D = 2, R = H / G, W = G * (R + 2) * D;
  Tensor qkv = Tensor::empty({B, T, W}, DType::F64);
  for (int64_t i = 0; i < qkv.numel(); ++i) qkv.data<double>()[i] = static_cast<double>(i);
  Tensor q = Tensor::empty({B, T, H, D}, DType::F64), k = Tensor::empty({B, T, G, D}, DType::F64);
  Tensor v = Tensor::empty({B, T, G, D}, DType::F64);
  ops::qkv_split_forward(q, k, v, qkv);
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t d = 0; d < D; ++d) {
        const double base = static_cast<double>(bt * W + g * (R + 2) * D + d);
        for (int64_t r = 0; r < R; ++r) CHECK(q.data<double>()[(bt * H + g * R + r) * D + d] == base + r * D);
        CHECK(k.data<double>()[(bt * G + g) * D + d] == base + R * D);
        CHECK(v.data<double>()[(bt * G + g) * D + d] == base + (R + 1) * D);
      }
  Tensor back = Tensor::empty({B, T, W}, DType::F64);
  ops::qkv_split_backward(back, q, k, v);
  CHECK(bitwise_equal(back, qkv));

  Tensor x = randn({B, T, W}, 5), wq = randn(q.shape(), 6), wk = randn(k.shape(), 7), wv = randn(v.shape(), 8);
  auto L = [&] {
    ops::qkv_split_forward(q, k, v, x);
    return dot(wq, q) + dot(wk, k) + dot(wv, v);
  };
  ops::qkv_split_backward(back, wq, wk, wv);
  check_grad("dqkv", back, x, L);
}

TEST_CASE("attention on the fused projection is split + attention (forward and backward)", "[ops][attention]") {
  for (int64_t G : {2, 4}) {
    const int64_t B = 2, T = 9, H = 4, D = 8, W = G * (H / G + 2) * D;
    INFO("G " << G);
    const Tensor qkv = randn({B, T, W}, 40 + G), dout = randn({B, T, H, D}, 50 + G);
    Tensor q = Tensor::empty({B, T, H, D}, DType::F64), k = Tensor::empty({B, T, G, D}, DType::F64),
           v = Tensor::empty({B, T, G, D}, DType::F64);
    ops::qkv_split_forward(q, k, v, qkv);
    Tensor out_r = Tensor::empty({B, T, H, D}, DType::F64), lse_r = Tensor::empty({B, H, T}, DType::F64);
    ops::attention_forward(out_r, lse_r, q, k, v);
    Tensor out = Tensor::empty({B, T, H, D}, DType::F64), lse = Tensor::empty({B, H, T}, DType::F64);
    ops::attention_forward_qkv(out, lse, qkv, G);
    CHECK(bitwise_equal(out, out_r));
    CHECK(bitwise_equal(lse, lse_r));
    Tensor dq = Tensor::empty(q.shape(), DType::F64), dk = Tensor::empty(k.shape(), DType::F64),
           dv = Tensor::empty(v.shape(), DType::F64), dqkv_r = Tensor::empty({B, T, W}, DType::F64);
    ops::attention_backward(dq, dk, dv, dout, q, k, v, out_r, lse_r);
    ops::qkv_split_backward(dqkv_r, dq, dk, dv);
    Tensor dqkv = Tensor::empty({B, T, W}, DType::F64);
    ops::attention_backward_qkv(dqkv, dout, qkv, out, lse, G);
    CHECK(bitwise_equal(dqkv, dqkv_r));
  }
}

TEST_CASE("attention forward matches a naive implementation (GQA, MHA, MQA)", "[ops][attention]") {
  struct Cfg {
    int64_t B, T, H, G, D;
  };
  const Cfg cfgs[] = {{2, 7, 4, 2, 8}, {2, 7, 4, 4, 8}, {2, 7, 4, 1, 8}, {1, 70, 2, 1, 4}, {1, 130, 2, 2, 3}, {2, 100, 4, 2, 16}};
  for (const Cfg& c : cfgs) {
    INFO("B " << c.B << " T " << c.T << " H " << c.H << " G " << c.G << " D " << c.D);
    Qkv x = make_qkv(c.B, c.T, c.H, c.G, c.D, 100 + c.G + c.T);
    Tensor lse, want_lse = Tensor::empty({c.B, c.H, c.T}, DType::F64);
    Tensor out = attention(x.q, x.k, x.v, &lse);
    CHECK(rel_err(out, naive_attention(x.q, x.k, x.v, &want_lse)) < 1e-13);
    CHECK(rel_err(lse, want_lse) < 1e-14);
  }
}

TEST_CASE("attention backward matches finite differences", "[ops][attention]") {
  struct Cfg {
    int64_t B, T, H, G, D;
  };
  const Cfg cfgs[] = {{2, 5, 4, 2, 4}, {2, 5, 2, 2, 4}, {1, 5, 4, 1, 3}, {1, 67, 2, 1, 2}};
  for (const Cfg& c : cfgs) {
    INFO("B " << c.B << " T " << c.T << " H " << c.H << " G " << c.G << " D " << c.D);
    Qkv x = make_qkv(c.B, c.T, c.H, c.G, c.D, 200 + c.G + c.T);
    Tensor wts = randn(x.q.shape(), 7);
    auto L = [&] { return dot(wts, attention(x.q, x.k, x.v)); };
    Tensor lse;
    Tensor out = attention(x.q, x.k, x.v, &lse);
    // Pre-filled outputs: the activation gradients must be overwritten.
    Tensor dq = randn(x.q.shape(), 1), dk = randn(x.k.shape(), 2), dv = randn(x.v.shape(), 3);
    ops::attention_backward(dq, dk, dv, wts, x.q, x.k, x.v, out, lse);
    check_grad("dq", dq, x.q, L);
    check_grad("dk", dk, x.k, L);
    check_grad("dv", dv, x.v, L);
  }
}

TEST_CASE("attention is causal: a future key/value does not change earlier outputs", "[ops][attention]") {
  const int64_t B = 1, T = 9, H = 4, G = 2, D = 4, t_changed = 5;
  Qkv x = make_qkv(B, T, H, G, D, 300);
  Tensor before = attention(x.q, x.k, x.v);
  for (int64_t c = 0; c < G * D; ++c) {
    x.k.data<double>()[t_changed * G * D + c] += 3.0;
    x.v.data<double>()[t_changed * G * D + c] -= 2.0;
  }
  Tensor after = attention(x.q, x.k, x.v);
  const int64_t row = H * D;
  CHECK(max_abs_diff(before.view({T, row}).slice(0, t_changed), after.view({T, row}).slice(0, t_changed)) == 0.0);
  CHECK(max_abs_diff(before.view({T, row}).slice(t_changed, T - t_changed),
                     after.view({T, row}).slice(t_changed, T - t_changed)) > 1e-3);
}

TEST_CASE("attention fp32 agrees with fp64", "[ops][attention]") {
  const int64_t B = 2, T = 80, H = 4, G = 2, D = 16;
  Qkv x = make_qkv(B, T, H, G, D, 400);
  Tensor dout = randn(x.q.shape(), 401);
  Tensor lse;
  Tensor out = attention(x.q, x.k, x.v, &lse);
  Tensor dq = Tensor::empty(x.q.shape(), DType::F64), dk = Tensor::empty(x.k.shape(), DType::F64);
  Tensor dv = Tensor::empty(x.v.shape(), DType::F64);
  ops::attention_backward(dq, dk, dv, dout, x.q, x.k, x.v, out, lse);

  const DType F = DType::F32;
  Tensor qf = to(x.q, F), kf = to(x.k, F), vf = to(x.v, F), doutf = to(dout, F), lsef;
  Tensor outf = attention(qf, kf, vf, &lsef);
  Tensor dqf = Tensor::empty(x.q.shape(), F), dkf = Tensor::empty(x.k.shape(), F), dvf = Tensor::empty(x.v.shape(), F);
  ops::attention_backward(dqf, dkf, dvf, doutf, qf, kf, vf, outf, lsef);
  CHECK(lsef.dtype() == DType::F32);
  CHECK(rel_err(outf, out) < 1e-5);
  CHECK(rel_err(lsef, lse) < 1e-6);
  CHECK(rel_err(dqf, dq) < 1e-5);
  CHECK(rel_err(dkf, dk) < 1e-5);
  CHECK(rel_err(dvf, dv) < 1e-5);
}

TEST_CASE("attention does not depend on the thread count", "[ops][attention]") {
  // Large enough for the parallel (b, h) / (b, g) loops.
  const int64_t B = 2, T = 100, H = 4, G = 2, D = 16;
  Qkv x = make_qkv(B, T, H, G, D, 600);
  Tensor dout = randn(x.q.shape(), 601);
  auto run = [&](int threads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    Tensor lse;
    Tensor out = attention(x.q, x.k, x.v, &lse);
    Tensor dq = Tensor::empty(x.q.shape(), DType::F64), dk = Tensor::empty(x.k.shape(), DType::F64);
    Tensor dv = Tensor::empty(x.v.shape(), DType::F64);
    ops::attention_backward(dq, dk, dv, dout, x.q, x.k, x.v, out, lse);
    omp_set_num_threads(saved);
    return std::vector<Tensor>{out, lse, dq, dk, dv};
  };
  const std::vector<Tensor> one = run(1), two = run(2), three = run(3);
  for (size_t i = 0; i < one.size(); ++i) {
    CHECK(max_abs_diff(one[i], two[i]) < 1e-13);
    CHECK(max_abs_diff(one[i], three[i]) < 1e-13);
  }
}

TEST_CASE("attention rejects a head count that is not a multiple of the groups", "[ops][attention]") {
  Qkv x = make_qkv(1, 4, 3, 2, 4, 500);
  Tensor out = Tensor::empty(x.q.shape(), DType::F64), lse = Tensor::empty({1, 3, 4}, DType::F64);
  CHECK_THROWS_AS(ops::attention_forward(out, lse, x.q, x.k, x.v), InternalError);
}

TEST_CASE("qkv_split_rope is the split, then rope on q and k (forward and backward)", "[ops][attention]") {
  for (int64_t G : {1, 2, 4}) {
    const int64_t B = 2, T = 5, H = 4, D = 6, W = G * (H / G + 2) * D;
    INFO("G " << G);
    const Tensor qkv = randn({B, T, W}, 60 + G);
    Tensor q = Tensor::empty({B, T, H, D}, DType::F64), k = Tensor::empty({B, T, G, D}, DType::F64),
           v = Tensor::empty({B, T, G, D}, DType::F64);
    ops::qkv_split_rope_forward(q, k, v, qkv, 100.0, 3);
    Tensor qr = q.clone(), kr = k.clone(), vr = v.clone();
    ops::qkv_split_forward(qr, kr, vr, qkv);
    ops::rope_forward(qr, 100.0, 3);
    ops::rope_forward(kr, 100.0, 3);
    CHECK(bitwise_equal(q, qr));
    CHECK(bitwise_equal(k, kr));
    CHECK(bitwise_equal(v, vr));
    const Tensor dq = randn(q.shape(), 70 + G), dk = randn(k.shape(), 80 + G), dv = randn(v.shape(), 90 + G);
    const Tensor dq0 = dq.clone(), dk0 = dk.clone();
    Tensor dqkv = Tensor::empty({B, T, W}, DType::F64);
    ops::qkv_split_rope_backward(dqkv, dq, dk, dv, 100.0, 3);
    CHECK(bitwise_equal(dq, dq0));  // inputs untouched
    CHECK(bitwise_equal(dk, dk0));
    // The gradient of L = <dq, q> + <dk, k> + <dv, v> with respect to qkv.
    Tensor x = qkv.clone();
    auto L = [&] {
      ops::qkv_split_rope_forward(q, k, v, x, 100.0, 3);
      return dot(dq, q) + dot(dk, k) + dot(dv, v);
    };
    check_grad("dqkv", dqkv, x, L);
  }
}
