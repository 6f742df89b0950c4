// The grouped expert GEMMs on Hopper (semantics: cuda/sm90/grouped_gemm.h). One kernel template, three products:
//   product    A (M x K)                   B (K x N)                    experts split   out
//   forward    x (rows, IC), K-major       W_e^T: W (El*OC, IC) K-major  M (rows)        bf16 (rows, OC)
//   dx         dout (rows, OC), K-major    W_e: W (El*OC, IC) MN-major   M (rows)        bf16 (rows, IC)
//   dweight    dout^T: (rows, OC) MN-major x (rows, IC), MN-major        K (rows)        fp32 / bf16 (El*OC, IC)
// A CTA (3 warpgroups, persistent over 128 x 256 output tiles, which it takes one at a time from a device counter, so
// that tiles of uneven cost (the weight gradient's K is its expert's rows) spread over the CTAs, and CTAs that start
// late, on SMs another kernel held (NCCL's, beside the backward), take fewer tiles instead of finishing late):
// warpgroup 0's first thread takes the next tile and issues TMA loads of 64-deep K slices of A (128 x 64) and B
// (64 x 256) into a ring of kStages stages; warpgroups 1 and 2 each run wgmma m64n256k16 over their 64 rows of the
// tile, releasing a stage once the MMAs that read it are done. bf16
// tiles of 128 full rows leave through shared memory and TMA stores, which run on under the next tile's main
// loop; of a last tile of an expert with fewer rows, each consumer's 64 rows leave that way if all are the expert's,
// row by row if some are (the rows past them are another expert's), and not at all if none are: that consumer then
// skips the tile's MMAs too (the MoE layer pads each expert to a multiple of 64 rows: such tiles are of 64 rows).
// Every output element is one fp32 dot product over K in k order: results do not depend on the tiling or grid.
// A fourth kernel (grouped_dx_swiglu) is dx on 128 x 128 tiles with the SwiGLU backward as its epilogue, a fifth
// (grouped_forward_swiglu) fc1's forward with the SwiGLU forward in its epilogue (Epi).
// The bf16 epilogues are deferred: a full tile's results wait in registers as bf16 pairs while the next tile's first
// K slices run, and leave (through shared memory and TMA stores) a step at a time between those slices' MMAs, so
// the tensor cores do not idle through the epilogue (one of 128 x 256 x 1024 takes ~10% of its tile's main loop).
#include "cuda/sm90/grouped_gemm.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

#include "cuda/cuda_check.h"
#include "cuda/cuda_context.h"
#include "cuda/sm90/hopper_ptx.cuh"
#include "cuda/swiglu_math.cuh"

