// bf16 main gradients (parallel.grad_reduce_in_fp32: false) on the GPU: AdamW reading bf16 gradients is the
// fp32-gradient update of the same values, bit for bit (fp32 master weights with and without their compute copy,
// master halves, decay runs, unaligned starts); the experts' weight gradients in bf16 are the fp32 ones rounded, bit
// for bit on our Hopper kernel (its sums of squares those of the rounded values) and to bf16's precision on cuBLAS
// (any row counts, accumulation); the dense weight-gradient writers (cuBLAS, the norms, the embedding, the router's
// parts) against their fp32 results (below).
#include "catch.h"

#if defined(MEGATRAIN_HAVE_CUDA)
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "cuda/sm90/grouped_gemm.h"
#include "tensor/master_halves_ops.h"
#include "tensor/moe_ops.h"
#include "test_cuda_util.h"

using namespace mt;
using namespace mt::gpu_test;

namespace {
// x rounded to bf16 on the device (nearest even)
Tensor to_bf16(const Tensor& x) {
  Tensor o = Tensor::empty(x.shape(), DType::BF16, Device::CUDA);
  ops::cast(o, x);
  return o;
}
}  // namespace

TEST_CASE("cuda adamw with bf16 gradients is the fp32-gradient update of the same values", "[cuda][adamw][grad_bf16]") {
  init();
  for (int64_t n : {int64_t(3), int64_t(100003)})
    for (int64_t shift : {int64_t(0), int64_t(1)}) {  // 1: the gradients' start off the vectors' alignment
      INFO("n " << n << " shift " << shift);
      const ops::DecayRuns r = decay_runs_of(n);
      const Tensor p0 = rounded(randn64({n}, 5 + n, 0.02), DType::F32), zero = Tensor::zeros({n}, DType::F64);
      // fp32 master weights with a bf16 compute copy; master halves
      Tensor p32 = to_device(p0, DType::F32), p16 = to_device(p0, DType::F32);
      Tensor c32 = Tensor::empty({n}, DType::BF16, Device::CUDA), c16 = Tensor::empty({n}, DType::BF16, Device::CUDA);
      Tensor hi32 = Tensor::empty({n}, DType::BF16, Device::CUDA), lo32 = Tensor::empty({n}, DType::U16, Device::CUDA);
      Tensor hi16 = Tensor::empty({n}, DType::BF16, Device::CUDA), lo16 = Tensor::empty({n}, DType::U16, Device::CUDA);
      ops::split_master(hi32, &lo32, p32);
      ops::split_master(hi16, &lo16, p32);
      std::vector<Tensor> state;  // m, v of the four updates
      for (int i = 0; i < 8; ++i) state.push_back(to_device(zero, DType::F32));
      ops::AdamWArgs a;
      a.lr = 1e-3;
      a.weight_decay = 0.1;
      a.grad_scale = 0.75;
      for (a.step = 1; a.step <= 3; ++a.step) {
        const Tensor g64 = rounded(randn64({n}, 4000 * a.step + n), DType::BF16);  // values bf16 holds exactly
        const Tensor g32 = to_device(g64, DType::F32), g16 = to_device_shifted(g64, DType::BF16, shift);
        ops::adamw_step(p32, state[0], state[1], g32, a, &c32, &r);
        ops::adamw_step(p16, state[2], state[3], g16, a, &c16, &r);
        ops::adamw_step_halves(hi32, lo32, state[4], state[5], g32, a, &r);
        ops::adamw_step_halves(hi16, lo16, state[6], state[7], g16, a, &r);
      }
      CHECK(bitwise_equal(p16, p32));
      CHECK(bitwise_equal(c16, c32));
      CHECK(bitwise_equal(hi16, hi32));
      CHECK(bitwise_equal(lo16, lo32));
      CHECK(bitwise_equal(state[2], state[0]));
      CHECK(bitwise_equal(state[3], state[1]));
      CHECK(bitwise_equal(state[6], state[4]));
      CHECK(bitwise_equal(state[7], state[5]));
      CHECK_FALSE(bitwise_equal(p32, to_device(p0, DType::F32)));  // (the updates moved the weights)
    }
}

