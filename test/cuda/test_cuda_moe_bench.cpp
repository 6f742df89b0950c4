// Hidden per-op timings of one MoE layer ("[.bench]", run with: mt_test_cuda "[.bench][moe]") at the shapes of
// configs/moe-8x-top2.yaml and configs/moe-64x-top8.yaml (one micro-batch of 8 x 2048 tokens, hidden 1024, bf16
// activations, fp32 router, fp32 expert weight gradients written first, as in a step of one micro-batch): every op
// MoELayer / Router / Experts run in forward and backward, in their order, medians of 10 runs. The routing comes
// from random logits (about balanced), as at initialization. GEMMs also in TFLOP/s; the line "BENCH moe layer" is
// the sum. Also "[moe-sweep]" (the padded layout's GEMM shapes) and "[moe-sustained]" (the expert GEMMs at the
// power limit).
#include "catch.h"

#if defined(MEGATRAIN_HAVE_CUDA)
#include <algorithm>
#include <chrono>
#include <functional>
#include <numeric>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/cuda_ops.h"
#include "tensor/moe_ops.h"
#include "test_cuda_util.h"

using namespace mt;
using namespace mt::gpu_test;

namespace {
Tensor dev_rand(const Shape& s, DType dt, uint64_t seed, double scale = 1.0) {
  return to_device(randn64(s, seed, scale), dt);
}

struct Profile {
  const char* config;
  double total = 0;
  void op(const std::string& what, double ms, double flops = 0) {
    total += ms;
    if (flops > 0)
      std::printf("BENCH %-14s %-40s %8.3f ms  %7.1f TFLOP/s\n", config, what.c_str(), ms, flops / ms * 1e-9);
    else
      std::printf("BENCH %-14s %-40s %8.3f ms\n", config, what.c_str(), ms);
  }
};

// padded: the layer's padded batched path (moe_pad_routing_map, equal-group GEMMs = one strided batched GEMM per
// product, padding rows of dyp zeroed); else the exact groups. skew > 0: the logits of expert 0 raised by skew
// (an unbalanced routing: max / mean > 1). Both run the SwiGLU backward fused with the recompute of a.
void bench_moe_layer(const char* config, int64_t E, int64_t k, int64_t F, bool padded, double skew = 0) {
  const int64_t N = 8 * 2048, C = 1024, reps = 10;
  const DType bf = DType::BF16, f32 = DType::F32;
  Profile p{config};
  const Tensor x = dev_rand({N, C}, bf, 1);
  const Tensor w1 = dev_rand({E, 2 * F, C}, bf, 3, 0.02), w2 = dev_rand({E, C, F}, bf, 4, 0.02);
  Tensor dw1 = Tensor::zeros({E, 2 * F, C}, f32, Device::CUDA), dw2 = Tensor::zeros({E, C, F}, f32, Device::CUDA);
  Tensor dwr = Tensor::zeros({E, C}, f32, Device::CUDA);
  ops::RouterSpec spec;
  spec.topk = k;

  // ---- forward
  const Tensor wrb = dev_rand({E, C}, bf, 2, 0.02);  // the router weight's bf16 compute copy
  Tensor logits = Tensor::empty({N, E}, f32, Device::CUDA);
  p.op("router logits (linear_forward_wide)", median_ms([&] { ops::linear_forward_wide(logits, x, wrb); }, reps),
       2.0 * N * C * E);
  Tensor scores = Tensor::empty({N, E}, f32, Device::CUDA), weights = Tensor::empty({N, k}, f32, Device::CUDA);
  Tensor choice = Tensor::empty({N, k}, DType::I32, Device::CUDA);
  if (skew > 0) {  // expert 0's logit column + skew
    Tensor row = Tensor::empty({N, E}, f32);
    row.copy_from(logits);
    for (int64_t n = 0; n < N; ++n) row.data<float>()[n * E] += float(skew);
    logits.copy_from(row);
  }
  p.op("moe_router_forward (softmax, top-k)",
       median_ms([&] { ops::moe_router_forward(choice, weights, scores, logits, nullptr, spec); }, reps));
  Tensor aux = Tensor::empty({1}, f32, Device::CUDA);
  p.op("moe_aux_loss_forward", median_ms([&] { ops::moe_aux_loss_forward(aux, scores, choice, 1, 1e-2, false); }, reps));
  Tensor s2r = Tensor::empty({N * k}, DType::I32, Device::CUDA), r2s = Tensor::empty({N * k}, DType::I32, Device::CUDA);
  Tensor counts = Tensor::empty({E}, DType::I32, Device::CUDA), counts_host = Tensor::empty({E}, DType::I32);
  p.op("moe_routing_map + counts to host (sync)", median_ms([&] {
         ops::moe_routing_map(s2r, r2s, counts, choice, E);
         counts_host.copy_from(counts);
       }, reps));
  std::vector<int64_t> cnt(counts_host.data<int32_t>(), counts_host.data<int32_t>() + E);
  int64_t M = 0, most = 0;
  for (int64_t c : cnt) M += c, most = std::max(most, c);
  std::printf("BENCH %-14s %s routed rows %lld, busiest expert %lld (mean %lld), padded choice %d\n", config,
              padded ? "[padded]" : "[exact] ", (long long)M, (long long)most, (long long)(M / E),
              int(!ops::moe_padded_regions(Device::CUDA, bf, cnt, C, 2 * F).empty()));
  const int64_t Mr = M;  // routed rows (the FLOPs counted below; padded rows are wasted work)
  Tensor pad;
  if (padded) {  // the layer's regions; when it would not pad, every expert padded to the busiest one's count
    std::vector<int64_t> regions = ops::moe_padded_regions(Device::CUDA, bf, cnt, C, 2 * F);
    if (regions.empty()) regions.assign(size_t(E), most);
    std::printf("BENCH %-14s [padded] regions:", config);
    for (int64_t r : regions) std::printf(" %lld", (long long)r);
    std::printf("\n");
    M = std::accumulate(regions.begin(), regions.end(), int64_t{0});
    pad = Tensor::empty({M}, DType::I32, Device::CUDA);
    Tensor r2s0 = r2s.clone();
    p.op("moe_pad_routing_map (+ a copy of the map)", median_ms([&] {
           r2s.copy_from(r2s0);
           ops::moe_pad_routing_map(pad, r2s, s2r, cnt, regions);
         }, reps));
    cnt = regions;
  }
  const Tensor& s2r_used = padded ? pad : s2r;
  Tensor xp = Tensor::empty({M, C}, bf, Device::CUDA);
  p.op("moe_permute_forward", median_ms([&] { ops::moe_permute_forward(xp, x, s2r_used, k); }, reps));
  Tensor h = Tensor::empty({M, 2 * F}, bf, Device::CUDA), a = Tensor::empty({M, F}, bf, Device::CUDA);
  p.op("grouped fc1 forward", median_ms([&] { ops::moe_grouped_linear_forward(h, xp, w1, cnt); }, reps),
       2.0 * Mr * C * 2 * F);
  p.op("swiglu_forward", median_ms([&] { ops::swiglu_forward(a, h); }, reps));
  Tensor yp = Tensor::empty({M, C}, bf, Device::CUDA);
  p.op("grouped fc2 forward", median_ms([&] { ops::moe_grouped_linear_forward(yp, a, w2, cnt); }, reps),
       2.0 * Mr * F * C);
  Tensor y = Tensor::empty({N, C}, bf, Device::CUDA);
  p.op("moe_unpermute_forward", median_ms([&] { ops::moe_unpermute_forward(y, yp, weights, r2s); }, reps));
  const double fwd = p.total;

  // ---- backward
  const Tensor dy = dev_rand({N, C}, bf, 5);
  Tensor dyp = Tensor::empty({M, C}, bf, Device::CUDA), dweights = Tensor::empty({N, k}, f32, Device::CUDA);
  p.op("moe_unpermute_backward",
       median_ms([&] { ops::moe_unpermute_backward(dyp, dweights, dy, yp, weights, r2s); }, reps));
  if (padded)
    p.op("moe_zero_unrouted_rows (dyp)", median_ms([&] { ops::moe_zero_unrouted_rows(dyp, pad); }, reps));
  Tensor da = Tensor::empty({M, F}, bf, Device::CUDA);
  p.op("grouped fc2 backward dx", median_ms([&] {
         ops::moe_grouped_linear_backward(&da, nullptr, dyp, a, w2, cnt, ops::GradMode::Accumulate);
       }, reps), 2.0 * Mr * F * C);
  p.op("grouped fc2 backward dweight (fp32, =)", median_ms([&] {
         ops::moe_grouped_linear_backward(nullptr, &dw2, dyp, a, w2, cnt, ops::GradMode::Overwrite);
       }, reps), 2.0 * Mr * F * C);
  Tensor dh = Tensor::empty({M, 2 * F}, bf, Device::CUDA);
  p.op("swiglu_backward + recompute a", median_ms([&] {
         ops::cuda::swiglu_backward_recompute_cuda<mt::bf16>(dh.data<mt::bf16>(), a.data<mt::bf16>(), da.data<mt::bf16>(),
                                                             h.data<mt::bf16>(), M, F);
       }, reps));
  {  // not in the sum: the whole fused fc2 backward (dx GEMM + SwiGLU pass + dweight GEMM) as the layer runs it
    const double ms = median_ms([&] {
      ops::moe_grouped_linear_backward_swiglu(dh, &dw2, dyp, w2, h, cnt, ops::GradMode::Overwrite);
    }, reps);
    std::printf("BENCH %-14s %-40s %8.3f ms (the three lines above, as one op)\n", config,
                "moe_grouped_linear_backward_swiglu", ms);
    // in place, as the layer calls it: on Hopper the SwiGLU runs in the dx GEMM's epilogue (h drifts from one run
    // to the next: the values, not the work, change)
    Tensor hh = h.clone();
    const double ms_in_place = median_ms([&] {
      ops::moe_grouped_linear_backward_swiglu(hh, &dw2, dyp, w2, hh, cnt, ops::GradMode::Overwrite);
    }, reps);
    std::printf("BENCH %-14s %-40s %8.3f ms (the same op in place: dh over h)\n", config,
                "moe_grouped_linear_backward_swiglu", ms_in_place);
  }
  Tensor dxp = Tensor::empty({M, C}, bf, Device::CUDA);
  p.op("grouped fc1 backward dx", median_ms([&] {
         ops::moe_grouped_linear_backward(&dxp, nullptr, dh, xp, w1, cnt, ops::GradMode::Accumulate);
       }, reps), 2.0 * Mr * C * 2 * F);
  p.op("grouped fc1 backward dweight (fp32, =)", median_ms([&] {
         ops::moe_grouped_linear_backward(nullptr, &dw1, dh, xp, w1, cnt, ops::GradMode::Overwrite);
       }, reps), 2.0 * Mr * C * 2 * F);
  Tensor dx = Tensor::empty({N, C}, bf, Device::CUDA);
  p.op("moe_permute_backward", median_ms([&] { ops::moe_permute_backward(dx, dxp, r2s, k); }, reps));
  Tensor dlogits = Tensor::empty({N, E}, f32, Device::CUDA);
  p.op("moe_router_backward", median_ms([&] { ops::moe_router_backward(dlogits, dweights, scores, choice, spec); }, reps));
  p.op("moe_aux_loss_backward",
       median_ms([&] { ops::moe_aux_loss_backward(dlogits, scores, choice, 1, 1e-2, false, 1.0); }, reps));
  Tensor dxb = Tensor::empty({N, C}, bf, Device::CUDA);
  p.op("router backward (linear_backward_wide)",
       median_ms([&] { ops::linear_backward_wide(&dxb, &dwr, dlogits, x, wrb); }, reps), 4.0 * N * C * E);
  p.op("router dx add", median_ms([&] { ops::add_(dx, dxb); }, reps));
  std::printf("BENCH %-14s %s moe layer forward %.3f ms, backward %.3f ms, total %.3f ms (x 12 layers: %.1f ms)\n",
              config, padded ? "[padded]" : "[exact] ", fwd, p.total - fwd, p.total, 12 * p.total);
}
// The padded layout's GEMMs at every shape it can meet at moe-64x-top8's sizes (C 1024, F 512): b experts of m
// rows each (m a multiple of kPadRows), scattered over E = 64 like a run of equal region sizes (pointer-array
// batched calls). Per shape and product: the first call's wall time (host clock, synchronized: cuBLAS's heuristics
// and any kernel load on first use) and the median of the next calls (device events). Lines "SWEEP product m b
// first_ms median_ms TFLOP/s"; a shape whose rate falls far below its neighbours' or whose first call costs
// milliseconds shows here.
void sweep_padded_gemms() {
  const int64_t E = 64, C = 1024, F = 512, maxb = 13, maxm = 16384;
  const DType bf = DType::BF16, f32 = DType::F32;
  const Tensor w1 = dev_rand({E, 2 * F, C}, bf, 3, 0.02), w2 = dev_rand({E, C, F}, bf, 4, 0.02);
  Tensor dw1 = Tensor::zeros({E, 2 * F, C}, f32, Device::CUDA), dw2 = Tensor::zeros({E, C, F}, f32, Device::CUDA);
  const Tensor xbuf = dev_rand({maxb * maxm, C}, bf, 1), hbuf = dev_rand({maxb * maxm, F}, bf, 5);
  Tensor obuf = Tensor::empty({maxb * maxm, C}, bf, Device::CUDA), dbuf = Tensor::empty({maxb * maxm, C}, bf, Device::CUDA);
  std::vector<int64_t> ms;
  for (int64_t m = ops::kPadRows; m <= 8192; m += ops::kPadRows) ms.push_back(m);
  for (int64_t m : {10240, 12288, 16384}) ms.push_back(m);
  double first_excess = 0, worst_first = 0;
  int slow_firsts = 0;
  for (int64_t b : {1, 2, 3, 5, 8, 13}) {
    for (int64_t m : ms) {
      std::vector<int64_t> cnt(E, 0);
      for (int64_t i = 0; i < b; ++i) cnt[(i * 37 + i * i) % E] = m;  // b distinct, unevenly spaced experts
      const int64_t rows = b * m;
      const Tensor x = xbuf.slice(0, rows), h = hbuf.slice(0, rows);
      Tensor o = obuf.slice(0, rows), dx = dbuf.slice(0, rows);
      const double f1 = 2.0 * rows * C * 2 * F, f2 = 2.0 * rows * F * C;
      struct P { const char* name; double flops; std::function<void()> fn; };
      const P products[] = {
          {"fc1_fwd", f1, [&] { ops::moe_grouped_linear_forward(o, x, w1, cnt); }},
          {"fc2_fwd", f2, [&] { ops::moe_grouped_linear_forward(o, h, w2, cnt); }},
          {"fc1_dx", f1, [&] { ops::moe_grouped_linear_backward(&dx, nullptr, o, x, w1, cnt); }},
          {"fc1_dw", f1, [&] { ops::moe_grouped_linear_backward(nullptr, &dw1, o, x, w1, cnt); }},
          {"fc2_dw", f2, [&] { ops::moe_grouped_linear_backward(nullptr, &dw2, o, h, w2, cnt); }},
      };
      for (const P& p : products) {
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        const auto t0 = std::chrono::steady_clock::now();
        p.fn();
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        const double first = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        const double med = median_ms(p.fn, 3);
        first_excess += first - med;
        worst_first = std::max(worst_first, first - med);
        slow_firsts += first - med > 1.0;
        std::printf("SWEEP %-8s %6lld %3lld %8.3f %8.3f %7.1f\n", p.name, (long long)m, (long long)b, first, med,
                    p.flops / med * 1e-9);
      }
    }
  }
  std::printf("SWEEP summary: first calls cost %.1f ms over their medians in all (worst %.2f ms, %d over 1 ms)\n",
              first_excess, worst_first, slow_firsts);
}

// The expert GEMMs of one layer at the configs' shapes (every expert 16384 x k / E rows, the padded layout's
// balanced case), each product 400 times back to back and then the six in a layer's order 100 times: long enough
// for the GPU to reach its power limit, where the step runs (the medians of 10 above run at a higher clock).
// Lines "SUSTAINED config product ms"; sample the SM clock and power beside it (nvidia-smi) to see the limit.
void sustained_expert_gemms(const char* config, int64_t E, int64_t k, int64_t F) {
  const int64_t C = 1024, M = 8 * 2048 * k;
  const DType bf = DType::BF16, f32 = DType::F32;
  const std::vector<int64_t> cnt(size_t(E), M / E);
  const Tensor xp = dev_rand({M, C}, bf, 1), w1 = dev_rand({E, 2 * F, C}, bf, 3, 0.02);
  const Tensor w2 = dev_rand({E, C, F}, bf, 4, 0.02), a = dev_rand({M, F}, bf, 5), dyp = dev_rand({M, C}, bf, 6);
  const Tensor dh = dev_rand({M, 2 * F}, bf, 7);
  Tensor h = Tensor::empty({M, 2 * F}, bf, Device::CUDA), yp = Tensor::empty({M, C}, bf, Device::CUDA);
  Tensor da = Tensor::empty({M, F}, bf, Device::CUDA), dxp = Tensor::empty({M, C}, bf, Device::CUDA);
  Tensor dw1 = Tensor::zeros({E, 2 * F, C}, f32, Device::CUDA), dw2 = Tensor::zeros({E, C, F}, f32, Device::CUDA);
  using ops::GradMode;
  const std::pair<const char*, std::function<void()>> products[] = {
      {"fc1_forward", [&] { ops::moe_grouped_linear_forward(h, xp, w1, cnt); }},
      {"fc2_forward", [&] { ops::moe_grouped_linear_forward(yp, a, w2, cnt); }},
      {"fc2_dx", [&] { ops::moe_grouped_linear_backward(&da, nullptr, dyp, a, w2, cnt, GradMode::Accumulate); }},
      {"fc2_dweight", [&] { ops::moe_grouped_linear_backward(nullptr, &dw2, dyp, a, w2, cnt, GradMode::Overwrite); }},
      {"fc1_dx", [&] { ops::moe_grouped_linear_backward(&dxp, nullptr, dh, xp, w1, cnt, GradMode::Accumulate); }},
      {"fc1_dweight", [&] { ops::moe_grouped_linear_backward(nullptr, &dw1, dh, xp, w1, cnt, GradMode::Overwrite); }},
  };
  const auto timed_ms = [](const std::function<void()>& fn, int reps) {
    cudaEvent_t e0, e1;
    REQUIRE(cudaEventCreate(&e0) == cudaSuccess);
    REQUIRE(cudaEventCreate(&e1) == cudaSuccess);
    REQUIRE(cudaEventRecord(e0, mt::cuda::current_stream()) == cudaSuccess);
    for (int r = 0; r < reps; ++r) fn();
    REQUIRE(cudaEventRecord(e1, mt::cuda::current_stream()) == cudaSuccess);
    REQUIRE(cudaEventSynchronize(e1) == cudaSuccess);
    float ms = 0;
    REQUIRE(cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return double(ms) / reps;
  };
  for (const auto& [name, fn] : products) {
    for (int w = 0; w < 20; ++w) fn();
    std::printf("SUSTAINED %-14s %-12s %8.4f ms\n", config, name, timed_ms(fn, 400));
  }
  const double layer = timed_ms([&] { for (const auto& p : products) p.second(); }, 100);
  std::printf("SUSTAINED %-14s %-12s %8.4f ms (the six in order)\n", config, "layer", layer);
}
}  // namespace

TEST_CASE("cuda moe expert GEMMs at the power limit", "[.bench][cuda][moe-sustained]") {
  init();
  sustained_expert_gemms("moe-8x-top2", 8, 2, 3584);
  sustained_expert_gemms("moe-64x-top8", 64, 8, 512);
}

TEST_CASE("cuda moe padded gemm shape sweep", "[.bench][cuda][moe-sweep]") {
  init();
  sweep_padded_gemms();
}

TEST_CASE("cuda moe layer op timings", "[.bench][cuda][moe]") {
  init();
  for (bool padded : {false, true}) {
    bench_moe_layer("moe-8x-top2", 8, 2, 3584, padded);
    bench_moe_layer("moe-64x-top8", 64, 8, 512, padded);
    bench_moe_layer("moe-64x-collapsed", 64, 8, 512, padded, 8.0);  // expert 0 takes every token (max / mean 8)
    bench_moe_layer("moe-8x-collapsed", 8, 2, 3584, padded, 8.0);   // expert 0 takes every token (max / mean 4)
  }
}

#endif
