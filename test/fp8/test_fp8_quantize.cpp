// The CPU reference of the FP8 ops (tensor/fp8/fp8_ops.h) and the recipe bookkeeping (tensor/fp8/fp8_recipe.h):
// codes are the casts of x * scale with the scale the recipe's rule gives, tiles and blocks take their own amax,
// transposed copies hold the same codes, dequantization is within half an FP8 step of x, and the FP8 GEMM equals
// the fp64 GEMM of the dequantized operands computed here.
#include <cmath>
#include <random>
#include <vector>

#include "catch.h"
#include "tensor/fp8/fp8_ops.h"
#include "tensor/fp8/fp8_recipe.h"

using namespace mt;
using namespace mt::ops;

namespace {

Tensor random_tensor(int64_t R, int64_t C, uint32_t seed, float spread = 4.0f) {
  Tensor t = Tensor::empty({R, C}, DType::F32);
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<float> e(-spread, spread);
  for (int64_t i = 0; i < R * C; ++i) t.data<float>()[i] = n(rng) * std::exp2(e(rng));
  return t;
}

float max_abs(const Tensor& t, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  float m = 0;
  const int64_t C = t.size(1);
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) m = std::max(m, std::fabs(t.data<float>()[r * C + c]));
  return m;
}

// Half an FP8 step relative (2^-(M+1)), or half the smallest subnormal times scale_inv.
void check_close(float deq, float x, float scale_inv, fp8::Fp8Dtype t) {
  const int M = t == fp8::Fp8Dtype::E4M3 ? 3 : 2;
  const float sub = t == fp8::Fp8Dtype::E4M3 ? std::ldexp(1.0f, -10) : std::ldexp(1.0f, -17);
  CHECK(std::fabs(deq - x) <= std::fabs(x) * std::ldexp(1.0f, -(M + 1)) * 1.0001f + sub * scale_inv);
}

}  // namespace

TEST_CASE("per-tensor quantization: codes of x * scale, transposed copy, amax fused", "[fp8][quantize]") {
  for (fp8::Fp8Dtype t : {fp8::Fp8Dtype::E4M3, fp8::Fp8Dtype::E5M2}) {
    const Tensor x = random_tensor(37, 53, 3);
    Tensor amax = Tensor::empty({1}, DType::F32);
    fp8_amax(amax, x);
    CHECK(amax.data<float>()[0] == max_abs(x, 0, 37, 0, 53));
    Fp8Tensor q = Fp8Tensor::empty(37, 53, t, Fp8Scaling::Tensor, Device::CPU);
    Fp8Tensor qt = Fp8Tensor::empty(53, 37, t, Fp8Scaling::Tensor, Device::CPU);
    fp8_quantize_tensor(&q, &qt, x, &amax, nullptr, nullptr, 0);
    const float s = fp8::scale_from_amax(amax.data<float>()[0], fp8::fp8_max(t), 0, false);
    CHECK(q.scale_inv.data<float>()[0] == 1.0f / s);
    CHECK(qt.scale_inv.data<float>()[0] == 1.0f / s);
    Tensor deq = Tensor::empty({37, 53}, DType::F32);
    fp8_dequantize(deq, q);
    for (int64_t r = 0; r < 37; ++r)
      for (int64_t c = 0; c < 53; ++c) {
        const float v = x.data<float>()[r * 53 + c];
        const uint8_t code = q.data.data<uint8_t>()[r * 53 + c];
        REQUIRE(code == fp8::float_to_fp8(v * s, t));
        REQUIRE(qt.data.data<uint8_t>()[c * 37 + r] == code);
        check_close(deq.data<float>()[r * 53 + c], v, 1.0f / s, t);
      }
    // delayed: a given scale, the amax accumulated (max with what was there) in the same call
    Tensor scale = Tensor::empty({1}, DType::F32), acc = Tensor::empty({1}, DType::F32);
    scale.data<float>()[0] = 2.0f;
    acc.data<float>()[0] = 1e6f;
    fp8_quantize_tensor(&q, nullptr, x, nullptr, &scale, &acc, 0);
    CHECK(acc.data<float>()[0] == 1e6f);
    acc.data<float>()[0] = 0.0f;
    fp8_quantize_tensor(&q, nullptr, x, nullptr, &scale, &acc, 0);
    CHECK(acc.data<float>()[0] == max_abs(x, 0, 37, 0, 53));
    CHECK(q.scale_inv.data<float>()[0] == 0.5f);
    CHECK(q.data.data<uint8_t>()[5] == fp8::float_to_fp8(x.data<float>()[5] * 2.0f, t));
  }
}

