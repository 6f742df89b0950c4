// Activations on CUDA, fp32 math (the CPU reference of tensor/cpu/activation.cpp gives the derivations).
// GELU, tanh approximation, through s = sigmoid(2u) = 0.5 (1 + tanh u), u = k (x + a x^3):
//   y = x s,   dy/dx = s + 2 x s (1 - s) k (1 + 3 a x^2).          Any shape, n elements.
// SwiGLU: inp (N, 2F) = [gate | up] per row, out (N, F) = silu(g) u, s = sigmoid(g):
//   dgate = dout u s (1 + g (1 - s)),   dup = dout g s.   dinp (N, 2F) is overwritten.
// linear_backward_swiglu: the llama MLP's fc2 backward without fc2's input a = swiglu(h): da = dout W (GEMM), then
//   one pass over h writes dh and recomputes a (the forward's expression, so the same bits), then dW += dout^T a
//   (dW, db: fp32 or bf16, as linear_backward_cuda).
//   a is never kept between forward and backward: the pass costs one extra write of (N, F).
// Memory-bound: GELU through launch_map (16-byte accesses); SwiGLU by rows (swiglu_rows_kernel), 16-byte
// chunks when F and the pointers allow, else one column at a time.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <type_traits>

#include "cuda/cuda_ops.h"
#include "cuda/kernel_utils.cuh"
#include "cuda/swiglu_math.cuh"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {

constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
constexpr float kGeluA = 0.044715f;

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

// SwiGLU kernels walk rows: a block holds R rows side by side, each taken by tpr threads (R tpr <= kThreads;
// R = 1, tpr = kThreads for long rows); block (x, y) covers columns [x * tpr * kUnroll * VEC, ...) of rows
// y R + r, (y + gridDim.y) R + r, ...; each thread kUnroll chunks of VEC columns, tpr * VEC apart (coalesced),
// every load of a row issued before its math (more bytes in flight per thread than one chunk at a time, no index
// division). Short rows (moe-64x-top8's experts: F 512, 64 chunks) otherwise left 3/4 of a block idle (1.9 TB/s).
// Blocks stop at kSwiBlocksPerSM per multiprocessor and walk rows (H200, session 16: the SwiGLU backward with
// recompute 5-6% faster than a block per row at F 512, 3584 and 8192; 4 and 8 per SM within 1% of 16).
constexpr int kSwiThreads = 256, kSwiUnroll = 2, kSwiBlocksPerSM = 16;

// g, u: the row's gate and up halves (N, 2F); o: the output row (N, F).
template <int VEC, typename D>
struct SwigluForward {
  D* __restrict__ out;
  const D* __restrict__ inp;
  struct Regs { D g[VEC], u[VEC]; };
  __device__ void load(Regs& r, int64_t n, int64_t F, int64_t f) const {
    load_vec<VEC>(r.g, inp + n * 2 * F + f);
    load_vec<VEC>(r.u, inp + n * 2 * F + F + f);
  }
  __device__ void finish(const Regs& r, int64_t n, int64_t F, int64_t f, uint32_t& m) const {
    D o[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float gf = to_float(r.g[k]);
      o[k] = from_float<D>(swiglu_value<D>(gf, to_float(r.u[k])));
      m = max(m, abs_bits(to_float(o[k])));
    }
    store_vec<VEC>(out + n * F + f, o);
  }
};

// kRecompute: also out (N, F) = swiglu(inp), the forward's expression (same bits). A thread reads its inp
// elements before writing the same elements of dinp, so dinp may alias inp (no __restrict__ on those two).
template <bool kRecompute, int VEC, typename D>
struct SwigluBackward {
  D* dinp;
  D* __restrict__ out;
  const D* __restrict__ dout;
  const D* inp;
  struct Regs { D g[VEC], u[VEC], dy[VEC]; };
  __device__ void load(Regs& r, int64_t n, int64_t F, int64_t f) const {
    load_vec<VEC>(r.g, inp + n * 2 * F + f);
    load_vec<VEC>(r.u, inp + n * 2 * F + F + f);
    load_vec<VEC>(r.dy, dout + n * F + f);
  }
  __device__ void finish(const Regs& r, int64_t n, int64_t F, int64_t f, uint32_t& m) const {
    D dg[VEC], du[VEC], o[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      float dgf, duf, af;
      swiglu_grads<D>(to_float(r.dy[k]), to_float(r.g[k]), to_float(r.u[k]), dgf, duf, af);
      dg[k] = from_float<D>(dgf);
      du[k] = from_float<D>(duf);
      m = max(m, max(abs_bits(to_float(dg[k])), abs_bits(to_float(du[k]))));
      if constexpr (kRecompute) o[k] = from_float<D>(af);
    }
    store_vec<VEC>(dinp + n * 2 * F + f, dg);
    store_vec<VEC>(dinp + n * 2 * F + F + f, du);
    if constexpr (kRecompute) store_vec<VEC>(out + n * F + f, o);
  }
};

