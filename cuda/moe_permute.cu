// MoE routing map, permute and unpermute on CUDA (tensor/cpu/moe_permute.cpp has the math). Gathers only: each
// output row is written by one warp or block, a token's slots summed in slot order (deterministic, no float
// atomics).
//
// Counts: a shared-memory histogram per block of slots, added into the global counts with integer atomics (exact,
// so deterministic). The routing map keeps the CPU's order (slots ascend inside an expert) in three launches:
// per-tile histograms; one block turns them into each tile's first row per expert (expert starts + the rows of
// the same expert in earlier tiles); then per tile a thread per slot finds its rank among the earlier slots of its
// expert (warp match, per-warp counts in shared memory). Every slot is read a constant number of times. (Session 18:
// this took the 8x top-2 routing map from 0.063 to 0.020 ms per layer on an H200; the former scatter had one thread
// per expert walk its tile's 2048 slots.)
//
// Padded layout (tensor/moe_ops.h moe_pad_routing_map): expert e's rows at the start of its region of the padded
// rows; one thread per padded row and per slot, the experts' compact and padded starts passed as kernel parameters
// (PadPlan), found by binary search.
//
// Permute / unpermute move rows as 16-byte vectors when the row width and the pointers allow (else one element
// per thread): memory-bound. The permute and the zeroing of padding rows run one warp per row (8 rows per block),
// each lane loading kUnroll vectors before storing them; the per-token gathers (permute backward, unpermute) one
// 128-thread block per token or slot. Measured on an H100 at 64x top-8 (session 10): the warp version took the
// zeroing of padding rows from 0.090 to 0.019 ms and left the permute at 0.16-0.17 ms, but ran the gathers 5-17%
// slower than a block per token, so those kept it.
#include "cuda/kernel_utils.cuh"
#include "cuda/moe_cuda.h"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {
constexpr int kThreads = 128;  // the per-token gathers: a block per token (or slot)
constexpr int kRowWarps = 8, kRowThreads = 32 * kRowWarps, kUnroll = 4;  // the row kernels: a warp per row

unsigned row_blocks(int64_t rows) { return unsigned(ceil_div(rows, int64_t{kRowWarps})); }
constexpr int kTile = 2048;       // slots per block of the histograms and the routing map's scatter
constexpr int kHistThreads = 256;

int64_t tiles(int64_t slots) { return ceil_div(slots, int64_t{kTile}); }

// hist (E, shared memory) = the histogram of this block's tile of indices (-1 = dropped, not counted): one
// shared-memory atomic per warp and distinct expert (the lanes holding the same expert found by __match_any_sync).
__device__ void tile_histogram(int32_t* hist, const int32_t* indices, int64_t slots, int64_t E) {
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const int64_t s0 = int64_t(blockIdx.x) * kTile, s1 = min(slots, s0 + kTile);
  for (int64_t round = s0; round < s1; round += blockDim.x) {  // every lane of a warp in each round's match
    const int64_t s = round + threadIdx.x;
    const int32_t i = s < s1 ? indices[s] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, i);
    if (i >= 0 && int(threadIdx.x % 32) == __ffs(peers) - 1) atomicAdd(&hist[i], __popc(peers));
  }
  __syncthreads();
}

// counts (E) += the tile's histogram (counts zeroed before)
__global__ void counts_kernel(int32_t* counts, const int32_t* indices, int64_t slots, int64_t E) {
  extern __shared__ int32_t hist[];
  tile_histogram(hist, indices, slots, E);
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
    if (hist[e]) atomicAdd(&counts[e], hist[e]);
}

// tile_counts (tiles, E): the histogram of each tile
__global__ void tile_counts_kernel(int32_t* tile_counts, const int32_t* indices, int64_t slots, int64_t E) {
  extern __shared__ int32_t hist[];
  tile_histogram(hist, indices, slots, E);
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) tile_counts[int64_t(blockIdx.x) * E + e] = hist[e];
}

