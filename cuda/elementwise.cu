// Elementwise ops on CUDA: fill, add, add_, scale, cast, copy, sum_squares_into, sum_each, gather_scalars. Any
// shape, n = numel.
//   fill: x = value   add: out = a + b (out may alias a or b)   scale: x *= s   cast: out = convert(in)
//   Arithmetic in fp32 (bf16 rounds once, to nearest even, on store); fp32 results are bit-identical
//   to the CPU reference's (same single operation per element).
//   sum_squares = sum_i x_i^2 in fp64, in two passes with a fixed grid: kSumBlocks blocks stride over
//   the input (thread t of block b always reads the same elements for a given n), each block reduces
//   its threads in a fixed tree and writes one partial; one block then adds the partials in a fixed
//   tree. Same input, same bits, on every run.
// Memory-bound: 16-byte accesses where the pointers allow (kernel_utils.cuh launch_map).
#include <algorithm>
#include <cmath>

#include "cuda/cuda_ops.h"
#include "cuda/kernel_utils.cuh"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {

constexpr int kSumBlocks = 1024;  // fixed: the reduction order depends on n only
constexpr int kSumThreads = 256;

template <typename D>
struct FillOp {
  D v;
  __device__ D operator()(int64_t, None, None) const { return v; }
};
template <typename D>
struct AddOp {
  __device__ D operator()(int64_t, D a, D b) const { return from_float<D>(to_float(a) + to_float(b)); }
};
template <typename D>
struct ScaleOp {
  float s;
  __device__ D operator()(int64_t, D a, None) const { return from_float<D>(to_float(a) * s); }
};
template <typename To, typename From>
struct CastOp {
  __device__ To operator()(int64_t, From a, None) const { return from_float<To>(to_float(a)); }
};

template <typename D>
__global__ void sum_squares_kernel_partials(double* partial, const D* x, int64_t n) {
  __shared__ double scratch[32];
  double acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double v = to_float(x[i]);
    acc += v * v;
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// The block's sum of x[0, n) (thread 0 gets it): thread t adds elements t, t + blockDim.x, ... in order, then
// block_sum's fixed tree.
__device__ __forceinline__ double block_strided_sum(const double* x, int64_t n) {
  __shared__ double scratch[32];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += x[i];
  return block_sum(acc, scratch);
}

__global__ void sum_squares_kernel_final(double* out, const double* partial, int count) {
  const double acc = block_strided_sum(partial, count);
  if (threadIdx.x == 0) *out = acc;
}

// out[i] = *in[i]: one-element tensors gathered for one copy to the host (tensor/scalar_read.h).
constexpr int kMaxScalars = 128;
struct ScalarPtrs {
  const void* p[kMaxScalars];
};
template <typename T>
__global__ void gather_scalars_kernel(T* out, const ScalarPtrs in, int n) {
  if (threadIdx.x < n) out[threadIdx.x] = *static_cast<const T*>(in.p[threadIdx.x]);
}

// out[i] = sum of in[i]'s n[i] values: block i strides over them (thread t: elements t, t + 256, ...), then a fixed
// tree (ops::sum_each).
constexpr int kMaxSums = 64;
struct SumInputs {
  const double* p[kMaxSums];
  int64_t n[kMaxSums];
};
__global__ void sum_each_kernel(double* out, const SumInputs in) {
  const double acc = block_strided_sum(in.p[blockIdx.x], in.n[blockIdx.x]);
  if (threadIdx.x == 0) out[blockIdx.x] = acc;
}

}  // namespace

// ---------------------------------------------------------------- launchers

template <typename T>
void fill_cuda(T* x, int64_t n, double value) {
  using D = dev_t<T>;
  launch_map("fill_cuda", n, FillOp<D>{from_float<D>(static_cast<float>(value))}, dev(x));
}

template <typename T>
void add_inplace_cuda(T* a, const T* b, int64_t n) {
  using D = dev_t<T>;
  launch_map("add_inplace_cuda", n, AddOp<D>{}, dev(a), dev(static_cast<const T*>(a)), dev(b));
}

