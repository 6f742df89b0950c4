// QKV split on CUDA: qkv (B, T, G*(R+2)*D), R = H / G; per token, group g holds R query heads, then
// its key head, then its value head (Megatron's grouped layout):
//   q[bt, g R + r] = qkv[bt, g, r],  k[bt, g] = qkv[bt, g, R],  v[bt, g] = qkv[bt, g, R + 1]  (D each).
// Backward is the inverse gather (every dqkv element is exactly one dq/dk/dv element): dqkv is written,
// never accumulated. One kernel does both directions: each thread moves VEC elements of D (16 bytes
// when D and the pointers allow), walking the qkv layout.
#include "cuda/cuda_ops.h"
#include "cuda/kernel_utils.cuh"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {

// kForward: qkv -> q, k, v; else q, k, v -> qkv.
template <bool kForward, int VEC, typename D>
__global__ void qkv_split_kernel(D* qkv, D* q, D* k, D* v, int64_t BT, int64_t H, int64_t G, int64_t Dh) {
  const int64_t R = H / G, slots = R + 2, W = G * slots * Dh, per_tok = W / VEC, total = BT * per_tok;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t bt = idx / per_tok, e = (idx % per_tok) * VEC;
    const int64_t g = e / (slots * Dh), within = e % (slots * Dh), slot = within / Dh, d = within % Dh;
    D* other;
    if (slot < R) other = q + (bt * H + g * R + slot) * Dh + d;
    else if (slot == R) other = k + (bt * G + g) * Dh + d;
    else other = v + (bt * G + g) * Dh + d;
    D* packed = qkv + bt * W + e;
    D tmp[VEC];
    if constexpr (kForward) {
      load_vec<VEC>(tmp, packed);
      store_vec<VEC>(other, tmp);
    } else {
      load_vec<VEC>(tmp, other);
      store_vec<VEC>(packed, tmp);
    }
  }
}

template <bool kForward, typename T>
void qkv_launch(const char* what, T* qkv, T* q, T* k, T* v, const AttnShape& s) {
  using D = dev_t<T>;
  const int64_t total = s.B * s.T * s.G * (s.H / s.G + 2) * s.D;
  if (total == 0) return;
  constexpr int kVec = 16 / sizeof(D), kThreads = 256;
  cudaStream_t st = current_stream();
  const bool vec = s.D % kVec == 0 && aligned(qkv, 16) && aligned(q, 16) && aligned(k, 16) && aligned(v, 16);
  if (vec)
    qkv_split_kernel<kForward, kVec><<<grid_for(total / kVec, kThreads), kThreads, 0, st>>>(
        dev(qkv), dev(q), dev(k), dev(v), s.B * s.T, s.H, s.G, s.D);
  else
    qkv_split_kernel<kForward, 1><<<grid_for(total, kThreads), kThreads, 0, st>>>(dev(qkv), dev(q), dev(k), dev(v),
                                                                                   s.B * s.T, s.H, s.G, s.D);
  MT_CUDA_CHECK_LAUNCH(what);
}

}  // namespace

template <typename T>
void qkv_split_forward_cuda(T* q, T* k, T* v, const T* qkv, const AttnShape& s) {
  qkv_launch<true>("qkv_split_forward_cuda", const_cast<T*>(qkv), q, k, v, s);
}

template <typename T>
void qkv_split_backward_cuda(T* dqkv, const T* dq, const T* dk, const T* dv, const AttnShape& s) {
  qkv_launch<false>("qkv_split_backward_cuda", dqkv, const_cast<T*>(dq), const_cast<T*>(dk), const_cast<T*>(dv), s);
}

#define MT_INSTANTIATE(T)                                                                      \
  template void qkv_split_forward_cuda<T>(T*, T*, T*, const T*, const AttnShape&);             \
  template void qkv_split_backward_cuda<T>(T*, const T*, const T*, const T*, const AttnShape&);
MT_INSTANTIATE(float)
MT_INSTANTIATE(mt::bf16)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cuda