TEST_CASE("1x128 tiles and 128x128 blocks: each its own power-of-2 scale, transposed copies agree", "[fp8][quantize]") {
  const int64_t R = 200, C = 300;  // partial tiles and blocks at both ends
  const Tensor x = random_tensor(R, C, 11, 6.0f);
  const fp8::Fp8Dtype t = fp8::Fp8Dtype::E4M3;
  Fp8Tensor rows = Fp8Tensor::empty(R, C, t, Fp8Scaling::Tile1x128, Device::CPU);
  Fp8Tensor cols = Fp8Tensor::empty(C, R, t, Fp8Scaling::Tile1x128, Device::CPU);
  fp8_quantize_tiles(rows, x, false);
  fp8_quantize_tiles(cols, x, true);
  REQUIRE(rows.scale_inv.shape() == Shape{R, 3});
  REQUIRE(cols.scale_inv.shape() == Shape{C, 2});
  for (int64_t r = 0; r < R; ++r)
    for (int64_t b = 0; b < 3; ++b) {
      const float s = fp8::scale_from_amax(max_abs(x, r, r + 1, b * 128, std::min(C, b * 128 + 128)), 448.0f, 0, true);
      REQUIRE(rows.scale_inv.data<float>()[r * 3 + b] == 1.0f / s);
      REQUIRE(std::log2(s) == std::floor(std::log2(s)));
      for (int64_t c = b * 128; c < std::min(C, b * 128 + 128); ++c)
        REQUIRE(rows.data.data<uint8_t>()[r * C + c] == fp8::float_to_e4m3(x.data<float>()[r * C + c] * s));
    }
  for (int64_t c = 0; c < C; ++c)
    for (int64_t b = 0; b < 2; ++b) {
      const float s = fp8::scale_from_amax(max_abs(x, b * 128, std::min(R, b * 128 + 128), c, c + 1), 448.0f, 0, true);
      REQUIRE(cols.scale_inv.data<float>()[c * 2 + b] == 1.0f / s);
      for (int64_t r = b * 128; r < std::min(R, b * 128 + 128); ++r)
        REQUIRE(cols.data.data<uint8_t>()[c * R + r] == fp8::float_to_e4m3(x.data<float>()[r * C + c] * s));
    }
  Fp8Tensor blk = Fp8Tensor::empty(R, C, t, Fp8Scaling::Block128x128, Device::CPU);
  Fp8Tensor blk_t = Fp8Tensor::empty(C, R, t, Fp8Scaling::Block128x128, Device::CPU);
  fp8_quantize_blocks(&blk, &blk_t, x);
  REQUIRE(blk.scale_inv.shape() == Shape{2, 3});
  for (int64_t bi = 0; bi < 2; ++bi)
    for (int64_t bj = 0; bj < 3; ++bj) {
      const float s = fp8::scale_from_amax(
          max_abs(x, bi * 128, std::min(R, bi * 128 + 128), bj * 128, std::min(C, bj * 128 + 128)), 448.0f, 0, true);
      CHECK(blk.scale_inv.data<float>()[bi * 3 + bj] == 1.0f / s);
      CHECK(blk_t.scale_inv.data<float>()[bj * 2 + bi] == 1.0f / s);
    }
  Tensor d1 = Tensor::empty({R, C}, DType::F32), d2 = Tensor::empty({C, R}, DType::F32);
  fp8_dequantize(d1, blk);
  fp8_dequantize(d2, blk_t);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      REQUIRE(d1.data<float>()[r * C + c] == d2.data<float>()[c * R + r]);
      check_close(d1.data<float>()[r * C + c], x.data<float>()[r * C + c],
                  blk.scale_inv.data<float>()[(r / 128) * 3 + c / 128], t);
    }
}

TEST_CASE("the FP8 GEMM is the fp64 GEMM of the dequantized operands", "[fp8][gemm]") {
  const int64_t M = 19, N = 23, K = 150;
  const Tensor a = random_tensor(M, K, 5), b = random_tensor(N, K, 6);
  Fp8Tensor qa = Fp8Tensor::empty(M, K, fp8::Fp8Dtype::E5M2, Fp8Scaling::Tile1x128, Device::CPU);
  Fp8Tensor qb = Fp8Tensor::empty(N, K, fp8::Fp8Dtype::E4M3, Fp8Scaling::Block128x128, Device::CPU);
  fp8_quantize_tiles(qa, a, false);
  fp8_quantize_blocks(&qb, nullptr, b);
  Tensor bias = random_tensor(1, N, 9).view({N});
  Tensor out = Tensor::empty({M, N}, DType::F64), out_acc = Tensor::empty({M, N}, DType::F64);
  Tensor da = Tensor::empty({M, K}, DType::F64), db = Tensor::empty({N, K}, DType::F64);
  fp8_dequantize(da, qa);
  fp8_dequantize(db, qb);
  Tensor bias64 = Tensor::empty({N}, DType::F64);
  for (int64_t n = 0; n < N; ++n) bias64.data<double>()[n] = bias.data<float>()[n];
  fp8_gemm(out, qa, qb, &bias64, false);
  for (int64_t i = 0; i < M * N; ++i) out_acc.data<double>()[i] = 1.0;
  fp8_gemm(out_acc, qa, qb, nullptr, true);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0;
      for (int64_t k = 0; k < K; ++k) ref += da.data<double>()[m * K + k] * db.data<double>()[n * K + k];
      CHECK(out.data<double>()[m * N + n] == Approx(ref + bias64.data<double>()[n]).epsilon(1e-12).margin(1e-12));
      CHECK(out_acc.data<double>()[m * N + n] == Approx(ref + 1.0).epsilon(1e-12).margin(1e-12));
    }
}