template <typename T>
void add_cuda(T* out, const T* a, const T* b, int64_t n) {
  using D = dev_t<T>;
  launch_map("add_cuda", n, AddOp<D>{}, dev(out), dev(a), dev(b));
}

template <typename T>
void scale_cuda(T* x, int64_t n, double s) {
  using D = dev_t<T>;
  launch_map("scale_cuda", n, ScaleOp<D>{static_cast<float>(s)}, dev(x), dev(static_cast<const T*>(x)));
}

template <typename To, typename From>
void cast_cuda(To* out, const From* in, int64_t n) {
  launch_map("cast_cuda", n, CastOp<dev_t<To>, dev_t<From>>{}, dev(out), dev(in));
}

void copy_cuda(void* out, const void* in, size_t bytes) {
  if (bytes == 0 || out == in) return;
  MT_CUDA_CHECK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice, current_stream()));
}

template <typename T>
void sum_squares_into_cuda(double* out, const T* x, int64_t n) {
  cudaStream_t s = current_stream();
  if (n <= 0) {
    MT_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), s));
    return;
  }
  Scratch partials(sizeof(double) * kSumBlocks);
  double* buf = partials.as<double>();
  sum_squares_kernel_partials<<<kSumBlocks, kSumThreads, 0, s>>>(buf, dev(x), n);
  MT_CUDA_CHECK_LAUNCH("sum_squares_kernel_partials");
  sum_squares_kernel_final<<<1, 1024, 0, s>>>(out, buf, kSumBlocks);
  MT_CUDA_CHECK_LAUNCH("sum_squares_kernel_final");
}

void sum_each_cuda(double* out, const double* const* in, const int64_t* n, int64_t count) {
  for (int64_t first = 0; first < count; first += kMaxSums) {
    const int m = static_cast<int>(std::min<int64_t>(kMaxSums, count - first));
    SumInputs s{};
    for (int i = 0; i < m; ++i) s.p[i] = in[first + i], s.n[i] = n[first + i];
    sum_each_kernel<<<m, kSumThreads, 0, current_stream()>>>(out + first, s);
    MT_CUDA_CHECK_LAUNCH("sum_each_kernel");
  }
}

template <typename T>
void gather_scalars_cuda(T* out, const T* const* in, int64_t n) {
  for (int64_t first = 0; first < n; first += kMaxScalars) {
    const int m = static_cast<int>(std::min<int64_t>(kMaxScalars, n - first));
    ScalarPtrs p{};
    for (int i = 0; i < m; ++i) p.p[i] = in[first + i];
    gather_scalars_kernel<T><<<1, kMaxScalars, 0, current_stream()>>>(out + first, p, m);
    MT_CUDA_CHECK_LAUNCH("gather_scalars_kernel");
  }
}
template void gather_scalars_cuda<float>(float*, const float* const*, int64_t);
template void gather_scalars_cuda<double>(double*, const double* const*, int64_t);

#define MT_INSTANTIATE(T)                                      \
  template void fill_cuda<T>(T*, int64_t, double);             \
  template void add_inplace_cuda<T>(T*, const T*, int64_t);    \
  template void add_cuda<T>(T*, const T*, const T*, int64_t);  \
  template void scale_cuda<T>(T*, int64_t, double);            \
  template void sum_squares_into_cuda<T>(double*, const T*, int64_t);
MT_INSTANTIATE(float)
MT_INSTANTIATE(mt::bf16)
MT_INSTANTIATE(mt::f16)
#undef MT_INSTANTIATE

template void cast_cuda<float, mt::bf16>(float*, const mt::bf16*, int64_t);
template void cast_cuda<mt::bf16, float>(mt::bf16*, const float*, int64_t);
template void cast_cuda<float, mt::f16>(float*, const mt::f16*, int64_t);
template void cast_cuda<mt::f16, float>(mt::f16*, const float*, int64_t);

}  // namespace mt::ops::cuda
