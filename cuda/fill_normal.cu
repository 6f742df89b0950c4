// Standard-normal fill on CUDA with the counter-based generator of core/counter_rng.h, the CPU reference's lines
// (tensor/cpu/fill_normal.cpp):
//   out[i] = normal01_keyed(key(seed, stream), offset + i)   rounded to T (bf16 / fp16: through fp32)
// The stream key is computed once on the host; each element hashes its own counter (rng::bits64_keyed) and takes
// Box-Muller in fp64. The hash and the uniforms are integer and exact arithmetic, so only CUDA's fp64 log and cos
// (within 1 and 2 ulp, where the host's libm is within 1) can make the fp64 value differ from the CPU's, by a few fp64
// ulps: an fp32 result then differs only when that value lies within them of an fp32 rounding boundary, about one
// value in 10^8. Any shape, n elements; no input; 16-byte stores.
#include "cuda/cuda_ops.h"
#include "cuda/kernel_utils.cuh"
#include "core/counter_rng.h"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {

template <typename D>
struct NormalOp {
  uint64_t key, offset;
  __device__ D operator()(int64_t i, None, None) const {
    return from_float<D>(static_cast<float>(rng::normal01_keyed(key, offset + static_cast<uint64_t>(i))));
  }
};

}  // namespace

template <typename T>
void fill_normal_cuda(T* out, int64_t n, uint64_t seed, uint64_t stream, uint64_t offset) {
  using D = dev_t<T>;
  launch_map("fill_normal_cuda", n, NormalOp<D>{rng::key(seed, stream), offset}, dev(out));
}

template void fill_normal_cuda<float>(float*, int64_t, uint64_t, uint64_t, uint64_t);
template void fill_normal_cuda<mt::bf16>(mt::bf16*, int64_t, uint64_t, uint64_t, uint64_t);
template void fill_normal_cuda<mt::f16>(mt::f16*, int64_t, uint64_t, uint64_t, uint64_t);

}  // namespace mt::ops::cuda
