// Activations on CUDA, fp32 math (the CPU reference of tensor/cpu/activation.cpp gives the derivations).
// GELU, tanh approximation, through s = sigmoid(2u) = 0.5 (1 + tanh u), u = k (x + a x^3):
//   y = x s,   dy/dx = s + 2 x s (1 - s) k (1 + 3 a x^2).          Any shape, n elements.
// SwiGLU: inp (N, 2F) = [gate | up] per row, out (N, F) = silu(g) u, s = sigmoid(g):
//   dgate = dout u s (1 + g (1 - s)),   dup = dout g s.   dinp (N, 2F) is overwritten.
// linear_backward_swiglu: the llama MLP's fc2 backward without fc2's input a = swiglu(h): da = dout W (GEMM), then
//   one pass over h writes dh and recomputes a (the forward's expression, so the same bits), then dW += dout^T a.
//   a is never kept between forward and backward: the pass costs one extra write of (N, F).
// Memory-bound: GELU through launch_map (16-byte accesses); SwiGLU with VEC columns per thread when
// F and the pointers allow 16-byte accesses, else one column per thread.
#include <cmath>
#include <initializer_list>
#include <type_traits>

#include "cuda/cuda_ops.h"
#include "cuda/kernel_utils.cuh"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {

constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
constexpr float kGeluA = 0.044715f;

__device__ __forceinline__ float sigmoidf_stable(float g) {
  if (g >= 0.f) return 1.f / (1.f + expf(-g));
  const float e = expf(g);
  return e / (1.f + e);
}

// sigmoid in fp32 for data type D. bf16 / fp16 use the fast exponential and reciprocal (a few fp32 ulp, far
// below the rounding of a 16-bit result; ~3x fewer instructions, which the SwiGLU kernels were bound by);
// fp32 keeps the exact form. Large |g| saturates correctly: exp -> inf gives 0, exp -> 0 gives 1.
template <typename D>
__device__ __forceinline__ float sigmoid_t(float g) {
  if constexpr (std::is_same_v<D, float>) return sigmoidf_stable(g);
  else return __frcp_rn(1.f + __expf(-g));
}

template <typename D>
__device__ __forceinline__ float gelu_s(float x) {
  return sigmoid_t<D>(2.f * kSqrt2OverPi * (x + kGeluA * x * x * x));
}

template <typename D>
struct GeluForwardOp {
  __device__ D operator()(int64_t, D in, None) const {
    const float x = to_float(in);
    return from_float<D>(x * gelu_s<D>(x));
  }
};

template <typename D>
struct GeluBackwardOp {
  __device__ D operator()(int64_t, D dout, D in) const {
    const float x = to_float(in), s = gelu_s<D>(x);
    const float d = s + 2.f * x * s * (1.f - s) * kSqrt2OverPi * (1.f + 3.f * kGeluA * x * x);
    return from_float<D>(to_float(dout) * d);
  }
};

// One thread per VEC consecutive columns of one row (F % VEC == 0 when VEC > 1). I: the index type, 32-bit
// where N * F fits (its division by the row length is several times cheaper than a 64-bit one).
template <typename I, int VEC, typename D>
__global__ void swiglu_forward_kernel(D* out, const D* inp, I N, I F) {
  const I per_row = F / VEC, total = N * per_row, stride = I(gridDim.x) * blockDim.x;
  for (I idx = I(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const I n = idx / per_row, f = (idx % per_row) * VEC;
    D g[VEC], u[VEC], o[VEC];
    load_vec<VEC>(g, inp + n * 2 * F + f);
    load_vec<VEC>(u, inp + n * 2 * F + F + f);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float gf = to_float(g[k]);
      o[k] = from_float<D>(gf * sigmoid_t<D>(gf) * to_float(u[k]));
    }
    store_vec<VEC>(out + n * F + f, o);
  }
}

