// Token embedding on CUDA, vocab-parallel ready. tokens int32 (N); table (Vl, C) holds global rows
// [vocab_start, vocab_start + Vl).
//   forward:  out[n, :] = table[tok[n] - vocab_start, :] if the token is in the slice, else 0.
//   backward: dtable (fp32, or bf16: see below) [tok[n] - vocab_start, :] += dout[n, :] for tokens in the slice.
// The backward is deterministic with one owner per table row, no float atomics:
//   1. key[n] = tok[n] - vocab_start (Vl for tokens outside the slice), value[n] = n;
//   2. a stable radix sort of (key, value) pairs (cub), so equal tokens sit together in order of n;
//   3. one block per sorted position i and column block: if i starts a run of equal keys (and the key
//      is in the slice), the block sums dout rows of that run in order of n in fp32 and adds the sum to
//      dtable's row once (a bf16 dtable: row + sum in fp32, rounded once); other blocks exit at once.
// A run of r repeats costs one block r row reads; a very frequent token serializes on one block.
// Memory-bound: VEC columns per thread (16 bytes of dout) when C and the pointers allow.
#include <cub/device/device_radix_sort.cuh>

#include "cuda/cuda_ops.h"
#include "cuda/kernel_utils.cuh"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {

constexpr int kThreads = 128;

template <int VEC, typename D>
__global__ void embedding_forward_kernel(D* out, const int32_t* tokens, const D* table, int64_t N, int64_t Vl,
                                         int64_t C, int64_t vocab_start) {
  const int64_t per_row = C / VEC, total = N * per_row, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t n = idx / per_row, c = (idx % per_row) * VEC;
    const int64_t r = static_cast<int64_t>(tokens[n]) - vocab_start;
    D v[VEC];
    if (r >= 0 && r < Vl) {
      load_vec<VEC>(v, table + r * C + c);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[k] = from_float<D>(0.f);
    }
    store_vec<VEC>(out + n * C + c, v);
  }
}

__global__ void embedding_backward_kernel_keys(int32_t* keys, int32_t* values, const int32_t* tokens, int64_t N,
                                               int64_t Vl, int64_t vocab_start) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const int64_t r = static_cast<int64_t>(tokens[n]) - vocab_start;
  keys[n] = (r >= 0 && r < Vl) ? static_cast<int32_t>(r) : static_cast<int32_t>(Vl);
  values[n] = static_cast<int32_t>(n);
}

// grid (N, column blocks of kThreads * VEC). G: float or __nv_bfloat16.
template <int VEC, typename D, typename G>
__global__ void embedding_backward_kernel_runs(G* dtable, const D* dout, const int32_t* keys, const int32_t* rows,
                                               int64_t N, int64_t Vl, int64_t C) {
  const int64_t i = blockIdx.x;
  const int32_t key = keys[i];
  if (key >= Vl || (i > 0 && keys[i - 1] == key)) return;  // outside the slice, or not a run start
  const int64_t c = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * VEC;
  if (c >= C) return;
  float acc[VEC] = {};
  for (int64_t j = i; j < N && keys[j] == key; ++j) {
    D g[VEC];
    load_vec<VEC>(g, dout + static_cast<int64_t>(rows[j]) * C + c);
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[k] += to_float(g[k]);
  }
  G* dst = dtable + static_cast<int64_t>(key) * C + c;
  G cur[VEC];
  if constexpr (VEC % 4 == 0) {
    load_vec<VEC>(cur, dst);
#pragma unroll
    for (int k = 0; k < VEC; ++k) cur[k] = from_float<G>(to_float(cur[k]) + acc[k]);
    store_vec<VEC>(dst, cur);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) dst[k] = from_float<G>(to_float(dst[k]) + acc[k]);
  }
}

int bits_for(int64_t max_key) {
  int b = 1;
  while ((int64_t(1) << b) <= max_key) ++b;
  return b;
}

}  // namespace

// ---------------------------------------------------------------- launchers