template <int VEC, bool kAmax, typename Op>
__global__ void __launch_bounds__(kSwiThreads) swiglu_rows_kernel(Op op, int64_t N, int64_t F, int tpr, float* amax) {
  const int R = kSwiThreads / tpr, r = int(threadIdx.x) / tpr, t = int(threadIdx.x) % tpr;
  const int64_t f0 = (int64_t(blockIdx.x) * kSwiUnroll * tpr + t) * VEC;
  uint32_t m = 0;  // max |written value| bits (the FP8 amax; unused, so optimized out, when amax is null)
  if (r < R)  // (threads past R rows: none when tpr divides kSwiThreads)
    for (int64_t n = int64_t(blockIdx.y) * R + r; n < N; n += int64_t(gridDim.y) * R) {
      typename Op::Regs regs[kSwiUnroll];
#pragma unroll
      for (int k = 0; k < kSwiUnroll; ++k) {
        const int64_t f = f0 + int64_t(k) * tpr * VEC;
        if (f < F) op.load(regs[k], n, F, f);
      }
#pragma unroll
      for (int k = 0; k < kSwiUnroll; ++k) {
        const int64_t f = f0 + int64_t(k) * tpr * VEC;
        if (f < F) op.finish(regs[k], n, F, f, m);
      }
    }
  if constexpr (kAmax) block_amax_to(amax, m);
}

// 16-byte chunks when F is a multiple of the vector width and every pointer is 16-byte aligned.
template <typename D>
bool swiglu_vec_ok(int64_t F, std::initializer_list<const void*> ptrs) {
  constexpr int kVec = 16 / sizeof(D);
  if (F % kVec != 0) return false;
  for (const void* p : ptrs)
    if (p && !aligned(p, 16)) return false;
  return true;
}

// Runs the op make_op.template operator()<VEC>() returns over (N, F): VEC = 16 bytes of D when vec, else 1.
// amax (if set) = max |x| over the values the op writes (the FP8 amax of its output: tensorwise scaling).
template <typename D, typename MakeOp>
void swiglu_launch(const char* what, bool vec, int64_t N, int64_t F, MakeOp make_op, float* amax = nullptr) {
  cudaStream_t s = current_stream();
  if (amax) MT_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), s));
  if (N * F == 0) return;
  constexpr int kVec = 16 / sizeof(D);
  const int v = vec ? kVec : 1;
  // threads per row: enough warps for the row's chunks at kSwiUnroll each, at most the block
  const int64_t per_thread = int64_t(v) * kSwiUnroll;
  const int tpr = int(std::min<int64_t>(kSwiThreads, ceil_div(ceil_div(F, per_thread), int64_t{32}) * 32));
  const int R = kSwiThreads / tpr;
  // about kSwiBlocksPerSM blocks per multiprocessor in all, each walking rows (one row per block: 5-6% slower)
  const int64_t gx = ceil_div(F, per_thread * tpr);
  const int64_t gy = std::min<int64_t>({ceil_div(N, int64_t{R}), 65535,
                                        std::max<int64_t>(1, int64_t(kSwiBlocksPerSM) * context().sm_count / gx)});
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  if (vec && amax)
    swiglu_rows_kernel<kVec, true><<<grid, kSwiThreads, 0, s>>>(make_op.template operator()<kVec>(), N, F, tpr, amax);
  else if (vec)
    swiglu_rows_kernel<kVec, false><<<grid, kSwiThreads, 0, s>>>(make_op.template operator()<kVec>(), N, F, tpr, amax);
  else if (amax)
    swiglu_rows_kernel<1, true><<<grid, kSwiThreads, 0, s>>>(make_op.template operator()<1>(), N, F, tpr, amax);
  else
    swiglu_rows_kernel<1, false><<<grid, kSwiThreads, 0, s>>>(make_op.template operator()<1>(), N, F, tpr, amax);
  MT_CUDA_CHECK_LAUNCH(what);
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
void swiglu_forward_cuda(T* out, const T* inp, int64_t N, int64_t F, float* out_amax) {
  using D = dev_t<T>;
  swiglu_launch<D>(
      "swiglu_forward_cuda", swiglu_vec_ok<D>(F, {out, inp}), N, F,
      [&]<int V>() { return SwigluForward<V, D>{dev(out), dev(inp)}; }, out_amax);
}

