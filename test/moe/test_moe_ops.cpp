// The MoE ops against fp64 finite differences and direct computations: router (softmax / sigmoid, pre-softmax,
// scaling, expert bias, ties), aux / seq-aux / z losses, expert-bias update, capacity, routing map, permute /
// unpermute, grouped GEMMs (with empty groups), the padded layout of padded batched experts and its choice.
#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "catch.h"
#include "moe/moe_experts_pass.h"
#include "ops/gradcheck.h"
#include "tensor/moe_ops.h"

using namespace mt;
using namespace mt::test;

namespace {
constexpr DType D = DType::F64;

struct Routed {
  Tensor indices, weights, scores;
};
Routed route(const Tensor& logits, const ops::RouterSpec& spec, const Tensor* bias = nullptr) {
  const int64_t N = logits.size(0), E = logits.size(1);
  Routed r{Tensor::empty({N, spec.topk}, DType::I32), Tensor::empty({N, spec.topk}, D), Tensor::empty({N, E}, D)};
  ops::moe_router_forward(r.indices, r.weights, r.scores, logits, bias, spec);
  return r;
}
}  // namespace

TEST_CASE("moe router: top-k ties go to the lower expert, the bias moves the choice only", "[moe][router]") {
  Tensor logits = Tensor::zeros({2, 4}, D);
  logits.data<double>()[4 + 3] = 1.0;  // row 1: expert 3 largest, the rest tied
  ops::RouterSpec spec;
  spec.topk = 2;
  Routed r = route(logits, spec);
  CHECK(r.indices.data<int32_t>()[0] == 0);
  CHECK(r.indices.data<int32_t>()[1] == 1);
  CHECK(r.indices.data<int32_t>()[2] == 3);
  CHECK(r.indices.data<int32_t>()[3] == 0);
  CHECK(r.weights.data<double>()[0] == Approx(0.5));  // renormalized over the two chosen
  // a bias on expert 2 makes it chosen in row 0, but the weights are still the (renormalized) scores
  Tensor bias = Tensor::zeros({4}, D);
  bias.data<double>()[2] = 0.1;
  Routed rb = route(logits, spec, &bias);
  CHECK(rb.indices.data<int32_t>()[0] == 2);
  CHECK(rb.indices.data<int32_t>()[1] == 0);
  CHECK(rb.weights.data<double>()[0] == Approx(0.5));
  // sigmoid, k = 1: the weight is the raw sigmoid score times the scaling factor
  spec.topk = 1;
  spec.sigmoid = true;
  spec.scaling = 2.5;
  Routed rs = route(logits, spec);
  CHECK(rs.indices.data<int32_t>()[1] == 3);
  CHECK(rs.weights.data<double>()[1] == Approx(2.5 / (1.0 + std::exp(-1.0))));
}

TEST_CASE("moe router backward matches finite differences", "[moe][router]") {
  const int64_t N = 6, E = 5;
  uint64_t seed = 10;
  for (bool sigmoid : {false, true})
    for (bool pre : {false, true})
      for (int64_t k : {int64_t(1), int64_t(2), int64_t(3)})
        for (double scaling : {1.0, 2.5})
          for (bool use_bias : {false, true}) {
            if (sigmoid && pre) continue;
            if (!sigmoid && !pre && k == 1) continue;  // softmax over one chosen logit: weight 1, no gradient
            ops::RouterSpec spec;
            spec.topk = k;
            spec.sigmoid = sigmoid;
            spec.pre_softmax = pre;
            spec.scaling = scaling;
            INFO("sigmoid " << sigmoid << " pre_softmax " << pre << " k " << k << " scaling " << scaling << " bias "
                            << use_bias);
            Tensor logits = randn({N, E}, ++seed);
            Tensor bias = randn({E}, ++seed, D, 0.3);
            const Tensor* b = use_bias ? &bias : nullptr;
            const Tensor dw = randn({N, k}, ++seed);
            Routed r = route(logits, spec, b);
            Tensor dlogits = Tensor::empty({N, E}, D);
            ops::moe_router_backward(dlogits, dw, r.scores, r.indices, spec);
            check_grad("dlogits", dlogits, logits, [&] { return dot(dw, route(logits, spec, b).weights); });
          }
}