TEST_CASE("recipe bookkeeping: formats per role, amax history, scales, layers kept in bf16", "[fp8][recipe]") {
  Fp8Options o;
  o.recipe = Fp8Recipe::Delayed;
  o.format = Fp8Format::Hybrid;
  CHECK(o.dtype(Fp8Role::Input) == fp8::Fp8Dtype::E4M3);
  CHECK(o.dtype(Fp8Role::Weight) == fp8::Fp8Dtype::E4M3);
  CHECK(o.dtype(Fp8Role::Grad) == fp8::Fp8Dtype::E5M2);
  o.format = Fp8Format::E4M3;
  CHECK(o.dtype(Fp8Role::Grad) == fp8::Fp8Dtype::E4M3);

  o.amax_history_len = 3;
  o.amax_compute_algo = Fp8AmaxAlgo::Max;
  AmaxHistory h;
  for (float a : {4.0f, 1.0f, 2.0f}) h.push(a, o, fp8::Fp8Dtype::E4M3);
  CHECK(h.history == std::vector<float>{2.0f, 1.0f, 4.0f});
  CHECK(h.scale == 448.0f / 4.0f);
  h.push(0.5f, o, fp8::Fp8Dtype::E4M3);  // 4 leaves the window of 3
  CHECK(h.history == std::vector<float>{0.5f, 2.0f, 1.0f});
  CHECK(h.scale == 448.0f / 2.0f);
  h.push(NAN, o, fp8::Fp8Dtype::E4M3);  // a non-finite step changes nothing
  CHECK(h.history.size() == 3);
  CHECK(h.scale == 224.0f);
  o.amax_compute_algo = Fp8AmaxAlgo::MostRecent;
  h.push(8.0f, o, fp8::Fp8Dtype::E5M2);
  CHECK(h.scale == 57344.0f / 8.0f);
  o.margin = 2;
  h.push(8.0f, o, fp8::Fp8Dtype::E5M2);
  CHECK(h.scale == 57344.0f / 8.0f / 4.0f);

  Fp8Options f;
  f.recipe = Fp8Recipe::Tensorwise;
  CHECK(f.layer_in_fp8(0, 4));
  f.first_last_layers_bf16 = true;
  CHECK(!f.layer_in_fp8(0, 4));
  CHECK(f.layer_in_fp8(1, 4));
  CHECK(f.layer_in_fp8(2, 4));
  CHECK(!f.layer_in_fp8(3, 4));
  f.num_layers_at_start_in_bf16 = 2;
  CHECK(!f.layer_in_fp8(1, 4));
  f.recipe = Fp8Recipe::None;
  CHECK(!f.layer_in_fp8(2, 4));
}

TEST_CASE("the FP8 context: one step's amaxes become the next step's scales; its state round-trips", "[fp8][recipe]") {
  Fp8Options o;
  o.recipe = Fp8Recipe::Delayed;
  o.amax_history_len = 2;
  o.amax_compute_algo = Fp8AmaxAlgo::Max;
  Fp8Context ctx(o, Device::CPU);
  CHECK(ctx.add_linear("decoder.layers.0.mlp.linear_fc1") == 0);
  CHECK(ctx.add_linear("decoder.layers.0.mlp.linear_fc2") == 1);
  CHECK(ctx.scale(1, Fp8Role::Grad).data<float>()[0] == 1.0f);  // before any step: scale 1
  ctx.begin_step();
  ctx.amax(1, Fp8Role::Grad).data<float>()[0] = 0.25f;
  ctx.amax(0, Fp8Role::Input).data<float>()[0] = 7.0f;
  ctx.end_step();
  CHECK(ctx.scale(1, Fp8Role::Grad).data<float>()[0] == 448.0f / 0.25f);
  CHECK(ctx.scale(0, Fp8Role::Input).data<float>()[0] == 64.0f);
  CHECK(ctx.scale(0, Fp8Role::Weight).data<float>()[0] == 1.0f);  // amax 0: the previous scale
  CHECK(ctx.amax(1, Fp8Role::Grad).data<float>()[0] == 0.0f);     // pending amaxes cleared
  Fp8Context other(o, Device::CPU);
  other.add_linear("decoder.layers.0.mlp.linear_fc1");
  other.add_linear("decoder.layers.0.mlp.linear_fc2");
  other.set_state(ctx.state());
  for (int l = 0; l < 2; ++l)
    for (Fp8Role r : {Fp8Role::Input, Fp8Role::Weight, Fp8Role::Grad}) {
      CHECK(other.scale(l, r).data<float>()[0] == ctx.scale(l, r).data<float>()[0]);
      CHECK(other.history(l, r).history == ctx.history(l, r).history);
    }
  Fp8Context wrong(o, Device::CPU);
  wrong.add_linear("decoder.layers.1.mlp.linear_fc1");
  CHECK_THROWS(wrong.set_state(ctx.state()));
}
