// A single MoE layer on its own parameter store (fp64, CPU) for the MoE tests, and a direct computation of its
// output: every token through its k experts with plain loops, weighted and summed (+ the shared expert).
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "model/moe/moe_layer.h"

namespace mt::test {

struct MoEFixture {
  ModelConfig mc;
  DerivedConfig dc;
  ParallelState ps;
  ModelContext ctx;
  std::unique_ptr<ParamStore> store;
  std::unique_ptr<MoELayer> layer;
  MoEOptions opt;

  // ps_in: the layout (single rank unless given); init std large enough that routing is far from ties.
  explicit MoEFixture(const MoEOptions& o, int64_t C, const ParallelState* ps_in = nullptr, uint64_t seed = 7)
      : opt(o) {
    mc.arch = o.swiglu ? "llama" : "gpt2";
    mc.num_layers = 2;
    mc.hidden_size = static_cast<int>(C);
    mc.seq_length = static_cast<int>(o.seq_length);
    if (ps_in) ps = *ps_in;
    ctx.model = &mc;
    ctx.derived = &dc;
    ctx.ps = &ps;
    ctx.dtype = DType::F64;
    store = std::make_unique<ParamStore>(0, 1);
    layer = std::make_unique<MoELayer>("layers.0.mlp", o, ctx, *store);
    store->allocate(DType::F64, Device::CPU);
    store->initialize(seed, 0.5, 2);
  }
  const double* value(const std::string& name) const {
    Param* p = store->find(name);
    REQUIRE(p != nullptr);
    return p->value.data<double>();
  }
};

// out (rows) = W (rows x cols) v + b
inline std::vector<double> matvec(const double* W, const double* b, const double* v, int64_t rows, int64_t cols) {
  std::vector<double> o(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    double s = b ? b[r] : 0.0;
    for (int64_t c = 0; c < cols; ++c) s += W[r * cols + c] * v[c];
    o[static_cast<size_t>(r)] = s;
  }
  return o;
}
inline double silu(double g) { return g / (1.0 + std::exp(-g)); }
inline double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
// fc2(act(fc1 v)): swiglu: fc1 rows [gate; up]
inline std::vector<double> mlp(const double* w1, const double* b1, const double* w2, const double* b2,
                               const double* v, int64_t C, int64_t F, bool swiglu) {
  const std::vector<double> h = matvec(w1, b1, v, swiglu ? 2 * F : F, C);
  std::vector<double> a(static_cast<size_t>(F));
  for (int64_t f = 0; f < F; ++f) a[f] = swiglu ? silu(h[f]) * h[F + f] : gelu(h[f]);
  return matvec(w2, b2, a.data(), C, F);
}

// The layer's output computed directly. bias: the expert bias (E) or null.
inline Tensor direct_moe(const MoEFixture& fx, const Tensor& x, const double* bias) {
  const MoEOptions& o = fx.opt;
  const int64_t N = x.size(0), C = x.size(1), E = o.num_experts, k = o.topk, F = o.ffn_hidden_size;
  const std::string p = "layers.0.mlp";
  const double* wr = fx.value(p + ".router.weight");
  std::vector<int64_t> idx(static_cast<size_t>(N * k));
  std::vector<double> w(static_cast<size_t>(N * k));
  for (int64_t n = 0; n < N; ++n) {
    const std::vector<double> l = matvec(wr, nullptr, x.data<double>() + n * C, E, C);
    std::vector<double> s(static_cast<size_t>(E));
    double mx = *std::max_element(l.begin(), l.end()), sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(l[e] - mx);
    for (int64_t e = 0; e < E; ++e) s[e] = o.sigmoid ? 1.0 / (1.0 + std::exp(-l[e])) : std::exp(l[e] - mx) / sum;
    std::vector<int64_t> order(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return s[a] + (bias ? bias[a] : 0.0) > s[b] + (bias ? bias[b] : 0.0);
    });
    double chosen = 0;
    for (int64_t j = 0; j < k; ++j) chosen += s[order[j]];
    const bool norm = o.sigmoid ? k > 1 : !o.pre_softmax;
    for (int64_t j = 0; j < k; ++j) {
      idx[n * k + j] = order[j];
      w[n * k + j] = s[order[j]] / (norm ? chosen : 1.0) * o.topk_scaling;
    }
  }
  if (o.capacity_factor > 0) {  // per expert keep the highest-weight slots (ties: lower slot)
    const auto cap = static_cast<int64_t>(std::ceil(static_cast<double>(N * k) / E * o.capacity_factor));
    for (int64_t e = 0; e < E; ++e) {
      std::vector<int64_t> slots;
      for (int64_t s = 0; s < N * k; ++s)
        if (idx[s] == e) slots.push_back(s);
      std::stable_sort(slots.begin(), slots.end(), [&](int64_t a, int64_t b) { return w[a] > w[b]; });
      for (size_t i = static_cast<size_t>(cap); i < slots.size(); ++i) idx[slots[i]] = -1;
    }
  }
  Tensor y = Tensor::zeros({N, C}, DType::F64);
  for (int64_t n = 0; n < N; ++n) {
    const double* xn = x.data<double>() + n * C;
    double* yn = y.data<double>() + n * C;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = idx[n * k + j];
      if (e < 0) continue;
      const std::string pe = p + ".experts." + std::to_string(e);
      const std::vector<double> ye = mlp(fx.value(pe + ".linear_fc1.weight"), nullptr,
                                         fx.value(pe + ".linear_fc2.weight"), nullptr, xn, C, F, o.swiglu);
      for (int64_t c = 0; c < C; ++c) yn[c] += w[n * k + j] * ye[c];
    }
    if (o.shared_ffn_hidden_size > 0) {
      const std::string ps = p + ".shared_experts";
      const bool b = !o.swiglu;
      const std::vector<double> ys =
          mlp(fx.value(ps + ".linear_fc1.weight"), b ? fx.value(ps + ".linear_fc1.bias") : nullptr,
              fx.value(ps + ".linear_fc2.weight"), b ? fx.value(ps + ".linear_fc2.bias") : nullptr, xn, C,
              o.shared_ffn_hidden_size, o.swiglu);
      for (int64_t c = 0; c < C; ++c) yn[c] += ys[c];
    }
  }
  return y;
}

}  // namespace mt::test