TEST_CASE("moe aux, seq-aux and z losses match a direct computation and finite differences", "[moe][router]") {
  const int64_t B = 3, T = 4, N = B * T, E = 6, k = 2;
  uint64_t seed = 50;
  for (bool sigmoid : {false, true})
    for (int64_t groups : {int64_t(1), B}) {
      INFO("sigmoid " << sigmoid << " groups " << groups);
      ops::RouterSpec spec;
      spec.topk = k;
      spec.sigmoid = sigmoid;
      Tensor logits = randn({N, E}, ++seed);
      const double coeff = 0.37;
      auto loss_of = [&] {
        Routed r = route(logits, spec);
        Tensor l = Tensor::empty({1}, D);
        ops::moe_aux_loss_forward(l, r.scores, r.indices, groups, coeff, sigmoid);
        return l.data<double>()[0];
      };
      // direct: coeff * mean over groups of E * sum_e f_e P_e
      Routed r = route(logits, spec);
      double expect = 0;
      const int64_t rows = N / groups;
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t e = 0; e < E; ++e) {
          double f = 0, P = 0;
          for (int64_t n = g * rows; n < (g + 1) * rows; ++n) {
            for (int64_t j = 0; j < k; ++j) f += r.indices.data<int32_t>()[n * k + j] == e ? 1.0 : 0.0;
            double S = 0;
            for (int64_t x = 0; x < E; ++x) S += r.scores.data<double>()[n * E + x];
            P += r.scores.data<double>()[n * E + e] / (sigmoid ? S : 1.0);
          }
          expect += coeff / static_cast<double>(groups) * static_cast<double>(E) * (f / (rows * k)) * (P / rows);
        }
      }
      CHECK(loss_of() == Approx(expect).epsilon(1e-12));
      Tensor dlogits = Tensor::zeros({N, E}, D);
      ops::moe_aux_loss_backward(dlogits, r.scores, r.indices, groups, coeff, sigmoid);
      check_grad("aux dlogits", dlogits, logits, loss_of);
    }
  // z-loss: coeff * mean(lse^2), gradient accumulated (+=) onto what is there
  Tensor logits = randn({N, E}, 99, D, 2.0);
  const double coeff = 1e-2;
  auto z_of = [&] {
    Tensor l = Tensor::empty({1}, D);
    ops::moe_z_loss_forward(l, logits, coeff);
    return l.data<double>()[0];
  };
  double expect = 0;
  for (int64_t n = 0; n < N; ++n) {
    double s = 0;
    for (int64_t e = 0; e < E; ++e) s += std::exp(logits.data<double>()[n * E + e]);
    expect += std::log(s) * std::log(s);
  }
  CHECK(z_of() == Approx(coeff * expect / N).epsilon(1e-12));
  const Tensor base = randn({N, E}, 98);
  Tensor dlogits = base.clone();
  ops::moe_z_loss_backward(dlogits, logits, coeff, 3.0);
  Tensor added = dlogits.clone();
  ops::scale_(added, 1.0);
  for (int64_t i = 0; i < N * E; ++i) added.data<double>()[i] -= base.data<double>()[i];
  check_grad("z dlogits", added, logits, [&] { return 3.0 * z_of(); });
}

TEST_CASE("moe expert bias update: rate * sign(mean load - load)", "[moe][router]") {
  Tensor bias = Tensor::zeros({4}, DType::F32);
  bias.data<float>()[1] = 0.5f;
  Tensor load = Tensor::empty({4}, DType::I32);
  const int32_t l[4] = {1, 7, 4, 4};  // mean 4
  std::copy_n(l, 4, load.data<int32_t>());
  ops::moe_expert_bias_update(bias, load, 0.25);
  CHECK(bias.data<float>()[0] == 0.25f);
  CHECK(bias.data<float>()[1] == 0.25f);
  CHECK(bias.data<float>()[2] == 0.0f);
  CHECK(bias.data<float>()[3] == 0.0f);
}

