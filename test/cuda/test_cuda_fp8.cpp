// FP8 on the GPU against the CPU emulation (tensor/fp8): the hardware casts of cuda/fp8_cast.cu give the CPU's codes
// bit for bit (per-tensor current and delayed scaling with the fused amax, transposed copies, 1x128 tiles along rows
// and columns, both tile orientations from one pass, 128x128 blocks) and the same scales and amaxes; the cuBLASLt FP8
// GEMM equals the fp64 GEMM of the dequantized operands within accumulation tolerance (kTolFp8Gemm below; bf16
// output: the bf16 tolerance), for tensor scaling (e4m3 x e4m3, e5m2 x e4m3), for blockwise scaling (tiles x blocks,
// tiles x tiles), with a bias and accumulating into fp32. The SwiGLU passes' fused amaxes equal fp8_amax's.
#include "catch.h"

#if defined(MEGATRAIN_HAVE_CUDA)
#include "cuda/fp8_cuda.h"
#include "tensor/fp8/fp8_ops.h"
#include "tensor/ops.h"
#include "test_cuda_util.h"

using namespace mt;
using namespace mt::gpu_test;
using ops::Fp8Scaling;
using ops::Fp8Tensor;

namespace {

// Hopper's FP8 tensor cores add products in a reduced-precision accumulator that cuBLASLt promotes to fp32 at
// intervals (DeepSeek-V3 §3.3.2 measured ~14 bits for plain accumulation): 2.5e-4 in norm was measured for K = 512
// (H100, cuBLASLt 13.1); 1e-3 leaves 4x headroom and still fails a wrong scale or layout (errors of order 1).
// Fast accumulation (the forward GEMM's mode) skips the promotions: held to bf16's tolerance.
constexpr double kTolFp8Gemm = 1e-3;

// x (R, C): normal values times 2^u, u uniform in [-spread, spread]; bf16-representable.
Tensor wide(int64_t R, int64_t C, uint64_t seed, double spread = 8) {
  Tensor t = randn64({R, C}, seed);
  std::mt19937_64 gen(seed + 1);
  std::uniform_real_distribution<double> u(-spread, spread);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] *= std::exp2(u(gen));
  return rounded(t, DType::BF16);
}

Fp8Tensor to_host(const Fp8Tensor& q) {
  Fp8Tensor h = q;
  h.data = gpu_test::to_host(q.data);
  h.scale_inv = gpu_test::to_host(q.scale_inv);
  return h;
}
Fp8Tensor to_device(const Fp8Tensor& q) {
  Fp8Tensor d = Fp8Tensor::empty(q.rows(), q.k(), q.dtype, q.scaling, Device::CUDA);
  d.data.copy_from(q.data);
  d.scale_inv.copy_from(q.scale_inv);
  return d;
}
void require_same(const char* what, const Fp8Tensor& gpu, const Fp8Tensor& cpu) {
  INFO(what << " " << gpu.data.str());
  CHECK(bitwise_equal(gpu.data, cpu.data));
  CHECK(bitwise_equal(gpu.scale_inv, cpu.scale_inv));
}
Tensor f32(const Tensor& x64) { return cast_host(x64, DType::F32); }

const fp8::Fp8Dtype kFp8[] = {fp8::Fp8Dtype::E4M3, fp8::Fp8Dtype::E5M2};

}  // namespace

