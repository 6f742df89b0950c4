// MoE routing map, permute and unpermute on CUDA (tensor/cpu/moe_permute.cpp has the math). Gathers only: each
// output row is written by one block, a token's slots summed in slot order (deterministic, no atomics).
// The routing map runs one thread per expert over the slots in order (tokens ascend inside an expert by
// construction): O(E * N * k) simple work, small next to the expert GEMMs at the sizes we train.
#include "cuda/kernel_utils.cuh"
#include "cuda/moe_cuda.h"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {
constexpr int kThreads = 128;

__global__ void counts_kernel(int32_t* counts, const int32_t* indices, int64_t slots, int64_t E) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= E) return;
  int32_t c = 0;
  for (int64_t s = 0; s < slots; ++s) c += indices[s] == e;
  counts[e] = c;
}

// thread e: its rows start after the rows of the experts before it
__global__ void map_kernel(int32_t* slot_of_row, int32_t* row_of_slot, const int32_t* counts, const int32_t* indices,
                           int64_t slots, int64_t E) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= E) return;
  int64_t r = 0;
  for (int64_t x = 0; x < e; ++x) r += counts[x];
  int64_t total = r;
  for (int64_t x = e; x < E; ++x) total += counts[x];
  for (int64_t s = 0; s < slots; ++s) {
    const int32_t i = indices[s];
    if (i == e) {
      row_of_slot[s] = int32_t(r);
      slot_of_row[r] = int32_t(s);
      ++r;
    } else if (i < 0 && e == 0) {
      row_of_slot[s] = -1;
    }
  }
  if (e == 0)
    for (int64_t x = total; x < slots; ++x) slot_of_row[x] = -1;
}

template <typename D>
__global__ void permute_kernel(D* out, const D* x, const int32_t* slot_of_row, int64_t C, int64_t k) {
  const int64_t r = blockIdx.x;
  const D* src = x + int64_t(slot_of_row[r] / k) * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[r * C + c] = src[c];
}

template <typename D>
__global__ void permute_backward_kernel(D* dx, const D* dout, const int32_t* row_of_slot, int64_t C, int64_t k) {
  const int64_t n = blockIdx.x;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = row_of_slot[n * k + j];
      if (r >= 0) acc += to_float(dout[int64_t(r) * C + c]);
    }
    dx[n * C + c] = from_float<D>(acc);
  }
}

template <typename D>
__global__ void unpermute_kernel(D* y, const D* yp, const float* weights, const int32_t* row_of_slot, int64_t C,
                                 int64_t k) {
  const int64_t n = blockIdx.x;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = row_of_slot[n * k + j];
      if (r >= 0) acc += weights[n * k + j] * to_float(yp[int64_t(r) * C + c]);
    }
    y[n * C + c] = from_float<D>(acc);
  }
}

// block per slot: dyp[row] = w * dy[token]; dweights[slot] = <dy[token], yp[row]> (block reduction, fixed order)
template <typename D>
__global__ void unpermute_backward_kernel(D* dyp, float* dweights, const D* dy, const D* yp, const float* weights,
                                          const int32_t* row_of_slot, int64_t C, int64_t k) {
  __shared__ float red[kThreads];
  const int64_t s = blockIdx.x, n = s / k;
  const int32_t r = row_of_slot[s];
  if (r < 0) {
    if (threadIdx.x == 0) dweights[s] = 0.f;
    return;
  }
  const float w = weights[s];
  float acc = 0.f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = to_float(dy[n * C + c]);
    acc += g * to_float(yp[int64_t(r) * C + c]);
    dyp[int64_t(r) * C + c] = from_float<D>(w * g);
  }
  red[threadIdx.x] = acc;
  __syncthreads();
  for (int h = kThreads / 2; h > 0; h /= 2) {
    if (int(threadIdx.x) < h) red[threadIdx.x] += red[threadIdx.x + h];
    __syncthreads();
  }
  if (threadIdx.x == 0) dweights[s] = red[0];
}
}  // namespace

void moe_expert_counts_cuda(int32_t* counts, const int32_t* indices, int64_t slots, int64_t E) {
  counts_kernel<<<unsigned(ceil_div(E, kThreads)), kThreads, 0, current_stream()>>>(counts, indices, slots, E);
  MT_CUDA_CHECK_LAUNCH("moe_expert_counts");
}

void moe_routing_map_cuda(int32_t* slot_of_row, int32_t* row_of_slot, int32_t* counts, const int32_t* indices,
                          int64_t slots, int64_t E) {
  moe_expert_counts_cuda(counts, indices, slots, E);
  map_kernel<<<unsigned(ceil_div(E, kThreads)), kThreads, 0, current_stream()>>>(slot_of_row, row_of_slot, counts,
                                                                                 indices, slots, E);
  MT_CUDA_CHECK_LAUNCH("moe_routing_map");
}

template <typename T>
void moe_permute_forward_cuda(T* out, const T* x, const int32_t* slot_of_row, int64_t M, int64_t C, int64_t k) {
  if (M == 0) return;
  permute_kernel<<<unsigned(M), kThreads, 0, current_stream()>>>(dev(out), dev(x), slot_of_row, C, k);
  MT_CUDA_CHECK_LAUNCH("moe_permute_forward");
}

template <typename T>
void moe_permute_backward_cuda(T* dx, const T* dout, const int32_t* row_of_slot, int64_t N, int64_t C, int64_t k) {
  if (N == 0) return;
  permute_backward_kernel<<<unsigned(N), kThreads, 0, current_stream()>>>(dev(dx), dev(dout), row_of_slot, C, k);
  MT_CUDA_CHECK_LAUNCH("moe_permute_backward");
}

template <typename T>
void moe_unpermute_forward_cuda(T* y, const T* yp, const float* weights, const int32_t* row_of_slot, int64_t N,
                                int64_t C, int64_t k) {
  if (N == 0) return;
  unpermute_kernel<<<unsigned(N), kThreads, 0, current_stream()>>>(dev(y), dev(yp), weights, row_of_slot, C, k);
  MT_CUDA_CHECK_LAUNCH("moe_unpermute_forward");
}

template <typename T>
void moe_unpermute_backward_cuda(T* dyp, float* dweights, const T* dy, const T* yp, const float* weights,
                                 const int32_t* row_of_slot, int64_t N, int64_t C, int64_t k) {
  if (N == 0) return;
  unpermute_backward_kernel<<<unsigned(N * k), kThreads, 0, current_stream()>>>(dev(dyp), dweights, dev(dy), dev(yp),
                                                                                weights, row_of_slot, C, k);
  MT_CUDA_CHECK_LAUNCH("moe_unpermute_backward");
}

#define MT_INSTANTIATE(T)                                                                                        \
  template void moe_permute_forward_cuda<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t);           \
  template void moe_permute_backward_cuda<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t);          \
  template void moe_unpermute_forward_cuda<T>(T*, const T*, const float*, const int32_t*, int64_t, int64_t,     \
                                              int64_t);                                                          \
  template void moe_unpermute_backward_cuda<T>(T*, float*, const T*, const T*, const float*, const int32_t*,    \
                                               int64_t, int64_t, int64_t);
MT_INSTANTIATE(float)
MT_INSTANTIATE(mt::bf16)
MT_INSTANTIATE(mt::f16)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cuda