TEST_CASE("moe capacity keeps each expert's highest-weight slots", "[moe][capacity]") {
  CHECK(ops::moe_capacity(10, 2, 4, 1.0) == 5);
  CHECK(ops::moe_capacity(10, 2, 4, 1.1) == 6);
  // 4 tokens, k 1, all to expert 1 with weights .2 .9 .5 .9; capacity 2 keeps slots 1 and 3 (ties: lower slot)
  Tensor idx = Tensor::empty({4, 1}, DType::I32);
  Tensor w = Tensor::empty({4, 1}, D);
  const double wv[4] = {0.2, 0.9, 0.5, 0.9};
  for (int i = 0; i < 4; ++i) {
    idx.data<int32_t>()[i] = 1;
    w.data<double>()[i] = wv[i];
  }
  ops::moe_apply_capacity(idx, w, 3, 2);
  CHECK(idx.data<int32_t>()[0] == -1);
  CHECK(idx.data<int32_t>()[1] == 1);
  CHECK(idx.data<int32_t>()[2] == -1);
  CHECK(idx.data<int32_t>()[3] == 1);
  ops::moe_apply_capacity(idx, w, 3, 1);  // ties: the lower slot stays
  CHECK(idx.data<int32_t>()[1] == 1);
  CHECK(idx.data<int32_t>()[3] == -1);
}

TEST_CASE("moe permute / unpermute: routing map order, adjointness, gradients", "[moe][permute]") {
  const int64_t N = 7, C = 3, k = 2, E = 4;
  Tensor idx = Tensor::empty({N, k}, DType::I32);
  // expert 2 gets nothing; slot 5 (token 2) dropped
  const int32_t iv[N * k] = {0, 1, 1, 3, 3, -1, 0, 3, 1, 0, 3, 1, 0, 1};
  std::copy_n(iv, N * k, idx.data<int32_t>());
  Tensor s2r = Tensor::empty({N * k}, DType::I32), r2s = Tensor::empty({N * k}, DType::I32),
         counts = Tensor::empty({E}, DType::I32);
  ops::moe_routing_map(s2r, r2s, counts, idx, E);
  const int32_t expect_counts[E] = {4, 5, 0, 4};
  for (int e = 0; e < E; ++e) CHECK(counts.data<int32_t>()[e] == expect_counts[e]);
  const int64_t M = 13;
  // rows are expert-major, tokens ascending inside an expert
  for (int64_t r = 1; r < M; ++r) {
    const int32_t a = s2r.data<int32_t>()[r - 1], b = s2r.data<int32_t>()[r];
    CHECK((iv[a] < iv[b] || (iv[a] == iv[b] && a < b)));
  }
  CHECK(s2r.data<int32_t>()[M] == -1);
  CHECK(r2s.data<int32_t>()[5] == -1);
  for (int64_t s = 0; s < N * k; ++s)
    if (iv[s] >= 0) CHECK(s2r.data<int32_t>()[r2s.data<int32_t>()[s]] == s);

  Tensor x = randn({N, C}, 1), xp = Tensor::empty({M, C}, D);
  ops::moe_permute_forward(xp, x, s2r, k);
  // permute_backward is the adjoint: <P x, g> = <x, P^T g>
  const Tensor g = randn({M, C}, 2);
  Tensor dx = Tensor::empty({N, C}, D);
  ops::moe_permute_backward(dx, g, r2s, k);
  CHECK(dot(xp, g) == Approx(dot(x, dx)).epsilon(1e-13));
  // unpermute: gradients wrt yp and weights
  Tensor yp = randn({M, C}, 3), w = randn({N, k}, 4);
  const Tensor dy = randn({N, C}, 5);
  auto L = [&] {
    Tensor y = Tensor::empty({N, C}, D);
    ops::moe_unpermute_forward(y, yp, w, r2s);
    return dot(y, dy);
  };
  Tensor dyp = Tensor::empty({M, C}, D), dw = Tensor::empty({N, k}, D);
  ops::moe_unpermute_backward(dyp, dw, dy, yp, w, r2s);
  check_grad("dyp", dyp, yp, L);
  check_grad("dweights", dw, w, L);
  // with the residual stream: the same sums plus x (fp64: one rounding either way)
  Tensor y = Tensor::empty({N, C}, D), yr = Tensor::empty({N, C}, D);
  ops::moe_unpermute_forward(y, yp, w, r2s);
  ops::moe_unpermute_forward(yr, yp, w, r2s, &x);
  for (int64_t i = 0; i < N * C; ++i) CHECK(yr.data<double>()[i] == y.data<double>()[i] + x.data<double>()[i]);
  CHECK(dw.data<double>()[5] == 0.0);  // the dropped slot
  // permute_backward with the router's input gradient (dlogits W) and a residual in its pass: the plain sum, plus
  // the product linear_backward makes, plus the residual (fp64: to rounding)
  const int64_t Er = 6;
  const Tensor dlogits = randn({N, Er}, 6), rw = randn({Er, C}, 7), res = randn({N, C}, 8);
  Tensor fused = Tensor::empty({N, C}, D), expect = Tensor::empty({N, C}, D);
  ops::moe_permute_backward(fused, g, r2s, k, &dlogits, &rw, &res);
  ops::linear_backward(&expect, nullptr, nullptr, dlogits, x, rw);  // expect = dlogits W
  for (int64_t i = 0; i < N * C; ++i) {
    const double want = dx.data<double>()[i] + expect.data<double>()[i] + res.data<double>()[i];
    CHECK(fused.data<double>()[i] == Approx(want).epsilon(1e-13).margin(1e-13));
  }
  const Tensor many = randn({N, ops::kRouterTermMaxE + 1}, 9), many_w = randn({ops::kRouterTermMaxE + 1, C}, 10);
  CHECK_THROWS_AS(ops::moe_permute_backward(fused, g, r2s, k, &many, &many_w), InternalError);  // a GEMM's work
}

