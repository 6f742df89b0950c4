// Device helpers shared by the kernel families: host <-> device element types, float conversion,
// vector loads/stores (16 bytes where alignment allows), warp/block reductions with a fixed order
// (so that results are bit-reproducible), grid sizing, and a generic elementwise "map" kernel.
// Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <type_traits>
#include <unordered_map>

#include "cuda/cuda_check.h"
#include "cuda/cuda_context.h"
#include "core/dtype.h"
#include "core/allocator.h"

namespace mt::cuda {

// ---------------------------------------------------------------- element types
// Host element types (float, mt::bf16, mt::f16) map to device ones (float, __nv_bfloat16, __half):
// same bits.
template <typename T> struct DevTypeOf { using type = T; };
template <> struct DevTypeOf<mt::bf16> { using type = __nv_bfloat16; };
template <> struct DevTypeOf<mt::f16> { using type = __half; };
template <typename T> using dev_t = typename DevTypeOf<T>::type;
static_assert(sizeof(mt::bf16) == sizeof(__nv_bfloat16));
static_assert(sizeof(mt::f16) == sizeof(__half));

template <typename T>
dev_t<T>* dev(T* p) { return reinterpret_cast<dev_t<T>*>(p); }
template <typename T>
const dev_t<T>* dev(const T* p) { return reinterpret_cast<const dev_t<T>*>(p); }

__host__ __device__ __forceinline__ float to_float(float x) { return x; }
__host__ __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__host__ __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <typename T> __host__ __device__ __forceinline__ T from_float(float x);
template <> __host__ __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __host__ __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <> __host__ __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

// ---------------------------------------------------------------- vector access
// VEC consecutive elements, moved as 16-byte (or 8/4-byte) words. The pointer must be aligned to
// vec_align<T, VEC>() bytes (launchers check with aligned()).
template <typename T, int VEC>
constexpr int vec_align() {
  return VEC * sizeof(T) >= 16 ? 16 : VEC * static_cast<int>(sizeof(T));
}
template <typename T, int VEC>
struct alignas(vec_align<T, VEC>()) Vec {
  T v[VEC];
};

template <int VEC, typename T>
__device__ __forceinline__ void load_vec(T (&dst)[VEC], const T* p) {
  if constexpr (VEC * sizeof(T) <= 16) {
    const auto w = *reinterpret_cast<const Vec<T, VEC>*>(p);
#pragma unroll
    for (int i = 0; i < VEC; ++i) dst[i] = w.v[i];
  } else {
    constexpr int kPer = 16 / sizeof(T);
#pragma unroll
    for (int c = 0; c < VEC / kPer; ++c) {
      const auto w = *reinterpret_cast<const Vec<T, kPer>*>(p + c * kPer);
#pragma unroll
      for (int i = 0; i < kPer; ++i) dst[c * kPer + i] = w.v[i];
    }
  }
}

template <int VEC, typename T>
__device__ __forceinline__ void store_vec(T* p, const T (&src)[VEC]) {
  if constexpr (VEC * sizeof(T) <= 16) {
    Vec<T, VEC> w;
#pragma unroll
    for (int i = 0; i < VEC; ++i) w.v[i] = src[i];
    *reinterpret_cast<Vec<T, VEC>*>(p) = w;
  } else {
    constexpr int kPer = 16 / sizeof(T);
#pragma unroll
    for (int c = 0; c < VEC / kPer; ++c) {
      Vec<T, kPer> w;
#pragma unroll
      for (int i = 0; i < kPer; ++i) w.v[i] = src[c * kPer + i];
      *reinterpret_cast<Vec<T, kPer>*>(p + c * kPer) = w;
    }
  }
}

inline bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
// The largest power of two <= 16 dividing p's address (the alignment cuBLASLt's preferences ask for).
inline int alignment_of(const void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  int a = 16;
  while (a > 1 && u % a != 0) a /= 2;
  return a;
}

// ---------------------------------------------------------------- reductions (fixed order)
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 values; the function synchronizes before returning so it can be reused.
template <typename T>
__device__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T r = lane < warps ? scratch[lane] : T(0);
  r = warp_sum(r);
  __syncthreads();
  return r;
}

