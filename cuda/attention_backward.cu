// Causal grouped-query attention backward on CUDA, bf16 on tensor cores (flash-attention 2 style,
// deterministic: no atomics). With P recomputed from q, k and the saved lse (c = 1/sqrt(D)):
//   p_ij = exp(c q_i . k_j - lse_i) (j <= i),  dp_ij = do_i . v_j,  ds_ij = p_ij (dp_ij - delta_i),
//   delta_i = do_i . o_i,  dv_j = sum_i p_ij do_i,  dk_j = c sum_i ds_ij q_i,  dq_i = c sum_j ds_ij k_j.
// Three kernels:
//   1. delta (B, H, T) fp32: one warp per (token, head) row.
//   2. dK/dV: one block per (b, kv head g, tile of kBcKV = 64 keys); its 4 warps own 16 keys each and
//      keep dK, dV in fp32 registers while the block streams every query tile of every query head of
//      the group (double-buffered cp.async). Per query tile, in transposed form (keys are the rows):
//        S^T = K Q^T, P^T = exp2(S^T c log2e - lse log2e) (masked), dV += P^T dO,
//        dP^T = V dO^T, dS^T = P^T (dP^T - delta), dK += dS^T Q.
//      Each dK/dV row has one owner, which sums heads and query tiles in a fixed order.
//   3. dQ: one block per (b, h, tile of 64 queries), streaming key tiles (double-buffered):
//        S = Q K^T, P, dP = dO V^T, dS = P (dP - delta), dQ += dS K.
//      Recomputing S and dP here costs 2 extra GEMMs of the 7 but keeps dQ free of atomics.
// Query tiles for dK/dV: 64 rows for D = 64, 32 for D = 128 (register budget).
#include <cmath>

#include "cuda/attention_common.cuh"