// The experts' weight gradient into bf16 main grads: against the same call into fp32 ones. On our Hopper kernel (every
// count a multiple of 64, a first write) the bf16 values are the fp32 results rounded, bit for bit, and its sums of
// squares are those of the bf16 values; on cuBLAS (any counts, accumulation) they agree to bf16's precision with the
// CPU's fp64. An expert without rows gets zeros on a first write.
TEST_CASE("cuda moe expert weight gradients into bf16 main grads", "[cuda][moe][grad_bf16]") {
  init();
  struct Case {
    std::vector<int64_t> counts;
    int64_t IC, OC;
    bool sm90;  // our Hopper kernel takes the first write
  };
  const bool hopper = ops::cuda::sm90::grouped_gemm_supported();
  if (!hopper) WARN("skipped the sm90 cases: the GPU is not compute capability 9.0 (Hopper)");
  std::vector<Case> cases = {{{37, 0, 130, 1, 64}, 96, 80, false}};
  if (hopper) {
    cases.push_back({{256, 0, 384, 128, 64}, 256, 512, true});
    cases.push_back({{128, 448, 0, 192}, 512, 256, true});
  }
  for (const Case& c : cases) {
    INFO("IC " << c.IC << " OC " << c.OC << (c.sm90 ? " (sm90)" : " (cuBLAS)"));
    const int64_t El = static_cast<int64_t>(c.counts.size());
    const int64_t M = std::accumulate(c.counts.begin(), c.counts.end(), int64_t{0});
    REQUIRE(ops::cuda::sm90::grouped_dweight_takes(c.counts.data(), El, c.IC, c.OC, false) == c.sm90);
    const Tensor x64 = rounded(randn64({M, c.IC}, 91), DType::BF16),
                 w64 = rounded(randn64({El, c.OC, c.IC}, 92, 0.05), DType::BF16),
                 dout64 = rounded(randn64({M, c.OC}, 93), DType::BF16);
    const Tensor x = to_device(x64, DType::BF16), w = to_device(w64, DType::BF16);
    const Tensor dout = to_device(dout64, DType::BF16);
    Tensor dw_ref = Tensor::empty({El, c.OC, c.IC}, DType::F64);
    ops::moe_grouped_linear_backward(nullptr, &dw_ref, dout64, x64, w64, c.counts, ops::GradMode::Overwrite);
    Tensor dw32 = poisoned({El, c.OC, c.IC}, DType::F32), dw16 = poisoned({El, c.OC, c.IC}, DType::BF16);
    Tensor sq32, sq16;
    ops::moe_grouped_linear_backward(nullptr, &dw32, dout, x, w, c.counts, ops::GradMode::Overwrite, &sq32);
    ops::moe_grouped_linear_backward(nullptr, &dw16, dout, x, w, c.counts, ops::GradMode::Overwrite, &sq16);
    check_close("bf16 dweight, first write", dw16, dw_ref, DType::BF16);
    CHECK(sq16.defined() == c.sm90);
    if (c.sm90) {
      CHECK(bitwise_equal(dw16, to_bf16(dw32)));
      Tensor sums = Tensor::empty({1}, DType::F64, Device::CUDA);
      ops::sum_each(sums, {sq16});
      const double got = to_host(sums).data<double>()[0], of_bf16 = ops::sum_squares(dw16),
                   of_f32 = ops::sum_squares(dw32);
      INFO("sums of squares: partials " << got << ", of the bf16 values " << of_bf16 << ", of the fp32 " << of_f32);
      CHECK(std::fabs(got - of_bf16) <= 1e-12 * of_bf16);
      CHECK(got != of_f32);  // (the rounded values' squares, not the fp32 results')
    }
    ops::moe_grouped_linear_backward(nullptr, &dw16, dout, x, w, c.counts, ops::GradMode::Accumulate);
    ops::scale_(dw_ref, 2.0);
    check_close("bf16 dweight, accumulated", dw16, dw_ref, DType::BF16);
  }
}

