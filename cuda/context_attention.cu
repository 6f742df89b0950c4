// What context-parallel attention adds on CUDA (ops.h attention_merge, seq_copy; the CPU reference in
// src/tensor/cpu/context_attention.cpp has the math). Merge: one thread per (b, t, h) row of the merged range,
// weights in fp32 from the fp32 log-sum-exps, out accumulated in fp32 and rounded once. seq_copy: one thread per
// element of the range (B x len x row), += in fp32 with accumulate.
#include <cmath>

#include "cuda/cuda_ops.h"
#include "cuda/kernel_utils.cuh"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {

template <typename D>
__global__ void attention_merge_kernel(D* out, float* lse, const D* part_out, const float* part_lse, int64_t B,
                                       int64_t T_, int64_t Tb, int64_t H, int64_t Dh, int64_t t0) {
  const int64_t total = B * Tb * H, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t h = idx % H, t = (idx / H) % Tb, b = idx / (H * Tb);
    float* l = lse + (b * H + h) * T_ + t0 + t;
    const float a = *l, p = part_lse[(b * H + h) * Tb + t];
    const float m = fmaxf(a, p);
    if (m == -INFINITY) continue;
    const float merged = m + logf(expf(a - m) + expf(p - m));
    const float wa = expf(a - merged), wp = expf(p - merged);
    D* o = out + ((b * T_ + t0 + t) * H + h) * Dh;
    const D* po = part_out + ((b * Tb + t) * H + h) * Dh;
    for (int64_t d = 0; d < Dh; ++d) o[d] = from_float<D>(to_float(o[d]) * wa + to_float(po[d]) * wp);
    *l = merged;
  }
}

template <typename D>
__global__ void seq_copy_kernel(D* dst, int64_t Td, int64_t dst_t, const D* src, int64_t Ts, int64_t src_t, int64_t B,
                                int64_t len, int64_t row, bool accumulate) {
  const int64_t per_b = len * row, total = B * per_b, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t b = idx / per_b, i = idx % per_b;
    D* d = dst + (b * Td + dst_t) * row + i;
    const D s = src[(b * Ts + src_t) * row + i];
    *d = accumulate ? from_float<D>(to_float(*d) + to_float(s)) : s;
  }
}

constexpr int kThreads = 256;

}  // namespace

template <typename T>
void attention_merge_cuda(T* out, float* lse, const T* part_out, const float* part_lse, int64_t B, int64_t T_,
                          int64_t Tb, int64_t H, int64_t D, int64_t t0) {
  if (B * Tb * H == 0) return;
  attention_merge_kernel<<<grid_for(B * Tb * H, kThreads), kThreads, 0, current_stream()>>>(
      dev(out), lse, dev(part_out), part_lse, B, T_, Tb, H, D, t0);
  MT_CUDA_CHECK_LAUNCH("attention_merge_cuda");
}

template <typename T>
void seq_copy_cuda(T* dst, int64_t Td, int64_t dst_t, const T* src, int64_t Ts, int64_t src_t, int64_t B, int64_t len,
                   int64_t row, bool accumulate) {
  if (B * len * row == 0) return;
  seq_copy_kernel<<<grid_for(B * len * row, kThreads), kThreads, 0, current_stream()>>>(
      dev(dst), Td, dst_t, dev(src), Ts, src_t, B, len, row, accumulate);
  MT_CUDA_CHECK_LAUNCH("seq_copy_cuda");
}

#define MT_INSTANTIATE(T)                                                                                          \
  template void attention_merge_cuda<T>(T*, float*, const T*, const float*, int64_t, int64_t, int64_t, int64_t,   \
                                        int64_t, int64_t);                                                        \
  template void seq_copy_cuda<T>(T*, int64_t, int64_t, const T*, int64_t, int64_t, int64_t, int64_t, int64_t, bool);
MT_INSTANTIATE(float)
MT_INSTANTIATE(mt::bf16)
MT_INSTANTIATE(mt::f16)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cuda
