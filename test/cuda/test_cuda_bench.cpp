// Hidden timings ("[.bench]", run with: mt_test_cuda "[.bench]") of the CUDA ops at training sizes:
// GEMMs in TFLOP/s, memory-bound kernels in GB/s counting the fewest bytes they must move (each
// input read once, each output written once). Random inputs (never zeros); medians of 20 runs.
#include "catch.h"

#if defined(MEGATRAIN_HAVE_CUDA)
#include <algorithm>
#include <cstdio>
#include <string>

#include "cuda/cuda_ops.h"
#include "tensor/master_halves_ops.h"
#include "test_cuda_util.h"

using namespace mt;
using namespace mt::gpu_test;

namespace {
void report(const char* what, double ms, double bytes, double flops = 0) {
  if (flops > 0)
    std::printf("BENCH %-52s %8.3f ms  %7.1f TFLOP/s\n", what, ms, flops / ms * 1e-9);
  else
    std::printf("BENCH %-52s %8.3f ms  %7.1f GB/s\n", what, ms, bytes / ms * 1e-6);
}
// Random device tensor, built from 2^20 random values repeated (fast to make at any size).
Tensor dev_randn(const Shape& s, DType dt, uint64_t seed, double scale = 1.0) {
  const int64_t n = shape_numel(s), chunk = std::min<int64_t>(n, int64_t(1) << 20);
  const Tensor src = to_device(randn64({chunk}, seed, scale), DType::F32);
  Tensor t = Tensor::empty({n}, dt, Device::CUDA);
  for (int64_t i = 0; i < n; i += chunk) {
    const int64_t len = std::min(chunk, n - i);
    Tensor dst = t.slice(i, len);
    ops::cast(dst, src.slice(0, len));
  }
  return t.view(s);
}
}  // namespace