TEST_CASE("cuda FP8 casts give the CPU emulation's codes, scales and amaxes bit for bit", "[cuda][fp8]") {
  init();
  for (fp8::Fp8Dtype t : kFp8)
    for (auto [R, C] : {std::pair<int64_t, int64_t>{256, 384}, {77, 301}}) {
      const Tensor x64 = wide(R, C, 10 + R);
      const Tensor xh = f32(x64);
      const Tensor xd = to_device(x64, DType::BF16);
      // amax
      Tensor amax_h = Tensor::empty({1}, DType::F32), amax_d = Tensor::empty({1}, DType::F32, Device::CUDA);
      ops::fp8_amax(amax_h, xh);
      ops::fp8_amax(amax_d, xd);
      CHECK(bitwise_equal(amax_d, amax_h));
      // current scaling, row-wise and transposed
      Fp8Tensor qh = Fp8Tensor::empty(R, C, t, Fp8Scaling::Tensor, Device::CPU);
      Fp8Tensor qth = Fp8Tensor::empty(C, R, t, Fp8Scaling::Tensor, Device::CPU);
      ops::fp8_quantize_tensor(&qh, &qth, xh, &amax_h, nullptr, nullptr, 0);
      Fp8Tensor qd = Fp8Tensor::empty(R, C, t, Fp8Scaling::Tensor, Device::CUDA);
      Fp8Tensor qtd = Fp8Tensor::empty(C, R, t, Fp8Scaling::Tensor, Device::CUDA);
      ops::fp8_quantize_tensor(&qd, &qtd, xd, &amax_d, nullptr, nullptr, 0);
      require_same("tensor rows", to_host(qd), qh);
      require_same("tensor transposed", to_host(qtd), qth);
      Fp8Tensor qd_rows = Fp8Tensor::empty(R, C, t, Fp8Scaling::Tensor, Device::CUDA);  // the row-only kernel
      ops::fp8_quantize_tensor(&qd_rows, nullptr, xd, &amax_d, nullptr, nullptr, 0);
      require_same("tensor rows only", to_host(qd_rows), qh);
      // delayed: given scale, amax fused into the cast (both kernels)
      Tensor scale_h = Tensor::empty({1}, DType::F32);
      scale_h.data<float>()[0] = 3.0f;
      const Tensor scale_d = to_device(scale_h, DType::F32);
      Tensor acc_h = Tensor::zeros({1}, DType::F32), acc_d = Tensor::zeros({1}, DType::F32, Device::CUDA);
      Tensor acc_d2 = Tensor::zeros({1}, DType::F32, Device::CUDA);
      ops::fp8_quantize_tensor(&qh, nullptr, xh, nullptr, &scale_h, &acc_h, 0);
      ops::fp8_quantize_tensor(&qd_rows, nullptr, xd, nullptr, &scale_d, &acc_d, 0);
      ops::fp8_quantize_tensor(&qd, &qtd, xd, nullptr, &scale_d, &acc_d2, 0);
      require_same("delayed rows", to_host(qd_rows), qh);
      require_same("delayed transposed-kernel rows", to_host(qd), qh);
      CHECK(bitwise_equal(acc_d, acc_h));
      CHECK(bitwise_equal(acc_d2, acc_h));
      // 1x128 tiles, both directions; 128x128 blocks
      for (bool tr : {false, true}) {
        Fp8Tensor th = Fp8Tensor::empty(tr ? C : R, tr ? R : C, t, Fp8Scaling::Tile1x128, Device::CPU);
        Fp8Tensor td = Fp8Tensor::empty(tr ? C : R, tr ? R : C, t, Fp8Scaling::Tile1x128, Device::CUDA);
        ops::fp8_quantize_tiles(th, xh, tr);
        ops::fp8_quantize_tiles(td, xd, tr);
        require_same(tr ? "tiles along columns" : "tiles along rows", to_host(td), th);
      }
      // both orientations from one pass (bf16 and fp32 input): the same codes and scales as each on its own
      {
        Fp8Tensor th = Fp8Tensor::empty(R, C, t, Fp8Scaling::Tile1x128, Device::CPU);
        Fp8Tensor tth = Fp8Tensor::empty(C, R, t, Fp8Scaling::Tile1x128, Device::CPU);
        ops::fp8_quantize_tiles(th, xh, false);
        ops::fp8_quantize_tiles(tth, xh, true);
        for (const Tensor& xin : {xd, to_device(x64, DType::F32)}) {
          INFO("input " << xin.str());
          Fp8Tensor td = Fp8Tensor::empty(R, C, t, Fp8Scaling::Tile1x128, Device::CUDA);
          Fp8Tensor ttd = Fp8Tensor::empty(C, R, t, Fp8Scaling::Tile1x128, Device::CUDA);
          ops::fp8_quantize_tiles(td, ttd, xin);
          require_same("tiles both: rows", to_host(td), th);
          require_same("tiles both: columns", to_host(ttd), tth);
        }
      }
      Fp8Tensor bh = Fp8Tensor::empty(R, C, t, Fp8Scaling::Block128x128, Device::CPU);
      Fp8Tensor bth = Fp8Tensor::empty(C, R, t, Fp8Scaling::Block128x128, Device::CPU);
      Fp8Tensor bd = Fp8Tensor::empty(R, C, t, Fp8Scaling::Block128x128, Device::CUDA);
      Fp8Tensor btd = Fp8Tensor::empty(C, R, t, Fp8Scaling::Block128x128, Device::CUDA);
      ops::fp8_quantize_blocks(&bh, &bth, xh);
      ops::fp8_quantize_blocks(&bd, &btd, xd);
      require_same("blocks", to_host(bd), bh);
      require_same("blocks transposed", to_host(btd), bth);
    }
}

