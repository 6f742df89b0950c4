// Vocab-parallel cross-entropy on CUDA (tensor/cpu/cross_entropy.cpp has the math). logits (N, Vl)
// in T, columns = global vocab ids [vocab_start, vocab_start + Vl), only the first n_valid real;
// targets int32 (N); all statistics fp32.
//   stats:    max(N) = max_v z_v, sumexp(N) = sum_v exp(z_v - max), target_logit(N) = z_t if t in the
//             slice else 0 (over the valid columns; no valid column: -inf and 0).
//   combine:  rescale sumexp to the global max, then lse = M + log(S) and loss = lse - target (fp64), per row.
//   backward: dlogits = (exp(z - lse[n]) - [v == t]) dloss[n], padding columns 0; may alias logits.
// One block per row; probabilities are never stored (the backward writes dlogits in place of them).
// Stats read the row once: each thread keeps an online (max, sum) pair, rescaling once per vector of
// VEC elements, and the pairs are merged across the block in a fixed order. 16-byte accesses when Vl
// and the pointers allow.
#include <cmath>

#include "cuda/cuda_ops.h"
#include "cuda/kernel_utils.cuh"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {

constexpr int kThreads = 512;

// Merges (m2, s2) into (m, s): the sum of exp(z - m) over the union.
__device__ __forceinline__ void merge_ms(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY) return;  // both empty
  s = s * expf(m - mn) + s2 * expf(m2 - mn);
  m = mn;
}

template <int VEC, typename D>
__global__ void cross_entropy_stats_kernel(float* max_out, float* sumexp_out, float* target_out, const D* logits,
                                           const int32_t* targets, int64_t Vl, int64_t vocab_start,
                                           int64_t n_valid) {
  __shared__ float sm[32], ss[32];
  const int64_t n = blockIdx.x;
  const D* z = logits + n * Vl;
  float m = -INFINITY, s = 0.f;
  const int64_t nv = n_valid / VEC * VEC;
  for (int64_t c = threadIdx.x * VEC; c < nv; c += blockDim.x * VEC) {
    D v[VEC];
    load_vec<VEC>(v, z + c);
    float f[VEC], vm = -INFINITY;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      f[k] = to_float(v[k]);
      vm = fmaxf(vm, f[k]);
    }
    const float mn = fmaxf(m, vm);
    float add = 0.f;
#pragma unroll
    for (int k = 0; k < VEC; ++k) add += expf(f[k] - mn);
    s = (m == -INFINITY ? 0.f : s * expf(m - mn)) + add;
    m = mn;
  }
  for (int64_t c = nv + threadIdx.x; c < n_valid; c += blockDim.x) merge_ms(m, s, to_float(z[c]), 1.f);
  // Merge across the warp, then across warps (fixed order).
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge_ms(m, s, m2, s2);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / 32;
    m = lane < warps ? sm[lane] : -INFINITY;
    s = lane < warps ? ss[lane] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
      merge_ms(m, s, m2, s2);
    }
    if (lane == 0) {
      max_out[n] = m;
      sumexp_out[n] = s;
      const int64_t t = static_cast<int64_t>(targets[n]) - vocab_start;
      target_out[n] = (t >= 0 && t < n_valid) ? to_float(z[t]) : 0.f;
    }
  }
}

template <int VEC, typename D>
__global__ void cross_entropy_backward_kernel(D* dlogits, const D* logits, const int32_t* targets, const float* lse,
                                              const float* dloss, int64_t Vl, int64_t vocab_start, int64_t n_valid) {
  const int64_t n = blockIdx.x;
  const D* z = logits + n * Vl;
  D* dz = dlogits + n * Vl;  // may be z: every element is read, then written, by one thread
  const float l = lse[n], g = dloss[n];
  const int64_t t = static_cast<int64_t>(targets[n]) - vocab_start;
  for (int64_t c = threadIdx.x * VEC; c < Vl; c += blockDim.x * VEC) {
    D v[VEC];
    load_vec<VEC>(v, z + c);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const int64_t col = c + k;
      const float p = col < n_valid ? expf(to_float(v[k]) - l) : 0.f;
      v[k] = from_float<D>(col < n_valid ? (p - (col == t ? 1.f : 0.f)) * g : 0.f);
    }
    store_vec<VEC>(dz + c, v);
  }
}

// The combine of the slices' statistics (one thread per row; cross_entropy.cpp has the math).
__global__ void cross_entropy_rescale_kernel(float* sumexp, const float* max, const float* gmax, int64_t N) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n < N) sumexp[n] = isinf(max[n]) ? 0.f : sumexp[n] * expf(max[n] - gmax[n]);
}