// One block: counts[e] = sum over tiles; tile_first[t, e] = first row of expert e's slots in tile t; slot_of_row
// = -1 past the routed rows (dropped slots leave them unused).
__global__ void tile_scan_kernel(int32_t* tile_first, int32_t* counts, int32_t* slot_of_row, const int32_t* tile_counts,
                                 int64_t ntiles, int64_t slots, int64_t E) {
  extern __shared__ int32_t total[];  // (E)
  __shared__ int64_t routed;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t c = 0;
    for (int64_t t = 0; t < ntiles; ++t) c += tile_counts[t * E + e];
    total[e] = c;
    counts[e] = c;
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t r = 0;
    for (int64_t x = 0; x < e; ++x) r += total[x];
    if (e == E - 1) routed = r + total[e];
    for (int64_t t = 0; t < ntiles; ++t) {
      tile_first[t * E + e] = r;
      r += tile_counts[t * E + e];
    }
  }
  __syncthreads();
  for (int64_t x = routed + threadIdx.x; x < slots; x += blockDim.x) slot_of_row[x] = -1;
}

// Block per tile, blockDim.x slots per round: a slot's row = its expert's next row in the tile (base) + the same
// expert's slots in the round's earlier warps (warp_count) + in its warp's earlier lanes. Rounds, warps and lanes
// go in slot order, so the slots still ascend inside an expert.
__global__ void tile_scatter_kernel(int32_t* slot_of_row, int32_t* row_of_slot, const int32_t* tile_first,
                                    const int32_t* indices, int64_t slots, int64_t E) {
  extern __shared__ int32_t sm[];  // base (E), then warp_count (warps, E)
  const int warps = int(blockDim.x / 32), warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  int32_t *base = sm, *warp_count = sm + E;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    base[e] = tile_first[int64_t(blockIdx.x) * E + e];
    for (int w = 0; w < warps; ++w) warp_count[w * E + e] = 0;
  }
  __syncthreads();
  const int64_t s0 = int64_t(blockIdx.x) * kTile, s1 = min(slots, s0 + kTile);
  for (int64_t round = s0; round < s1; round += blockDim.x) {
    const int64_t s = round + threadIdx.x;
    const int32_t i = s < s1 ? indices[s] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, i);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    if (i >= 0 && rank == 0) warp_count[warp * E + i] = __popc(peers);
    __syncthreads();
    if (i >= 0) {
      int32_t r = base[i] + rank;
      for (int w = 0; w < warp; ++w) r += warp_count[w * E + i];
      row_of_slot[s] = r;
      slot_of_row[r] = int32_t(s);
    } else if (s < s1) {
      row_of_slot[s] = -1;
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
      for (int w = 0; w < warps; ++w) {
        base[e] += warp_count[w * E + e];
        warp_count[w * E + e] = 0;
      }
    __syncthreads();
  }
}

// V elements per access (V = 1: scalar; else 16-byte vectors, C % V == 0 and the pointers aligned).
// The row kernels: warp w of block b owns row 8 b + w; lane l the columns l V + 32 V u (u < kUnroll) + 32 V kUnroll i.
__device__ __forceinline__ int64_t row_of_warp() { return int64_t(blockIdx.x) * kRowWarps + threadIdx.x / 32; }

template <int V, typename D>
__device__ __forceinline__ void zero_row(D* dst, int64_t C) {
  D z[V];
#pragma unroll
  for (int i = 0; i < V; ++i) z[i] = from_float<D>(0.f);
  for (int64_t c = (threadIdx.x % 32) * V; c < C; c += 32 * V) store_vec<V>(dst + c, z);
}

