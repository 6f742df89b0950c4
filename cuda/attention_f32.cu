// Causal grouped-query attention in fp32 on CUDA cores: the parity path (no TF32, no bf16 rounding),
// same math as attention.cu / attention_backward.cu. Simple and exact rather than fast. Also the non-causal
// blocks of context-parallel attention (every query sees all Tk keys, Tk != T allowed; s.causal false).
// One warp per row; a block of kRows warps shares tiles of 32 rows of the other side in shared memory
// (rows padded to D + 1 floats, so lane j reading row j is conflict-free). Per tile of 32:
//   forward (warp = query i):   lane j scores key j; warp max/sum update the online softmax (m, l);
//                               o (D / 32 values per lane) += sum_j p_j v_j, p_j broadcast by shuffle.
//   dQ (warp = query i):        lane j: p_j = exp(s_ij - lse_i), ds_j = p_j (do_i . v_j - delta_i);
//                               dq += sum_j ds_j k_j.
//   dK, dV (warp = key j of kv head g, over the R query heads of the group):
//                               lane i: p_i, ds_i as above; dv += sum_i p_i do_i; dk += sum_i ds_i q_i.
// delta = rowsum(dO * O) comes from attention_backward.cu's kernel. Fixed summation orders: deterministic.
#include <cmath>

#include "cuda/attention_common.cuh"

