// One MoE layer's expert path, forward and backward, op by op as MoELayer / Experts run it with one rank holding
// every expert (SwiGLU experts): routing map -> [padded layout] -> permute -> fc1 -> SwiGLU -> fc2 -> unpermute,
// then back. padded: the layout of ops::moe_pad_routing_map (Mp = the largest count) with equal groups (one
// strided batched GEMM per projection on the GPU), else the exact groups. On any device and dtype (the inputs'),
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
inline ExpertsPass run_experts_pass(bool padded, const Tensor& idx, const Tensor& x, const Tensor& weights,
                                    const Tensor& w1, const Tensor& w2, const Tensor& dy) {
  const Device dev = x.device();
  const DType dt = x.dtype(), gdt = dev == Device::CUDA ? DType::F32 : dt;
  const int64_t N = x.size(0), C = x.size(1), k = idx.size(1), E = w1.size(0), F = w2.size(2);
  Tensor s2r = Tensor::empty({N * k}, DType::I32, dev), r2s = Tensor::empty({N * k}, DType::I32, dev);
  Tensor counts = Tensor::empty({E}, DType::I32, dev), host = Tensor::empty({E}, DType::I32);
  ops::moe_routing_map(s2r, r2s, counts, idx, E);
  host.copy_from(counts);
  std::vector<int64_t> cnt(host.data<int32_t>(), host.data<int32_t>() + E);
  int64_t M = 0, Mp = 0;
  for (int64_t c : cnt) M += c, Mp = std::max(Mp, c);
  if (padded) {
    Tensor pad = Tensor::empty({E * Mp}, DType::I32, dev);
    ops::moe_pad_routing_map(pad, r2s, s2r, counts, Mp);
    s2r = pad;
    M = E * Mp;
    cnt.assign(static_cast<size_t>(E), Mp);
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

// A routing of N tokens over E >= 6 experts, top-2: expert 0 takes the first choice of 5/6 of the tokens (very
// unbalanced), expert 2 is never chosen (empty), the second choices spread over 1, 3, 4, 5; a few slots of the
// last tokens dropped (-1), as a capacity would.
inline Tensor unbalanced_routing(int64_t N) {
  Tensor idx = Tensor::empty({N, 2}, DType::I32);
  const int32_t others[4] = {1, 3, 4, 5};
  for (int64_t n = 0; n < N; ++n) {
    int32_t* r = idx.data<int32_t>() + n * 2;
    r[0] = n < N * 5 / 6 ? 0 : others[n % 4];
    r[1] = others[(n + 1) % 4];
    if (r[1] == r[0]) r[1] = others[(n + 2) % 4];
    if (n >= N - 3) r[n % 2] = -1;
  }
  return idx;
}

}  // namespace mt::test