namespace mt::ops::cuda::sm90 {

using namespace ::mt::cuda::sm90;
using ::mt::cuda::swiglu_grads;
using ::mt::cuda::swiglu_value;

namespace {

constexpr int kBM = 128, kBK = 64, kThreads = 384;
constexpr int kStageA = kBM * kBK * 2;  // bytes
constexpr int kBox = 64 * 64 * 2;       // a 64 x 64 bf16 TMA box: 8 KiB
constexpr int kStageC = 2 * kBox;       // a consumer's 64 rows x 128 columns of bf16 in shared memory
// The weight gradient's sums of squares: one fp64 partial per consumer warp of a tile (2 warpgroups x 4 warps).
constexpr int kSquaresPerTile = 8;
constexpr int kIds = 2;  // the ring of tile indices the producer hands to the consumers (and the SwiGLU's mover)

// What a kernel does with its fp32 tile: store it as bf16 (through shared memory and TMA; a bf16 weight gradient, whose
// tiles are all full, also sums its squares), store it as fp32 (straight from registers: the weight gradient into fp32
// main grads), or (kSwigluBwd, the fc2 dx of a SwiGLU expert) run the SwiGLU backward on it: da (the tile, rounded to
// bf16 as a stored da would be) with the tile's gate and up columns of h, loaded into shared memory under the main
// loop, gives dgate and dup, written over g and u (h becomes dh in place), and the recomputed a = swiglu(g, u) (the
// forward's value, for fc2's weight gradient), stored from registers. The consumers do the math from
// registers; one thread of warpgroup 0 (the mover) stores dgate and dup and then loads the next tile's g and u, so that
// neither waits on the consumers' critical path. kSwigluFwd (fc1's forward of a SwiGLU expert): a tile's 256 columns
// are 128 gate columns and the same 128 features' up columns (B's rows n and F + n of the expert), so that each thread
// holds g and u of the same elements; g and u go to h, and a = swiglu(g, u) (from their bf16 values, as the separate
// pass would compute it) to act.
enum Epi { kBf16 = 0, kF32 = 1, kSwigluBwd = 2, kSwigluFwd = 3 };
template <int EPI>
struct Cfg {
  // 128 x 256 tiles; 128 x 128 for the SwiGLU backward, whose g and u (64 KiB) must fit beside the ring
  static constexpr int BN = EPI == kSwigluBwd ? 128 : 256;
  // Stages of the operand ring. The SwiGLU backward's main loop waits on its operand loads while the epilogues'
  // stores and g / u loads fill the memory system (ncu, session 24): it takes a fifth stage in the room a third
  // staging buffer (for a) would need, and stores a from registers.
  static constexpr int kStages = EPI == kSwigluBwd ? 5 : 4;
  static constexpr int TN = EPI == kSwigluFwd ? 128 : BN;  // output features per tile (tile_of's N step)
  static constexpr int kStageB = BN * kBK * 2;
  static constexpr bool kStaged = EPI == kBf16 || EPI == kSwigluFwd;  // deferred, through one buffer per consumer
  // deferred epilogue steps, one between two K slices: kBf16 the two 128-column halves; kSwigluFwd g, u, and a in
  // two steps of 64 columns (its exponentials and reciprocals take about a K slice's MMAs each)
  static constexpr int kSteps = EPI == kBf16 ? 2 : EPI == kSwigluFwd ? 4 : 0;
  static constexpr int kEpiBytes = EPI == kSwigluBwd ? 2 * 2 * kStageC : kStaged ? 2 * kStageC : 0;
  static constexpr int kBars = 2 * kStages + 2 * kIds + 2;
  static constexpr int kSmem = kStages * (kStageA + kStageB) + kEpiBytes + kBars * 8 + kIds * 4 + 1024;
};

// The expert layout of one launch, passed by value (kernel parameters: 3 x 257 x 4 + 24 bytes).
struct Groups {
  int32_t E;
  int32_t n_tiles;     // output tiles along N
  int32_t k_grouped;   // experts split K (the weight gradient) rather than M
  int32_t M, N, K;     // k_grouped: M (OC) per expert; else K per expert (and B's rows per expert)
  int32_t tile_prefix[kMaxExperts + 1];  // row blocks of 128 before expert e
  int32_t row0[kMaxExperts];             // expert e's first row of x / dout
  int32_t count[kMaxExperts];
};

// The SwiGLU epilogues' outputs (unused by the other kernels): h (rows, 2F) = [g | u] (the backward writes dh over
// it) and a (rows, F); the stores from registers use them (a last, shorter tile's, and the backward's a). The
// backward's act may be null: a kept from the forward, nothing to recompute it for.
struct SwigluOut {
  __nv_bfloat16* h;
  __nv_bfloat16* act;
  int32_t F;
};

// Byte offset of a consumer thread's bf16 pair (accumulators 4j + 2i, 4j + 2i + 1) in its 64-row half tile of
// 64 x 64 boxes in the 128-byte swizzle (the TMA maps' layout): row r (r_lo + 8i), 16-byte chunk j % 8 of box j / 8.
__device__ __forceinline__ int swizzled_pair(int j, int r, int lane) {
  return (j / 8) * kBox + r * 128 + (((j % 8) ^ (r % 8)) * 16) + (lane % 4) * 4;
}

__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// a = swiglu(g, u) of two bf16 pairs (cuda/swiglu_math.cuh: the separate pass's bits)
__device__ __forceinline__ uint32_t swiglu_pair(uint32_t g, uint32_t u) {
  const __nv_bfloat162 gv = *reinterpret_cast<const __nv_bfloat162*>(&g), uv = *reinterpret_cast<const __nv_bfloat162*>(&u);
  return bf16_pair(swiglu_value<__nv_bfloat16>(__low2float(gv), __low2float(uv)),
                   swiglu_value<__nv_bfloat16>(__high2float(gv), __high2float(uv)));
}

// A consumer warp's fp64 partial of its tile's sum of squares (each thread's sq over its elements): summed over the
// warp by a fixed butterfly, written to squares[8 t + 4 c + warp] (grouped_dweight_square_partials)
__device__ __forceinline__ void store_squares(double* squares, int t, int c, int warp, int lane, double sq) {
  static_assert(kSquaresPerTile == 2 * 4, "a partial per consumer warp");
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
  if (lane == 0) squares[int64_t(t) * kSquaresPerTile + c * 4 + warp] = sq;
}

struct Tile {
  int a_m, a_k;    // A's first M and K
  int b_row;       // B K-major: its row of the tile's first N; MN-major: its row of K = 0
  int out_m, n;    // the output tile's first row and column
  int mvalid;      // rows of the tile to write
  int kblocks;     // K slices of 64
};

template <int TB, int BN>
__device__ __forceinline__ Tile tile_of(const Groups& g, int t) {
  const int bm = t / g.n_tiles, nt = t % g.n_tiles;
  int lo = 0, hi = g.E;  // the expert: tile_prefix[e] <= bm < tile_prefix[e + 1]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (g.tile_prefix[mid] <= bm) lo = mid; else hi = mid;
  }
  const int e = lo, mt = bm - g.tile_prefix[e];
  Tile tl;
  tl.n = nt * BN;
  if (!g.k_grouped) {
    tl.a_m = g.row0[e] + mt * kBM, tl.a_k = 0;
    tl.out_m = tl.a_m;
    tl.mvalid = min(kBM, g.count[e] - mt * kBM);
    tl.kblocks = g.K / kBK;
    // in the stacked (El*OC, IC) weight: forward, W_e's rows are N (= OC); dx, they are K (= OC)
    tl.b_row = TB ? e * g.K : e * g.N + tl.n;
  } else {
    tl.a_m = mt * kBM, tl.a_k = g.row0[e];
    tl.out_m = e * g.M + tl.a_m;
    tl.mvalid = kBM;
    tl.kblocks = g.count[e] / kBK;
    tl.b_row = g.row0[e];
  }
  return tl;
}

// TA / TB: A / B are MN-major. EPI: what becomes of the fp32 tile (Epi). map_h / map_act / so: the SwiGLU
// epilogue's h (loads of g and u, stores of dg and du over them) and a; the other kernels ignore them.
// Tiles are taken from `counter`: this launch's tile t is the (base + t)-th increment (every launch makes exactly
// tiles + gridDim.x of them: each tile once, and each CTA one past the last, which ends it; the host adds that up).
template <int TA, int TB, int EPI>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                        const __grid_constant__ CUtensorMap map_out, const __grid_constant__ CUtensorMap map_h,
                        const __grid_constant__ CUtensorMap map_act, void* out, const SwigluOut so,
                        const __grid_constant__ Groups g, int tiles, unsigned long long* counter,
                        unsigned long long base, double* squares) {
  using C = Cfg<EPI>;
  constexpr int BN = C::BN, kStages = C::kStages;
  extern __shared__ uint8_t smem_raw[];
  // 128-byte swizzled TMA boxes want 1024-byte aligned shared memory. An offset from smem_raw, not a pointer rounded
  // as an integer: the compiler then still knows that every pointer below is shared memory, so their loads and stores
  // are ld.shared / st.shared rather than generic ones (a rounded integer lost that: the tile-index reads and the
  // SwiGLU backward's g / u accesses were generic, and fc1's forward + SwiGLU spilled 20 bytes).
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  uint8_t* sA = smem;
  uint8_t* sB = sA + kStages * kStageA;
  uint8_t* sC = sB + kStages * C::kStageB;  // bf16: each consumer's half tile; SwiGLU backward: g, u (2 kStageC each)
  uint64_t* full = reinterpret_cast<uint64_t*>(sC + C::kEpiBytes);
  uint64_t* empty = full + kStages;
  uint64_t* id_full = empty + kStages;  // the tile-index ring: written by the producer, read by the consumers
  uint64_t* id_empty = id_full + kIds;
  uint64_t* gu_full = id_empty + kIds;  // SwiGLU: the tile's g and u have landed
  uint64_t* out_full = gu_full + 1;     // SwiGLU: the consumers have written dg and du (256 arrivals)
  int* ids = reinterpret_cast<int*>(out_full + 1);
  constexpr int kIdReaders = 2 * 128 + (EPI == kSwigluBwd ? 1 : 0);  // the consumers (and the mover)
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], 2);
    for (int j = 0; j < kIds; ++j) mbar_init(&id_full[j], 1), mbar_init(&id_empty[j], kIdReaders);
    mbar_init(gu_full, 1), mbar_init(out_full, 256);
    mbar_init_fence();
  }
  __syncthreads();
  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {  // producer
      int s = 0, j = 0;
      uint32_t phase = 0, id_phase = 0;
      for (;;) {
        const long long next = static_cast<long long>(atomicAdd(counter, 1ull) - base);
        const int t = next < tiles ? static_cast<int>(next) : -1;  // -1: no tile left, the consumers stop
        mbar_wait(&id_empty[j], id_phase ^ 1);
        ids[j] = t;
        mbar_arrive(&id_full[j]);
        if (++j == kIds) j = 0, id_phase ^= 1;
        if (t < 0) break;
        const Tile tl = tile_of<TB, C::TN>(g, t);
        for (int kb = 0; kb < tl.kblocks; ++kb) {
          mbar_wait(&empty[s], phase ^ 1);
          mbar_expect_tx(&full[s], kStageA + C::kStageB);
          const int k = kb * kBK;
          if constexpr (TA)  // two 64 (M) x 64 (K) boxes, rows along K
            for (int c = 0; c < 2; ++c)
              tma_load_2d(sA + s * kStageA + c * kBox, &map_a, &full[s], tl.a_m + 64 * c, tl.a_k + k);
          else  // one 128 (M) x 64 (K) box
            tma_load_2d(sA + s * kStageA, &map_a, &full[s], tl.a_k + k, tl.a_m);
          if constexpr (TB)  // BN / 64 boxes of 64 (N) x 64 (K)
            for (int c = 0; c < BN / 64; ++c)
              tma_load_2d(sB + s * C::kStageB + c * kBox, &map_b, &full[s], tl.n + 64 * c, tl.b_row + k);
          else if constexpr (EPI == kSwigluFwd) {  // 128 gate rows, then the same features' up rows
            tma_load_2d(sB + s * C::kStageB, &map_b, &full[s], k, tl.b_row);
            tma_load_2d(sB + s * C::kStageB + C::kStageB / 2, &map_b, &full[s], k, tl.b_row + so.F);
          } else  // one BN (N) x 64 (K) box
            tma_load_2d(sB + s * C::kStageB, &map_b, &full[s], k, tl.b_row);
          if (++s == kStages) s = 0, phase ^= 1;
        }
      }
    } else if constexpr (EPI == kSwigluBwd) {
      if (threadIdx.x == 32) {  // the mover: tile i - 1's results out, then tile i's g and u in (one buffer each)
        uint8_t *sG = sC, *sU = sC + 2 * kStageC;
        int j = 0, done = 0;
        uint32_t id_phase = 0;
        Tile prev{};
        for (;;) {
          mbar_wait(&id_full[j], id_phase);
          const int t = ids[j];
          mbar_arrive(&id_empty[j]);
          if (++j == kIds) j = 0, id_phase ^= 1;
          if (done > 0) {
            mbar_wait(out_full, (done - 1) & 1);
            // each consumer's 64 full rows (a last, shorter half went to global memory from its registers)
            for (int c = 0; c < 2; ++c)
              if (prev.mvalid >= 64 * (c + 1))
                for (int b = 0; b < 2; ++b) {
                  const int o = c * kStageC + b * kBox, col = prev.n + 64 * b, row = prev.out_m + 64 * c;
                  tma_store_2d(&map_h, sG + o, col, row);
                  tma_store_2d(&map_h, sU + o, so.F + col, row);
                }
            bulk_commit();
            bulk_wait_read_all();  // the buffers may take the next tile
          }
          if (t < 0) break;
          prev = tile_of<TB, C::TN>(g, t);
          ++done;
          const int halves = prev.mvalid > 64 ? 2 : 1;  // g and u of the consumers with rows
          mbar_expect_tx(gu_full, halves * 2 * kStageC);
          for (int c = 0; c < halves; ++c)
            for (int b = 0; b < 2; ++b) {
              tma_load_2d(sG + c * kStageC + b * kBox, &map_h, gu_full, prev.n + 64 * b, prev.out_m + 64 * c);
              tma_load_2d(sU + c * kStageC + b * kBox, &map_h, gu_full, so.F + prev.n + 64 * b, prev.out_m + 64 * c);
            }
        }
        bulk_wait_all();
      }
    }
  } else {  // consumers: warpgroup c = wg - 1 owns rows 64c .. 64c + 63 of each tile
    setmaxnreg_inc<232>();
    const int c = wg - 1, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    const int r_lo = warp * 16 + lane / 4;  // this thread's first row within its 64, then + 8
    int s = 0, j = 0;
    [[maybe_unused]] int done = 0;  // SwiGLU: tiles finished (gu_full's phase)
    uint32_t phase = 0, id_phase = 0;
    float d[BN / 2];
    // The deferred epilogue (C::kStaged): the last full tile's results as bf16 pairs, pk[2j + i] = columns
    // 8j + 2(lane % 4) + {0, 1} of row r_lo + 8i, and its steps still to run (step == kSteps: none).
    [[maybe_unused]] uint32_t pk[C::kStaged ? BN / 4 : 1] = {};
    [[maybe_unused]] Tile pend{};
    [[maybe_unused]] int step = C::kSteps;
    // Pairs jj in [J0, J1) of a 64 x 128 block into this consumer's buffer (pair(jj, i)); FIRST waits until the
    // buffer's last TMA store has read it, LAST stores the buffer's two 64 x 64 boxes at column col of `map`.
    // (Compile-time bounds and steps: pk stays in registers.)
    auto stage = [&]<int J0, int J1, bool FIRST, bool LAST>(const CUtensorMap* map, int col, auto pair) {
      const uint32_t cbase = smem_u32(sC + c * kStageC);
      if constexpr (FIRST) {
        if (tid == 0) bulk_wait_read_all();
        named_barrier(1 + c, 128);
      }
#pragma unroll
      for (int jj = J0; jj < J1; ++jj)
#pragma unroll
        for (int i = 0; i < 2; ++i)
          asm volatile("st.shared.b32 [%0], %1;" ::"r"(cbase + swizzled_pair(jj, r_lo + 8 * i, lane)),
                       "r"(pair(jj, i))
                       : "memory");
      if constexpr (LAST) {
        fence_proxy_async_smem();
        named_barrier(1 + c, 128);
        if (tid == 0) {
          for (int b = 0; b < 2; ++b) tma_store_2d(map, sC + c * kStageC + b * kBox, col + b * 64, pend.out_m + c * 64);
          bulk_commit();
        }
      }
    };
    auto epi = [&]<int ST>() {
      if constexpr (EPI == kBf16) {  // the two 128-column halves
        stage.template operator()<0, 16, true, true>(&map_out, pend.n + 128 * ST,
                                                    [&](int jj, int i) { return pk[2 * (16 * ST + jj) + i]; });
      } else if constexpr (EPI == kSwigluFwd) {  // g (pairs 0-15) and u (16-31) to h, then a in two steps
        if constexpr (ST < 2)
          stage.template operator()<0, 16, true, true>(&map_out, pend.n + ST * so.F,
                                                      [&](int jj, int i) { return pk[2 * (16 * ST + jj) + i]; });
        else
          stage.template operator()<8 * (ST - 2), 8 * (ST - 1), ST == 2, ST == 3>(
              &map_act, pend.n, [&](int jj, int i) { return swiglu_pair(pk[2 * jj + i], pk[2 * (jj + 16) + i]); });
      }
    };
    auto epi_step = [&](int st) {
      static_assert(C::kSteps <= 4, "epi_step dispatches four steps");
      switch (st) {
        case 0: epi.template operator()<0>(); break;
        case 1: epi.template operator()<1>(); break;
        case 2: epi.template operator()<2>(); break;
        case 3: epi.template operator()<3>(); break;
        default: break;
      }
    };
    for (;;) {
      mbar_wait(&id_full[j], id_phase);
      const int t = ids[j];
      mbar_arrive(&id_empty[j]);
      if (++j == kIds) j = 0, id_phase ^= 1;
      if (t < 0) break;
      const Tile tl = tile_of<TB, C::TN>(g, t);
      // this warpgroup's rows of the tile: 64 all of them; <= 0 none (an expert's last tile of at most 64 rows:
      // its MMAs are skipped, the slices go back unread)
      const int mine = tl.mvalid - 64 * c;
      int prev = -1;
      for (int kb = 0; kb < tl.kblocks; ++kb) {
        mbar_wait(&full[s], phase);
        if (mine <= 0) {
          if constexpr (C::kStaged)
            if (kb % 2 == 0 && step < C::kSteps) epi_step(step++);
          if (tid == 0) mbar_arrive(&empty[s]);
          if (++s == kStages) s = 0, phase ^= 1;
          continue;  // its own path: with the MMAs alone made conditional (fence, commit and wait outside them),
                     // ptxas serializes every wgmma of the kernel (C7520, a compiler-inserted warpgroup.arrive)
        }
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          // K-major: 16 elements of K are 32 bytes along the row; MN-major: 16 rows of 128 bytes
          const uint64_t da = TA ? smem_desc(sA + s * kStageA + c * kBox + kk * 2048, kBox)
                                 : smem_desc(sA + s * kStageA + c * 64 * 128 + kk * 32, 16);
          const uint64_t db = TB ? smem_desc(sB + s * C::kStageB + kk * 2048, kBox)
                                 : smem_desc(sB + s * C::kStageB + kk * 32, 16);
          if constexpr (BN == 256)
            wgmma_m64n256k16_bf16<TA, TB>(d, da, db, (kb > 0 || kk > 0) ? 1 : 0);
          else
            wgmma_m64n128k16_bf16<TA, TB>(d, da, db, (kb > 0 || kk > 0) ? 1 : 0);
        }
        wgmma_commit();
        if constexpr (C::kStaged)  // the previous tile's epilogue, a step under every other slice's MMAs
          if (kb % 2 == 0 && step < C::kSteps) epi_step(step++);
        wgmma_wait<1>();  // the previous slice's MMAs are done: its stage goes back to the producer
        if (prev >= 0 && tid == 0) mbar_arrive(&empty[prev]);
        prev = s;
        if (++s == kStages) s = 0, phase ^= 1;
      }
      if constexpr (C::kStaged)  // a short main loop: the rest under its last slice
        while (step < C::kSteps) epi_step(step++);
      wgmma_wait<0>();
      if (prev >= 0 && tid == 0) mbar_arrive(&empty[prev]);
      if constexpr (EPI == kF32) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int64_t at = int64_t(tl.out_m + c * 64 + r_lo + 8 * i) * g.N + tl.n + 2 * (lane % 4);
#pragma unroll
          for (int j = 0; j < BN / 8; ++j)
            *reinterpret_cast<float2*>(static_cast<float*>(out) + at + 8 * j) =
                make_float2(d[4 * j + 2 * i], d[4 * j + 2 * i + 1]);
        }
        if (squares) {
          double sq = 0;
#pragma unroll
          for (int q = 0; q < BN / 2; ++q) sq = fma(double(d[q]), double(d[q]), sq);
          store_squares(squares, t, c, warp, lane, sq);
        }
      } else if constexpr (EPI == kSwigluBwd) {
        // the SwiGLU backward on this thread's elements: da rounded to bf16 (what a stored da would hold); g and u
        // from shared memory, where dgate and dup go over them (the mover stores them; the next g and u land only
        // after it has: the buffers are free when gu_full completes); a straight from registers to global memory
        mbar_wait(gu_full, done & 1);
        ++done;
        uint8_t *sG = sC + c * kStageC, *sU = sC + 2 * kStageC + c * kStageC;
        const bool full_half = mine >= 64;  // through shared memory and the mover; else from registers
        if (mine > 0) {  // a warpgroup with no rows of the tile has nothing to compute
#pragma unroll
          for (int j = 0; j < 16; ++j) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              const int r = r_lo + 8 * i, off = swizzled_pair(j, r, lane);
              const __nv_bfloat162 dv = __floats2bfloat162_rn(d[4 * j + 2 * i], d[4 * j + 2 * i + 1]);
              const __nv_bfloat162 gv = *reinterpret_cast<const __nv_bfloat162*>(sG + off);
              const __nv_bfloat162 uv = *reinterpret_cast<const __nv_bfloat162*>(sU + off);
              float dg0, du0, a0, dg1, du1, a1;
              swiglu_grads<__nv_bfloat16>(__low2float(dv), __low2float(gv), __low2float(uv), dg0, du0, a0);
              swiglu_grads<__nv_bfloat16>(__high2float(dv), __high2float(gv), __high2float(uv), dg1, du1, a1);
              const __nv_bfloat162 dg = __floats2bfloat162_rn(dg0, dg1), du = __floats2bfloat162_rn(du0, du1),
                                   av = __floats2bfloat162_rn(a0, a1);
              if (full_half) {
                *reinterpret_cast<__nv_bfloat162*>(sG + off) = dg;
                *reinterpret_cast<__nv_bfloat162*>(sU + off) = du;
                const int64_t row = tl.out_m + c * 64 + r, col = tl.n + 8 * j + 2 * (lane % 4);
                if (so.act) *reinterpret_cast<__nv_bfloat162*>(so.act + row * so.F + col) = av;
              } else if (c * 64 + r < tl.mvalid) {
                const int64_t row = tl.out_m + c * 64 + r;
                const int col = tl.n + 8 * j + 2 * (lane % 4);
                *reinterpret_cast<__nv_bfloat162*>(so.h + row * 2 * so.F + col) = dg;
                *reinterpret_cast<__nv_bfloat162*>(so.h + row * 2 * so.F + so.F + col) = du;
                if (so.act) *reinterpret_cast<__nv_bfloat162*>(so.act + row * so.F + col) = av;
              }
            }
          }
        }
        if (full_half) fence_proxy_async_smem();  // the mover's TMA stores read what this thread wrote
        mbar_arrive(out_full);
      } else if (mine >= 64) {  // deferred: the steps run under the next tile's first slices
#pragma unroll
        for (int q = 0; q < BN / 4; ++q) pk[q] = bf16_pair(d[2 * q], d[2 * q + 1]);
        if constexpr (EPI == kBf16)
          if (squares) {  // a bf16 weight gradient: the squares of the rounded values, in kF32's order
            double sq = 0;
#pragma unroll
            for (int q = 0; q < BN / 4; ++q) {
              const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&pk[q]);
              const double lo = __low2float(v), hi = __high2float(v);
              sq = fma(lo, lo, sq), sq = fma(hi, hi, sq);
            }
            store_squares(squares, t, c, warp, lane, sq);
          }
        pend = tl, step = 0;
      } else if (mine > 0) {  // a last, shorter tile: its rows straight to global memory (the rows past it are another
                              // expert's)
        __nv_bfloat16* o = EPI == kSwigluFwd ? so.h : static_cast<__nv_bfloat16*>(out);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int r = c * 64 + r_lo + 8 * i;
          if (r < tl.mvalid) {
            const int64_t row = tl.out_m + r;
            const int col = tl.n + 2 * (lane % 4);
            if constexpr (EPI == kSwigluFwd) {
#pragma unroll
              for (int j = 0; j < 16; ++j) {
                const uint32_t gp = bf16_pair(d[4 * j + 2 * i], d[4 * j + 2 * i + 1]),
                               up = bf16_pair(d[4 * (j + 16) + 2 * i], d[4 * (j + 16) + 2 * i + 1]),
                               ap = swiglu_pair(gp, up);
                *reinterpret_cast<uint32_t*>(o + row * g.N + col + 8 * j) = gp;
                *reinterpret_cast<uint32_t*>(o + row * g.N + so.F + col + 8 * j) = up;
                *reinterpret_cast<uint32_t*>(so.act + row * so.F + col + 8 * j) = ap;
              }
            } else {
#pragma unroll
              for (int j = 0; j < BN / 8; ++j)
                *reinterpret_cast<uint32_t*>(o + row * g.N + col + 8 * j) =
                    bf16_pair(d[4 * j + 2 * i], d[4 * j + 2 * i + 1]);
            }
          }
        }
      }
    }
    if constexpr (C::kStaged)  // the last tile's epilogue
      while (step < C::kSteps) epi_step(step++);
    if (tid == 0) bulk_wait_all();
  }
}

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    MT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
    MT_CHECK(p && q == cudaDriverEntryPointSuccess, "the CUDA driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A row-major (rows, cols) bf16 matrix as a TMA map of box_rows x 64-column boxes, 128-byte swizzle; rows past
// the matrix read as 0.
CUtensorMap tensor_map(const void* base, int64_t rows, int64_t cols, int box_rows) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(box_rows)}, elem[2] = {1, 1};
  const CUresult r = encode_tiled()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides,
                                    box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MT_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (", int(r), ") for a ", rows, " x ", cols, " matrix");
  return m;
}