// kRecompute: also out (N, F) = swiglu(inp), the forward kernel's expression. Each thread reads its inp elements
// before writing the same elements of dinp, so dinp may alias inp.
template <bool kRecompute, typename I, int VEC, typename D>
__global__ void swiglu_backward_kernel(D* dinp, D* out, const D* dout, const D* inp, I N, I F) {
  const I per_row = F / VEC, total = N * per_row, stride = I(gridDim.x) * blockDim.x;
  for (I idx = I(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const I n = idx / per_row, f = (idx % per_row) * VEC;
    D g[VEC], u[VEC], dy[VEC], dg[VEC], du[VEC], o[VEC];
    load_vec<VEC>(g, inp + n * 2 * F + f);
    load_vec<VEC>(u, inp + n * 2 * F + F + f);
    load_vec<VEC>(dy, dout + n * F + f);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float gf = to_float(g[k]), uf = to_float(u[k]), d = to_float(dy[k]), s = sigmoid_t<D>(gf);
      dg[k] = from_float<D>(d * uf * s * (1.f + gf * (1.f - s)));
      du[k] = from_float<D>(d * gf * s);
      if constexpr (kRecompute) o[k] = from_float<D>(gf * sigmoid_t<D>(gf) * uf);  // the forward's expression
    }
    store_vec<VEC>(dinp + n * 2 * F + f, dg);
    store_vec<VEC>(dinp + n * 2 * F + F + f, du);
    if constexpr (kRecompute) store_vec<VEC>(out + n * F + f, o);
  }
}

// 16-byte path when F is a multiple of the vector width and every pointer is 16-byte aligned.
template <typename D>
bool swiglu_vec_ok(int64_t F, std::initializer_list<const void*> ptrs) {
  constexpr int kVec = 16 / sizeof(D);
  if (F % kVec != 0) return false;
  for (const void* p : ptrs)
    if (!aligned(p, 16)) return false;
  return true;
}

}  // namespace

// ---------------------------------------------------------------- launchers

template <typename T>
void gelu_forward_cuda(T* out, const T* inp, int64_t n) {
  using D = dev_t<T>;
  launch_map("gelu_forward_cuda", n, GeluForwardOp<D>{}, dev(out), dev(inp));
}

template <typename T>
void gelu_backward_cuda(T* dinp, const T* dout, const T* inp, int64_t n) {
  using D = dev_t<T>;
  launch_map("gelu_backward_cuda", n, GeluBackwardOp<D>{}, dev(dinp), dev(dout), dev(inp));
}

template <typename T>
void swiglu_forward_cuda(T* out, const T* inp, int64_t N, int64_t F) {
  using D = dev_t<T>;
  if (N * F == 0) return;
  constexpr int kVec = 16 / sizeof(D), kThreads = 256;
  cudaStream_t s = current_stream();
  const bool vec = swiglu_vec_ok<D>(F, {out, inp});
  const unsigned grid = grid_for(vec ? N * F / kVec : N * F, kThreads);
  // 32-bit indices while every intermediate (up to 2 N F, plus a grid stride) stays below 2^31
  const bool small = 2 * N * F + int64_t(grid) * kThreads < (int64_t(1) << 31);
  if (vec && small)
    swiglu_forward_kernel<int32_t, kVec><<<grid, kThreads, 0, s>>>(dev(out), dev(inp), int32_t(N), int32_t(F));
  else if (vec)
    swiglu_forward_kernel<int64_t, kVec><<<grid, kThreads, 0, s>>>(dev(out), dev(inp), N, F);
  else
    swiglu_forward_kernel<int64_t, 1><<<grid, kThreads, 0, s>>>(dev(out), dev(inp), N, F);
  MT_CUDA_CHECK_LAUNCH("swiglu_forward_cuda");
}