TEST_CASE("cuda op timings", "[.bench][cuda]") {
  init();
  const DType bf = DType::BF16, f32 = DType::F32;
  {  // linear, bf16 operands, fp32 main grads
    const int64_t N = 8192, IC = 4096, OC = 4096;
    const Tensor x = dev_randn({N, IC}, bf, 1), w = dev_randn({OC, IC}, bf, 2, 0.02), b = dev_randn({OC}, bf, 3);
    const Tensor g = dev_randn({N, OC}, bf, 4);
    Tensor y = Tensor::empty({N, OC}, bf, Device::CUDA), dx = Tensor::empty({N, IC}, bf, Device::CUDA);
    Tensor dw = dev_randn({OC, IC}, f32, 5), db = dev_randn({OC}, f32, 6);
    const double fl = 2.0 * N * IC * OC;
    report("linear_forward bf16 8192x4096x4096 +bias", median_ms([&] { ops::linear_forward(y, x, w, &b); }, 20), 0, fl);
    report("linear_backward dinp", median_ms([&] { ops::linear_backward(&dx, nullptr, nullptr, g, x, w); }, 20), 0, fl);
    report("linear_backward dweight(fp32 +=)",
           median_ms([&] { ops::linear_backward(nullptr, &dw, nullptr, g, x, w); }, 20), 0, fl);
    report("linear_backward dbias(fp32 +=)",
           median_ms([&] { ops::linear_backward(nullptr, nullptr, &db, g, x, w); }, 20), 2.0 * N * OC);
  }
  {  // norms
    const int64_t N = 16384, C = 4096;
    const Tensor x = dev_randn({N, C}, bf, 7), w = dev_randn({C}, bf, 8), b = dev_randn({C}, bf, 9);
    const Tensor g = dev_randn({N, C}, bf, 10);
    Tensor y = Tensor::empty({N, C}, bf, Device::CUDA), dx = Tensor::empty({N, C}, bf, Device::CUDA);
    Tensor mean = Tensor::empty({N}, f32, Device::CUDA), rstd = Tensor::empty({N}, f32, Device::CUDA);
    Tensor dw = dev_randn({C}, f32, 11), db = dev_randn({C}, f32, 12);
    const double io = 2.0 * N * C;  // one bf16 (N, C) tensor
    report("rmsnorm_forward bf16 16384x4096", median_ms([&] { ops::rmsnorm_forward(y, rstd, x, w, 1e-5); }, 20),
           2 * io);
    report("rmsnorm_backward", median_ms([&] { ops::rmsnorm_backward(dx, dw, g, x, w, rstd); }, 20), 3 * io);
    report("layernorm_forward", median_ms([&] { ops::layernorm_forward(y, mean, rstd, x, w, b, 1e-5); }, 20), 2 * io);
    report("layernorm_backward", median_ms([&] { ops::layernorm_backward(dx, dw, db, g, x, w, mean, rstd); }, 20),
           3 * io);
    report("add_ bf16", median_ms([&] { ops::add_(y, g); }, 20), 3 * io);
    report("gelu_forward bf16", median_ms([&] { ops::gelu_forward(y, x); }, 20), 2 * io);
    const Tensor h = dev_randn({N, C}, bf, 13), gh = dev_randn({N, C / 2}, bf, 14);
    Tensor sw = Tensor::empty({N, C / 2}, bf, Device::CUDA);
    report("swiglu_forward bf16 16384x(2x2048)", median_ms([&] { ops::swiglu_forward(sw, h); }, 20), 1.5 * io);
    report("swiglu_backward", median_ms([&] { ops::swiglu_backward(dx, gh, h); }, 20), 2.5 * io);
  }
  {  // the llama shapes of the step profile (micro-batch 8 x 2048 tokens): llama-1b C 2048, F 8192, GQA 32/8 D 64;
     // llama-3b C 3072; 7B C 4096 (2 x 2048 tokens)
    for (int64_t C : {int64_t(2048), int64_t(3072), int64_t(4096)}) {
      const int64_t N = C == 4096 ? 4096 : 16384;
      const Tensor x = dev_randn({N, C}, bf, 40), w = dev_randn({C}, bf, 41), g = dev_randn({N, C}, bf, 42);
      Tensor y = Tensor::empty({N, C}, bf, Device::CUDA), dx = dev_randn({N, C}, bf, 43);
      Tensor rstd = Tensor::empty({N}, f32, Device::CUDA), dw = dev_randn({C}, f32, 44);
      const double io = 2.0 * N * C;
      const std::string sz = std::to_string(N) + "x" + std::to_string(C);
      report(("rmsnorm_forward bf16 " + sz).c_str(),
             median_ms([&] { ops::rmsnorm_forward(y, rstd, x, w, 1e-5); }, 20), 2 * io);
      report(("rmsnorm_backward (dx +=) " + sz).c_str(),
             median_ms([&] { ops::rmsnorm_backward(dx, dw, g, x, w, rstd, ops::GradMode::Accumulate); }, 20), 4 * io);
    }
    const int64_t N = 16384, F = 8192, OC = 2048;
    const Tensor h = dev_randn({N, 2 * F}, bf, 45), dy = dev_randn({N, F}, bf, 46), d2 = dev_randn({N, OC}, bf, 47);
    const Tensor w2 = dev_randn({OC, F}, bf, 48, 0.02);
    Tensor a = Tensor::empty({N, F}, bf, Device::CUDA), dh = Tensor::empty({N, 2 * F}, bf, Device::CUDA);
    Tensor dw2 = dev_randn({OC, F}, f32, 49);
    const double io = 2.0 * N * F;
    report("swiglu_forward bf16 16384x(2x8192)", median_ms([&] { ops::swiglu_forward(a, h); }, 20), 3 * io);
    report("swiglu_backward", median_ms([&] { ops::swiglu_backward(dh, dy, h); }, 20), 5 * io);
    report("linear_backward_swiglu 16384x8192->2048 (2 GEMMs + pass)",
           median_ms([&] { ops::linear_backward_swiglu(dh, &dw2, nullptr, d2, w2, h); }, 20), 0, 4.0 * N * F * OC);
    const int64_t B = 8, T = 2048, H = 32, G = 8, D = 64, W = G * (H / G + 2) * D;
    const Tensor qkv = dev_randn({B, T, W}, bf, 50);
    Tensor q = Tensor::empty({B, T, H, D}, bf, Device::CUDA), k = Tensor::empty({B, T, G, D}, bf, Device::CUDA),
           v = Tensor::empty({B, T, G, D}, bf, Device::CUDA), dqkv = Tensor::empty({B, T, W}, bf, Device::CUDA);
    report("qkv_split_rope_forward bf16 8x2048 H32 G8 D64",
           median_ms([&] { ops::qkv_split_rope_forward(q, k, v, qkv, 10000.0, 0); }, 20), 4.0 * B * T * W);
    report("qkv_split_rope_backward",
           median_ms([&] { ops::qkv_split_rope_backward(dqkv, q, k, v, 10000.0, 0); }, 20), 4.0 * B * T * W);
  }
  {  // cross-entropy over a GPT-2 sized vocabulary
    const int64_t N = 8192, V = 50304;
    const Tensor z = dev_randn({N, V}, bf, 14, 3.0), t = to_device(randint32({N}, 15, 0, 50256), DType::I32);
    Tensor mx = Tensor::empty({N}, f32, Device::CUDA), se = Tensor::empty({N}, f32, Device::CUDA),
           tl = Tensor::empty({N}, f32, Device::CUDA), dz = Tensor::empty({N, V}, bf, Device::CUDA);
    const Tensor lse = dev_randn({N}, f32, 16), dl = dev_randn({N}, f32, 17);
    report("cross_entropy_stats bf16 8192x50304",
           median_ms([&] { ops::cross_entropy_stats(mx, se, tl, z, t, 0, 50257); }, 20), 2.0 * N * V);
    report("cross_entropy_backward", median_ms([&] { ops::cross_entropy_backward(dz, z, t, lse, dl, 0, 50257); }, 20),
           4.0 * N * V);
  }
  {  // embedding
    const int64_t N = 16384, V = 50304, C = 4096;
    const Tensor t = to_device(randint32({N}, 18, 0, 50256), DType::I32), table = dev_randn({V, C}, bf, 19);
    const Tensor g = dev_randn({N, C}, bf, 20);
    Tensor out = Tensor::empty({N, C}, bf, Device::CUDA), dtab = dev_randn({V, C}, f32, 21);
    report("embedding_forward bf16 16384x4096", median_ms([&] { ops::embedding_forward(out, t, table, 0); }, 20),
           4.0 * N * C);
    report("embedding_backward (fp32 +=)", median_ms([&] { ops::embedding_backward(dtab, g, t, 0); }, 20),
           2.0 * N * C + 8.0 * N * C);
  }
  {  // rope, qkv split, dropout, adamw, sum_squares
    const int64_t B = 4, T = 2048, H = 32, D = 128, n = B * T * H * D;
    Tensor x = dev_randn({B, T, H, D}, bf, 22);
    report("rope_forward bf16 4x2048x32x128", median_ms([&] { ops::rope_forward(x, 10000.0, 0); }, 20), 4.0 * n);
    Tensor y = Tensor::empty({B, T, H, D}, bf, Device::CUDA);
    report("dropout_forward bf16", median_ms([&] { ops::dropout_forward(y, x, 0.1, 1, 0); }, 20), 4.0 * n);
    const int64_t P = 100000000;
    Tensor p = dev_randn({P}, f32, 23, 0.02), m = dev_randn({P}, f32, 24, 1e-3), v = dev_randn({P}, f32, 25, 1e-3);
    ops::AdamWArgs a;
    a.lr = 1e-4;
    ops::fill_(v, 1e-6);  // second moments must be nonnegative
    const Tensor grad = dev_randn({P}, f32, 26);
    report("adamw_step fp32 1e8", median_ms([&] { ops::adamw_step(p, m, v, grad, a); }, 20), 28.0 * P);
    report("sum_squares fp32 1e8 (incl. sync)", median_ms([&] { (void)ops::sum_squares(grad); }, 20), 4.0 * P);
  }
}
// AdamW over 3e8 fp32 parameters with the bf16 copy (30 bytes per element), and over master weights as halves (28), as
// the trainer runs it on one flat buffer. Run with: mt_test_cuda "[adamw-bw]".
TEST_CASE("cuda adamw bandwidth", "[.bench][adamw-bw]") {
  init();
  const int64_t P = 300000000;
  Tensor p = dev_randn({P}, DType::F32, 23, 0.02), m = dev_randn({P}, DType::F32, 24, 1e-3);
  Tensor v = dev_randn({P}, DType::F32, 25, 1e-3), copy = Tensor::empty({P}, DType::BF16, Device::CUDA);
  ops::fill_(v, 1e-6);
  const Tensor grad = dev_randn({P}, DType::F32, 26);
  ops::AdamWArgs a;
  a.lr = 1e-4;
  a.weight_decay = 0.1;
  report("adamw_step fp32 3e8 + bf16 copy", median_ms([&] { ops::adamw_step(p, m, v, grad, a, &copy); }, 10), 30.0 * P);
  // the trainer's bf16 path: the master weights as halves (the bf16 values and their low halves, 28 bytes an element)
  Tensor lo = Tensor::empty({P}, DType::U16, Device::CUDA);
  ops::split_master(copy, &lo, p);
  report("adamw_step_halves 3e8", median_ms([&] { ops::adamw_step_halves(copy, lo, m, v, grad, a); }, 10), 28.0 * P);
}

