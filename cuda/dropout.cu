// Dropout on CUDA with the counter-based mask of tensor/cpu/counter_rng.h, bit-identical to the CPU:
//   keep[i] = uniform01(seed, kDropoutStream, offset + i) >= p     (SplitMix64 hash, 53-bit uniform)
//   forward:  out[i] = keep[i] ? inp[i] / (1 - p) : 0;   backward: the same map on dout (same mask).
// The stream key mix64(mix64(seed) + kDropoutStream) is computed once on the host; each element then
// hashes key + (offset + i + 1) * kGolden (rng::bits64_keyed), exactly rng::bits64. The scale multiply is done
// in fp64 as on the CPU, so fp32 outputs are bit-identical too. Any shape, n elements; 16-byte accesses.
#include "cuda/cuda_ops.h"
#include "cuda/kernel_utils.cuh"
#include "core/counter_rng.h"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {

template <typename D>
struct DropoutOp {
  uint64_t key, offset;
  double p, keep_scale;
  __device__ D operator()(int64_t i, D x, None) const {
    const uint64_t bits = rng::bits64_keyed(key, offset + static_cast<uint64_t>(i));
    const bool keep = rng::bits_to_unit(bits) >= p;
    return keep ? from_float<D>(static_cast<float>(static_cast<double>(to_float(x)) * keep_scale)) : from_float<D>(0.f);
  }
};

template <typename T>
void dropout_apply(const char* what, T* out, const T* inp, int64_t n, double p, uint64_t seed, uint64_t offset) {
  using D = dev_t<T>;
  const DropoutOp<D> op{rng::key(seed, rng::kDropoutStream), offset, p, p < 1.0 ? 1.0 / (1.0 - p) : 0.0};
  launch_map(what, n, op, dev(out), dev(inp));
}

}  // namespace

template <typename T>
void dropout_forward_cuda(T* out, const T* inp, int64_t n, double p, uint64_t seed, uint64_t offset) {
  dropout_apply("dropout_forward_cuda", out, inp, n, p, seed, offset);
}

template <typename T>
void dropout_backward_cuda(T* dinp, const T* dout, int64_t n, double p, uint64_t seed, uint64_t offset) {
  dropout_apply("dropout_backward_cuda", dinp, dout, n, p, seed, offset);
}

#define MT_INSTANTIATE(T)                                                                   \
  template void dropout_forward_cuda<T>(T*, const T*, int64_t, double, uint64_t, uint64_t); \
  template void dropout_backward_cuda<T>(T*, const T*, int64_t, double, uint64_t, uint64_t);
MT_INSTANTIATE(float)
MT_INSTANTIATE(mt::bf16)
MT_INSTANTIATE(mt::f16)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cuda