// ---------------------------------------------------------------- amax (max |x|) on float bits
// Non-negative floats order as unsigned ints, so max |x| is a max over the bits with the sign cleared (a NaN,
// above +inf, propagates) and an atomicMax on an fp32 amax's bits (FP8 scaling: tensor/fp8/fp8_ops.h).
__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }
__device__ __forceinline__ uint32_t warp_max_u(uint32_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Max over the block (blockDim a multiple of 32); every thread gets it. scratch: 32 entries.
__device__ __forceinline__ uint32_t block_max_u(uint32_t v, uint32_t* scratch) {
  const int tid = threadIdx.x + threadIdx.y * blockDim.x, lane = tid % 32, warp = tid / 32;
  const int warps = (blockDim.x * blockDim.y) / 32;
  v = warp_max_u(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  uint32_t r = lane < warps ? scratch[lane] : 0u;
  r = warp_max_u(r);
  __syncthreads();
  return r;
}
// *amax = max(*amax, the block's max bits v): every thread of the block calls it.
__device__ __forceinline__ void block_amax_to(float* amax, uint32_t v) {
  __shared__ uint32_t scratch[32];
  v = block_max_u(v, scratch);
  if (threadIdx.x == 0 && threadIdx.y == 0) atomicMax(reinterpret_cast<unsigned int*>(amax), v);
}

// ---------------------------------------------------------------- partial sums (fixed order)
// out[c] += sum_{r < rows} in[r * C + c] for every column c < C, deterministic: a block owns 32
// columns (one per lane) and kGroups row groups (threadIdx.y); group y adds rows y, y + kGroups, ... in
// order, then the group sums are added in y order. Coalesced 128-byte reads, ceil(C / 32) blocks: the
// per-column loop is rows / kGroups long (a one-thread-per-column loop over all rows is latency-bound).
// 8 groups; 32 when the columns give fewer than 128 blocks (most SMs idle) and there are many rows (the
// norms' backward at C = 1024: 32 blocks over ~1,700 partial rows, a chain of ~215 loads per thread).
// out is fp32 or bf16 (G): the += is done in fp32 and rounded once to G.
constexpr int kSumRowGroups = 8, kSumRowGroupsFew = 32;
template <int kGroups, typename G>
__global__ void sum_rows_accumulate_kernel(G* out, const float* in, int rows, int64_t C) {
  __shared__ float red[kGroups][33];
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  float acc = 0.f;
  if (c < C)
    for (int r = threadIdx.y; r < rows; r += kGroups) acc += in[int64_t(r) * C + c];
  red[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float s = 0.f;
#pragma unroll
    for (int y = 0; y < kGroups; ++y) s += red[y][threadIdx.x];
    out[c] = from_float<G>(to_float(out[c]) + s);
  }
}
// G: float or mt::bf16 (host or device element type).
template <typename G>
void sum_rows_accumulate(G* out, const float* in, int rows, int64_t C, cudaStream_t stream) {
  if (C == 0) return;
  const dim3 grid(static_cast<unsigned>((C + 31) / 32));
  auto* o = dev(out);
  if (grid.x < 128 && rows >= 4 * kSumRowGroupsFew)
    sum_rows_accumulate_kernel<kSumRowGroupsFew><<<grid, dim3(32, kSumRowGroupsFew), 0, stream>>>(o, in, rows, C);
  else
    sum_rows_accumulate_kernel<kSumRowGroups><<<grid, dim3(32, kSumRowGroups), 0, stream>>>(o, in, rows, C);
}

// ---------------------------------------------------------------- scratch memory
// Temporary device memory from the caching allocator (no cudaMalloc in a step). Freed when the
// object dies, possibly before the kernels using it have run: safe because every op runs on the one
// current stream, so the next user of the block is ordered after them.
class Scratch {
 public:
  explicit Scratch(size_t bytes) : bytes_(bytes == 0 ? 1 : bytes), p_(allocator_for(Device::CUDA)->allocate(bytes_)) {}
  ~Scratch() { allocator_for(Device::CUDA)->deallocate(p_, bytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }

 private:
  size_t bytes_;
  void* p_;
};

// ---------------------------------------------------------------- launch attributes
// Raises a kernel's dynamic shared memory limit to `bytes` (needed above 48 KiB), once per kernel.
template <typename Kernel>
void ensure_dynamic_smem(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return;
  static std::mutex mu;
  static std::unordered_map<const void*, size_t> done;
  std::lock_guard<std::mutex> lock(mu);
  size_t& have = done[reinterpret_cast<const void*>(kernel)];
  if (have >= bytes) return;
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  have = bytes;
}

// Blocks of `threads` threads with `smem` bytes of dynamic shared memory that fit on one SM (at least 1),
// queried once per kernel and size.
template <typename Kernel>
int blocks_per_sm(Kernel kernel, int threads, size_t smem) {
  static std::mutex mu;
  static std::unordered_map<const void*, std::unordered_map<size_t, int>> done;
  std::lock_guard<std::mutex> lock(mu);
  auto& per = done[reinterpret_cast<const void*>(kernel)];
  auto it = per.find(smem * 4096 + static_cast<size_t>(threads));
  if (it != per.end()) return it->second;
  int n = 0;
  MT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
  return per[smem * 4096 + static_cast<size_t>(threads)] = n < 1 ? 1 : n;
}

// ---------------------------------------------------------------- grids
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Blocks for a grid-stride loop over `work` items with `threads` per block: enough to fill the GPU.
inline unsigned grid_for(int64_t work, int threads) {
  const int64_t want = ceil_div(work, threads), cap = int64_t(context().sm_count) * 16;
  return static_cast<unsigned>(want < 1 ? 1 : (want < cap ? want : cap));
}

// ---------------------------------------------------------------- generic elementwise map
// out[i] = op(i, a[i], b[i]) for i < n, with up to two inputs (None: absent). Each thread handles VEC
// consecutive elements per step with vector loads/stores; the n % VEC tail goes element by element.
// Op is a functor struct (no extended lambdas) with a __device__ operator()(int64_t, A, B) -> Out.
struct None {};

template <int VEC, typename Op, typename Out, typename A, typename B>
__global__ void map_kernel(int64_t n, Op op, Out* out, const A* a, const B* b) {
  const int64_t chunks = n / VEC, stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t c = tid; c < chunks; c += stride) {
    const int64_t i0 = c * VEC;
    A va[VEC];
    B vb[VEC];
    if constexpr (!std::is_same_v<A, None>) load_vec<VEC>(va, a + i0);
    if constexpr (!std::is_same_v<B, None>) load_vec<VEC>(vb, b + i0);
    Out r[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) r[k] = op(i0 + k, va[k], vb[k]);
    store_vec<VEC>(out + i0, r);
  }
  for (int64_t i = chunks * VEC + tid; i < n; i += stride) {
    A va{};
    B vb{};
    if constexpr (!std::is_same_v<A, None>) va = a[i];
    if constexpr (!std::is_same_v<B, None>) vb = b[i];
    out[i] = op(i, va, vb);
  }
}

template <typename T, int VEC>
bool vec_ok(const T* p) {
  if constexpr (std::is_same_v<T, None>) return true;
  else return aligned(p, vec_align<T, VEC>());
}

// Launches map_kernel on the current stream: 16-byte accesses of `out` when every pointer allows.
template <typename Op, typename Out, typename A = None, typename B = None>
void launch_map(const char* what, int64_t n, const Op& op, Out* out, const A* a = nullptr, const B* b = nullptr) {
  if (n <= 0) return;
  constexpr int kVec = 16 / sizeof(Out);
  constexpr int kThreads = 256;
  cudaStream_t s = current_stream();
  if (vec_ok<Out, kVec>(out) && vec_ok<A, kVec>(a) && vec_ok<B, kVec>(b))
    map_kernel<kVec><<<grid_for(ceil_div(n, kVec), kThreads), kThreads, 0, s>>>(n, op, out, a, b);
  else
    map_kernel<1><<<grid_for(n, kThreads), kThreads, 0, s>>>(n, op, out, a, b);
  MT_CUDA_CHECK_LAUNCH(what);
}

}  // namespace mt::cuda
