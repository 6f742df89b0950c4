// One MoE layer's expert path, forward and backward, op by op as MoELayer / Experts run it with one rank holding
// every expert (SwiGLU experts): routing map -> [padded layout] -> permute -> fc1 -> SwiGLU -> fc2 -> unpermute,
// then back. layout: the region sizes of the padded layout (ops::moe_pad_routing_map; on the GPU one batched GEMM
// per distinct size) as a function of the counts, or null for the exact groups. On any device and dtype (the inputs'),
// so a test can hold the padded path against the exact one on the CPU and on the GPU.
#pragma once

#include <algorithm>
#include <vector>

#include "tensor/moe_ops.h"
#include "tensor/ops.h"

namespace mt::test {

struct ExpertsPass {
  Tensor y, dx, dweights, dw1, dw2;  // layer output, input gradient, routing-weight gradient, expert weight grads
  int64_t rows = 0;                  // rows the experts ran (E * Mp when padded)
};

// idx (N, k) int32 (-1: dropped), x (N, C), weights (N, k) router dtype, w1 (E, 2F, C), w2 (E, C, F), dy (N, C);
// all on one device. Weight gradients are fp32 on the GPU, the activation dtype on the CPU.
using Layout = std::vector<int64_t> (*)(const std::vector<int64_t>& counts);
inline ExpertsPass run_experts_pass(Layout layout, const Tensor& idx, const Tensor& x, const Tensor& weights,
                                    const Tensor& w1, const Tensor& w2, const Tensor& dy) {
  const Device dev = x.device();
  const DType dt = x.dtype(), gdt = dev == Device::CUDA ? DType::F32 : dt;
  const int64_t N = x.size(0), C = x.size(1), k = idx.size(1), E = w1.size(0), F = w2.size(2);
  Tensor s2r = Tensor::empty({N * k}, DType::I32, dev), r2s = Tensor::empty({N * k}, DType::I32, dev);
  Tensor counts = Tensor::empty({E}, DType::I32, dev), host = Tensor::empty({E}, DType::I32);
  ops::moe_routing_map(s2r, r2s, counts, idx, E);
  host.copy_from(counts);
  std::vector<int64_t> cnt(host.data<int32_t>(), host.data<int32_t>() + E);
  int64_t M = 0;
  for (int64_t c : cnt) M += c;
  const bool padded = layout != nullptr;
  if (padded) {
    const std::vector<int64_t> regions = layout(cnt);
    M = 0;
    for (int64_t r : regions) M += r;
    M = ops::moe_alloc_rows(M) + 3;  // rows past the regions, as the layer allocates them (and then some)
    Tensor pad = Tensor::empty({M}, DType::I32, dev);
    ops::moe_pad_routing_map(pad, r2s, s2r, cnt, regions);
    s2r = pad;
    cnt = regions;
  }
  ExpertsPass out;
  out.rows = M;
  Tensor xp = Tensor::empty({M, C}, dt, dev), h = Tensor::empty({M, 2 * F}, dt, dev);
  Tensor a = Tensor::empty({M, F}, dt, dev), yp = Tensor::empty({M, C}, dt, dev);
  ops::moe_permute_forward(xp, x, s2r, k);
  ops::moe_grouped_linear_forward(h, xp, w1, cnt);
  ops::swiglu_forward(a, h);
  ops::moe_grouped_linear_forward(yp, a, w2, cnt);
  out.y = Tensor::empty({N, C}, dt, dev);
  ops::moe_unpermute_forward(out.y, yp, weights, r2s);

  Tensor dyp = Tensor::empty({M, C}, dt, dev);
  out.dweights = Tensor::empty({N, k}, weights.dtype(), dev);
  ops::moe_unpermute_backward(dyp, out.dweights, dy, yp, weights, r2s);
  if (padded) ops::moe_zero_unrouted_rows(dyp, s2r);
  out.dw2 = Tensor::empty(w2.shape(), gdt, dev);
  ops::moe_grouped_linear_backward_swiglu(h, &out.dw2, dyp, w2, h, cnt, ops::GradMode::Overwrite);  // dh over h
  Tensor dxp = Tensor::empty({M, C}, dt, dev);
  out.dw1 = Tensor::empty(w1.shape(), gdt, dev);
  ops::moe_grouped_linear_backward(&dxp, &out.dw1, h, xp, w1, cnt, ops::GradMode::Overwrite);
  out.dx = Tensor::empty({N, C}, dt, dev);
  ops::moe_permute_backward(out.dx, dxp, r2s, k);
  return out;
}

// A routing of N tokens over E >= 6 experts, top-2: expert 3 takes the first choice of 5/6 of the tokens (very
// unbalanced), expert 2 is never chosen (empty), the second choices spread over 0, 1, 4, 5; a few slots of the
// last tokens dropped (-1), as a capacity would.
inline Tensor unbalanced_routing(int64_t N) {
  Tensor idx = Tensor::empty({N, 2}, DType::I32);
  const int32_t others[4] = {0, 1, 4, 5};
  for (int64_t n = 0; n < N; ++n) {
    int32_t* r = idx.data<int32_t>() + n * 2;
    r[0] = n < N * 5 / 6 ? 3 : others[n % 4];
    r[1] = others[(n + 1) % 4];
    if (r[1] == r[0]) r[1] = others[(n + 2) % 4];
    if (n >= N - 3) r[n % 2] = -1;
  }
  return idx;
}

// Layouts: every expert padded to the largest count (equal regions: one strided batched GEMM); the largest expert
// its own region, the others (the empty one included) the largest of theirs (two sizes, the equal ones not evenly
// spaced: a batched GEMM on pointer arrays).
inline std::vector<int64_t> one_region(const std::vector<int64_t>& c) {
  return std::vector<int64_t>(c.size(), *std::max_element(c.begin(), c.end()));
}
inline std::vector<int64_t> two_regions(const std::vector<int64_t>& c) {
  const auto big = std::max_element(c.begin(), c.end()) - c.begin();
  int64_t rest = 0;
  for (size_t e = 0; e < c.size(); ++e)
    if (static_cast<int64_t>(e) != big) rest = std::max(rest, c[e]);
  std::vector<int64_t> r(c.size(), rest);
  r[static_cast<size_t>(big)] = c[static_cast<size_t>(big)];
  return r;
}

}  // namespace mt::test