// ---------------------------------------------------------------- bf16 main grads ([grad_bf16])
// Parameter gradients in bf16 (grad_reduce_in_fp32 false): each op run once with fp32 and once with bf16 gradients
// from the same start (bf16 values), the bf16 result against the fp32 one. Our own reductions (column sums, norm
// partials, embedding runs, the router's part sums) add the same fp32 values in the same order either way, then
// round once: bit for bit. cuBLASLt's dweight on a bf16 C rounds the product to bf16 and, for +=, adds C and rounds
// again (measured on H200: 20,832 of 786,432 elements at 512 x 768 x 1024 differ from one rounding, by up to 2 ulp);
// the tests feeding it use small integers times powers of 2, whose fp32 sums are exact in any order, so each element
// must be one of the two roundings exactly.
namespace {
struct LinearDims { int64_t N, IC, OC; };

// Host fp64 tensor of integers in [lo, hi] times scale (exact in bf16 and fp16).
Tensor grid64(const Shape& s, uint64_t seed, int32_t lo, int32_t hi, double scale) {
  const Tensor k = randint32(s, seed, lo, hi);
  Tensor t = Tensor::empty(s, DType::F64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = k.data<int32_t>()[i] * scale;
  return t;
}

// bf16 bits as an ordered integer: neighbouring values differ by 1, +0 and -0 are both 0.
int bf16_order(uint16_t b) { return (b & 0x8000u) ? -int(b & 0x7fffu) : int(b); }

enum class Rounding {
  kOnce,    // g16 = bf16(g32), bit for bit
  kCublas,  // or, for +=, bf16(start + bf16(g32 - start)): cuBLASLt's product rounded before C is added
};

// g16 (bf16, device) against g32 (fp32, device), both computed from start (host fp64; undefined for a first write).
// Most expected values must differ from 0 and from start, so zeros, a skipped write or a skipped += fail.
void check_bf16_grad(const std::string& what, const Tensor& g16, const Tensor& g32, Rounding rounding,
                     const Tensor& start = Tensor()) {
  const Tensor want = to_host(g32), have = to_host(g16);
  REQUIRE((have.dtype() == DType::BF16 && want.dtype() == DType::F32 && have.numel() == want.numel()));
  int64_t bad = 0, worst = 0, twice = 0, nonzero = 0, moved = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const float r = want.data<float>()[i];
    const uint16_t h = have.data<bf16>()[i].bits, once = bf16(r).bits;
    uint16_t other = once;
    if (start.defined()) {
      const double s0 = start.data<double>()[i];
      moved += bf16_order(bf16(float(s0)).bits) != bf16_order(once);
      if (rounding == Rounding::kCublas) other = bf16(float(s0 + double(float(bf16(float(double(r) - s0)))))).bits;
    } else {
      ++moved;
    }
    worst = std::max<int64_t>(worst, std::abs(bf16_order(h) - bf16_order(once)));
    bad += h != once && h != other;
    twice += h != once && h == other;
    nonzero += bf16_order(once) != 0;
  }
  INFO(what << " " << g16.str() << ": " << bad << " elements neither rounding (" << twice << " rounded twice, worst "
            << worst << " ulp from one rounding), " << nonzero << " nonzero, " << moved << " moved from the start");
  CHECK(bad == 0);
  CHECK(nonzero * 2 > want.numel());
  CHECK(moved * 2 > want.numel());
}

// Runs backward(grads, mode) with fp32 gradients ([0]) and bf16 ones ([1]): each gradient i starts at starts[i]
// (host fp64, bf16 values) for +=; for = the dweight (grad 0) starts as NaN, the others (biases: always +=) at
// their starts. Then checks [1] against [0]: grad 0 by dweight_rounding, the rest bit for bit.
void check_grad_modes(const std::string& op, const std::vector<Tensor>& starts, Rounding dweight_rounding,
                      const std::function<void(std::vector<Tensor>&, ops::GradMode)>& backward) {
  for (ops::GradMode mode : {ops::GradMode::Overwrite, ops::GradMode::Accumulate}) {
    const bool acc = mode == ops::GradMode::Accumulate;
    std::vector<Tensor> grads[2];
    for (int k = 0; k < 2; ++k) {
      const DType gt = k ? DType::BF16 : DType::F32;
      for (size_t i = 0; i < starts.size(); ++i)
        grads[k].push_back(i == 0 && !acc ? poisoned(starts[i].shape(), gt) : to_device(starts[i], gt));
      backward(grads[k], mode);
    }
    for (size_t i = 0; i < starts.size(); ++i)
      check_bf16_grad(op + (acc ? " += " : " = ") + "grad " + std::to_string(i), grads[1][i], grads[0][i],
                      i == 0 ? dweight_rounding : Rounding::kOnce, i == 0 && !acc ? Tensor() : starts[i]);
  }
}
}  // namespace

