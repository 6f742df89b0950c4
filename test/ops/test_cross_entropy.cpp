// cross_entropy_stats / cross_entropy_backward: naive log-softmax, padded columns, two vocab slices
// combined as the TP layer does, finite differences, aliasing.
#include "gradcheck.h"

using namespace mt;
using namespace mt::test;

namespace {
const int64_t N = 6, V = 11;

struct Stats {
  Tensor max, sumexp, target;
};
Stats stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t n_valid) {
  const int64_t n = logits.size(0);
  const DType st = logits.dtype();
  Stats s{Tensor::empty({n}, st), Tensor::empty({n}, st), Tensor::empty({n}, st)};
  ops::cross_entropy_stats(s.max, s.sumexp, s.target, logits, targets, vocab_start, n_valid);
  return s;
}
// Columns [c0, c0 + n) of logits copied into an (N, width) tensor whose extra columns hold `pad`.
Tensor columns(const Tensor& logits, int64_t c0, int64_t n, int64_t width, double pad) {
  Tensor o = Tensor::empty({N, width}, DType::F64);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < width; ++c)
      o.data<double>()[r * width + c] = c < n ? logits.data<double>()[r * V + c0 + c] : pad;
  return o;
}
double naive_lse(const Tensor& logits, int64_t r) {
  double m = -1e300, s = 0;
  for (int64_t c = 0; c < V; ++c) m = std::max(m, logits.data<double>()[r * V + c]);
  for (int64_t c = 0; c < V; ++c) s += std::exp(logits.data<double>()[r * V + c] - m);
  return m + std::log(s);
}
}  // namespace

TEST_CASE("cross-entropy stats of the full vocab give the naive log-softmax loss", "[ops][cross_entropy]") {
  Tensor logits = randn({N, V}, 1, DType::F64, 4.0), targets = randint({N}, 2, 0, V - 1);
  logits.data<double>()[3] = 1000.0;  // stable: no exp overflow
  logits.data<double>()[V + 4] = -1000.0;
  Stats s = stats(logits, targets, 0, V);
  for (int64_t r = 0; r < N; ++r) {
    const int32_t t = targets.data<int32_t>()[r];
    const double lse = s.max.data<double>()[r] + std::log(s.sumexp.data<double>()[r]);
    CHECK(lse == Approx(naive_lse(logits, r)).epsilon(1e-14));
    CHECK(s.target.data<double>()[r] == logits.data<double>()[r * V + t]);
  }
}

TEST_CASE("cross-entropy over two padded vocab slices combines to the full-vocab loss and gradient",
          "[ops][cross_entropy]") {
  Tensor logits = randn({N, V}, 11, DType::F64, 4.0), targets = randint({N}, 12, 0, V - 1);
  targets.data<int32_t>()[0] = 0;      // first column of slice 1
  targets.data<int32_t>()[1] = V - 1;  // last valid column of slice 2
  // Slice 1: global columns [0, 6), no padding. Slice 2: [6, 11) stored in 8 columns, 3 of them
  // padding holding huge values that would dominate the softmax if they were used.
  const int64_t n1 = 6, n2 = V - n1, w2 = 8;
  Tensor a = columns(logits, 0, n1, n1, 0.0), b = columns(logits, n1, n2, w2, 1e4);
  Stats s1 = stats(a, targets, 0, n1), s2 = stats(b, targets, n1, n2);
  Tensor lse = Tensor::empty({N}, DType::F64), dloss = randn({N}, 13);
  for (int64_t r = 0; r < N; ++r) {
    const double m1 = s1.max.data<double>()[r], m2 = s2.max.data<double>()[r];
    const double M = std::max(m1, m2);
    const double S = s1.sumexp.data<double>()[r] * std::exp(m1 - M) + s2.sumexp.data<double>()[r] * std::exp(m2 - M);
    lse.data<double>()[r] = M + std::log(S);
    const double loss = lse.data<double>()[r] - (s1.target.data<double>()[r] + s2.target.data<double>()[r]);
    const int32_t t = targets.data<int32_t>()[r];
    CHECK(loss == Approx(naive_lse(logits, r) - logits.data<double>()[r * V + t]).epsilon(1e-13));
    // Exactly one slice owns the target.
    CHECK(((t < n1 ? s2.target : s1.target).data<double>()[r]) == 0.0);
  }
  Tensor da = Tensor::empty({N, n1}, DType::F64), db = Tensor::empty({N, w2}, DType::F64);
  ops::cross_entropy_backward(da, a, targets, lse, dloss, 0, n1);
  ops::cross_entropy_backward(db, b, targets, lse, dloss, n1, n2);
  for (int64_t r = 0; r < N; ++r) {
    const double l = naive_lse(logits, r), g = dloss.data<double>()[r];
    const int32_t t = targets.data<int32_t>()[r];
    for (int64_t c = 0; c < V; ++c) {
      const double want = (std::exp(logits.data<double>()[r * V + c] - l) - (c == t ? 1.0 : 0.0)) * g;
      const double got = c < n1 ? da.data<double>()[r * n1 + c] : db.data<double>()[r * w2 + c - n1];
      CHECK(got == Approx(want).margin(1e-15).epsilon(1e-12));
    }
    for (int64_t c = n2; c < w2; ++c) CHECK(db.data<double>()[r * w2 + c] == 0.0);
  }
}