// Token-level dispatch (expert parallelism): the send order from moe_dest_ranks + moe_routing_map and each send
// row's choices on its rank (moe_local_choices), against a direct construction: for each rank ascending, the tokens
// with a kept choice among its experts, ascending; their other choices -1.
TEST_CASE("moe token-level send map: one row per token and rank holding its experts", "[moe][permute]") {
  const int64_t N = 6, k = 3, E = 8;
  // token 1: all on rank 0; token 3: choices dropped but one; token 5: nothing kept
  const int32_t iv[N * k] = {0, 5, 6, 1, 0, 2, 7, 3, 4, -1, 6, -1, 2, 4, 1, -1, -1, -1};
  Tensor idx = Tensor::empty({N, k}, DType::I32);
  std::copy_n(iv, N * k, idx.data<int32_t>());
  for (int64_t P : {1, 2, 4}) {
    INFO("P " << P);
    const int64_t El = E / P;
    Tensor dest = Tensor::empty({N, P}, DType::I32), send_slot = Tensor::empty({N * P}, DType::I32),
           row_of_send = Tensor::empty({N * P}, DType::I32), rank_rows = Tensor::empty({P}, DType::I32);
    ops::moe_dest_ranks(dest, idx, El);
    ops::moe_routing_map(send_slot, row_of_send, rank_rows, dest, P);
    std::vector<std::pair<int64_t, int64_t>> expect;  // (token, rank) in send order
    for (int64_t d = 0; d < P; ++d)
      for (int64_t n = 0; n < N; ++n)
        if (std::any_of(iv + n * k, iv + (n + 1) * k, [&](int32_t e) { return e >= 0 && e / El == d; }))
          expect.emplace_back(n, d);
    const auto S = static_cast<int64_t>(expect.size());
    int64_t total = 0;
    for (int64_t d = 0; d < P; ++d) total += rank_rows.data<int32_t>()[d];
    REQUIRE(total == S);
    for (int64_t r = 0; r < S; ++r) {
      const int32_t slot = send_slot.data<int32_t>()[r];
      CHECK(slot / P == expect[r].first);
      CHECK(slot % P == expect[r].second);
      CHECK(row_of_send.data<int32_t>()[slot] == r);
    }
    int64_t unsent = 0;
    for (int64_t i = 0; i < N * P; ++i) unsent += row_of_send.data<int32_t>()[i] < 0;
    CHECK(unsent == N * P - S);
    Tensor local = Tensor::empty({S, k}, DType::I32);
    ops::moe_local_choices(local, idx, send_slot, P, El);
    for (int64_t r = 0; r < S; ++r)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = iv[expect[r].first * k + j];
        CHECK(local.data<int32_t>()[r * k + j] == (e >= 0 && e / El == expect[r].second ? e % El : -1));
      }
  }
}