namespace mt::ops::cuda::attn {

using namespace ::mt::cuda;

namespace {

constexpr int kWarps = 4, kThreads = kWarps * 32;
constexpr int kBcKV = 64;  // keys per dK/dV block
constexpr int kBrQ = 64;   // queries per dQ block
constexpr int kBcQ = 64;   // keys per dQ iteration

template <int D>
constexpr int kv_query_tile() { return D == 64 ? 64 : 32; }

// ---------------------------------------------------------------- delta
template <typename DT>
__global__ void attention_delta_kernel(float* delta, const DT* dout, const DT* out, int64_t BT, int T, int H, int D) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;  // (b, t, h)
  if (row >= BT * H) return;
  const DT* a = dout + row * D;
  const DT* o = out + row * D;
  float s = 0.f;
  for (int d = threadIdx.x % 32; d < D; d += 32) s += to_float(a[d]) * to_float(o[d]);
  s = warp_sum(s);
  if (threadIdx.x % 32 == 0) {
    const int64_t bt = row / H, h = row % H, b = bt / T, t = bt % T;
    delta[(b * H + h) * T + t] = s;
  }
}

// ---------------------------------------------------------------- dK, dV
template <int D>
constexpr size_t dkv_smem() {
  constexpr int BR = kv_query_tile<D>();
  return sizeof(bf16_t) * (D + 8) * (2 * kBcKV + 4 * BR) + sizeof(float) * 4 * BR;
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_backward_kernel_dkv(bf16_t* dk, bf16_t* dv, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                                  const bf16_t* dout, const float* lse, const float* delta, int T, int H, int G,
                                  float scale, float scale_log2) {
  constexpr int BR = kv_query_tile<D>(), LD = D + 8, kDT = D / 8, kNT = BR / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16_t* sK = reinterpret_cast<bf16_t*>(smem_raw);
  bf16_t* sV = sK + kBcKV * LD;
  bf16_t* sQ = sV + kBcKV * LD;   // 2 buffers of BR * LD
  bf16_t* sdO = sQ + 2 * BR * LD;  // 2 buffers of BR * LD
  float* sL = reinterpret_cast<float*>(sdO + 2 * BR * LD);  // 2 x BR lse * log2e (+inf past T)
  float* sDelta = sL + 2 * BR;                               // 2 x BR
  const int R = H / G, b = blockIdx.y / G, g = blockIdx.y % G;
  const int j0 = blockIdx.x * kBcKV, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t q_stride = int64_t(H) * D, kv_stride = int64_t(G) * D;
  const int64_t kv_off = (int64_t(b) * T * G + g) * D;
  const int first_tile = j0 / BR, n_qt = (T + BR - 1) / BR, per_head = n_qt - first_tile, n_it = R * per_head;

  // Issues the loads of iteration `it` (head g R + it / per_head, query tile first + it % per_head).
  auto issue = [&](int it, int buf) {
    const int h = g * R + it / per_head, i0 = (first_tile + it % per_head) * BR;
    const int64_t q_off = (int64_t(b) * T * H + h) * D;
    load_tile_async<BR, D, kThreads>(sQ + buf * BR * LD, q + q_off, q_stride, i0, T);
    load_tile_async<BR, D, kThreads>(sdO + buf * BR * LD, dout + q_off, q_stride, i0, T);
    for (int r = threadIdx.x; r < BR; r += kThreads) {
      const int t = i0 + r;
      const int64_t idx = (int64_t(b) * H + h) * T + t;
      sL[buf * BR + r] = t < T ? lse[idx] * kLog2e : INFINITY;
      sDelta[buf * BR + r] = t < T ? delta[idx] : 0.f;
    }
  };

  load_tile_async<kBcKV, D, kThreads>(sK, k + kv_off, kv_stride, j0, T);
  load_tile_async<kBcKV, D, kThreads>(sV, v + kv_off, kv_stride, j0, T);
  issue(0, 0);
  cp_async_commit();

  float dkacc[kDT][4] = {}, dvacc[kDT][4] = {};
  const int key0 = j0 + warp * 16 + lane / 4;  // this thread's keys: key0 and key0 + 8
  for (int it = 0; it < n_it; ++it) {
    const int buf = it % 2;
    if (it + 1 < n_it) {
      issue(it + 1, 1 - buf);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int i0 = (first_tile + it % per_head) * BR;
    const bf16_t* tQ = sQ + buf * BR * LD;
    const bf16_t* tdO = sdO + buf * BR * LD;
    const float* tL = sL + buf * BR;
    const float* tDelta = sDelta + buf * BR;

    // S^T = K Q^T and dP^T = V dO^T (16 keys x BR queries per warp).
    float s[kNT][4] = {}, dp[kNT][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ka[4], va[4];
      load_a_frag<LD>(ka, sK, warp * 16, kk * 16);
      load_a_frag<LD>(va, sV, warp * 16, kk * 16);
#pragma unroll
      for (int nt = 0; nt < kNT; nt += 2) {
        uint32_t bq[4], bo[4];
        load_b_frags_nk<LD>(bq, tQ, nt * 8, kk * 16);
        load_b_frags_nk<LD>(bo, tdO, nt * 8, kk * 16);
        mma_16816(s[nt], ka, bq[0], bq[1]);
        mma_16816(s[nt + 1], ka, bq[2], bq[3]);
        mma_16816(dp[nt], va, bo[0], bo[1]);
        mma_16816(dp[nt + 1], va, bo[2], bo[3]);
      }
    }
    // P^T and dS^T (columns are queries).
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nt * 8 + (lane % 4) * 2 + (e % 2), key = key0 + (e / 2) * 8;
        const float p = (key <= i0 + col) ? exp2f(fmaf(s[nt][e], scale_log2, -tL[col])) : 0.f;
        s[nt][e] = p;
        dp[nt][e] = p * (dp[nt][e] - tDelta[col]);
      }
    // dV += P^T dO, dK += dS^T Q.
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) {
      uint32_t pa[4], dsa[4];
      c_to_a_frag(pa, s[2 * kk], s[2 * kk + 1]);
      c_to_a_frag(dsa, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
      for (int dt = 0; dt < kDT; dt += 2) {
        uint32_t bo[4], bq[4];
        load_b_frags_kn<LD>(bo, tdO, kk * 16, dt * 8);
        load_b_frags_kn<LD>(bq, tQ, kk * 16, dt * 8);
        mma_16816(dvacc[dt], pa, bo[0], bo[1]);
        mma_16816(dvacc[dt + 1], pa, bo[2], bo[3]);
        mma_16816(dkacc[dt], dsa, bq[0], bq[1]);
        mma_16816(dkacc[dt + 1], dsa, bq[2], bq[3]);
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int key = key0 + rr * 8;
    if (key >= T) continue;
    bf16_t* dkrow = dk + kv_off + int64_t(key) * kv_stride;
    bf16_t* dvrow = dv + kv_off + int64_t(key) * kv_stride;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
      const int d = dt * 8 + (lane % 4) * 2;
      *reinterpret_cast<__nv_bfloat162*>(dkrow + d) =
          __floats2bfloat162_rn(dkacc[dt][2 * rr] * scale, dkacc[dt][2 * rr + 1] * scale);
      *reinterpret_cast<__nv_bfloat162*>(dvrow + d) = __floats2bfloat162_rn(dvacc[dt][2 * rr], dvacc[dt][2 * rr + 1]);
    }
  }
}

// ---------------------------------------------------------------- dQ
template <int D>
constexpr size_t dq_smem() {
  return sizeof(bf16_t) * (D + 8) * (2 * kBrQ + 4 * kBcQ);
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_backward_kernel_dq(bf16_t* dq, const bf16_t* q, const bf16_t* k, const bf16_t* v, const bf16_t* dout,
                                 const float* lse, const float* delta, int T, int H, int G, float scale,
                                 float scale_log2) {
  constexpr int LD = D + 8, kDT = D / 8, kNT = kBcQ / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16_t* sQ = reinterpret_cast<bf16_t*>(smem_raw);
  bf16_t* sdO = sQ + kBrQ * LD;
  bf16_t* sK = sdO + kBrQ * LD;    // 2 buffers of kBcQ * LD
  bf16_t* sV = sK + 2 * kBcQ * LD;  // 2 buffers of kBcQ * LD
  const int tile = gridDim.x - 1 - blockIdx.x;
  const int b = blockIdx.y / H, h = blockIdx.y % H, g = h / (H / G);
  const int i0 = tile * kBrQ, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t q_stride = int64_t(H) * D, kv_stride = int64_t(G) * D;
  const int64_t q_off = (int64_t(b) * T * H + h) * D, kv_off = (int64_t(b) * T * G + g) * D;
  const int n_tiles = (min(T, i0 + kBrQ) + kBcQ - 1) / kBcQ;

  load_tile_async<kBrQ, D, kThreads>(sQ, q + q_off, q_stride, i0, T);
  load_tile_async<kBrQ, D, kThreads>(sdO, dout + q_off, q_stride, i0, T);
  load_tile_async<kBcQ, D, kThreads>(sK, k + kv_off, kv_stride, 0, T);
  load_tile_async<kBcQ, D, kThreads>(sV, v + kv_off, kv_stride, 0, T);
  cp_async_commit();

  const int row0 = i0 + warp * 16 + lane / 4;
  float rl[2], rd[2];  // lse * log2e and delta of rows row0, row0 + 8
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int row = row0 + rr * 8;
    const int64_t idx = (int64_t(b) * H + h) * T + row;
    rl[rr] = row < T ? lse[idx] * kLog2e : INFINITY;
    rd[rr] = row < T ? delta[idx] : 0.f;
  }
  float dqacc[kDT][4] = {};
  for (int j = 0; j < n_tiles; ++j) {
    const int buf = j % 2;
    if (j + 1 < n_tiles) {
      load_tile_async<kBcQ, D, kThreads>(sK + (1 - buf) * kBcQ * LD, k + kv_off, kv_stride, (j + 1) * kBcQ, T);
      load_tile_async<kBcQ, D, kThreads>(sV + (1 - buf) * kBcQ * LD, v + kv_off, kv_stride, (j + 1) * kBcQ, T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16_t* tK = sK + buf * kBcQ * LD;
    const bf16_t* tV = sV + buf * kBcQ * LD;
    float s[kNT][4] = {}, dp[kNT][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[4], oa[4];
      load_a_frag<LD>(qa, sQ, warp * 16, kk * 16);
      load_a_frag<LD>(oa, sdO, warp * 16, kk * 16);
#pragma unroll
      for (int nt = 0; nt < kNT; nt += 2) {
        uint32_t bk[4], bv[4];
        load_b_frags_nk<LD>(bk, tK, nt * 8, kk * 16);
        load_b_frags_nk<LD>(bv, tV, nt * 8, kk * 16);
        mma_16816(s[nt], qa, bk[0], bk[1]);
        mma_16816(s[nt + 1], qa, bk[2], bk[3]);
        mma_16816(dp[nt], oa, bv[0], bv[1]);
        mma_16816(dp[nt + 1], oa, bv[2], bv[3]);
      }
    }
    const int j0 = j * kBcQ;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = j0 + nt * 8 + (lane % 4) * 2 + (e % 2), rr = e / 2;
        const float p = (key <= row0 + rr * 8) ? exp2f(fmaf(s[nt][e], scale_log2, -rl[rr])) : 0.f;
        dp[nt][e] = p * (dp[nt][e] - rd[rr]);
      }
    // dQ += dS K.
#pragma unroll
    for (int kk = 0; kk < kBcQ / 16; ++kk) {
      uint32_t dsa[4];
      c_to_a_frag(dsa, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
      for (int dt = 0; dt < kDT; dt += 2) {
        uint32_t bk[4];
        load_b_frags_kn<LD>(bk, tK, kk * 16, dt * 8);
        mma_16816(dqacc[dt], dsa, bk[0], bk[1]);
        mma_16816(dqacc[dt + 1], dsa, bk[2], bk[3]);
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int row = row0 + rr * 8;
    if (row >= T) continue;
    bf16_t* dqrow = dq + q_off + int64_t(row) * q_stride;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
      *reinterpret_cast<__nv_bfloat162*>(dqrow + dt * 8 + (lane % 4) * 2) =
          __floats2bfloat162_rn(dqacc[dt][2 * rr] * scale, dqacc[dt][2 * rr + 1] * scale);
  }
}

template <int D>
void backward_launch(bf16_t* dq, bf16_t* dk, bf16_t* dv, const bf16_t* dout, const bf16_t* q, const bf16_t* k,
                     const bf16_t* v, const float* lse, const float* delta, const AttnShape& s) {
  cudaStream_t st = current_stream();
  const float scale = 1.f / std::sqrt(static_cast<float>(D)), scale_log2 = scale * kLog2e;
  const int T = static_cast<int>(s.T), H = static_cast<int>(s.H), G = static_cast<int>(s.G);
  {
    constexpr size_t smem = dkv_smem<D>();
    auto kernel = attention_backward_kernel_dkv<D>;
    MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    const dim3 grid(static_cast<unsigned>(ceil_div(s.T, kBcKV)), static_cast<unsigned>(s.B * s.G));
    kernel<<<grid, kThreads, smem, st>>>(dk, dv, q, k, v, dout, lse, delta, T, H, G, scale, scale_log2);
    MT_CUDA_CHECK_LAUNCH("attention_backward_kernel_dkv");
  }
  {
    constexpr size_t smem = dq_smem<D>();
    auto kernel = attention_backward_kernel_dq<D>;
    MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    const dim3 grid(static_cast<unsigned>(ceil_div(s.T, kBrQ)), static_cast<unsigned>(s.B * s.H));
    kernel<<<grid, kThreads, smem, st>>>(dq, q, k, v, dout, lse, delta, T, H, G, scale, scale_log2);
    MT_CUDA_CHECK_LAUNCH("attention_backward_kernel_dq");
  }
}

}  // namespace

template <typename DT>
void attention_delta(float* delta, const DT* dout, const DT* out, const AttnShape& s) {
  constexpr int kRowsPerBlock = 8;
  const int64_t rows = s.B * s.T * s.H;
  attention_delta_kernel<<<static_cast<unsigned>(ceil_div(rows, kRowsPerBlock)), kRowsPerBlock * 32, 0,
                           current_stream()>>>(delta, dout, out, s.B * s.T, static_cast<int>(s.T),
                                               static_cast<int>(s.H), static_cast<int>(s.D));
  MT_CUDA_CHECK_LAUNCH("attention_delta_kernel");
}
template void attention_delta<float>(float*, const float*, const float*, const AttnShape&);
template void attention_delta<bf16_t>(float*, const bf16_t*, const bf16_t*, const AttnShape&);

void attention_backward_bf16(bf16_t* dq, bf16_t* dk, bf16_t* dv, const bf16_t* dout, const bf16_t* q,
                             const bf16_t* k, const bf16_t* v, const bf16_t* out, const float* lse,
                             const AttnShape& s) {
  Scratch delta(sizeof(float) * static_cast<size_t>(s.B * s.H * s.T));
  attention_delta(delta.as<float>(), dout, out, s);
  if (s.D == 64) backward_launch<64>(dq, dk, dv, dout, q, k, v, lse, delta.as<float>(), s);
  else backward_launch<128>(dq, dk, dv, dout, q, k, v, lse, delta.as<float>(), s);
}

}  // namespace mt::ops::cuda::attn