TEST_CASE("cuda SwiGLU passes take their output's FP8 amax: fp8_amax's, bit for bit, and the same output",
          "[cuda][fp8]") {
  init();
  for (auto [N, F] : {std::pair<int64_t, int64_t>{64, 512}, {37, 301}}) {  // 16-byte chunks; one column at a time
    INFO("N " << N << " F " << F);
    const Tensor h = to_device(wide(N, 2 * F, 70 + F, 4), DType::BF16);
    const Tensor dy = to_device(wide(N, F, 80 + F, 4), DType::BF16);
    Tensor a = Tensor::empty({N, F}, DType::BF16, Device::CUDA), a_ref = Tensor::empty({N, F}, DType::BF16, Device::CUDA);
    Tensor amax = Tensor::empty({1}, DType::F32, Device::CUDA), amax_ref = Tensor::empty({1}, DType::F32, Device::CUDA);
    ops::swiglu_forward(a_ref, h);
    ops::swiglu_forward(a, h, &amax);
    ops::fp8_amax(amax_ref, a_ref);
    CHECK(bitwise_equal(a, a_ref));
    CHECK(bitwise_equal(amax, amax_ref));
    CHECK(to_host(amax).data<float>()[0] > 0.0f);
    Tensor dh = Tensor::empty({N, 2 * F}, DType::BF16, Device::CUDA);
    Tensor dh_ref = Tensor::empty({N, 2 * F}, DType::BF16, Device::CUDA);
    ops::swiglu_backward(dh_ref, dy, h);
    ops::swiglu_backward(dh, dy, h, &amax);
    ops::fp8_amax(amax_ref, dh_ref);
    CHECK(bitwise_equal(dh, dh_ref));
    CHECK(bitwise_equal(amax, amax_ref));
  }
}