TEST_CASE("moe grouped linear equals one GEMM per expert, empty groups included", "[moe][experts]") {
  const int64_t IC = 5, OC = 4;
  const std::vector<int64_t> counts = {3, 0, 4, 0, 1};
  const int64_t El = 5, M = 8;
  Tensor x = randn({M, IC}, 7), w = randn({El, OC, IC}, 8);
  Tensor out = Tensor::empty({M, OC}, D);
  ops::moe_grouped_linear_forward(out, x, w, counts);
  int64_t r0 = 0;
  for (int64_t e = 0; e < El; ++e) {
    for (int64_t r = r0; r < r0 + counts[e]; ++r)
      for (int64_t o = 0; o < OC; ++o) {
        double s = 0;
        for (int64_t i = 0; i < IC; ++i) s += x.data<double>()[r * IC + i] * w.data<double>()[(e * OC + o) * IC + i];
        CHECK(out.data<double>()[r * OC + o] == Approx(s).epsilon(1e-13));
      }
    r0 += counts[e];
  }
  const Tensor dout = randn({M, OC}, 9);
  auto L = [&] {
    Tensor o = Tensor::empty({M, OC}, D);
    ops::moe_grouped_linear_forward(o, x, w, counts);
    return dot(o, dout);
  };
  Tensor dx = Tensor::empty({M, IC}, D);
  Tensor dw = Tensor::empty({El, OC, IC}, D);
  ops::fill_(dw, std::nan(""));  // Overwrite must write every group, the empty ones as 0
  ops::moe_grouped_linear_backward(&dx, &dw, dout, x, w, counts, ops::GradMode::Overwrite);
  check_grad("dx", dx, x, L);
  check_grad("dweight", dw, w, L);
  // Accumulate adds onto what is there; the sums of squares asked for are those of what the call left
  Tensor dw2 = dw.clone(), squares;
  ops::moe_grouped_linear_backward(nullptr, &dw2, dout, x, w, counts, ops::GradMode::Accumulate, &squares);
  ops::scale_(dw, 2.0);
  CHECK(rel_err(dw2, dw) < 1e-15);
  REQUIRE(squares.defined());
  Tensor total = Tensor::empty({1}, DType::F64);
  ops::sum_each(total, {squares});
  CHECK(total.data<double>()[0] == Approx(ops::sum_squares(dw)).epsilon(1e-14));
}

TEST_CASE("moe padded batched experts: the padded layout gives the exact groups' results", "[moe][experts]") {
  // an empty expert, one with most of the rows, dropped slots: padding rows must add nothing anywhere
  const int64_t N = 60, C = 6, F = 5, E = 6, k = 2;
  const Tensor idx = unbalanced_routing(N);
  const Tensor x = randn({N, C}, 31), w = randn({N, k}, 32), w1 = randn({E, 2 * F, C}, 33, D, 0.5),
               w2 = randn({E, C, F}, 34, D, 0.5), dy = randn({N, C}, 35);
  const ExpertsPass exact = run_experts_pass(nullptr, idx, x, w, w1, w2, dy);
  CHECK(exact.rows == N * k - 3);
  for (Layout layout : {Layout(one_region), Layout(two_regions)}) {
    const ExpertsPass padded = run_experts_pass(layout, idx, x, w, w1, w2, dy);
    CHECK(padded.rows > exact.rows);
    CHECK(rel_err(padded.y, exact.y) < 1e-14);
    CHECK(rel_err(padded.dx, exact.dx) < 1e-14);
    CHECK(rel_err(padded.dweights, exact.dweights) < 1e-14);
    CHECK(rel_err(padded.dw1, exact.dw1) < 1e-14);
    CHECK(rel_err(padded.dw2, exact.dw2) < 1e-14);
    for (int64_t i = 0; i < 2 * F * C; ++i) CHECK(padded.dw1.data<double>()[2 * 2 * F * C + i] == 0.0);  // expert 2
  }

  // the layout itself: padded row of each kept slot, the slot of each padded row, -1 for padding
  Tensor s2r = Tensor::empty({N * k}, DType::I32), r2s = Tensor::empty({N * k}, DType::I32),
         cnt = Tensor::empty({E}, DType::I32);
  ops::moe_routing_map(s2r, r2s, cnt, idx, E);
  const std::vector<int64_t> counts(cnt.data<int32_t>(), cnt.data<int32_t>() + E), regions = two_regions(counts);
  REQUIRE(counts[3] == N * 5 / 6);
  std::vector<int64_t> pstart(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) pstart[e + 1] = pstart[e] + regions[e];
  const int64_t P = pstart[E];
  Tensor pad = Tensor::empty({P}, DType::I32), r2p = r2s.clone();
  ops::moe_pad_routing_map(pad, r2p, s2r, counts, regions);
  int64_t kept = 0;
  for (int64_t s = 0; s < N * k; ++s) {
    const int32_t e = idx.data<int32_t>()[s], p = r2p.data<int32_t>()[s];
    if (e < 0) {
      CHECK(p == -1);
      continue;
    }
    ++kept;
    CHECK(p >= pstart[e]);
    CHECK(p < pstart[e] + counts[e]);
    CHECK(pad.data<int32_t>()[p] == s);
  }
  CHECK(std::count_if(pad.data<int32_t>(), pad.data<int32_t>() + P, [](int32_t v) { return v >= 0; }) == kept);
  // padding rows: permute writes 0, moe_zero_unrouted_rows zeroes them and leaves the others
  Tensor xp = Tensor::empty({P, C}, D);
  ops::moe_permute_forward(xp, x, pad, k);
  Tensor g = randn({P, C}, 36), g0 = g.clone();
  ops::moe_zero_unrouted_rows(g, pad);
  for (int64_t r = 0; r < P; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const bool padding = pad.data<int32_t>()[r] < 0;
      CHECK(xp.data<double>()[r * C + c] ==
            (padding ? 0.0 : x.data<double>()[(pad.data<int32_t>()[r] / k) * C + c]));
      CHECK(g.data<double>()[r * C + c] == (padding ? 0.0 : g0.data<double>()[r * C + c]));
    }
}

