// Causal grouped-query attention backward on CUDA, bf16 on tensor cores (flash-attention 2 style,
// deterministic: no atomics). With P recomputed from q, k and the saved lse (c = 1/sqrt(D)):
//   p_ij = exp(c q_i . k_j - lse_i) (j <= i),  dp_ij = do_i . v_j,  ds_ij = p_ij (dp_ij - delta_i),
//   delta_i = do_i . o_i,  dv_j = sum_i p_ij do_i,  dk_j = c sum_i ds_ij q_i,  dq_i = c sum_j ds_ij k_j.
// Three kernels:
//   1. delta (B, H, T) fp32: one warp per (token, head) row.
//   2. dK/dV: one block per (b, kv head g, tile of 4 * 16 * MT keys); each of its 4 warps owns MT
//      m-tiles of 16 keys and keeps their dK, dV in fp32 registers while the block streams every query
//      tile (BR rows) of every query head of the group (double-buffered cp.async). Per query tile, in
//      transposed form (keys are the rows):
//        S^T = K Q^T, P^T = exp2(S^T c log2e - lse log2e) (masked), dV += P^T dO,
//        dP^T = V dO^T, dS^T = P^T (dP^T - delta), dK += dS^T Q.
//      Each dK/dV row has one owner, which sums heads and query tiles in a fixed order.
//   3. dQ: one block per (b, h, tile of 4 * 16 * MT queries), streaming key tiles (kBc rows,
//      double-buffered):
//        S = Q K^T, P, dP = dO V^T, dS = P (dP - delta), dQ += dS K.
//      Recomputing S and dP here costs 2 extra GEMMs of the 7 but keeps dQ free of atomics.
// MT > 1 lets every fragment read from shared memory feed MT tensor-core products (shared-memory
// bandwidth bounds MT = 1); the tiles per head dim below keep the fp32 accumulators in registers.
#include <cmath>

#include "cuda/attention_common.cuh"

namespace mt::ops::cuda::attn {

using namespace ::mt::cuda;

namespace {

constexpr int kWarps = 4, kThreads = kWarps * 32;

// dK/dV: MT key m-tiles per warp, BR queries per streamed tile.
// dQ: MT query m-tiles per warp, kBc keys per streamed tile.
template <int D> struct DkvTiles;
template <int D> struct DqTiles;
// Measured on an H200 against the alternatives (benchmarks/kernels/cuda_kernels.md): D = 64 with MT = 2
// (dK/dV BR 32, dQ kBc 32) ran 6% slower; dQ at D = 128 with MT = 1, kBc = 64 ran 3% slower.
template <> struct DkvTiles<64> { static constexpr int MT = 1, BR = 64; };
template <> struct DkvTiles<128> { static constexpr int MT = 1, BR = 32; };
template <> struct DqTiles<64> { static constexpr int MT = 1, kBc = 64; };
template <> struct DqTiles<128> { static constexpr int MT = 2, kBc = 32; };  // 255 registers, 20 B spilled
template <int D> constexpr int dkv_keys() { return kWarps * 16 * DkvTiles<D>::MT; }
template <int D> constexpr int dq_rows() { return kWarps * 16 * DqTiles<D>::MT; }

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
  constexpr int BR = DkvTiles<D>::BR;
  return sizeof(bf16_t) * kTileLD<D> * (2 * dkv_keys<D>() + 4 * BR) + sizeof(float) * 4 * BR;
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_backward_kernel_dkv(bf16_t* dk, bf16_t* dv, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                                  const bf16_t* dout, const float* lse, const float* delta, int T, int H, int G,
                                  float scale, float scale_log2) {
  constexpr int MT = DkvTiles<D>::MT, BR = DkvTiles<D>::BR, kKeys = dkv_keys<D>();
  constexpr int LD = kTileLD<D>, kDT = D / 8, kNT = BR / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16_t* sK = reinterpret_cast<bf16_t*>(smem_raw);
  bf16_t* sV = sK + kKeys * LD;
  bf16_t* sQ = sV + kKeys * LD;    // 2 buffers of BR * LD
  bf16_t* sdO = sQ + 2 * BR * LD;  // 2 buffers of BR * LD
  float* sL = reinterpret_cast<float*>(sdO + 2 * BR * LD);  // 2 x BR lse * log2e (+inf past T)
  float* sDelta = sL + 2 * BR;                               // 2 x BR
  const int R = H / G, b = blockIdx.y / G, g = blockIdx.y % G;
  const int j0 = blockIdx.x * kKeys, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
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

  load_tile_async<kKeys, D, kThreads>(sK, k + kv_off, kv_stride, j0, T);
  load_tile_async<kKeys, D, kThreads>(sV, v + kv_off, kv_stride, j0, T);
  issue(0, 0);
  cp_async_commit();

  float dkacc[MT][kDT][4] = {}, dvacc[MT][kDT][4] = {};
  const int wkey = warp * 16 * MT;         // the warp's first key in the tile
  const int key0 = j0 + wkey + lane / 4;   // m-tile mt: keys key0 + 16 mt and key0 + 16 mt + 8
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

    // S^T = K Q^T and dP^T = V dO^T (16 MT keys x BR queries per warp).
    float s[MT][kNT][4] = {}, dp[MT][kNT][4] = {};
    mma_rows_x_cols<MT, kNT, D, LD>(s, sK, wkey, tQ);   // S^T = K Q^T
    mma_rows_x_cols<MT, kNT, D, LD>(dp, sV, wkey, tdO);  // dP^T = V dO^T
    // P^T and dS^T (columns are queries).
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = nt * 8 + (lane % 4) * 2 + (e % 2), key = key0 + mt * 16 + (e / 2) * 8;
          const float p = (key <= i0 + col) ? exp2f(fmaf(s[mt][nt][e], scale_log2, -tL[col])) : 0.f;
          s[mt][nt][e] = p;
          dp[mt][nt][e] = p * (dp[mt][nt][e] - tDelta[col]);
        }
    mma_cfrags_x_tile<MT, kDT, BR, LD>(dvacc, s, tdO);  // dV += P^T dO
    mma_cfrags_x_tile<MT, kDT, BR, LD>(dkacc, dp, tQ);  // dK += dS^T Q
    __syncthreads();
  }

