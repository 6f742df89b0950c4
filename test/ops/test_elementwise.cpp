// fill / add / scale / cast / sum_squares, and the dispatch errors.
#include <omp.h>

#include <cfloat>
#include <iterator>

#include "gradcheck.h"
#include "tensor/scalar_read.h"

using namespace mt;
using namespace mt::test;

TEST_CASE("fill, add, add_ and scale", "[ops][elementwise]") {
  for (DType dt : {DType::F32, DType::F64}) {
    Tensor a = randn({5, 7}, 1, dt), b = randn({35}, 2, dt), out = Tensor::empty({5, 7}, dt);
    ops::add(out, a, b);
    const Tensor a64 = f64(a), b64 = f64(b);
    for (int64_t i = 0; i < 35; ++i)
      CHECK(f64(out).data<double>()[i] == Approx(a64.data<double>()[i] + b64.data<double>()[i]).epsilon(1e-6));
    Tensor c = a.clone();
    ops::add_(c, b);
    CHECK(bitwise_equal(c, out));
    ops::add(a, a, b);  // out aliases a
    CHECK(bitwise_equal(a, out));
    ops::scale_(c, -2.0);
    CHECK(max_abs_diff(c, out) > 0);
    ops::add_(c, out);
    ops::add_(c, out);
    CHECK(max_abs_diff(c, Tensor::zeros({35}, DType::F64)) == 0.0);
    ops::fill_(c, 1.5);
    for (int64_t i = 0; i < 35; ++i) CHECK(f64(c).data<double>()[i] == 1.5);
  }
}

TEST_CASE("cast round trips fp32 / fp64 / bf16 and int32 / int64", "[ops][elementwise]") {
  Tensor x = randn({100}, 1);
  Tensor f = to(x, DType::F32), back = to(f, DType::F64);
  CHECK(rel_err(back, x) < 1e-7);
  CHECK(bitwise_equal(to(back, DType::F32), f));  // fp32 -> fp64 -> fp32 is exact
  Tensor b = to(f, DType::BF16);
  CHECK(rel_err(to(b, DType::F64), x) < 1e-2);
  CHECK(bitwise_equal(to(to(b, DType::F32), DType::BF16), b));  // bf16 -> fp32 -> bf16 is exact
  CHECK(bitwise_equal(to(to(b, DType::F64), DType::BF16), b));

  // bf16 rounds to nearest even, once: 1 + 2^-8 is a tie (-> 1), 1 + 3 * 2^-8 a tie (-> 1 + 2^-6),
  // and 1 + 2^-8 + 2^-40 is just above the tie (-> 1 + 2^-7; rounding through fp32 would give 1).
  Tensor d = Tensor::empty({4}, DType::F64);
  const double in[4] = {1 + std::ldexp(1, -8), 1 + 3 * std::ldexp(1, -8), 1 + std::ldexp(1, -8) + std::ldexp(1, -40),
                        1e300};
  std::copy(in, in + 4, d.data<double>());
  Tensor r = to(to(d, DType::BF16), DType::F64);
  CHECK(r.data<double>()[0] == 1.0);
  CHECK(r.data<double>()[1] == 1 + std::ldexp(1, -6));
  CHECK(r.data<double>()[2] == 1 + std::ldexp(1, -7));
  CHECK(std::isinf(r.data<double>()[3]));

  Tensor i32 = randint({50}, 3, -1000000, 1000000);
  Tensor i64 = to(i32, DType::I64);
  for (int64_t i = 0; i < 50; ++i) CHECK(i64.data<int64_t>()[i] == i32.data<int32_t>()[i]);
  CHECK(bitwise_equal(to(i64, DType::I32), i32));
  CHECK_THROWS_WITH(to(i32, DType::F32), "op cast is not supported on device cpu for int32 -> fp32");
}