template <int V, typename D>
__global__ void permute_kernel(D* out, const D* x, const int32_t* slot_of_row, int64_t M, int64_t C, int64_t k) {
  const int64_t r = row_of_warp();
  if (r >= M) return;
  const int32_t slot = slot_of_row[r];
  D* dst = out + r * C;
  if (slot < 0) return zero_row<V>(dst, C);  // a padding row of the padded layout: zeros
  const D* src = x + int64_t(slot / k) * C;
  for (int64_t c0 = (threadIdx.x % 32) * V; c0 < C; c0 += 32 * V * kUnroll) {
    D v[kUnroll][V];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + u * 32 * V < C) load_vec<V>(v[u], src + c0 + u * 32 * V);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + u * 32 * V < C) store_vec<V>(dst + c0 + u * 32 * V, v[u]);
  }
}

// rows r with slot_of_row[r] < 0 (padding) = 0; the others untouched
template <int V, typename D>
__global__ void zero_unrouted_kernel(D* x, const int32_t* slot_of_row, int64_t M, int64_t C) {
  const int64_t r = row_of_warp();
  if (r >= M || slot_of_row[r] >= 0) return;
  zero_row<V>(x + r * C, C);
}

// The last e with start[e] <= r, start (E + 1) ascending (an empty expert never is: its start is the next one's).
__device__ int64_t expert_of(const int32_t* start, int64_t E, int64_t r) {
  int64_t lo = 0, hi = E;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (start[mid] <= r) lo = mid;
    else hi = mid;
  }
  return lo;
}

// thread per padded row p of expert e's region: slot_of_row_pad[p] = the slot of expert e's (p - pstart[e])-th
// row, or -1 (padding)
__global__ void pad_slots_kernel(int32_t* slot_of_row_pad, const int32_t* slot_of_row, PadPlan plan) {
  const int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= plan.pstart[plan.E]) return;
  const int64_t e = expert_of(plan.pstart, plan.E, p), i = p - plan.pstart[e];
  slot_of_row_pad[p] = i < plan.start[e + 1] - plan.start[e] ? slot_of_row[plan.start[e] + i] : -1;
}

// thread per slot: compact row r of expert e -> pstart[e] + r - start[e]; -1 stays
__global__ void pad_rows_kernel(int32_t* row_of_slot, int64_t slots, PadPlan plan) {
  const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= slots) return;
  const int32_t r = row_of_slot[s];
  if (r < 0) return;
  const int64_t e = expert_of(plan.start, plan.E, r);
  row_of_slot[s] = int32_t(plan.pstart[e] + r - plan.start[e]);
}

// The router's share of the permute's backward: dlogits (N, E) fp32 times its weight (E, C), summed over e in order.
template <typename D>
struct RouterTerm {
  const float* dlogits = nullptr;
  const D* weight = nullptr;
  int64_t E = 0;
};

// kMaxE: 0 without the router term, else kRouterTermMaxE: the token's dlogits are loaded into registers before the
// gathers (their latency behind the rows'), and the E weight vectors of a column issued together (unrolled, guarded
// by router.E), not one dependent load after another; the sum keeps the order (rows, then e ascending, then residual).
template <int V, int kMaxE, typename D>
__global__ void unpermute_kernel(D* y, const D* yp, const float* weights, const int32_t* row_of_slot, int64_t C,
                                 int64_t k, const D* residual, const RouterTerm<D> router) {
  const int64_t n = blockIdx.x;
  float g[kMaxE > 0 ? kMaxE : 1];
#pragma unroll
  for (int e = 0; e < kMaxE; ++e) g[e] = e < router.E ? router.dlogits[n * router.E + e] : 0.f;
  for (int64_t c = threadIdx.x * V; c < C; c += int64_t(blockDim.x) * V) {
    float acc[V] = {};
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = row_of_slot[n * k + j];
      if (r < 0) continue;
      const float w = weights ? weights[n * k + j] : 1.f;  // null: the plain sum (the permute's backward)
      D v[V];
      load_vec<V>(v, yp + int64_t(r) * C + c);
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] += w * to_float(v[i]);
    }
