// embedding_forward / embedding_backward: row lookup, vocab slices, finite differences, accumulation.
#include "gradcheck.h"

using namespace mt;
using namespace mt::test;

namespace {
const int64_t V = 10, C = 4, N = 12;

Tensor lookup(const Tensor& tokens, const Tensor& table, int64_t start) {
  Tensor out = Tensor::empty({tokens.numel(), table.size(1)}, table.dtype());
  ops::embedding_forward(out, tokens, table, start);
  return out;
}
}  // namespace

TEST_CASE("embedding forward copies rows; vocab slices sum to the full lookup", "[ops][embedding]") {
  Tensor table = randn({V, C}, 1), tokens = randint({N}, 2, 0, V - 1);
  Tensor out = lookup(tokens, table, 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      CHECK(out.data<double>()[n * C + c] == table.data<double>()[tokens.data<int32_t>()[n] * C + c]);

  const int64_t split = 6;
  Tensor a = lookup(tokens, table.slice(0, split), 0), b = lookup(tokens, table.slice(split, V - split), split);
  for (int64_t n = 0; n < N; ++n) {
    const bool in_a = tokens.data<int32_t>()[n] < split;
    for (int64_t c = 0; c < C; ++c) CHECK((in_a ? b : a).data<double>()[n * C + c] == 0.0);
  }
  Tensor both = Tensor::empty({N, C}, DType::F64);
  ops::add(both, a, b);
  CHECK(bitwise_equal(both, out));
}

TEST_CASE("embedding backward matches finite differences and accumulates", "[ops][embedding]") {
  Tensor table = randn({V, C}, 11), tokens = randint({N}, 12, 0, V - 1), wts = randn({N, C}, 13);
  tokens.data<int32_t>()[1] = tokens.data<int32_t>()[0];  // a repeated token
  auto L = [&] { return dot(wts, lookup(tokens, table, 0)); };
  Tensor dtable = Tensor::zeros({V, C}, DType::F64);
  ops::embedding_backward(dtable, wts, tokens, 0);
  check_grad("dtable", dtable, table, L);

  // A slice's gradient is the slice of the full gradient, added onto what was there.
  const int64_t start = 3, Vl = 5;
  Tensor prefill = randn({Vl, C}, 14), dslice = prefill.clone();
  ops::embedding_backward(dslice, wts, tokens, start);
  Tensor want = Tensor::empty({Vl, C}, DType::F64);
  ops::add(want, prefill, dtable.slice(start, Vl));
  CHECK(max_abs_diff(dslice, want) < 1e-14);
}

TEST_CASE("embedding checks dtypes and shapes", "[ops][embedding]") {
  Tensor table = randn({V, C}, 21), tok64 = Tensor::zeros({N}, DType::I64);
  Tensor out = Tensor::empty({N, C}, DType::F64);
  CHECK_THROWS_AS(ops::embedding_forward(out, tok64, table, 0), InternalError);
  Tensor tokens = randint({N}, 22, 0, V - 1), wrong = Tensor::empty({N, C + 1}, DType::F64);
  CHECK_THROWS_AS(ops::embedding_forward(wrong, tokens, table, 0), InternalError);
  Tensor outf = lookup(tokens, to(table, DType::F32), 0);
  CHECK(max_abs_diff(outf, lookup(tokens, table, 0)) < 1e-6);
}
