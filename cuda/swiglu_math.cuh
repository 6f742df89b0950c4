// SwiGLU's elementwise math, one definition for every kernel that computes it (cuda/activation.cu's passes and
// the sm90 expert GEMM whose epilogue runs the SwiGLU backward, cuda/sm90/grouped_gemm.cu), so that both give the
// same bits. Every operation is rounded explicitly (no contraction left to the compiler, which may contract one
// instantiation and not another). fp32 math; s = sigmoid(g):
//   a = silu(g) u = g s u,   dgate = da u s (1 + g (1 - s)),   dup = da g s.
// Data type D picks the sigmoid: 16-bit types use the hardware's approximate exponential and reciprocal (a few fp32
// ulp, far below the rounding of a 16-bit result; in a GEMM's epilogue the math is on the critical path); fp32
// keeps the exact, overflow-safe form.
#pragma once

#include <type_traits>

namespace mt::cuda {

__device__ __forceinline__ float sigmoidf_stable(float g) {
  if (g >= 0.f) return 1.f / (1.f + expf(-g));
  const float e = expf(g);
  return e / (1.f + e);
}

// 1 / x to 1 ulp (the hardware's approximation; x >= 1 here, so flushing denormals changes nothing)
__device__ __forceinline__ float rcp_approx(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// Large |g| saturates correctly: exp -> inf gives 0, exp -> 0 gives 1.
template <typename D>
__device__ __forceinline__ float sigmoid_t(float g) {
  if constexpr (std::is_same_v<D, float>) return sigmoidf_stable(g);
  else return rcp_approx(__fadd_rn(1.f, __expf(-g)));
}

template <typename D>
__device__ __forceinline__ float swiglu_value(float g, float u) {
  return __fmul_rn(__fmul_rn(g, sigmoid_t<D>(g)), u);
}

// The gradients of a = swiglu(g, u) for da, and a itself (one sigmoid for the three).
template <typename D>
__device__ __forceinline__ void swiglu_grads(float da, float g, float u, float& dg, float& du, float& a) {
  const float s = sigmoid_t<D>(g);
  dg = __fmul_rn(__fmul_rn(__fmul_rn(da, u), s), __fmaf_rn(g, __fsub_rn(1.f, s), 1.f));
  du = __fmul_rn(__fmul_rn(da, g), s);
  a = __fmul_rn(__fmul_rn(g, s), u);
}

}  // namespace mt::cuda