TEST_CASE("fp16 casts round to nearest even, once, with IEEE overflow and subnormals", "[ops][elementwise]") {
  // Every finite fp16 value survives fp16 -> fp32 -> fp16 and fp16 -> fp64 -> fp16; NaNs stay NaN.
  Tensor all = Tensor::empty({65536}, DType::F16);
  for (int i = 0; i < 65536; ++i) all.data<f16>()[i].bits = static_cast<uint16_t>(i);
  const Tensor via32 = to(to(all, DType::F32), DType::F16), via64 = to(to(all, DType::F64), DType::F16);
  int64_t wrong = 0;
  for (int i = 0; i < 65536; ++i) {
    const bool nan = (i & 0x7c00) == 0x7c00 && (i & 0x3ff) != 0;
    const uint16_t a = via32.data<f16>()[i].bits, b = via64.data<f16>()[i].bits;
    wrong += nan ? !std::isnan(static_cast<float>(via32.data<f16>()[i])) : (a != i || b != i);
  }
  CHECK(wrong == 0);

  // 1 + 2^-11 is a tie (-> 1), 1 + 3 * 2^-11 a tie (-> 1 + 2^-9), 1 + 2^-11 + 2^-40 just above the tie
  // (-> 1 + 2^-10; through a rounded fp32 it would be 1); 65519.99 -> 65504, 65520 (a tie with 2^16)
  // -> inf; 2^-25 (a tie with 0) -> 0, 3 * 2^-25 -> 2^-23 (subnormals round to nearest even too).
  const double in[] = {1 + std::ldexp(1, -11), 1 + 3 * std::ldexp(1, -11), 1 + std::ldexp(1, -11) + std::ldexp(1, -40),
                       65519.99, 65520, -1e300, std::ldexp(1, -25), 3 * std::ldexp(1, -25), std::ldexp(1, -24)};
  const double want[] = {1, 1 + std::ldexp(1, -9), 1 + std::ldexp(1, -10), 65504, INFINITY, -INFINITY, 0,
                         std::ldexp(1, -23), std::ldexp(1, -24)};
  const int64_t n = static_cast<int64_t>(std::size(in));
  Tensor d = Tensor::empty({n}, DType::F64);
  std::copy(in, in + n, d.data<double>());
  const Tensor r64 = to(to(d, DType::F16), DType::F64), r32 = to(to(to(d, DType::F32), DType::F16), DType::F64);
  for (int64_t i = 0; i < n; ++i) {
    INFO("input " << in[i]);
    CHECK(r64.data<double>()[i] == want[i]);
    if (i != 2) CHECK(r32.data<double>()[i] == want[i]);  // from fp32 too (i = 2 is not an fp32 value)
  }
}

TEST_CASE("sum_squares is exact enough and bit-identical for any thread count", "[ops][elementwise]") {
  const int64_t n = 1000003;
  Tensor x = randn({n}, 5, DType::F32);
  long double ref = 0;
  for (int64_t i = 0; i < n; ++i) ref += static_cast<long double>(x.data<float>()[i]) * x.data<float>()[i];
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const double s1 = ops::sum_squares(x);
  omp_set_num_threads(2);
  const double s2 = ops::sum_squares(x);
  omp_set_num_threads(3);
  const double s3 = ops::sum_squares(x);
  omp_set_num_threads(saved);
  CHECK(std::memcmp(&s1, &s2, sizeof(double)) == 0);
  CHECK(std::memcmp(&s1, &s3, sizeof(double)) == 0);
  CHECK(s1 == Approx(static_cast<double>(ref)).epsilon(1e-12));
  CHECK(ops::sum_squares(randn({0}, 6)) == 0.0);
}

TEST_CASE("sum_squares_into and read_scalars: the step's values without a wait per value", "[ops][elementwise]") {
  const Tensor x = randn({4097}, 7, DType::F32);
  Tensor sums = Tensor::empty({2}, DType::F64);
  Tensor s0 = sums.slice(0, 1), s1 = sums.slice(1, 1);
  ops::sum_squares_into(s0, x);
  ops::sum_squares_into(s1, x.slice(0, 0));  // empty: 0
  const double direct = ops::sum_squares(x);
  // F32 and F64 scalars, interleaved: the values come back in order, each exactly.
  Tensor f = Tensor::empty({2}, DType::F32);
  f.data<float>()[0] = 1.5f;
  f.data<float>()[1] = -2.25f;
  const std::vector<double> v = read_scalars({f.slice(1, 1), s0, f.slice(0, 1), s1});
  REQUIRE(v.size() == 4);
  CHECK(v[0] == -2.25);
  CHECK(std::memcmp(&v[1], &direct, sizeof(double)) == 0);
  CHECK(v[2] == 1.5);
  CHECK(v[3] == 0.0);
  CHECK(read_scalars({}).empty());
  Tensor out = Tensor::empty({1}, DType::F64);
  CHECK_THROWS_AS(ops::gather_scalars(out, {Tensor::zeros({2}, DType::F64)}), InternalError);  // not one element
  CHECK_THROWS_AS(ops::gather_scalars(out, {Tensor::zeros({1}, DType::F32)}), InternalError);  // another dtype
  Tensor wrong = Tensor::empty({1}, DType::F32);
  CHECK_THROWS_AS(ops::sum_squares_into(wrong, x), InternalError);                           // not F64
}

TEST_CASE("unsupported devices and dtypes name the op", "[ops][elementwise]") {
  Tensor meta = Tensor::empty({4}, DType::F32, Device::Meta), meta_out = Tensor::empty({4}, DType::F32, Device::Meta);
  CHECK_THROWS_WITH(ops::gelu_forward(meta_out, meta), "op gelu_forward is not supported on device meta for fp32");
  Tensor h = Tensor::zeros({4}, DType::BF16);
  CHECK_THROWS_WITH(ops::scale_(h, 2.0), "op scale_ is not supported on device cpu for bf16");
  CHECK_THROWS_AS(ops::sum_squares(Tensor::zeros({4}, DType::I32)), Error);
  Tensor a = Tensor::zeros({4}, DType::F32), b = Tensor::zeros({5}, DType::F32);
  CHECK_THROWS_AS(ops::add_(a, b), InternalError);
}