namespace {
// out: null, or (N, F) to receive swiglu(inp) recomputed in the same pass; amax: of dinp, if set.
template <typename T>
void swiglu_backward_launch(const char* what, T* dinp, T* out, const T* dout, const T* inp, int64_t N, int64_t F,
                            float* amax = nullptr) {
  using D = dev_t<T>;
  const bool vec = swiglu_vec_ok<D>(F, {dinp, out, dout, inp});
  if (out)
    swiglu_launch<D>(what, vec, N, F,
                     [&]<int V>() { return SwigluBackward<true, V, D>{dev(dinp), dev(out), dev(dout), dev(inp)}; },
                     amax);
  else
    swiglu_launch<D>(what, vec, N, F,
                     [&]<int V>() { return SwigluBackward<false, V, D>{dev(dinp), dev(out), dev(dout), dev(inp)}; },
                     amax);
}
}  // namespace

template <typename T>
void swiglu_backward_cuda(T* dinp, const T* dout, const T* inp, int64_t N, int64_t F, float* dinp_amax) {
  swiglu_backward_launch<T>("swiglu_backward_cuda", dinp, nullptr, dout, inp, N, F, dinp_amax);
}

template <typename T>
void swiglu_backward_recompute_cuda(T* dinp, T* out, const T* dout, const T* inp, int64_t N, int64_t F) {
  swiglu_backward_launch<T>("swiglu_backward_recompute_cuda", dinp, out, dout, inp, N, F);
}

template <typename T, typename G>
void linear_backward_swiglu_cuda(T* dh, G* dweight, G* dbias, const T* dout, const T* weight, const T* h, int64_t N,
                                 int64_t F, int64_t OC, bool accumulate_dweight) {
  if (N == 0 || F == 0) {
    linear_backward_cuda<T, G>(nullptr, dweight, nullptr, dout, h, weight, N, F, OC, false, accumulate_dweight);
    return;
  }
  Scratch a(sizeof(T) * static_cast<size_t>(N * F));
  {
    Scratch da(sizeof(T) * static_cast<size_t>(N * F));  // back to the cache before the dweight GEMM
    linear_backward_cuda<T, float>(da.as<T>(), nullptr, nullptr, dout, nullptr, weight, N, F, OC, false);
    swiglu_backward_launch<T>("linear_backward_swiglu_cuda", dh, a.as<T>(), da.as<T>(), h, N, F);
  }
  linear_backward_cuda<T, G>(nullptr, dweight, dbias, dout, a.as<T>(), weight, N, F, OC, false, accumulate_dweight);
}

#define MT_INSTANTIATE(T)                                                          \
  template void gelu_forward_cuda<T>(T*, const T*, int64_t);                                                   \
  template void gelu_backward_cuda<T>(T*, const T*, const T*, int64_t);                                        \
  template void swiglu_forward_cuda<T>(T*, const T*, int64_t, int64_t, float*);                                \
  template void swiglu_backward_cuda<T>(T*, const T*, const T*, int64_t, int64_t, float*);                     \
  template void swiglu_backward_recompute_cuda<T>(T*, T*, const T*, const T*, int64_t, int64_t);
MT_INSTANTIATE(float)
MT_INSTANTIATE(mt::bf16)
MT_INSTANTIATE(mt::f16)
#undef MT_INSTANTIATE
#define MT_INSTANTIATE_GRAD(T, G)                                                                               \
  template void linear_backward_swiglu_cuda<T, G>(T*, G*, G*, const T*, const T*, const T*, int64_t, int64_t,     \
                                                  int64_t, bool);
MT_CUDA_GRAD_TYPES(MT_INSTANTIATE_GRAD)
#undef MT_INSTANTIATE_GRAD

}  // namespace mt::ops::cuda
