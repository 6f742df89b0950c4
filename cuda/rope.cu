// Rotary position embedding on CUDA, in place on x (B, T, heads, D), rotate-half convention
// (tensor/cpu/rope.cpp has the derivation). For p = positions(t) (core/rope_params.h) and i < D/2:
//   a = p * inv_freq_i, inv_freq_i = theta^(-2i/D) (Llama-3 rescaled when rope.scaling: tensor/rope_params.h);
//   (x1, x2) = (x[i], x[i + D/2]) -> (x1 cos a - x2 sin a, x2 cos a + x1 sin a)
// Backward rotates the gradient by -a (sin negated). As on the CPU the angle, cos and sin are computed
// in fp64 (an fp32 angle would be off by ~1e-4 rad at p ~ 2000) and applied in fp32.
// One thread per (token, VEC consecutive i): it computes its VEC (cos, sin) pairs once and applies
// them to every head of the token. VEC = 16 bytes of T when D/2 allows, else 1.
#include <cmath>

#include "cuda/cuda_ops.h"
#include "cuda/kernel_utils.cuh"
#include "cuda/rope_common.cuh"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {

template <int VEC, typename D>
__global__ void rope_kernel(D* x, int64_t BT, int64_t T_, int64_t heads, int64_t Dh, double log_theta,
                            RopeParams rope, RopePositions positions, float sign) {
  const int64_t half = Dh / 2, per_tok = half / VEC, total = BT * per_tok;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t bt = idx / per_tok, i0 = (idx % per_tok) * VEC;
    const double p = static_cast<double>(positions(bt % T_));
    float c[VEC], s[VEC];
    rope_angles<VEC>(c, s, p, i0, Dh, log_theta, rope, sign);
    for (int64_t h = 0; h < heads; ++h) {
      D* v = x + (bt * heads + h) * Dh + i0;
      D a[VEC], b[VEC];
      load_vec<VEC>(a, v);
      load_vec<VEC>(b, v + half);
      rope_rotate<VEC>(a, b, c, s);
      store_vec<VEC>(v, a);
      store_vec<VEC>(v + half, b);
    }
  }
}

template <typename T>
void rope_launch(const char* what, T* x, int64_t B, int64_t T_, int64_t heads, int64_t Dh, const RopeParams& rope,
                 RopePositions positions, float sign) {
  using D = dev_t<T>;
  const int64_t half = Dh / 2;
  if (B * T_ * heads * half == 0) return;
  constexpr int kVec = 16 / sizeof(D), kThreads = 256;
  cudaStream_t s = current_stream();
  // theta^(-2i/D) as exp(-2i/D ln theta): the CPU's pow(theta, -2i/D) to within an ulp of fp64.
  const double log_theta = std::log(rope.theta);
  if (half % kVec == 0 && aligned(x, 16))
    rope_kernel<kVec><<<grid_for(B * T_ * half / kVec, kThreads), kThreads, 0, s>>>(dev(x), B * T_, T_, heads, Dh,
                                                                                     log_theta, rope, positions, sign);
  else
    rope_kernel<1><<<grid_for(B * T_ * half, kThreads), kThreads, 0, s>>>(dev(x), B * T_, T_, heads, Dh, log_theta,
                                                                           rope, positions, sign);
  MT_CUDA_CHECK_LAUNCH(what);
}

}  // namespace

template <typename T>
void rope_forward_cuda(T* x, int64_t B, int64_t T_, int64_t heads, int64_t D, const RopeParams& rope,
                       RopePositions positions) {
  rope_launch("rope_forward_cuda", x, B, T_, heads, D, rope, positions, 1.f);
}

template <typename T>
void rope_backward_cuda(T* dx, int64_t B, int64_t T_, int64_t heads, int64_t D, const RopeParams& rope,
                        RopePositions positions) {
  rope_launch("rope_backward_cuda", dx, B, T_, heads, D, rope, positions, -1.f);
}

#define MT_INSTANTIATE(T)                                                                     \
  template void rope_forward_cuda<T>(T*, int64_t, int64_t, int64_t, int64_t, const RopeParams&, RopePositions); \
  template void rope_backward_cuda<T>(T*, int64_t, int64_t, int64_t, int64_t, const RopeParams&, RopePositions);
MT_INSTANTIATE(float)
MT_INSTANTIATE(mt::bf16)
MT_INSTANTIATE(mt::f16)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cuda
