// QKV split on CUDA: qkv (B, T, G*(R+2)*D), R = H / G; per token, group g holds R query heads, then
// its key head, then its value head (Megatron's grouped layout):
//   q[bt, g R + r] = qkv[bt, g, r],  k[bt, g] = qkv[bt, g, R],  v[bt, g] = qkv[bt, g, R + 1]  (D each).
// Backward is the inverse gather (every dqkv element is exactly one dq/dk/dv element): dqkv is written,
// never accumulated. One kernel does both directions: each thread moves VEC elements of D (16 bytes
// when D and the pointers allow), walking the qkv layout.
// qkv_split_rope (llama): the same split with rope.cu's rotation of q and k applied on the way (backward: the
// inverse rotation of dq and dk on the way back), so the projection is read once and q, k, v written once
// instead of a split and then two in-place rotations (qkv_split_rope_kernel has the work split).
#include <cmath>

#include "cuda/cuda_ops.h"
#include "cuda/kernel_utils.cuh"
#include "cuda/rope_common.cuh"

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

// kForward: qkv -> q, k (rotated by +a), v; else dq, dk (rotated by -a), dv -> dqkv.
// A block takes kRopeTokens tokens: first its threads compute the tokens' cos/sin (D/2 angles each, fp64 as
// rope.cu, same bits) into shared memory, then every thread moves (token, head slot, VEC pairs) items, so all
// the block's threads stream memory (one thread per token walking 48 head slots left the GPU a quarter full).
constexpr int kRopeTokens = 8, kRopeThreads = 256;
template <bool kForward, int VEC, typename D>
__global__ void __launch_bounds__(kRopeThreads)
    qkv_split_rope_kernel(D* __restrict__ qkv, D* __restrict__ q, D* __restrict__ k, D* __restrict__ v, int64_t BT,
                          int64_t T_, int H, int G, int Dh, double log_theta, RopeParams rope,
                          RopePositions positions) {
  extern __shared__ float cs[];  // [kRopeTokens][half] cos, then [kRopeTokens][half] sin
  const int R = H / G, slots = G * (R + 2), half = Dh / 2, chunks = half / VEC, W = slots * Dh;
  const int64_t bt0 = int64_t(blockIdx.x) * kRopeTokens;
  const int tokens = static_cast<int>(BT - bt0 < kRopeTokens ? BT - bt0 : kRopeTokens);
  for (int i = threadIdx.x; i < tokens * half; i += blockDim.x) {
    const int t = i / half, j = i % half;
    rope_angles<1>(cs + i, cs + kRopeTokens * half + i, static_cast<double>(positions((bt0 + t) % T_)), j, Dh,
                   log_theta, rope, kForward ? 1.f : -1.f);
  }
  __syncthreads();
  const int per_tok = slots * chunks;
  for (int it = threadIdx.x; it < tokens * per_tok; it += blockDim.x) {
    const int t = it / per_tok, rem = it % per_tok, slot = rem / chunks, i0 = (rem % chunks) * VEC;
    const int g = slot / (R + 2), r = slot % (R + 2);
    const int64_t bt = bt0 + t;
    D* other = r < R ? q + (bt * H + g * R + r) * Dh : (r == R ? k : v) + (bt * G + g) * Dh;
    D* packed = qkv + bt * W + int64_t(slot) * Dh;
    const D* src = kForward ? packed : other;
    D* dst = kForward ? other : packed;
    D a[VEC], b[VEC];
    load_vec<VEC>(a, src + i0);
    load_vec<VEC>(b, src + i0 + half);
    if (r <= R) rope_rotate<VEC>(a, b, cs + t * half + i0, cs + (kRopeTokens + t) * half + i0);  // query or key
    store_vec<VEC>(dst + i0, a);
    store_vec<VEC>(dst + i0 + half, b);
  }
}

template <bool kForward, typename T>
void qkv_rope_launch(const char* what, T* qkv, T* q, T* k, T* v, const AttnShape& s, const RopeParams& rope,
                     RopePositions positions) {
  using D = dev_t<T>;
  const int64_t half = s.D / 2;
  if (s.B * s.T * s.G * half == 0) return;
  constexpr int kVec = 16 / sizeof(D);
  cudaStream_t st = current_stream();
  const double log_theta = std::log(rope.theta);  // as rope.cu
  const bool vec = half % kVec == 0 && aligned(qkv, 16) && aligned(q, 16) && aligned(k, 16) && aligned(v, 16);
  const int H = static_cast<int>(s.H), G = static_cast<int>(s.G), Dh = static_cast<int>(s.D);
  const unsigned grid = static_cast<unsigned>(ceil_div(s.B * s.T, kRopeTokens));
  const size_t smem = sizeof(float) * 2 * kRopeTokens * static_cast<size_t>(half);
  MT_CHECK(smem <= 48 * 1024, what, ": head dim ", s.D, " too large");
  if (vec)
    qkv_split_rope_kernel<kForward, kVec><<<grid, kRopeThreads, smem, st>>>(
        dev(qkv), dev(q), dev(k), dev(v), s.B * s.T, s.T, H, G, Dh, log_theta, rope, positions);
  else
    qkv_split_rope_kernel<kForward, 1><<<grid, kRopeThreads, smem, st>>>(
        dev(qkv), dev(q), dev(k), dev(v), s.B * s.T, s.T, H, G, Dh, log_theta, rope, positions);
  MT_CUDA_CHECK_LAUNCH(what);
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

template <typename T>
void qkv_split_rope_forward_cuda(T* q, T* k, T* v, const T* qkv, const AttnShape& s, const RopeParams& rope,
                                 RopePositions positions) {
  qkv_rope_launch<true>("qkv_split_rope_forward_cuda", const_cast<T*>(qkv), q, k, v, s, rope, positions);
}

template <typename T>
void qkv_split_rope_backward_cuda(T* dqkv, const T* dq, const T* dk, const T* dv, const AttnShape& s, const RopeParams& rope,
                                  RopePositions positions) {
  qkv_rope_launch<false>("qkv_split_rope_backward_cuda", dqkv, const_cast<T*>(dq), const_cast<T*>(dk),
                         const_cast<T*>(dv), s, rope, positions);
}

#define MT_INSTANTIATE(T)                                                                                    \
  template void qkv_split_forward_cuda<T>(T*, T*, T*, const T*, const AttnShape&);                           \
  template void qkv_split_backward_cuda<T>(T*, const T*, const T*, const T*, const AttnShape&);              \
  template void qkv_split_rope_forward_cuda<T>(T*, T*, T*, const T*, const AttnShape&, const RopeParams&, RopePositions); \
  template void qkv_split_rope_backward_cuda<T>(T*, const T*, const T*, const T*, const AttnShape&,         \
                                                const RopeParams&, RopePositions);
MT_INSTANTIATE(float)
MT_INSTANTIATE(mt::bf16)
MT_INSTANTIATE(mt::f16)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cuda