TEST_CASE("cross-entropy backward matches finite differences of the weighted loss", "[ops][cross_entropy]") {
  const int64_t Vl = 9, n_valid = 7, start = 3;
  Tensor logits = randn({N, Vl}, 21, DType::F64, 2.0), targets = randint({N}, 22, 0, 12), dloss = randn({N}, 23);
  auto lse_of = [&] {
    Stats s = stats(logits, targets, start, n_valid);
    Tensor lse = Tensor::empty({N}, DType::F64);
    for (int64_t r = 0; r < N; ++r)
      lse.data<double>()[r] = s.max.data<double>()[r] + std::log(s.sumexp.data<double>()[r]);
    return std::make_pair(lse, s.target);
  };
  // L = sum_n dloss_n (lse_n - target_logit_n), this slice standing for the whole vocab.
  auto L = [&] {
    auto [lse, tl] = lse_of();
    double sum = 0;
    for (int64_t r = 0; r < N; ++r)
      sum += dloss.data<double>()[r] * (lse.data<double>()[r] - tl.data<double>()[r]);
    return sum;
  };
  Tensor lse = lse_of().first, d = Tensor::empty({N, Vl}, DType::F64);
  ops::cross_entropy_backward(d, logits, targets, lse, dloss, start, n_valid);
  check_grad("dlogits", d, logits, L);

  // dlogits may alias logits; fp32 dloss is accepted with fp64 logits.
  Tensor inplace = logits.clone();
  ops::cross_entropy_backward(inplace, inplace, targets, lse, dloss, start, n_valid);
  CHECK(bitwise_equal(inplace, d));
  Tensor d32 = Tensor::empty({N, Vl}, DType::F64);
  ops::cross_entropy_backward(d32, logits, targets, lse, to(dloss, DType::F32), start, n_valid);
  CHECK(rel_err(d32, d) < 1e-6);
}

TEST_CASE("cross-entropy in fp32 keeps fp32 statistics and agrees with fp64", "[ops][cross_entropy]") {
  Tensor logits = randn({N, V}, 31, DType::F64, 4.0), targets = randint({N}, 32, 0, V - 1);
  Stats s = stats(logits, targets, 0, V);
  Stats sf = stats(to(logits, DType::F32), targets, 0, V);
  CHECK(sf.max.dtype() == DType::F32);
  CHECK(rel_err(sf.max, s.max) < 1e-6);
  CHECK(rel_err(sf.sumexp, s.sumexp) < 1e-6);
  CHECK(rel_err(sf.target, s.target) < 1e-6);
  Tensor lse64 = Tensor::empty({N}, DType::F64);
  CHECK_THROWS_AS(stats(to(logits, DType::F32), targets, 0, V + 1), InternalError);
  Tensor d = Tensor::empty({N, V}, DType::F32);
  CHECK_THROWS_AS(ops::cross_entropy_backward(d, to(logits, DType::F32), targets, lse64, lse64, 0, V), InternalError);
}

TEST_CASE("cross-entropy combine ops: rescale and finish over three slices give the full-vocab loss",
          "[ops][cross_entropy]") {
  Tensor logits = randn({N, V}, 41, DType::F64, 4.0), targets = randint({N}, 42, 0, V - 1);
  // Slices [0, 4), [4, 11) and an empty third one (a rank whose columns are all padding: max -inf, sumexp 0).
  Tensor a = columns(logits, 0, 4, 4, 0.0), b = columns(logits, 4, V - 4, V - 4, 0.0), c = columns(logits, 0, 0, 3, 7.0);
  std::vector<Stats> s = {stats(a, targets, 0, 4), stats(b, targets, 4, V - 4), stats(c, targets, V, 0)};
  CHECK(std::isinf(s[2].max.data<double>()[0]));
  Tensor gmax = s[0].max.clone(), S = Tensor::zeros({N}, DType::F64), T = Tensor::zeros({N}, DType::F64);
  for (auto& st : s)  // the all-reduce(max) over the slices
    for (int64_t r = 0; r < N; ++r) gmax.data<double>()[r] = std::max(gmax.data<double>()[r], st.max.data<double>()[r]);
  for (auto& st : s) {
    ops::cross_entropy_rescale(st.sumexp, st.max, gmax);
    ops::add_(S, st.sumexp);  // the all-reduce(sum)
    ops::add_(T, st.target);
  }
  Tensor lse = Tensor::empty({N}, DType::F64), loss = Tensor::empty({N}, DType::F64);
  ops::cross_entropy_finish(lse, loss, gmax, S, T);
  double want_sum = 0;
  for (int64_t r = 0; r < N; ++r) {
    const double want = naive_lse(logits, r) - logits.data<double>()[r * V + targets.data<int32_t>()[r]];
    CHECK(lse.data<double>()[r] == Approx(naive_lse(logits, r)).epsilon(1e-14));
    CHECK(loss.data<double>()[r] == Approx(want).epsilon(1e-13));
    want_sum += loss.data<double>()[r];
  }
  // sum_accumulate adds in index order.
  Tensor acc = Tensor::zeros({1}, DType::F64);
  acc.data<double>()[0] = 0.5;
  ops::sum_accumulate(acc, loss);
  CHECK(acc.data<double>()[0] == 0.5 + want_sum);
  // One slice: finish may write lse over its own max (gmax aliasing lse), as the model does.
  Stats whole = stats(logits, targets, 0, V);
  Tensor loss1 = Tensor::empty({N}, DType::F64);
  ops::cross_entropy_finish(whole.max, loss1, whole.max, whole.sumexp, whole.target);
  CHECK(rel_err(loss1, loss) < 1e-14);
}