namespace {
// The padded layout's estimated time, recomputed here from its definition (tensor/moe_ops.h): every region size
// used by an expert with rows is one batched call of (experts of that size) x size rows.
double layout_seconds(const std::vector<int64_t>& counts, const std::vector<int64_t>& regions, int64_t IC,
                      int64_t OC) {
  std::map<int64_t, int64_t> runs;  // region size -> experts with rows
  for (size_t e = 0; e < counts.size(); ++e)
    if (counts[e] > 0) ++runs[regions[e]];
  double t = 0;
  for (const auto& [size, n] : runs)
    t += 2.0 * IC * OC * n * size * 1e-12 / ops::kBatchedTflops + ops::kBatchedCallUs * 1e-6;
  return t;
}
}  // namespace

TEST_CASE("moe padded batched experts: the regions, chosen on the GPU by the time estimate", "[moe][experts]") {
  const int64_t C = 1024, F2 = 1024;  // small experts: against the grouped call (kGroupedTflops)
  const std::vector<int64_t> balanced(64, 2048);
  CHECK(ops::moe_padded_regions(Device::CUDA, DType::F32, balanced, C, F2) == balanced);
  CHECK(ops::moe_padded_regions(Device::CPU, DType::F32, balanced, C, F2).empty());
  CHECK(ops::moe_padded_regions(Device::CUDA, DType::F32, std::vector<int64_t>(8, 0), C, F2).empty());
  // a balanced routing rounds up to kPadRows
  std::vector<int64_t> near(64, 2000);
  near[5] = 2001;
  CHECK(ops::moe_padded_regions(Device::CUDA, DType::F32, near, C, F2) == std::vector<int64_t>(64, 2048));
  // collapsed routing (64 experts top-8: one expert takes every token), the others uneven, one empty
  std::vector<int64_t> collapsed(64);
  for (int64_t e = 0; e < 64; ++e) collapsed[e] = 700 + (e * 977) % 2900;
  collapsed[9] = 16384;
  collapsed[20] = 0;
  const std::vector<int64_t> r = ops::moe_padded_regions(Device::CUDA, DType::F32, collapsed, C, F2);
  REQUIRE(r.size() == 64);
  std::set<int64_t> sizes;
  for (int64_t e = 0; e < 64; ++e) {
    CHECK(r[e] >= collapsed[e]);
    CHECK(r[e] % ops::kPadRows == 0);
    if (collapsed[e] > 0) sizes.insert(r[e]);
  }
  CHECK(r[9] == 16384);
  CHECK(r[20] == 0);
  CHECK(static_cast<int64_t>(sizes.size()) <= ops::kPadBuckets);
  // the best cut of the sorted experts into at most kPadBuckets runs: every other cut estimates no faster (all
  // cuts of a smaller case, by brute force)
  const std::vector<int64_t> few = {130, 3000, 0, 900, 2500, 140, 1000, 16384};
  const std::vector<int64_t> best = ops::moe_padded_regions(Device::CUDA, DType::F32, few, C, F2);
  REQUIRE(best.size() == few.size());
  const double t_best = layout_seconds(few, best, C, F2);
  std::vector<int64_t> order = {7, 1, 4, 6, 3, 5, 0};  // with rows, largest first
  const auto n = static_cast<int64_t>(order.size());
  for (int64_t mask = 0; mask < (1 << (n - 1)); ++mask) {  // bit i: a run starts at sorted position i + 1
    if (__builtin_popcountll(mask) + 1 > ops::kPadBuckets) continue;
    std::vector<int64_t> reg(few.size(), 0);
    int64_t head = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (i > 0 && (mask >> (i - 1) & 1)) head = i;
      reg[order[i]] = (few[order[head]] + ops::kPadRows - 1) / ops::kPadRows * ops::kPadRows;
    }
    CHECK(t_best <= layout_seconds(few, reg, C, F2) * (1 + 1e-12));
  }
  // the allocated rows: at most 1/32 more, in few sizes (a 30% range of row counts: about 10)
  std::set<int64_t> classes;
  for (int64_t P = 131072; P < 170000; P += 7) {
    const int64_t a = ops::moe_alloc_rows(P);
    CHECK(a >= P);
    CHECK(a * 32 <= P * 33);
    classes.insert(a);
  }
  CHECK(classes.size() <= 11);
  CHECK(ops::moe_alloc_rows(32768) == 32768);
  // and the exact groups when they are estimated faster: a nearly balanced many-expert routing with one expert far
  // above the rest is still padded (its own region), but tiny experts (per-call cost) are not
  CHECK(ops::moe_padded_regions(Device::CUDA, DType::F32, std::vector<int64_t>(64, 8), 64, 64).empty());
}