TEST_CASE("cuda FP8 hardware casts round like the emulation at every midpoint and beyond the range", "[cuda][fp8]") {
  init();
  for (fp8::Fp8Dtype t : kFp8) {
    std::vector<float> probes;
    for (int c = 0; c < 127; ++c) {
      const float a = fp8::fp8_to_float(static_cast<uint8_t>(c), t), b = fp8::fp8_to_float(static_cast<uint8_t>(c + 1), t);
      if (!std::isfinite(a) || !std::isfinite(b)) continue;
      const float mid = (a + b) / 2;
      for (float v : {a, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
        probes.push_back(v);
        probes.push_back(-v);
      }
    }
    for (float v : {500.0f, 1e5f, 1e30f, 3.4e38f, 1e-30f, 464.0f, 480.0f, 61440.0f, 65536.0f})
      probes.push_back(v), probes.push_back(-v);
    while (probes.size() % 8) probes.push_back(0.0f);
    const int64_t n = static_cast<int64_t>(probes.size());
    Tensor ph = Tensor::from_blob(probes.data(), {1, n}, DType::F32).clone();
    Tensor pd = Tensor::empty({1, n}, DType::F32, Device::CUDA);
    pd.copy_from(ph);
    Tensor one_h = Tensor::empty({1}, DType::F32);
    one_h.data<float>()[0] = 1.0f;
    const Tensor one_d = to_device(one_h, DType::F32);
    Fp8Tensor qh = Fp8Tensor::empty(1, n, t, Fp8Scaling::Tensor, Device::CPU);
    Fp8Tensor qd = Fp8Tensor::empty(1, n, t, Fp8Scaling::Tensor, Device::CUDA);
    ops::fp8_quantize_tensor(&qh, nullptr, ph, nullptr, &one_h, nullptr, 0);
    ops::fp8_quantize_tensor(&qd, nullptr, pd, nullptr, &one_d, nullptr, 0);
    const Tensor g = gpu_test::to_host(qd.data);
    int mismatches = 0;
    for (int64_t i = 0; i < n; ++i)
      if (g.data<uint8_t>()[i] != qh.data.data<uint8_t>()[i] && mismatches++ < 10)
        UNSCOPED_INFO("x = " << probes[static_cast<size_t>(i)] << ": gpu " << int(g.data<uint8_t>()[i]) << ", cpu "
                             << int(qh.data.data<uint8_t>()[i]));
    CHECK(mismatches == 0);
  }
}

TEST_CASE("cuda FP8 GEMM equals the fp64 GEMM of the dequantized operands", "[cuda][fp8]") {
  init();
  const int64_t M = 256, N = 384, K = 512;
  struct Case {
    const char* name;
    fp8::Fp8Dtype ta, tb;
    Fp8Scaling sa, sb;
  };
  const Case cases[] = {{"tensor e4m3 x e4m3", fp8::Fp8Dtype::E4M3, fp8::Fp8Dtype::E4M3, Fp8Scaling::Tensor, Fp8Scaling::Tensor},
                        {"tensor e5m2 x e4m3", fp8::Fp8Dtype::E5M2, fp8::Fp8Dtype::E4M3, Fp8Scaling::Tensor, Fp8Scaling::Tensor},
                        {"tiles x blocks", fp8::Fp8Dtype::E4M3, fp8::Fp8Dtype::E4M3, Fp8Scaling::Tile1x128, Fp8Scaling::Block128x128},
                        {"tiles x tiles", fp8::Fp8Dtype::E5M2, fp8::Fp8Dtype::E4M3, Fp8Scaling::Tile1x128, Fp8Scaling::Tile1x128}};
  uint64_t seed = 500;
  for (const Case& c : cases) {
    INFO(c.name);
    Tensor a = f32(wide(M, K, ++seed, 3)), b = f32(wide(N, K, ++seed, 3));
    // Every 128x128 block of b (and every 128-column block of a) at its own power of 2, so that each block and
    // tile has its own scale: a scale read from the wrong place is then a wrong value, never a coincidence.
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) b.data<float>()[n * K + k] *= std::ldexp(1.0f, int((n / 128) * 3 + (k / 128)));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) a.data<float>()[m * K + k] *= std::ldexp(1.0f, -int(2 * (k / 128)));
    auto quantize = [](const Tensor& x, fp8::Fp8Dtype t, Fp8Scaling s) {
      Fp8Tensor q = Fp8Tensor::empty(x.size(0), x.size(1), t, s, Device::CPU);
      if (s == Fp8Scaling::Tensor) {
        Tensor amax = Tensor::empty({1}, DType::F32);
        ops::fp8_amax(amax, x);
        ops::fp8_quantize_tensor(&q, nullptr, x, &amax, nullptr, nullptr, 0);
      } else if (s == Fp8Scaling::Tile1x128) {
        ops::fp8_quantize_tiles(q, x, false);
      } else {
        ops::fp8_quantize_blocks(&q, nullptr, x);
      }
      return q;
    };
    const Fp8Tensor qa = quantize(a, c.ta, c.sa), qb = quantize(b, c.tb, c.sb);
    Tensor ref = Tensor::empty({M, N}, DType::F64);
    ops::fp8_gemm(ref, qa, qb, nullptr, false);  // the CPU reference: dequantize, fp64 GEMM
    const Fp8Tensor da = to_device(qa), db = to_device(qb);
    Tensor out = poisoned({M, N}, DType::F32);
    if (c.sa == Fp8Scaling::Tensor) {
      ops::fp8_gemm(out, da, db, nullptr, false);
      check_close(std::string("fp8_gemm ") + c.name, out, ref, DType::F32, kTolFp8Gemm);
      Tensor out_fast = poisoned({M, N}, DType::F32);
      ops::fp8_gemm(out_fast, da, db, nullptr, false, /*fast_accum=*/true);
      check_close(std::string("fp8_gemm fast accumulation ") + c.name, out_fast, ref, DType::F32, kTolBF16);
      // bf16 output with a bias
      const Tensor bias64 = rounded(randn64({N}, ++seed), DType::BF16);
      Tensor ref_b = Tensor::empty({M, N}, DType::F64);
      ops::fp8_gemm(ref_b, qa, qb, &bias64, false);
      Tensor out_b = poisoned({M, N}, DType::BF16);
      const Tensor bias_d = to_device(bias64, DType::BF16);
      ops::fp8_gemm(out_b, da, db, &bias_d, false);
      check_close(std::string("fp8_gemm bias bf16 ") + c.name, out_b, ref_b, DType::BF16);
      // bf16 output with a bias and a residual (the row-parallel layer's, in the epilogue), fast accumulation
      const Tensor res64 = rounded(randn64({M, N}, ++seed, 8.0), DType::BF16);
      Tensor ref_r = Tensor::empty({M, N}, DType::F64);
      ops::fp8_gemm(ref_r, qa, qb, &bias64, false, false, &res64);
      Tensor out_r = poisoned({M, N}, DType::BF16);
      const Tensor res_d = to_device(res64, DType::BF16);
      ops::fp8_gemm(out_r, da, db, &bias_d, false, /*fast_accum=*/true, &res_d);
      check_close(std::string("fp8_gemm bias residual bf16 ") + c.name, out_r, ref_r, DType::BF16);
    } else {
      // Every candidate block-scale layout (cuda/fp8_gemm.cu, Note [FP8 block scale layout]): layout 0, the one
      // fp8_gemm uses, must match the reference, and the others must not where they differ from it for this pair
      // (the check tells layouts apart).
      double err0 = -1;
      for (int layout = 0; layout < 4; ++layout) {
        Tensor o = Tensor::zeros({M, N}, DType::F32, Device::CUDA);
        bool ok = true;
        try {
          ops::cuda::fp8_gemm_cuda_scale_layout<float>(
              o.data<float>(),
              {da.data.data<uint8_t>(), da.scale_inv.data<float>(), da.dtype, static_cast<int>(da.scaling), M, K},
              {db.data.data<uint8_t>(), db.scale_inv.data<float>(), db.dtype, static_cast<int>(db.scaling), N, K},
              false, layout);
          cudaDeviceSynchronize();
        } catch (const std::exception& e) {
          ok = false;
          UNSCOPED_INFO("layout " << layout << ": " << e.what());
        }
        const double e = ok ? rel_err(to_host64(o), ref) : -1;
        std::printf("fp8 block-scale layout %d for %s: relative error %.3e\n", layout, c.name, e);
        if (layout == 0) err0 = e;
        // layout 1 (compact tiles) differs from 0 in the tiles; 2 and 3 only in the blocks' orientation.
        if (layout == 1 || (layout > 0 && c.sb == Fp8Scaling::Block128x128)) CHECK(!(e >= 0 && e <= kTolFp8Gemm));
      }
      CHECK(err0 >= 0);
      CHECK(err0 <= kTolFp8Gemm);
      ops::fp8_gemm(out, da, db, nullptr, false);
      check_close(std::string("fp8_gemm ") + c.name, out, ref, DType::F32, kTolFp8Gemm);
    }
    // accumulate into fp32 (the weight gradient's main grad)
    Tensor acc = Tensor::empty({M, N}, DType::F32, Device::CUDA);
    ops::fill_(acc, 0.5);
    ops::fp8_gemm(acc, da, db, nullptr, true);
    Tensor ref_acc = ref.clone();
    for (int64_t i = 0; i < M * N; ++i) ref_acc.data<double>()[i] += 0.5;
    check_close(std::string("fp8_gemm accumulate ") + c.name, acc, ref_acc, DType::F32, kTolFp8Gemm);
  }
}

#endif  // MEGATRAIN_HAVE_CUDA