namespace mt::ops::cuda::attn {

using namespace ::mt::cuda;

namespace {

constexpr int kRows = 8, kThreads = kRows * 32, kTile = 32;

// Loads rows [t0, t0 + ROWS) of one head (`head0` = (b, t = 0, head), rows `stride` apart) into a
// tile with row stride LD; rows past T are zero.
template <int ROWS, int D, int LD>
__device__ void load_rows(float* tile, const float* head0, int64_t stride, int t0, int T) {
  for (int i = threadIdx.x; i < ROWS * D; i += blockDim.x) {
    const int r = i / D, d = i % D, t = t0 + r;
    tile[r * LD + d] = t < T ? head0[int64_t(t) * stride + d] : 0.f;
  }
}

__device__ __forceinline__ float dot_row(const float* a, const float* b, int D) {
  float s = 0.f;
  for (int d = 0; d < D; ++d) s = fmaf(a[d], b[d], s);
  return s;
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel_f32(float* out, float* lse, const float* q, const float* k, const float* v, int T, int Tk,
                                 bool causal, int H, int G, float scale) {
  constexpr int E = D / 32, LD = D + 1;
  __shared__ float sQ[kRows][D], sK[kTile][LD], sV[kTile][D];
  const int b = blockIdx.y / H, h = blockIdx.y % H, g = h / (H / G);
  const int i0 = blockIdx.x * kRows, warp = threadIdx.x / 32, lane = threadIdx.x % 32, i = i0 + warp;
  const int64_t q_stride = int64_t(H) * D, kv_stride = int64_t(G) * D;
  const float* qh = q + (int64_t(b) * T * H + h) * D;
  const float* kh = k + (int64_t(b) * Tk * G + g) * D;
  const float* vh = v + (int64_t(b) * Tk * G + g) * D;
  load_rows<kRows, D, D>(&sQ[0][0], qh, q_stride, i0, T);
  float o[E] = {}, m = -INFINITY, l = 0.f;
  const int n_keys = causal ? min(T, i0 + kRows) : Tk;
  for (int t0 = 0; t0 < n_keys; t0 += kTile) {
    __syncthreads();
    load_rows<kTile, D, LD>(&sK[0][0], kh, kv_stride, t0, Tk);
    load_rows<kTile, D, D>(&sV[0][0], vh, kv_stride, t0, Tk);
    __syncthreads();
    if (i >= T) continue;  // warp-uniform; the warp still joins the barriers
    const int key = t0 + lane;
    const bool seen = key < Tk && (!causal || key <= i);
    const float s = seen ? dot_row(sQ[warp], sK[lane], D) * scale : -INFINITY;
    const float m_new = fmaxf(m, warp_max(s));  // finite: key 0 <= i is in the first tile
    const float alpha = expf(m - m_new), p = expf(s - m_new);
    l = l * alpha + warp_sum(p);
    m = m_new;
#pragma unroll
    for (int e = 0; e < E; ++e) o[e] *= alpha;
    for (int j = 0; j < kTile; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
      for (int e = 0; e < E; ++e) o[e] = fmaf(pj, sV[j][lane + 32 * e], o[e]);
    }
  }
  if (i >= T) return;
  float* orow = out + (int64_t(b) * T + i) * q_stride + int64_t(h) * D;
#pragma unroll
  for (int e = 0; e < E; ++e) orow[lane + 32 * e] = o[e] / l;
  if (lane == 0) lse[(int64_t(b) * H + h) * T + i] = m + logf(l);
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_backward_kernel_dq_f32(float* dq, const float* q, const float* k, const float* v, const float* dout,
                                     const float* lse, const float* delta, int T, int Tk, bool causal, int H, int G,
                                     float scale) {
  constexpr int E = D / 32, LD = D + 1;
  __shared__ float sQ[kRows][D], sdO[kRows][D], sK[kTile][LD], sV[kTile][LD];
  const int b = blockIdx.y / H, h = blockIdx.y % H, g = h / (H / G);
  const int i0 = blockIdx.x * kRows, warp = threadIdx.x / 32, lane = threadIdx.x % 32, i = i0 + warp;
  const int64_t q_stride = int64_t(H) * D, kv_stride = int64_t(G) * D;
  const int64_t q_off = (int64_t(b) * T * H + h) * D, kv_off = (int64_t(b) * Tk * G + g) * D;
  load_rows<kRows, D, D>(&sQ[0][0], q + q_off, q_stride, i0, T);
  load_rows<kRows, D, D>(&sdO[0][0], dout + q_off, q_stride, i0, T);
  const int64_t stat = (int64_t(b) * H + h) * T + i;
  const float li = i < T ? lse[stat] : 0.f, di = i < T ? delta[stat] : 0.f;
  float acc[E] = {};
  const int n_keys = causal ? min(T, i0 + kRows) : Tk;
  for (int t0 = 0; t0 < n_keys; t0 += kTile) {
    __syncthreads();
    load_rows<kTile, D, LD>(&sK[0][0], k + kv_off, kv_stride, t0, Tk);
    load_rows<kTile, D, LD>(&sV[0][0], v + kv_off, kv_stride, t0, Tk);
    __syncthreads();
    if (i >= T) continue;
    const int key = t0 + lane;
    float ds = 0.f;
    if (key < Tk && (!causal || key <= i)) {
      const float p = expf(dot_row(sQ[warp], sK[lane], D) * scale - li);
      ds = p * (dot_row(sdO[warp], sV[lane], D) - di);
    }
    for (int j = 0; j < kTile; ++j) {
      const float dsj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] = fmaf(dsj, sK[j][lane + 32 * e], acc[e]);
    }
  }
  if (i >= T) return;
  float* row = dq + q_off + int64_t(i) * q_stride;
#pragma unroll
  for (int e = 0; e < E; ++e) row[lane + 32 * e] = acc[e] * scale;
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_backward_kernel_dkv_f32(float* dk, float* dv, const float* q, const float* k, const float* v,
                                      const float* dout, const float* lse, const float* delta, int T, int Tk,
                                      bool causal, int H, int G, float scale) {
  constexpr int E = D / 32, LD = D + 1;
  __shared__ float sK[kRows][D], sV[kRows][D], sQ[kTile][LD], sdO[kTile][LD], sL[kTile], sD[kTile];
  const int R = H / G, b = blockIdx.y / G, g = blockIdx.y % G;
  const int j0 = blockIdx.x * kRows, warp = threadIdx.x / 32, lane = threadIdx.x % 32, j = j0 + warp;
  const int64_t q_stride = int64_t(H) * D, kv_stride = int64_t(G) * D;
  const int64_t kv_off = (int64_t(b) * Tk * G + g) * D;
  load_rows<kRows, D, D>(&sK[0][0], k + kv_off, kv_stride, j0, Tk);
  load_rows<kRows, D, D>(&sV[0][0], v + kv_off, kv_stride, j0, Tk);
  float dka[E] = {}, dva[E] = {};
  const int first = causal ? j0 / kTile * kTile : 0;
  for (int h = g * R; h < (g + 1) * R; ++h) {
    const int64_t q_off = (int64_t(b) * T * H + h) * D;
    for (int t0 = first; t0 < T; t0 += kTile) {
      __syncthreads();
      load_rows<kTile, D, LD>(&sQ[0][0], q + q_off, q_stride, t0, T);
      load_rows<kTile, D, LD>(&sdO[0][0], dout + q_off, q_stride, t0, T);
      for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
        const int t = t0 + r;
        sL[r] = t < T ? lse[(int64_t(b) * H + h) * T + t] : 0.f;
        sD[r] = t < T ? delta[(int64_t(b) * H + h) * T + t] : 0.f;
      }
      __syncthreads();
      if (j >= Tk) continue;
      const int query = t0 + lane;
      float p = 0.f, ds = 0.f;
      if ((!causal || query >= j) && query < T) {
        p = expf(dot_row(sQ[lane], sK[warp], D) * scale - sL[lane]);
        ds = p * (dot_row(sdO[lane], sV[warp], D) - sD[lane]);
      }
      for (int r = 0; r < kTile; ++r) {
        const float pr = __shfl_sync(0xffffffffu, p, r), dsr = __shfl_sync(0xffffffffu, ds, r);
#pragma unroll
        for (int e = 0; e < E; ++e) {
          dva[e] = fmaf(pr, sdO[r][lane + 32 * e], dva[e]);
          dka[e] = fmaf(dsr, sQ[r][lane + 32 * e], dka[e]);
        }
      }
    }
  }
  if (j >= Tk) return;
  float* krow = dk + kv_off + int64_t(j) * kv_stride;
  float* vrow = dv + kv_off + int64_t(j) * kv_stride;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    krow[lane + 32 * e] = dka[e] * scale;
    vrow[lane + 32 * e] = dva[e];
  }
}

template <int D>
void forward_f32(float* out, float* lse, const float* q, const float* k, const float* v, const AttnShape& s) {
  const dim3 grid(static_cast<unsigned>(ceil_div(s.T, kRows)), static_cast<unsigned>(s.B * s.H));
  attention_forward_kernel_f32<D><<<grid, kThreads, 0, current_stream()>>>(
      out, lse, q, k, v, static_cast<int>(s.T), static_cast<int>(s.keys()), s.causal, static_cast<int>(s.H),
      static_cast<int>(s.G),
      1.f / std::sqrt(static_cast<float>(D)));
  MT_CUDA_CHECK_LAUNCH("attention_forward_kernel_f32");
}

template <int D>
void backward_f32(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                  const float* lse, const float* delta, const AttnShape& s) {
  const int T = static_cast<int>(s.T), Tk = static_cast<int>(s.keys()), H = static_cast<int>(s.H),
            G = static_cast<int>(s.G);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  cudaStream_t st = current_stream();
  const dim3 grid_q(static_cast<unsigned>(ceil_div(s.T, kRows)), static_cast<unsigned>(s.B * s.H));
  attention_backward_kernel_dq_f32<D><<<grid_q, kThreads, 0, st>>>(dq, q, k, v, dout, lse, delta, T, Tk, s.causal, H,
                                                                   G, scale);
  MT_CUDA_CHECK_LAUNCH("attention_backward_kernel_dq_f32");
  const dim3 grid_kv(static_cast<unsigned>(ceil_div(s.keys(), kRows)), static_cast<unsigned>(s.B * s.G));
  attention_backward_kernel_dkv_f32<D><<<grid_kv, kThreads, 0, st>>>(dk, dv, q, k, v, dout, lse, delta, T, Tk,
                                                                     s.causal, H, G, scale);
  MT_CUDA_CHECK_LAUNCH("attention_backward_kernel_dkv_f32");
}

}  // namespace

void attention_forward_f32(float* out, float* lse, const float* q, const float* k, const float* v, const AttnShape& s) {
  if (s.D == 64) forward_f32<64>(out, lse, q, k, v, s);
  else forward_f32<128>(out, lse, q, k, v, s);
}

void attention_backward_f32(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                            const float* v, const float* out, const float* lse, const AttnShape& s) {
  Scratch delta(sizeof(float) * static_cast<size_t>(s.B * s.H * s.T));
  attention_delta(delta.as<float>(), dout, out, s);
  if (s.D == 64) backward_f32<64>(dq, dk, dv, dout, q, k, v, lse, delta.as<float>(), s);
  else backward_f32<128>(dq, dk, dv, dout, q, k, v, lse, delta.as<float>(), s);
}

}  // namespace mt::ops::cuda::attn