template <typename T>
void embedding_forward_cuda(T* out, const int32_t* tokens, const T* table, int64_t N, int64_t Vl, int64_t C,
                            int64_t vocab_start) {
  using D = dev_t<T>;
  if (N * C == 0) return;
  constexpr int kVec = 16 / sizeof(D);
  cudaStream_t s = current_stream();
  if (C % kVec == 0 && aligned(out, 16) && aligned(table, 16))
    embedding_forward_kernel<kVec><<<grid_for(N * C / kVec, 256), 256, 0, s>>>(dev(out), tokens, dev(table), N, Vl,
                                                                                C, vocab_start);
  else
    embedding_forward_kernel<1><<<grid_for(N * C, 256), 256, 0, s>>>(dev(out), tokens, dev(table), N, Vl, C,
                                                                      vocab_start);
  MT_CUDA_CHECK_LAUNCH("embedding_forward_cuda");
}

template <typename T, typename G>
void embedding_backward_cuda(G* dtable, const T* dout, const int32_t* tokens, int64_t N, int64_t Vl, int64_t C,
                             int64_t vocab_start) {
  using D = dev_t<T>;
  if (N == 0 || C == 0) return;
  MT_CHECK(N < (int64_t(1) << 31) && Vl < (int64_t(1) << 31), "embedding_backward_cuda: N = ", N, " or Vl = ", Vl,
           " does not fit int32");
  cudaStream_t s = current_stream();
  const int nitems = static_cast<int>(N), end_bit = bits_for(Vl);
  size_t sort_bytes = 0;
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), nitems, 0, end_bit, s));
  const size_t arr = static_cast<size_t>(ceil_div(N * 4, 256) * 256);  // bytes per int32 array, padded
  Scratch scratch(4 * arr + sort_bytes);
  char* base = scratch.as<char>();
  int32_t* keys_in = reinterpret_cast<int32_t*>(base);
  int32_t* keys_out = reinterpret_cast<int32_t*>(base + arr);
  int32_t* vals_in = reinterpret_cast<int32_t*>(base + 2 * arr);
  int32_t* vals_out = reinterpret_cast<int32_t*>(base + 3 * arr);
  embedding_backward_kernel_keys<<<ceil_div(N, 256), 256, 0, s>>>(keys_in, vals_in, tokens, N, Vl, vocab_start);
  MT_CUDA_CHECK_LAUNCH("embedding_backward_kernel_keys");
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + 4 * arr, sort_bytes, keys_in, keys_out, vals_in, vals_out,
                                                nitems, 0, end_bit, s));
  constexpr int kVec = 16 / sizeof(D);
  if (C % kVec == 0 && aligned(dout, 16) && aligned(dtable, 16)) {
    const dim3 grid(static_cast<unsigned>(N), static_cast<unsigned>(ceil_div(C, kThreads * kVec)));
    embedding_backward_kernel_runs<kVec><<<grid, kThreads, 0, s>>>(dev(dtable), dev(dout), keys_out, vals_out, N, Vl,
                                                                   C);
  } else {
    const dim3 grid(static_cast<unsigned>(N), static_cast<unsigned>(ceil_div(C, kThreads)));
    embedding_backward_kernel_runs<1><<<grid, kThreads, 0, s>>>(dev(dtable), dev(dout), keys_out, vals_out, N, Vl, C);
  }
  MT_CUDA_CHECK_LAUNCH("embedding_backward_kernel_runs");
}

#define MT_INSTANTIATE(T)                                                                                         \
  template void embedding_forward_cuda<T>(T*, const int32_t*, const T*, int64_t, int64_t, int64_t, int64_t);
MT_INSTANTIATE(float)
MT_INSTANTIATE(mt::bf16)
MT_INSTANTIATE(mt::f16)
#undef MT_INSTANTIATE
#define MT_INSTANTIATE_GRAD(T, G) \
  template void embedding_backward_cuda<T, G>(G*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t);
MT_CUDA_GRAD_TYPES(MT_INSTANTIATE_GRAD)
#undef MT_INSTANTIATE_GRAD

}  // namespace mt::ops::cuda
