// Elementwise ops on CUDA: fill, add, add_, scale, cast, copy, sum_squares. Any shape, n = numel.
//   fill: x = value   add: out = a + b (out may alias a or b)   scale: x *= s   cast: out = convert(in)
//   Arithmetic in fp32 (bf16 rounds once, to nearest even, on store); fp32 results are bit-identical
//   to the CPU reference's (same single operation per element).
//   sum_squares = sum_i x_i^2 in fp64, in two passes with a fixed grid: kSumBlocks blocks stride over
//   the input (thread t of block b always reads the same elements for a given n), each block reduces
//   its threads in a fixed tree and writes one partial; one block then adds the partials in a fixed
//   tree. Same input, same bits, on every run.
// Memory-bound: 16-byte accesses where the pointers allow (kernel_utils.cuh launch_map).
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

__global__ void sum_squares_kernel_final(double* out, const double* partial, int count) {
  __shared__ double scratch[32];
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = acc;
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
double sum_squares_cuda(const T* x, int64_t n) {
  if (n <= 0) return 0.0;
  cudaStream_t s = current_stream();
  Scratch scratch(sizeof(double) * (kSumBlocks + 1));  // kSumBlocks partials + the result
  double* buf = scratch.as<double>();
  sum_squares_kernel_partials<<<kSumBlocks, kSumThreads, 0, s>>>(buf, dev(x), n);
  MT_CUDA_CHECK_LAUNCH("sum_squares_kernel_partials");
  sum_squares_kernel_final<<<1, 1024, 0, s>>>(buf + kSumBlocks, buf, kSumBlocks);
  MT_CUDA_CHECK_LAUNCH("sum_squares_kernel_final");
  double result = 0;
  MT_CUDA_CHECK(cudaMemcpyAsync(&result, buf + kSumBlocks, sizeof(double), cudaMemcpyDeviceToHost, s));
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
  return result;
}

#define MT_INSTANTIATE(T)                                      \
  template void fill_cuda<T>(T*, int64_t, double);             \
  template void add_inplace_cuda<T>(T*, const T*, int64_t);    \
  template void add_cuda<T>(T*, const T*, const T*, int64_t);  \
  template void scale_cuda<T>(T*, int64_t, double);            \
  template double sum_squares_cuda<T>(const T*, int64_t);
MT_INSTANTIATE(float)
MT_INSTANTIATE(mt::bf16)
MT_INSTANTIATE(mt::f16)
#undef MT_INSTANTIATE

template void cast_cuda<float, mt::bf16>(float*, const mt::bf16*, int64_t);
template void cast_cuda<mt::bf16, float>(mt::bf16*, const float*, int64_t);
template void cast_cuda<float, mt::f16>(float*, const mt::f16*, int64_t);
template void cast_cuda<mt::f16, float>(mt::f16*, const float*, int64_t);

}  // namespace mt::ops::cuda