// Every cuDNN engine configuration for one attention shape, timed (cuda_ops.h cudnn_attention_sweep); a
// non-causal block also on our own kernels.
namespace {
void sweep_attention(const ops::cuda::AttnShape& s, bool deterministic, double budget_s, bool forward = true) {
  const DType bf = DType::BF16;
  const Shape qs{s.B, s.T, s.H, s.D}, ks{s.B, s.keys(), s.G, s.D};
  const Tensor q = dev_randn(qs, bf, 31), k = dev_randn(ks, bf, 32), v = dev_randn(ks, bf, 33);
  const Tensor dout = dev_randn(qs, bf, 34);
  Tensor out = Tensor::empty(qs, bf, Device::CUDA), lse = Tensor::empty({s.B, s.H, s.T}, DType::F32, Device::CUDA);
  Tensor dq = Tensor::empty(qs, bf, Device::CUDA), dk = Tensor::empty(ks, bf, Device::CUDA),
         dv = Tensor::empty(ks, bf, Device::CUDA);
  std::printf("CUDNN-SWEEP shape B %lld T %lld Tk %lld H %lld G %lld D %lld %s, %s backward\n", (long long)s.B,
              (long long)s.T, (long long)s.keys(), (long long)s.H, (long long)s.G, (long long)s.D,
              s.causal ? "causal" : "non-causal", deterministic ? "deterministic" : "non-deterministic");
  auto p = [](const Tensor& t) { return t.data<mt::bf16>(); };
  ops::set_deterministic(deterministic);
  ops::attention_forward(out, lse, q, k, v, s.causal);  // out and lse for the backward (the configuration training uses)
  if (forward)
    ops::cuda::cudnn_attention_sweep(s, false, deterministic, p(q), p(k), p(v), p(out), lse.data<float>(), p(dout),
                                     p(dq), p(dk), p(dv), 5, budget_s);
  ops::cuda::cudnn_attention_sweep(s, true, deterministic, p(q), p(k), p(v), p(out), lse.data<float>(), p(dout), p(dq),
                                   p(dk), p(dv), 5, budget_s);
  const double fl = 4.0 * s.B * s.H * s.T * s.keys() * s.D * (s.causal ? 0.5 : 1.0);
  for (auto b : {ops::AttentionBackend::Auto, ops::AttentionBackend::Own}) {
    if (s.causal && b == ops::AttentionBackend::Own) continue;
    ops::set_attention_backend(b);
    const std::string name = b == ops::AttentionBackend::Own ? " own kernels" : " auto";
    report(("attention_forward" + name).c_str(), median_ms([&] { ops::attention_forward(out, lse, q, k, v, s.causal); }, 3),
           0, fl);
    report(("attention_backward" + name).c_str(),
           median_ms([&] { ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s.causal); }, 3), 0, 2.5 * fl);
  }
  ops::set_attention_backend(ops::AttentionBackend::Auto);
  ops::set_deterministic(true);
}
}  // namespace