#pragma unroll
    for (int e = 0; e < kMaxE; ++e) {  // (its E x C weight stays in L1: E <= kRouterTermMaxE)
      if (e >= router.E) break;
      D v[V];
      load_vec<V>(v, router.weight + e * C + c);
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] += g[e] * to_float(v[i]);
    }
    if (residual) {
      D v[V];
      load_vec<V>(v, residual + n * C + c);
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] += to_float(v[i]);
    }
    D o[V];
#pragma unroll
    for (int i = 0; i < V; ++i) o[i] = from_float<D>(acc[i]);
    store_vec<V>(y + n * C + c, o);
  }
}

// block per slot: dyp[row] = w * dy[token]; dweights[slot] = <dy[token], yp[row]> (block reduction, fixed order)
template <int V, typename D>
__global__ void unpermute_backward_kernel(D* dyp, float* dweights, const D* dy, const D* yp, const float* weights,
                                          const int32_t* row_of_slot, int64_t C, int64_t k) {
  __shared__ float red[32];
  const int64_t s = blockIdx.x, n = s / k;
  const int32_t r = row_of_slot[s];
  if (r < 0) {
    if (threadIdx.x == 0) dweights[s] = 0.f;
    return;
  }
  const float w = weights[s];
  float acc = 0.f;
  for (int64_t c = threadIdx.x * V; c < C; c += int64_t(blockDim.x) * V) {
    D g[V], v[V], o[V];
    load_vec<V>(g, dy + n * C + c);
    load_vec<V>(v, yp + int64_t(r) * C + c);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float gf = to_float(g[i]);
      acc += gf * to_float(v[i]);
      o[i] = from_float<D>(w * gf);
    }
    store_vec<V>(dyp + int64_t(r) * C + c, o);
  }
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) dweights[s] = acc;
}

// Launches kernel<V> with 16-byte vectors when C and every pointer allow, else kernel<1>.
template <typename D, typename Launch>
void by_width(int64_t C, std::initializer_list<const void*> ptrs, Launch&& launch) {
  constexpr int V = 16 / sizeof(D);
  bool ok = C % V == 0;
  for (const void* p : ptrs) ok = ok && aligned(p, 16);
  if (ok)
    launch(std::integral_constant<int, V>{});
  else
    launch(std::integral_constant<int, 1>{});
}
}  // namespace

void moe_expert_counts_cuda(int32_t* counts, const int32_t* indices, int64_t slots, int64_t E) {
  cudaStream_t st = current_stream();
  MT_CUDA_CHECK(cudaMemsetAsync(counts, 0, size_t(E) * sizeof(int32_t), st));
  if (slots == 0) return;
  counts_kernel<<<unsigned(tiles(slots)), kHistThreads, size_t(E) * sizeof(int32_t), st>>>(counts, indices, slots, E);
  MT_CUDA_CHECK_LAUNCH("moe_expert_counts");
}

void moe_routing_map_cuda(int32_t* slot_of_row, int32_t* row_of_slot, int32_t* counts, const int32_t* indices,
                          int64_t slots, int64_t E) {
  cudaStream_t st = current_stream();
  if (slots == 0) {
    MT_CUDA_CHECK(cudaMemsetAsync(counts, 0, size_t(E) * sizeof(int32_t), st));
    return;
  }
  const int64_t nt = tiles(slots);
  Scratch scratch(2 * size_t(nt * E) * sizeof(int32_t));
  int32_t *tile_counts = scratch.as<int32_t>(), *tile_first = tile_counts + nt * E;
  const size_t hist = size_t(E) * sizeof(int32_t);
  tile_counts_kernel<<<unsigned(nt), kHistThreads, hist, st>>>(tile_counts, indices, slots, E);
  MT_CUDA_CHECK_LAUNCH("moe_routing_map (tile counts)");
  tile_scan_kernel<<<1, 1024, hist, st>>>(tile_first, counts, slot_of_row, tile_counts, nt, slots, E);
  MT_CUDA_CHECK_LAUNCH("moe_routing_map (scan)");
  const size_t scatter_smem = size_t(1 + kHistThreads / 32) * hist;
  if (scatter_smem > 48 * 1024)  // over 1365 experts
    MT_CUDA_CHECK(cudaFuncSetAttribute(tile_scatter_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(scatter_smem)));
  tile_scatter_kernel<<<unsigned(nt), kHistThreads, scatter_smem, st>>>(slot_of_row, row_of_slot, tile_first, indices,
                                                                        slots, E);
  MT_CUDA_CHECK_LAUNCH("moe_routing_map (scatter)");
}