  store_cfrags_rows<MT, kDT>(dk + kv_off, kv_stride, dkacc, key0, T, scale);
  store_cfrags_rows<MT, kDT>(dv + kv_off, kv_stride, dvacc, key0, T, 1.f);
}

// ---------------------------------------------------------------- dQ
template <int D>
constexpr size_t dq_smem() {
  return sizeof(bf16_t) * kTileLD<D> * (2 * dq_rows<D>() + 4 * DqTiles<D>::kBc);
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_backward_kernel_dq(bf16_t* dq, const bf16_t* q, const bf16_t* k, const bf16_t* v, const bf16_t* dout,
                                 const float* lse, const float* delta, int T, int H, int G, float scale,
                                 float scale_log2) {
  constexpr int MT = DqTiles<D>::MT, kBc = DqTiles<D>::kBc, kBr = dq_rows<D>();
  constexpr int LD = kTileLD<D>, kDT = D / 8, kNT = kBc / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16_t* sQ = reinterpret_cast<bf16_t*>(smem_raw);
  bf16_t* sdO = sQ + kBr * LD;
  bf16_t* sK = sdO + kBr * LD;     // 2 buffers of kBc * LD
  bf16_t* sV = sK + 2 * kBc * LD;  // 2 buffers of kBc * LD
  const int tile = gridDim.x - 1 - blockIdx.x;
  const int b = blockIdx.y / H, h = blockIdx.y % H, g = h / (H / G);
  const int i0 = tile * kBr, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t q_stride = int64_t(H) * D, kv_stride = int64_t(G) * D;
  const int64_t q_off = (int64_t(b) * T * H + h) * D, kv_off = (int64_t(b) * T * G + g) * D;
  const int n_tiles = (min(T, i0 + kBr) + kBc - 1) / kBc;

  load_tile_async<kBr, D, kThreads>(sQ, q + q_off, q_stride, i0, T);
  load_tile_async<kBr, D, kThreads>(sdO, dout + q_off, q_stride, i0, T);
  load_tile_async<kBc, D, kThreads>(sK, k + kv_off, kv_stride, 0, T);
  load_tile_async<kBc, D, kThreads>(sV, v + kv_off, kv_stride, 0, T);
  cp_async_commit();

  const int wrow = warp * 16 * MT;
  const int row0 = i0 + wrow + lane / 4;  // m-tile mt: rows row0 + 16 mt and row0 + 16 mt + 8
  float rl[MT][2], rd[MT][2];             // lse * log2e and delta of those rows
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int row = row0 + mt * 16 + rr * 8;
      const int64_t idx = (int64_t(b) * H + h) * T + row;
      rl[mt][rr] = row < T ? lse[idx] * kLog2e : INFINITY;
      rd[mt][rr] = row < T ? delta[idx] : 0.f;
    }
  float dqacc[MT][kDT][4] = {};
  for (int j = 0; j < n_tiles; ++j) {
    const int buf = j % 2;
    next_kv_tile_async<kBc, D, kThreads>(sK, sV, buf, k + kv_off, v + kv_off, kv_stride, j, n_tiles, T);
    __syncthreads();
    const bf16_t* tK = sK + buf * kBc * LD;
    const bf16_t* tV = sV + buf * kBc * LD;
    float s[MT][kNT][4] = {}, dp[MT][kNT][4] = {};
    mma_rows_x_cols<MT, kNT, D, LD>(s, sQ, wrow, tK);   // S = Q K^T
    mma_rows_x_cols<MT, kNT, D, LD>(dp, sdO, wrow, tV);  // dP = dO V^T
    const int j0 = j * kBc;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = j0 + nt * 8 + (lane % 4) * 2 + (e % 2), rr = e / 2;
          const float p =
              (key <= row0 + mt * 16 + rr * 8) ? exp2f(fmaf(s[mt][nt][e], scale_log2, -rl[mt][rr])) : 0.f;
          dp[mt][nt][e] = p * (dp[mt][nt][e] - rd[mt][rr]);
        }
    mma_cfrags_x_tile<MT, kDT, kBc, LD>(dqacc, dp, tK);  // dQ += dS K
    __syncthreads();
  }

  store_cfrags_rows<MT, kDT>(dq + q_off, q_stride, dqacc, row0, T, scale);
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
    ensure_dynamic_smem(kernel, smem);
    const dim3 grid(static_cast<unsigned>(ceil_div(s.T, dkv_keys<D>())), static_cast<unsigned>(s.B * s.G));
    kernel<<<grid, kThreads, smem, st>>>(dk, dv, q, k, v, dout, lse, delta, T, H, G, scale, scale_log2);
    MT_CUDA_CHECK_LAUNCH("attention_backward_kernel_dkv");
  }
  {
    constexpr size_t smem = dq_smem<D>();
    auto kernel = attention_backward_kernel_dq<D>;
    ensure_dynamic_smem(kernel, smem);
    const dim3 grid(static_cast<unsigned>(ceil_div(s.T, dq_rows<D>())), static_cast<unsigned>(s.B * s.H));
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