__global__ void cross_entropy_finish_kernel(float* lse, double* loss, const float* gmax, const float* sumexp,
                                            const float* target_logit, int64_t N) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  const float l = gmax[n] + logf(sumexp[n]);
  lse[n] = l;
  loss[n] = static_cast<double>(l) - static_cast<double>(target_logit[n]);
}

// acc[0] += sum of x, one block: each thread sums a fixed stride of x, then a fixed tree (the same bits every run).
__global__ void sum_accumulate_kernel(double* acc, const double* x, int64_t n) {
  __shared__ double part[kThreads];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) acc[0] += part[0];
}

}  // namespace

// ---------------------------------------------------------------- launchers

void cross_entropy_rescale_cuda(float* sumexp, const float* max, const float* gmax, int64_t N) {
  if (N == 0) return;
  const unsigned grid = static_cast<unsigned>((N + 255) / 256);
  cross_entropy_rescale_kernel<<<grid, 256, 0, current_stream()>>>(sumexp, max, gmax, N);
  MT_CUDA_CHECK_LAUNCH("cross_entropy_rescale_cuda");
}

void cross_entropy_finish_cuda(float* lse, double* loss, const float* gmax, const float* sumexp,
                               const float* target_logit, int64_t N) {
  if (N == 0) return;
  const unsigned grid = static_cast<unsigned>((N + 255) / 256);
  cross_entropy_finish_kernel<<<grid, 256, 0, current_stream()>>>(lse, loss, gmax, sumexp, target_logit, N);
  MT_CUDA_CHECK_LAUNCH("cross_entropy_finish_cuda");
}

void sum_accumulate_cuda(double* acc, const double* x, int64_t n) {
  if (n == 0) return;
  sum_accumulate_kernel<<<1, kThreads, 0, current_stream()>>>(acc, x, n);
  MT_CUDA_CHECK_LAUNCH("sum_accumulate_cuda");
}

template <typename T>
void cross_entropy_stats_cuda(float* max, float* sumexp, float* target_logit, const T* logits, const int32_t* targets,
                              int64_t N, int64_t Vl, int64_t vocab_start, int64_t n_valid) {
  using D = dev_t<T>;
  if (N == 0) return;
  constexpr int kVec = 16 / sizeof(D);
  cudaStream_t s = current_stream();
  const unsigned grid = static_cast<unsigned>(N);
  if (Vl % kVec == 0 && aligned(logits, 16))
    cross_entropy_stats_kernel<kVec><<<grid, kThreads, 0, s>>>(max, sumexp, target_logit, dev(logits), targets, Vl,
                                                               vocab_start, n_valid);
  else
    cross_entropy_stats_kernel<1><<<grid, kThreads, 0, s>>>(max, sumexp, target_logit, dev(logits), targets, Vl,
                                                            vocab_start, n_valid);
  MT_CUDA_CHECK_LAUNCH("cross_entropy_stats_cuda");
}

template <typename T>
void cross_entropy_backward_cuda(T* dlogits, const T* logits, const int32_t* targets, const float* lse,
                                 const float* dloss, int64_t N, int64_t Vl, int64_t vocab_start, int64_t n_valid) {
  using D = dev_t<T>;
  if (N == 0 || Vl == 0) return;
  constexpr int kVec = 16 / sizeof(D);
  cudaStream_t s = current_stream();
  const unsigned grid = static_cast<unsigned>(N);
  if (Vl % kVec == 0 && aligned(logits, 16) && aligned(dlogits, 16))
    cross_entropy_backward_kernel<kVec><<<grid, kThreads, 0, s>>>(dev(dlogits), dev(logits), targets, lse, dloss, Vl,
                                                                  vocab_start, n_valid);
  else
    cross_entropy_backward_kernel<1><<<grid, kThreads, 0, s>>>(dev(dlogits), dev(logits), targets, lse, dloss, Vl,
                                                               vocab_start, n_valid);
  MT_CUDA_CHECK_LAUNCH("cross_entropy_backward_cuda");
}

#define MT_INSTANTIATE(T)                                                                                      \
  template void cross_entropy_stats_cuda<T>(float*, float*, float*, const T*, const int32_t*, int64_t, int64_t, \
                                            int64_t, int64_t);                                                 \
  template void cross_entropy_backward_cuda<T>(T*, const T*, const int32_t*, const float*, const float*, int64_t, \
                                               int64_t, int64_t, int64_t);
MT_INSTANTIATE(float)
MT_INSTANTIATE(mt::bf16)
MT_INSTANTIATE(mt::f16)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cuda