template <typename T>
void moe_permute_forward_cuda(T* out, const T* x, const int32_t* slot_of_row, int64_t M, int64_t C, int64_t k) {
  if (M == 0) return;
  using D = dev_t<T>;
  by_width<D>(C, {out, x}, [&](auto v) {
    permute_kernel<decltype(v)::value><<<row_blocks(M), kRowThreads, 0, current_stream()>>>(dev(out), dev(x),
                                                                                           slot_of_row, M, C, k);
  });
  MT_CUDA_CHECK_LAUNCH("moe_permute_forward");
}

void moe_pad_routing_map_cuda(int32_t* slot_of_row_pad, int32_t* row_of_slot, const int32_t* slot_of_row,
                              int64_t slots, const PadPlan& plan, int64_t tail) {
  cudaStream_t st = current_stream();
  if (tail > 0)  // all bits set: -1
    MT_CUDA_CHECK(cudaMemsetAsync(slot_of_row_pad + plan.pstart[plan.E], 0xFF, size_t(tail) * sizeof(int32_t), st));
  constexpr int kT = 256;
  if (plan.pstart[plan.E] > 0) {
    pad_slots_kernel<<<unsigned(ceil_div(int64_t{plan.pstart[plan.E]}, int64_t{kT})), kT, 0, st>>>(slot_of_row_pad,
                                                                                                   slot_of_row, plan);
    MT_CUDA_CHECK_LAUNCH("moe_pad_routing_map (slots)");
  }
  if (slots > 0) {
    pad_rows_kernel<<<unsigned(ceil_div(slots, int64_t{kT})), kT, 0, st>>>(row_of_slot, slots, plan);
    MT_CUDA_CHECK_LAUNCH("moe_pad_routing_map (rows)");
  }
}

template <typename T>
void moe_zero_unrouted_rows_cuda(T* x, const int32_t* slot_of_row, int64_t M, int64_t C) {
  if (M == 0) return;
  using D = dev_t<T>;
  by_width<D>(C, {x}, [&](auto v) {
    zero_unrouted_kernel<decltype(v)::value><<<row_blocks(M), kRowThreads, 0, current_stream()>>>(dev(x), slot_of_row,
                                                                                                 M, C);
  });
  MT_CUDA_CHECK_LAUNCH("moe_zero_unrouted_rows");
}

template <typename T>
void moe_permute_backward_cuda(T* dx, const T* dout, const int32_t* row_of_slot, int64_t N, int64_t C, int64_t k,
                               const float* dlogits, const T* router_weight, int64_t E, const T* residual) {
  if (N == 0) return;
  using D = dev_t<T>;
  const RouterTerm<D> router{dlogits, dev(router_weight), dlogits ? E : 0};
  by_width<D>(C, {dx, dout, router_weight, residual}, [&](auto v) {
    constexpr int kV = decltype(v)::value;
    if (dlogits)
      unpermute_kernel<kV, int(kRouterTermMaxE)><<<unsigned(N), kThreads, 0, current_stream()>>>(
          dev(dx), dev(dout), static_cast<const float*>(nullptr), row_of_slot, C, k, dev(residual), router);
    else
      unpermute_kernel<kV, 0><<<unsigned(N), kThreads, 0, current_stream()>>>(
          dev(dx), dev(dout), static_cast<const float*>(nullptr), row_of_slot, C, k, dev(residual), router);
  });
  MT_CUDA_CHECK_LAUNCH("moe_permute_backward");
}