// llama-1b at 32K tokens (configs/llama-1b-32k.yaml: B 1, H 32, G 8, D 64, non-deterministic backward).
// Run with: mt_test_cuda "[cudnn-sweep]".
TEST_CASE("cuda cudnn attention configurations at 32K", "[.bench][cudnn-sweep]") {
  init();
  sweep_attention({1, 32768, 32, 8, 64}, false, 30.0);
}
// The same with the key/value heads repeated to 32 (multi-head graph: no head reduction in cuDNN), backward only.
TEST_CASE("cuda cudnn attention configurations at 32K, heads repeated", "[.bench][cudnn-sweep-mha]") {
  init();
  sweep_attention({1, 32768, 32, 32, 64}, false, 20.0, false);
}
// The 2K-token shapes of the benchmark configs with 64-wide heads, non-deterministic backward: the MoE configs
// (micro-batch 8, 16 heads, 4 KV groups) and llama-1b (micro-batch 8, 32 heads, 8 groups).
TEST_CASE("cuda cudnn attention configurations at 2K tokens", "[.bench][cudnn-sweep-2k]") {
  init();
  sweep_attention({8, 2048, 16, 4, 64}, false, 8.0);
  sweep_attention({8, 2048, 32, 8, 64}, false, 8.0);
}
// A context-parallel block at that length (CP2: chunks of 8192; the second chunk's queries over a whole
// 16384-key block, non-causal), deterministic as the CP tests run it.
TEST_CASE("cuda cudnn attention configurations of a context-parallel block", "[.bench][cudnn-sweep-block]") {
  init();
  ops::cuda::AttnShape block{1, 8192, 32, 8, 64};
  block.Tk = 16384;
  block.causal = false;
  sweep_attention(block, true, 10.0);
}
#endif
