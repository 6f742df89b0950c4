// Rotary position embedding arithmetic shared by the RoPE kernels (rope.cu) and the fused
// qkv split + RoPE kernels (qkv_split.cu): the angles of VEC consecutive pair indices of one
// position, and the rotation of the pairs (a[j], b[j]) = (x[i0 + j], x[i0 + j + D/2]).
#pragma once

#include "cuda/kernel_utils.cuh"
#include "tensor/rope_params.h"

namespace mt::cuda {

// c[j] = cos(p * f_j), s[j] = sign * sin(p * f_j), f_j = theta^(-2 (i0 + j) / Dh) (Llama-3 rescaled when
// rope.scaling: tensor/rope_params.h), in fp64 (the angles of long sequences need it), stored as float.
template <int VEC>
__device__ __forceinline__ void rope_angles(float* c, float* s, double p, int64_t i0, int64_t Dh, double log_theta,
                                            const RopeParams& rope, float sign) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const double inv_freq =
        rope_scale_inv_freq(exp(-2.0 * static_cast<double>(i0 + j) / static_cast<double>(Dh) * log_theta), rope);
    double sd, cd;
    sincos(p * inv_freq, &sd, &cd);
    c[j] = static_cast<float>(cd);
    s[j] = sign * static_cast<float>(sd);
  }
}

// (a, b) <- (a c - b s, b c + a s), element-wise, in fp32.
template <int VEC, typename D>
__device__ __forceinline__ void rope_rotate(D* a, D* b, const float* c, const float* s) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float x1 = to_float(a[j]), x2 = to_float(b[j]);
    a[j] = from_float<D>(x1 * c[j] - x2 * s[j]);
    b[j] = from_float<D>(x2 * c[j] + x1 * s[j]);
  }
}

}  // namespace mt::cuda
