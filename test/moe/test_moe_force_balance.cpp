// model.moe_router_force_load_balancing (fp64, one rank): the router's logits are the keyed standard normals of
// their global rows, so rows split in two (as two ranks hold them) draw the whole's numbers; the gradient passes
// straight through to the router weight (dW = dlogits^T x, dx = dlogits W, dlogits from the random logits, the
// z-loss's included), compared with a direct computation; and the load is balanced whatever the weight.
#include <algorithm>

#include "catch.h"
#include "core/counter_rng.h"
#include "moe/moe_fixture.h"
#include "ops/gradcheck.h"

using namespace mt;
using namespace mt::test;

namespace {
MoEOptions forced(int64_t E, int64_t k) {
  MoEOptions o;
  o.num_experts = E;
  o.topk = k;
  o.ffn_hidden_size = 2;
  o.seq_length = 4;
  o.force_load_balancing = true;
  return o;
}

const double* data(const Tensor& t) { return t.data<double>(); }

// Routed slots per expert of a choice (N, k).
std::vector<int64_t> load_of(const Tensor& choice, int64_t E) {
  std::vector<int64_t> load(static_cast<size_t>(E), 0);
  for (int64_t i = 0; i < choice.numel(); ++i) ++load[static_cast<size_t>(choice.data<int32_t>()[i])];
  return load;
}
}  // namespace

TEST_CASE("forced balancing: the logits are the keyed normals of the global rows; halves continue the whole",
          "[moe][router][force_balance]") {
  const int64_t N = 12, C = 5, E = 8, k = 2;
  MoEOptions o = forced(E, k);
  o.aux_loss_coeff = 0.01;
  MoEFixture fx(o, C);
  const Router& r = fx.layer->router();
  const Tensor x = randn({N, C}, 3);
  const RowKey key{0xfeedull, 1000};
  Router::Saved whole;
  r.forward(whole, x, key);
  int64_t differ = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e)
      differ += data(whole.logits)[n * E + e] !=
                rng::normal01(key.seed, rng::kRouterLogitsStream, static_cast<uint64_t>((key.first_row + n) * E + e));
  CHECK(differ == 0);
  // rows [0, N/2) at first_row 1000 and [N/2, N) at 1000 + N/2: the whole's logits, choice and weights
  for (int64_t half = 0; half < 2; ++half) {
    const int64_t r0 = half * N / 2;
    Router::Saved s;
    r.choose(s, x.slice(r0, N / 2), RowKey{key.seed, key.first_row + r0});
    CHECK(bitwise_equal(s.logits, whole.logits.slice(r0, N / 2)));
    CHECK(bitwise_equal(s.choice, whole.choice.slice(r0, N / 2)));
    CHECK(bitwise_equal(s.weights, whole.weights.slice(r0, N / 2)));
  }
  // another layer's seed or other rows draw other logits
  Router::Saved other;
  r.choose(other, x, RowKey{key.seed + 1, key.first_row});
  CHECK(max_abs_diff(other.logits, whole.logits) > 0.5);
  r.choose(other, x, RowKey{key.seed, key.first_row + N});
  CHECK(max_abs_diff(other.logits, whole.logits) > 0.5);
  // the whole layer with the halves' keys: the whole's output rows (each token's experts and weights are its own)
  MoELayer::Saved sl;
  const Tensor y = fx.layer->forward(sl, x, nullptr, key);
  for (int64_t half = 0; half < 2; ++half) {
    const int64_t r0 = half * N / 2;
    MoELayer::Saved sh;
    const Tensor yh = fx.layer->forward(sh, x.slice(r0, N / 2), nullptr, RowKey{key.seed, key.first_row + r0});
    CHECK(max_abs_diff(yh, y.slice(r0, N / 2)) < 1e-13);
  }
}