TEST_CASE("moe aux loss of rows split over ranks: the shares sum to the whole set's loss and gradient",
          "[moe][router]") {
  // Sequence parallelism: each TP rank routes a slice of a micro-batch's rows; with the whole set's tokens per
  // expert (AuxLossGroup) each slice's loss is its share, the shares sum to the unsplit loss, and each slice's
  // gradient equals the unsplit gradient's rows.
  const int64_t N = 12, E = 5, k = 2, parts = 3, rows = N / parts;
  for (bool sigmoid : {false, true}) {
    INFO("sigmoid " << sigmoid);
    ops::RouterSpec spec;
    spec.topk = k;
    spec.sigmoid = sigmoid;
    const double coeff = 0.2;
    Routed whole = route(randn({N, E}, 7), spec);
    Tensor l = Tensor::empty({1}, D);
    ops::moe_aux_loss_forward(l, whole.scores, whole.indices, 1, coeff, sigmoid);
    Tensor dwhole = Tensor::zeros({N, E}, D);
    ops::moe_aux_loss_backward(dwhole, whole.scores, whole.indices, 1, coeff, sigmoid, 0.5);
    ops::AuxLossGroup group;
    group.rows = N;
    group.counts.assign(E, 0);
    for (int64_t i = 0; i < N * k; ++i) ++group.counts[static_cast<size_t>(whole.indices.data<int32_t>()[i])];
    double sum = 0;
    for (int64_t p = 0; p < parts; ++p) {
      Tensor sc = whole.scores.slice(p * rows, rows).clone(), ix = whole.indices.slice(p * rows, rows).clone();
      Tensor lp = Tensor::empty({1}, D), dp = Tensor::zeros({rows, E}, D);
      ops::moe_aux_loss_forward(lp, sc, ix, 1, coeff, sigmoid, &group);
      ops::moe_aux_loss_backward(dp, sc, ix, 1, coeff, sigmoid, 0.5, &group);
      sum += lp.data<double>()[0];
      for (int64_t i = 0; i < rows * E; ++i)
        CHECK(dp.data<double>()[i] == Approx(dwhole.data<double>()[p * rows * E + i]).epsilon(1e-12).margin(1e-15));
    }
    CHECK(sum == Approx(l.data<double>()[0]).epsilon(1e-12));
  }
}