std::atomic<int64_t> g_launches{0};

// A stream's tile counter: the launches of one stream run one after another, each taking its tiles from where the
// one before left the counter (never reset); base counts the increments of the launches issued before.
struct TileCounter {
  unsigned long long* dev = nullptr;
  unsigned long long base = 0;
};
TileCounter& tile_counter(cudaStream_t stream) {
  static std::mutex mu;
  static std::map<cudaStream_t, TileCounter> counters;
  std::lock_guard<std::mutex> lock(mu);
  TileCounter& c = counters[stream];
  if (!c.dev) {
    MT_CUDA_CHECK(cudaMalloc(&c.dev, sizeof(unsigned long long)));
    MT_CUDA_CHECK(cudaMemset(c.dev, 0, sizeof(unsigned long long)));
  }
  return c;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int sm_count() {
  static int n = [] {
    int dev = 0, v = 0;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

template <int TA, int TB, int EPI>
void launch(const CUtensorMap& a, const CUtensorMap& b, const CUtensorMap& o, void* out, const Groups& g,
            const CUtensorMap* h = nullptr, const CUtensorMap* act = nullptr, const SwigluOut& so = {},
            double* squares = nullptr) {
  const int tiles = g.tile_prefix[g.E] * g.n_tiles;
  if (tiles == 0) return;
  static std::once_flag attr;
  std::call_once(attr, [] {
    MT_CUDA_CHECK(cudaFuncSetAttribute(grouped_gemm_kernel<TA, TB, EPI>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       Cfg<EPI>::kSmem));
  });
  const int grid = std::min(sm_count(), tiles);
  const cudaStream_t stream = ::mt::cuda::current_stream();
  TileCounter& counter = tile_counter(stream);
  grouped_gemm_kernel<TA, TB, EPI><<<grid, kThreads, Cfg<EPI>::kSmem, stream>>>(
      a, b, o, h ? *h : o, act ? *act : o, out, so, g, tiles, counter.dev, counter.base, squares);
  MT_CUDA_CHECK_LAUNCH("sm90 grouped_gemm_kernel");
  counter.base += static_cast<unsigned long long>(tiles) + static_cast<unsigned long long>(grid);
  g_launches.fetch_add(1, std::memory_order_relaxed);
}

// The expert layout: rows prefix sums, and row blocks of 128 per expert (M-grouped: ceil(count / 128); K-grouped:
// M / 128 for every expert with rows). Returns the total rows.
// Every tile has at least one K slice: experts without rows get no tiles, and K (M-grouped) or a count (K-grouped)
// is a positive multiple of 64.
int64_t fill_groups(Groups& g, const int64_t* counts, int64_t El, bool k_grouped, int64_t M) {
  g.E = int32_t(El);
  int64_t r = 0;
  g.tile_prefix[0] = 0;
  for (int64_t e = 0; e < El; ++e) {
    g.row0[e] = int32_t(r), g.count[e] = int32_t(counts[e]);
    const int64_t blocks = counts[e] == 0 ? 0 : k_grouped ? M / kBM : (counts[e] + kBM - 1) / kBM;
    g.tile_prefix[e + 1] = int32_t(g.tile_prefix[e] + blocks);
    r += counts[e];
  }
  return r;
}

}  // namespace

bool grouped_gemm_supported() {
  static const bool ok = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return major == 9 && minor == 0;
  }();
  return ok;
}

int64_t grouped_gemm_launches() { return g_launches.load(std::memory_order_relaxed); }

bool grouped_forward_takes(int64_t El, int64_t IC, int64_t OC) {
  return El <= kMaxExperts && IC % kBK == 0 && OC % Cfg<kBf16>::BN == 0 && grouped_gemm_supported();
}
bool grouped_dx_takes(int64_t El, int64_t IC, int64_t OC) {
  return El <= kMaxExperts && OC % kBK == 0 && IC % Cfg<kBf16>::BN == 0 && grouped_gemm_supported();
}
bool grouped_dweight_takes(const int64_t* counts, int64_t El, int64_t IC, int64_t OC, bool accumulate) {
  // accumulating: each output read back in the epilogue, under no main loop, ran at half cuBLAS's rate (8x fc1
  // dW 1.44 vs 0.78 ms on an H200): cuBLAS, which reads C inside its kernel
  if (accumulate) return false;
  if (El > kMaxExperts || OC % kBM != 0 || IC % Cfg<kF32>::BN != 0 || !grouped_gemm_supported()) return false;
  for (int64_t e = 0; e < El; ++e)
    if (counts[e] % kBK != 0) return false;
  return true;
}

bool grouped_forward(mt::bf16* out, const mt::bf16* x, const mt::bf16* weight, const int64_t* counts, int64_t El,
                     int64_t IC, int64_t OC) {
  if (!grouped_forward_takes(El, IC, OC) || !aligned16(out) || !aligned16(x) || !aligned16(weight)) return false;
  Groups g{};
  const int64_t rows = fill_groups(g, counts, El, false, 0);
  if (rows == 0) return true;
  constexpr int BN = Cfg<kBf16>::BN;
  g.n_tiles = int32_t(OC / BN), g.k_grouped = 0, g.N = int32_t(OC), g.K = int32_t(IC);
  launch<0, 0, kBf16>(tensor_map(x, rows, IC, kBM), tensor_map(weight, El * OC, IC, BN), tensor_map(out, rows, OC, 64),
                      out, g);
  return true;
}

bool grouped_dx(mt::bf16* dx, const mt::bf16* dout, const mt::bf16* weight, const int64_t* counts, int64_t El,
                int64_t IC, int64_t OC) {
  if (!grouped_dx_takes(El, IC, OC) || !aligned16(dx) || !aligned16(dout) || !aligned16(weight)) return false;
  Groups g{};
  const int64_t rows = fill_groups(g, counts, El, false, 0);
  if (rows == 0) return true;
  g.n_tiles = int32_t(IC / Cfg<kBf16>::BN), g.k_grouped = 0, g.N = int32_t(IC), g.K = int32_t(OC);
  launch<0, 1, kBf16>(tensor_map(dout, rows, OC, kBM), tensor_map(weight, El * OC, IC, 64),
                      tensor_map(dx, rows, IC, 64), dx, g);
  return true;
}

int64_t grouped_dweight_square_partials(const int64_t* counts, int64_t El, int64_t IC, int64_t OC) {
  int64_t experts = 0;  // with rows: the others have no tiles
  for (int64_t e = 0; e < El; ++e) experts += counts[e] > 0;
  return experts * (OC / kBM) * (IC / Cfg<kF32>::BN) * kSquaresPerTile;
}

bool grouped_dweight(void* dweight, bool dweight_bf16, const mt::bf16* dout, const mt::bf16* x,
                     const int64_t* counts, int64_t El, int64_t IC, int64_t OC, bool accumulate, double* squares) {
  if (!grouped_dweight_takes(counts, El, IC, OC, accumulate) || !aligned16(dweight) || !aligned16(dout) ||
      !aligned16(x))
    return false;
  Groups g{};
  const int64_t rows = fill_groups(g, counts, El, true, OC);
  if (rows == 0) return true;
  // one tiling for both outputs: _takes, the square partials' count and n_tiles use kF32's tile width
  static_assert(Cfg<kBf16>::BN == Cfg<kF32>::BN, "the fp32 and bf16 weight gradients share their tiles");
  g.n_tiles = int32_t(IC / Cfg<kF32>::BN), g.k_grouped = 1, g.M = int32_t(OC), g.N = int32_t(IC);
  const CUtensorMap a = tensor_map(dout, rows, OC, 64), b = tensor_map(x, rows, IC, 64);
  if (dweight_bf16)  // rounded, and stored through the deferred epilogue as the other bf16 products
    launch<1, 1, kBf16>(a, b, tensor_map(dweight, El * OC, IC, 64), dweight, g, nullptr, nullptr, {}, squares);
  else
    launch<1, 1, kF32>(a, b, a /*unused: the output is stored directly*/, dweight, g, nullptr, nullptr, {}, squares);
  return true;
}

bool grouped_forward_swiglu_takes(int64_t El, int64_t IC, int64_t F) {
  return El <= kMaxExperts && IC % kBK == 0 && F % Cfg<kSwigluFwd>::TN == 0 && grouped_gemm_supported();
}

bool grouped_forward_swiglu(mt::bf16* h, mt::bf16* act, const mt::bf16* x, const mt::bf16* weight,
                            const int64_t* counts, int64_t El, int64_t IC, int64_t F) {
  if (!grouped_forward_swiglu_takes(El, IC, F) || !aligned16(h) || !aligned16(act) || !aligned16(x) ||
      !aligned16(weight))
    return false;
  Groups g{};
  const int64_t rows = fill_groups(g, counts, El, false, 0);
  if (rows == 0) return true;
  constexpr int TN = Cfg<kSwigluFwd>::TN;
  g.n_tiles = int32_t(F / TN), g.k_grouped = 0, g.N = int32_t(2 * F), g.K = int32_t(IC);
  const CUtensorMap ma = tensor_map(act, rows, F, 64);
  const SwigluOut so{reinterpret_cast<__nv_bfloat16*>(h), reinterpret_cast<__nv_bfloat16*>(act), int32_t(F)};
  launch<0, 0, kSwigluFwd>(tensor_map(x, rows, IC, kBM), tensor_map(weight, El * 2 * F, IC, TN),
                           tensor_map(h, rows, 2 * F, 64), nullptr, g, nullptr, &ma, so);
  return true;
}

bool grouped_dx_swiglu_takes(int64_t El, int64_t F, int64_t OC) {
  return El <= kMaxExperts && OC % kBK == 0 && F % Cfg<kSwigluBwd>::BN == 0 && grouped_gemm_supported();
}

bool grouped_dx_swiglu(mt::bf16* h, mt::bf16* act, const mt::bf16* dout, const mt::bf16* weight,
                       const int64_t* counts, int64_t El, int64_t F, int64_t OC) {
  if (!grouped_dx_swiglu_takes(El, F, OC) || !aligned16(h) || (act && !aligned16(act)) || !aligned16(dout) ||
      !aligned16(weight))
    return false;
  Groups g{};
  const int64_t rows = fill_groups(g, counts, El, false, 0);
  if (rows == 0) return true;
  g.n_tiles = int32_t(F / Cfg<kSwigluBwd>::BN), g.k_grouped = 0, g.N = int32_t(F), g.K = int32_t(OC);
  const CUtensorMap mh = tensor_map(h, rows, 2 * F, 64);  // a leaves from registers (so.act): no map
  const SwigluOut so{reinterpret_cast<__nv_bfloat16*>(h), reinterpret_cast<__nv_bfloat16*>(act), int32_t(F)};
  launch<0, 1, kSwigluBwd>(tensor_map(dout, rows, OC, kBM), tensor_map(weight, El * OC, F, 64), mh, nullptr, g, &mh,
                           nullptr, so);
  return true;
}

}  // namespace mt::ops::cuda::sm90