TEST_CASE("forced balancing: straight-through gradient to the router weight and input",
          "[moe][router][force_balance]") {
  const int64_t N = 10, C = 6, E = 8, k = 3;
  MoEOptions o = forced(E, k);
  o.aux_loss_coeff = 0;  // no balancing loss; the z-loss on the random logits
  o.z_loss_coeff = 0.01;
  MoEFixture fx(o, C);
  const Router& r = fx.layer->router();
  const Tensor x = randn({N, C}, 4), dweights = randn({N, k}, 5);
  const RowKey key{77, 40};
  Router::Saved s;
  r.forward(s, x, key);
  REQUIRE(s.z_loss.defined());
  const Tensor logits = s.logits.clone(), choice = s.choice.clone(), weights = s.weights.clone();
  // dL/dlogits from the random logits l: the weights are the softmax over the chosen k (w_j = exp(l_j) / sum over
  // the chosen), so dl_e = w_e (dw_e - sum_j w_j dw_j) for a chosen e; the z-loss coeff / N lse_n^2 adds
  // coeff / N 2 lse_n softmax(l_n)_e
  std::vector<double> dl(static_cast<size_t>(N * E), 0.0);
  double z = 0;
  for (int64_t n = 0; n < N; ++n) {
    const double* l = data(logits) + n * E;
    double wdw = 0;
    for (int64_t j = 0; j < k; ++j) wdw += data(weights)[n * k + j] * data(dweights)[n * k + j];
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = choice.data<int32_t>()[n * k + j];
      dl[n * E + e] += data(weights)[n * k + j] * (data(dweights)[n * k + j] - wdw);
    }
    const double mx = *std::max_element(l, l + E);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(l[e] - mx);
    const double lse = mx + std::log(sum);
    z += lse * lse;
    for (int64_t e = 0; e < E; ++e) dl[n * E + e] += o.z_loss_coeff / N * 2 * lse * std::exp(l[e] - lse);
  }
  CHECK(MoELayer::loss_value(s.z_loss) == Approx(o.z_loss_coeff * z / N).epsilon(1e-12));
  // dW = dl^T x, dx = dl W: through the GEMM of the real logits
  const double* W = fx.value("layers.0.mlp.router.weight");
  fx.store->zero_grads();
  Tensor dx = Tensor::zeros({N, C}, DType::F64);
  r.backward(s, dweights, x, dx);
  const Tensor& dW = r.weight()->grad;
  double err = 0, norm = 0;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t c = 0; c < C; ++c) {
      double want = 0;
      for (int64_t n = 0; n < N; ++n) want += dl[n * E + e] * data(x)[n * C + c];
      err = std::max(err, std::fabs(data(dW)[e * C + c] - want));
      norm = std::max(norm, std::fabs(want));
    }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      double want = 0;
      for (int64_t e = 0; e < E; ++e) want += dl[n * E + e] * W[e * C + c];
      err = std::max(err, std::fabs(data(dx)[n * C + c] - want));
    }
  CHECK(norm > 0.01);  // the weight does get a gradient
  CHECK(err < 1e-13);
}

TEST_CASE("forced balancing: 4096 tokens over 64 experts top-8 are balanced whatever the weight",
          "[moe][router][force_balance]") {
  const int64_t N = 4096, C = 8, E = 64, k = 8;
  // a router weight that sends every token to expert 0: its row 10, the others 0, on positive inputs
  Tensor x = uniform({N, C}, 6, 0.5, 1.5);
  auto load = [&](bool force) {
    MoEOptions o = forced(E, k);
    o.ffn_hidden_size = 1;
    o.force_load_balancing = force;
    MoEFixture fx(o, C);
    Tensor& w = fx.store->find("layers.0.mlp.router.weight")->value;
    w.zero_();
    for (int64_t c = 0; c < C; ++c) w.data<double>()[c] = 10.0;
    Router::Saved s;
    fx.layer->router().choose(s, x, RowKey{123, 0});
    return load_of(s.choice, E);
  };
  const double mean = static_cast<double>(N * k) / E;
  const std::vector<int64_t> plain = load(false), balanced = load(true);
  CHECK(plain[0] == N);  // every token, max / mean = 8
  const auto [lo, hi] = std::minmax_element(balanced.begin(), balanced.end());
  INFO("forced: tokens per expert in [" << *lo << ", " << *hi << "], mean " << mean);
  CHECK(static_cast<double>(*hi) / mean < 1.3);
  CHECK(static_cast<double>(*lo) / mean > 0.7);
}