TEST_CASE("cuda bf16 main grads: linear backward (cuBLAS bf16 C, column sums)", "[cuda][linear][grad_bf16]") {
  init();
  uint64_t seed = 3000;
  for (DType dt : {DType::BF16, DType::F16})  // fp16: the dweight GEMM through an fp32 scratch
    for (LinearDims d : {LinearDims{300, 256, 96}, LinearDims{37, 45, 19}, LinearDims{512, 768, 1024}}) {
      INFO(dtype_name(dt) << " N " << d.N << " IC " << d.IC << " OC " << d.OC);
      const Tensor x = to_device(grid64({d.N, d.IC}, ++seed, -4, 4, 0.25), dt);
      const Tensor w = to_device(grid64({d.OC, d.IC}, ++seed, -4, 4, 0.25), dt);
      const Tensor g = to_device(grid64({d.N, d.OC}, ++seed, -4, 4, 1.0), dt);
      const Tensor dw0 = grid64({d.OC, d.IC}, ++seed, -64, 64, 0.25), db0 = grid64({d.OC}, ++seed, -128, 128, 1.0);
      auto backward = [&](std::vector<Tensor>& gr, ops::GradMode m) {
        ops::linear_backward(nullptr, &gr[0], &gr[1], g, x, w, ops::GradMode::Overwrite, m);
      };
      check_grad_modes("linear_backward", {dw0, db0}, Rounding::kCublas, backward);
      // the bias gradient alone (no inp, weight): the same column sums
      Tensor db[2] = {to_device(db0, DType::F32), to_device(db0, DType::BF16)};
      for (Tensor& b : db) ops::linear_backward(nullptr, nullptr, &b, g, Tensor(), Tensor());
      check_bf16_grad("linear_backward dbias alone", db[1], db[0], Rounding::kOnce, db0);
    }
}

TEST_CASE("cuda bf16 main grads: linear_backward_wide (part sums)", "[cuda][linear][moe][grad_bf16]") {
  init();
  uint64_t seed = 3100;
  for (DType dt : {DType::BF16, DType::F16})  // fp16: through fp32 copies
    for (LinearDims d : {LinearDims{300, 1024, 64}, LinearDims{37, 45, 19}}) {
      INFO(dtype_name(dt) << " N " << d.N << " IC " << d.IC << " OC " << d.OC);
      const Tensor x = to_device(randn64({d.N, d.IC}, ++seed), dt);
      const Tensor w = to_device(randn64({d.OC, d.IC}, ++seed, 0.05), dt);
      const Tensor g = to_device(randn64({d.N, d.OC}, ++seed, 1e-3), DType::F32);
      const Tensor dw0 = rounded(randn64({d.OC, d.IC}, ++seed, 1e-2), DType::BF16);
      auto backward = [&](std::vector<Tensor>& gr, ops::GradMode m) {
        ops::linear_backward_wide(nullptr, &gr[0], g, x, w, m);
      };
      check_grad_modes("linear_backward_wide", {dw0}, Rounding::kOnce, backward);
    }
}

TEST_CASE("cuda bf16 main grads: linear + GELU backward", "[cuda][linear_gelu][grad_bf16]") {
  init();
  uint64_t seed = 3200;
  for (DType dt : {DType::BF16, DType::F16})
    for (LinearDims d : {LinearDims{256, 768, 96}, LinearDims{37, 45, 19}}) {
      INFO(dtype_name(dt) << " N " << d.N << " IC " << d.IC << " OC " << d.OC);
      const Tensor x = to_device(grid64({d.N, d.IC}, ++seed, -4, 4, 0.25), dt);
      const Tensor w = to_device(grid64({d.OC, d.IC}, ++seed, -4, 4, 0.25), dt);
      const Tensor g = to_device(grid64({d.N, d.OC}, ++seed, -4, 4, 1.0), dt);
      const Tensor pre = to_device(randn64({d.N, d.IC}, ++seed), dt);
      const Tensor dw0 = grid64({d.OC, d.IC}, ++seed, -64, 64, 0.25), db0 = grid64({d.OC}, ++seed, -128, 128, 1.0);
      auto backward = [&](std::vector<Tensor>& gr, ops::GradMode m) {
        Tensor dpre = poisoned({d.N, d.IC}, dt);
        ops::linear_backward_gelu(dpre, &gr[0], &gr[1], g, x, w, pre, m);
      };
      check_grad_modes("linear_backward_gelu", {dw0, db0}, Rounding::kCublas, backward);
    }
}