namespace {
// out: null, or (N, F) to receive swiglu(inp) recomputed in the same pass.
template <typename T>
void swiglu_backward_launch(const char* what, T* dinp, T* out, const T* dout, const T* inp, int64_t N, int64_t F) {
  using D = dev_t<T>;
  if (N * F == 0) return;
  constexpr int kVec = 16 / sizeof(D), kThreads = 256;
  cudaStream_t s = current_stream();
  const bool vec = swiglu_vec_ok<D>(F, {dinp, dout, inp}) && (!out || aligned(out, 16));
  const unsigned grid = grid_for(vec ? N * F / kVec : N * F, kThreads);
  const bool small = 2 * N * F + int64_t(grid) * kThreads < (int64_t(1) << 31);  // as in the forward
  const int32_t n32 = static_cast<int32_t>(small ? N : 0), f32 = static_cast<int32_t>(small ? F : 0);
  if (out && vec && small)
    swiglu_backward_kernel<true, int32_t, kVec><<<grid, kThreads, 0, s>>>(dev(dinp), dev(out), dev(dout), dev(inp),
                                                                         n32, f32);
  else if (out && vec)
    swiglu_backward_kernel<true, int64_t, kVec><<<grid, kThreads, 0, s>>>(dev(dinp), dev(out), dev(dout), dev(inp),
                                                                         N, F);
  else if (out)
    swiglu_backward_kernel<true, int64_t, 1><<<grid, kThreads, 0, s>>>(dev(dinp), dev(out), dev(dout), dev(inp), N, F);
  else if (vec && small)
    swiglu_backward_kernel<false, int32_t, kVec><<<grid, kThreads, 0, s>>>(dev(dinp), dev(out), dev(dout), dev(inp),
                                                                          n32, f32);
  else if (vec)
    swiglu_backward_kernel<false, int64_t, kVec><<<grid, kThreads, 0, s>>>(dev(dinp), dev(out), dev(dout), dev(inp),
                                                                          N, F);
  else
    swiglu_backward_kernel<false, int64_t, 1><<<grid, kThreads, 0, s>>>(dev(dinp), dev(out), dev(dout), dev(inp), N, F);
  MT_CUDA_CHECK_LAUNCH(what);
}
}  // namespace

template <typename T>
void swiglu_backward_cuda(T* dinp, const T* dout, const T* inp, int64_t N, int64_t F) {
  swiglu_backward_launch<T>("swiglu_backward_cuda", dinp, nullptr, dout, inp, N, F);
}

template <typename T>
void linear_backward_swiglu_cuda(T* dh, float* dweight, float* dbias, const T* dout, const T* weight, const T* h,
                                 int64_t N, int64_t F, int64_t OC) {
  if (N == 0 || F == 0) return;
  Scratch a(sizeof(T) * static_cast<size_t>(N * F));
  {
    Scratch da(sizeof(T) * static_cast<size_t>(N * F));  // back to the cache before the dweight GEMM
    linear_backward_cuda<T>(da.as<T>(), nullptr, nullptr, dout, nullptr, weight, N, F, OC, false);
    swiglu_backward_launch<T>("linear_backward_swiglu_cuda", dh, a.as<T>(), da.as<T>(), h, N, F);
  }
  linear_backward_cuda<T>(nullptr, dweight, dbias, dout, a.as<T>(), weight, N, F, OC, false);
}

#define MT_INSTANTIATE(T)                                                          \
  template void gelu_forward_cuda<T>(T*, const T*, int64_t);                                                   \
  template void gelu_backward_cuda<T>(T*, const T*, const T*, int64_t);                                        \
  template void swiglu_forward_cuda<T>(T*, const T*, int64_t, int64_t);                                        \
  template void swiglu_backward_cuda<T>(T*, const T*, const T*, int64_t, int64_t);                             \
  template void linear_backward_swiglu_cuda<T>(T*, float*, float*, const T*, const T*, const T*, int64_t, int64_t, \
                                               int64_t);
MT_INSTANTIATE(float)
MT_INSTANTIATE(mt::bf16)
MT_INSTANTIATE(mt::f16)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cuda