template <typename T>
void moe_unpermute_forward_cuda(T* y, const T* yp, const float* weights, const int32_t* row_of_slot, int64_t N,
                                int64_t C, int64_t k, const T* residual) {
  if (N == 0) return;
  using D = dev_t<T>;
  by_width<D>(C, {y, yp, residual}, [&](auto v) {
    unpermute_kernel<decltype(v)::value, 0><<<unsigned(N), kThreads, 0, current_stream()>>>(
        dev(y), dev(yp), weights, row_of_slot, C, k, dev(residual), RouterTerm<D>{});
  });
  MT_CUDA_CHECK_LAUNCH("moe_unpermute_forward");
}

template <typename T>
void moe_unpermute_backward_cuda(T* dyp, float* dweights, const T* dy, const T* yp, const float* weights,
                                 const int32_t* row_of_slot, int64_t N, int64_t C, int64_t k) {
  if (N == 0) return;
  using D = dev_t<T>;
  by_width<D>(C, {dyp, dy, yp}, [&](auto v) {
    unpermute_backward_kernel<decltype(v)::value><<<unsigned(N * k), kThreads, 0, current_stream()>>>(
        dev(dyp), dweights, dev(dy), dev(yp), weights, row_of_slot, C, k);
  });
  MT_CUDA_CHECK_LAUNCH("moe_unpermute_backward");
}

namespace {
__global__ void dest_ranks_kernel(int32_t* dest, const int32_t* indices, int64_t N, int64_t k, int64_t P, int64_t El) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  for (int64_t d = 0; d < P; ++d) dest[n * P + d] = -1;
  for (int64_t j = 0; j < k; ++j)
    if (const int32_t e = indices[n * k + j]; e >= 0) dest[n * P + e / El] = int32_t(e / El);
}

__global__ void local_choices_kernel(int32_t* local, const int32_t* indices, const int32_t* send_slot, int64_t S,
                                     int64_t k, int64_t P, int64_t El) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= S) return;
  const int64_t n = send_slot[r] / P, d = send_slot[r] % P;
  for (int64_t j = 0; j < k; ++j) {
    const int32_t e = indices[n * k + j];
    local[r * k + j] = e >= 0 && e / El == d ? int32_t(e - d * El) : -1;
  }
}
}  // namespace

void moe_dest_ranks_cuda(int32_t* dest, const int32_t* indices, int64_t N, int64_t k, int64_t P, int64_t El) {
  if (N == 0) return;
  dest_ranks_kernel<<<unsigned((N + 255) / 256), 256, 0, current_stream()>>>(dest, indices, N, k, P, El);
  MT_CUDA_CHECK_LAUNCH("moe_dest_ranks");
}

void moe_local_choices_cuda(int32_t* local, const int32_t* indices, const int32_t* send_slot, int64_t S, int64_t k,
                            int64_t P, int64_t El) {
  if (S == 0) return;
  local_choices_kernel<<<unsigned((S + 255) / 256), 256, 0, current_stream()>>>(local, indices, send_slot, S, k, P,
                                                                                El);
  MT_CUDA_CHECK_LAUNCH("moe_local_choices");
}

#define MT_INSTANTIATE(T)                                                                                        \
  template void moe_permute_forward_cuda<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t);           \
  template void moe_permute_backward_cuda<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t, const float*, \
                                             const T*, int64_t, const T*);                                         \
  template void moe_zero_unrouted_rows_cuda<T>(T*, const int32_t*, int64_t, int64_t);                            \
  template void moe_unpermute_forward_cuda<T>(T*, const T*, const float*, const int32_t*, int64_t, int64_t,     \
                                              int64_t, const T*);                                                \
  template void moe_unpermute_backward_cuda<T>(T*, float*, const T*, const T*, const float*, const int32_t*,    \
                                               int64_t, int64_t, int64_t);
MT_INSTANTIATE(float)
MT_INSTANTIATE(mt::bf16)
MT_INSTANTIATE(mt::f16)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cuda