// The recomputed a = silu(gate) up is exact here: gates of 20..32 give sigmoid 1 in fp32, so a = gate * up.
TEST_CASE("cuda bf16 main grads: linear + SwiGLU backward", "[cuda][linear_swiglu][grad_bf16]") {
  init();
  uint64_t seed = 3300;
  struct Dims { int64_t N, F, OC; };
  for (DType dt : {DType::BF16, DType::F16})
    for (Dims d : {Dims{256, 512, 96}, Dims{37, 45, 19}}) {
      INFO(dtype_name(dt) << " N " << d.N << " F " << d.F << " OC " << d.OC);
      const Tensor gate = grid64({d.N, d.F}, ++seed, 20, 32, 1.0), up = grid64({d.N, d.F}, ++seed, -4, 4, 0.25);
      Tensor h64 = Tensor::empty({d.N, 2 * d.F}, DType::F64);
      for (int64_t n = 0; n < d.N; ++n)
        for (int64_t f = 0; f < d.F; ++f) {
          h64.data<double>()[n * 2 * d.F + f] = gate.data<double>()[n * d.F + f];
          h64.data<double>()[n * 2 * d.F + d.F + f] = up.data<double>()[n * d.F + f];
        }
      const Tensor h = to_device(h64, dt), w = to_device(grid64({d.OC, d.F}, ++seed, -4, 4, 0.25), dt);
      const Tensor g = to_device(grid64({d.N, d.OC}, ++seed, -4, 4, 1.0), dt);
      const Tensor dw0 = grid64({d.OC, d.F}, ++seed, -64, 64, 0.25), db0 = grid64({d.OC}, ++seed, -128, 128, 1.0);
      auto backward = [&](std::vector<Tensor>& gr, ops::GradMode m) {
        Tensor dh = poisoned({d.N, 2 * d.F}, dt);
        ops::linear_backward_swiglu(dh, &gr[0], &gr[1], g, w, h, m);
      };
      check_grad_modes("linear_backward_swiglu", {dw0, db0}, Rounding::kCublas, backward);
    }
}

// Norm weight gradients always accumulate (+=): every launch branch (warp per row with the row held or re-read,
// block per rows, the scalar path at C = 13 and 1001; sum_rows_accumulate's 8 and 32 row groups).
TEST_CASE("cuda bf16 main grads: layernorm and rmsnorm backward (partial sums)", "[cuda][norm][grad_bf16]") {
  init();
  struct Dims { int64_t N, C; };
  uint64_t seed = 3400;
  for (DType dt : {DType::BF16, DType::F16})
    for (Dims d : {Dims{67, 96}, Dims{33, 13}, Dims{16, 4096}, Dims{40, 3072}, Dims{3000, 2048}, Dims{9, 1001},
                   Dims{20, 8192}})
      for (bool layer : {true, false}) {
        INFO(dtype_name(dt) << (layer ? " layernorm" : " rmsnorm") << " N " << d.N << " C " << d.C);
        const Tensor x = to_device(randn64({d.N, d.C}, ++seed, 2.0), dt), w = to_device(randn64({d.C}, ++seed), dt);
        const Tensor b = to_device(randn64({d.C}, ++seed), dt), g = to_device(randn64({d.N, d.C}, ++seed), dt);
        Tensor y = poisoned({d.N, d.C}, dt), mean = poisoned({d.N}, DType::F32), rstd = poisoned({d.N}, DType::F32);
        if (layer) ops::layernorm_forward(y, mean, rstd, x, w, b, 1e-5);
        else ops::rmsnorm_forward(y, rstd, x, w, 1e-5);
        const Tensor dw0 = rounded(randn64({d.C}, ++seed), DType::BF16);
        const Tensor db0 = rounded(randn64({d.C}, ++seed), DType::BF16);
        Tensor dw[2], db[2];
        for (int k = 0; k < 2; ++k) {
          const DType gt = k ? DType::BF16 : DType::F32;
          Tensor dx = poisoned({d.N, d.C}, dt);
          dw[k] = to_device(dw0, gt), db[k] = to_device(db0, gt);
          if (layer) ops::layernorm_backward(dx, dw[k], db[k], g, x, w, mean, rstd);
          else ops::rmsnorm_backward(dx, dw[k], g, x, w, rstd);
        }
        check_bf16_grad("norm dweight +=", dw[1], dw[0], Rounding::kOnce, dw0);
        if (layer) check_bf16_grad("layernorm dbias +=", db[1], db[0], Rounding::kOnce, db0);
      }
}

TEST_CASE("cuda bf16 main grads: embedding backward (runs of equal tokens)", "[cuda][embedding][grad_bf16]") {
  init();
  uint64_t seed = 3500;
  for (DType dt : {DType::BF16, DType::F16})
    for (int64_t C : {int64_t(96), int64_t(13)}) {  // 16-byte vectors, and one column at a time
      INFO(dtype_name(dt) << " C " << C);
      const int64_t N = 333, Vl = 50, vocab_start = 100;
      const Tensor tok = to_device(randint32({N}, ++seed, 80, 170), DType::I32);  // some outside [100, 150)
      const Tensor g = to_device(randn64({N, C}, ++seed), dt), dt0 = rounded(randn64({Vl, C}, ++seed), DType::BF16);
      Tensor dtab[2] = {to_device(dt0, DType::F32), to_device(dt0, DType::BF16)};
      for (Tensor& t : dtab) ops::embedding_backward(t, g, tok, vocab_start);
      check_bf16_grad("embedding_backward dtable +=", dtab[1], dtab[0], Rounding::kOnce, dt0);
    }
}

#endif
