// Shared pieces of the attention kernels (attention.cu, attention_backward.cu, attention_f32.cu):
// tensor-core primitives (mma.sync m16n8k16 bf16 -> fp32, ldmatrix, cp.async), tile loaders, and
// the launchers each file provides to attention.cu's entry points. Declarations and inline device
// helpers only.
//
// Fragment layouts of mma.m16n8k16 (lane = 4 * r + c, r = lane / 4, c = lane % 4):
//   A (16 x 16, row): a0 = (r, 2c..2c+1), a1 = (r + 8, 2c..), a2 = (r, 2c + 8..), a3 = (r + 8, 2c + 8..)
//   B (16 x 8, col):  b0 = (k = 2c..2c+1, n = r), b1 = (k = 2c + 8.., n = r)
//   C (16 x 8, fp32): c0, c1 = (r, 2c..2c+1), c2, c3 = (r + 8, 2c..)
// so the C fragments of two adjacent n-tiles, rounded to bf16, are the A fragment of the next product
// (P = softmax(S) feeds P V without leaving registers).
// Tiles live in shared memory with rows padded by 8 elements (16 bytes), which makes the 8 row
// addresses of every ldmatrix hit distinct banks.
#pragma once

#include <cuda_bf16.h>

#include <array>
#include <cstdint>

#include "cuda/cuda_ops.h"
#include "cuda/kernel_utils.cuh"

namespace mt::ops::cuda::attn {

using bf16_t = __nv_bfloat16;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// 16-byte asynchronous copy global -> shared; when !valid the 16 bytes are zero-filled (src unread).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The row stride of the kernels' shared K / V / Q tiles: D + 8 elements (16 bytes of padding a row, so that the
// rows of a fragment load fall in different banks).
template <int D>
constexpr int kTileLD = D + 8;

// Rows [t0, t0 + ROWS) of one head of a (B, T, heads, D) tensor into a padded shared tile
// (row stride kTileLD<D>); rows at or past T are zero-filled. `head0` points at (b, t = 0, head);
// consecutive t are `row_stride` elements apart.
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile_async(bf16_t* tile, const bf16_t* head0, int64_t row_stride, int t0, int T) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
#pragma unroll
  for (int i = threadIdx.x; i < ROWS * kChunks; i += THREADS) {
    const int r = i / kChunks, c = (i % kChunks) * 8, t = t0 + r;
    const bool valid = t < T;
    cp_async_16(tile + r * kTileLD<D> + c, head0 + (valid ? int64_t(t) * row_stride + c : 0), valid);
  }
}

// A warp's accumulator fragments acc[mt][dt] (rows row0 + 16 mt and + 8, this lane's column pair of each 8-column
// block dt) times scale, as bf16 to the rows of `base` (row_stride apart) below T.
template <int MT, int kDT>
__device__ __forceinline__ void store_cfrags_rows(bf16_t* base, int64_t row_stride, const float (&acc)[MT][kDT][4],
                                                  int row0, int T, float scale) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int row = row0 + mt * 16 + rr * 8;
      if (row >= T) continue;
      bf16_t* out = base + int64_t(row) * row_stride;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt)
        *reinterpret_cast<__nv_bfloat162*>(out + dt * 8 + (lane % 4) * 2) =
            __floats2bfloat162_rn(acc[mt][dt][2 * rr] * scale, acc[mt][dt][2 * rr + 1] * scale);
    }
}

// The key loop's double buffering: tile j + 1 of n_tiles (kBc keys of K and V) starts loading into buffer 1 - buf
// while tile j's loads are awaited; the last tile waits for all.
template <int kBc, int D, int THREADS>
__device__ __forceinline__ void next_kv_tile_async(bf16_t* sK, bf16_t* sV, int buf, const bf16_t* k_head,
                                                   const bf16_t* v_head, int64_t kv_stride, int j, int n_tiles, int T) {
  if (j + 1 < n_tiles) {
    constexpr int kTile = kBc * kTileLD<D>;
    load_tile_async<kBc, D, THREADS>(sK + (1 - buf) * kTile, k_head, kv_stride, (j + 1) * kBc, T);
    load_tile_async<kBc, D, THREADS>(sV + (1 - buf) * kTile, v_head, kv_stride, (j + 1) * kBc, T);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
}

// A fragment (16 x 16) at (row0, col0) of a padded tile with row stride LD.
template <int LD>
__device__ __forceinline__ void load_a_frag(uint32_t (&a)[4], const bf16_t* tile, int row0, int col0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(a, tile + (row0 + lane % 16) * LD + col0 + (lane / 16) * 8);
}
// B fragments of two n-tiles (n0, n0 + 8) x k16 at k0 from a tile stored [n][k] (K for Q K^T):
// b[0], b[1] for n-tile n0; b[2], b[3] for n0 + 8.
template <int LD>
__device__ __forceinline__ void load_b_frags_nk(uint32_t (&b)[4], const bf16_t* tile, int n0, int k0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4(b, tile + (n0 + lane % 8 + (lane / 16) * 8) * LD + k0 + ((lane / 8) % 2) * 8);
}
// B fragments of two n-tiles (n0, n0 + 8) x k16 at k0 from a tile stored [k][n] (V for P V).
template <int LD>
__device__ __forceinline__ void load_b_frags_kn(uint32_t (&b)[4], const bf16_t* tile, int k0, int n0) {
  const int lane = threadIdx.x % 32;
  ldmatrix_x4_trans(b, tile + (k0 + lane % 8 + ((lane / 8) % 2) * 8) * LD + n0 + (lane / 16) * 8);
}

// A fragment for k-chunk kk from fp32 C fragments of n-tiles 2kk and 2kk + 1, rounded to bf16.
__device__ __forceinline__ void c_to_a_frag(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

constexpr float kLog2e = 1.4426950408889634f;

// ---------------------------------------------------------------- per-file launchers
// bf16, tensor cores (attention.cu / attention_backward.cu); D in {64, 128}.
void attention_forward_bf16(bf16_t* out, float* lse, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                            const AttnShape& s);
void attention_backward_bf16(bf16_t* dq, bf16_t* dk, bf16_t* dv, const bf16_t* dout, const bf16_t* q,
                             const bf16_t* k, const bf16_t* v, const bf16_t* out, const float* lse,
                             const AttnShape& s);
// E = bf16_t or __half through cuDNN's fused flash attention (attention_cudnn.cu): false when cuDNN does not run this
// shape (T % 128 != 0, a graph cuDNN refuses, training.attention_backend: own), and the caller uses the kernels above
// after check_own_kernels_allowed.
// Strides (in elements, of cuDNN's logical [b, h, t, d]) of q/dq and of k, v/dk, dv.
struct CudnnLayout {
  std::array<int64_t, 4> q, kv;
  static CudnnLayout separate(const AttnShape& s);   // q (B, T, H, D), k and v (B, T, G, D)
  static CudnnLayout fused_mha(const AttnShape& s);  // heads of the fused projection (B, T, 3 H D), G == H
};
template <typename E>
bool cudnn_attention_forward(E* out, float* lse, const E* q, const E* k, const E* v, const AttnShape& s,
                             const CudnnLayout& layout);
template <typename E>
bool cudnn_attention_backward(E* dq, E* dk, E* dv, const E* dout, const E* q, const E* k, const E* v, const E* out,
                              const float* lse, const AttnShape& s, const CudnnLayout& layout);
// Called before our kernels run `op` instead of cuDNN (fp32 = an fp32 call, which cuDNN never gets): an error naming
// training.attention_backend and the reason when the policy is AttentionBackend::Cudnn.
void check_own_kernels_allowed(const char* op, const AttnShape& s, bool fp32);
// fp32, CUDA cores (attention_f32.cu); D in {64, 128}.
void attention_forward_f32(float* out, float* lse, const float* q, const float* k, const float* v, const AttnShape& s);
void attention_backward_f32(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                            const float* v, const float* out, const float* lse, const AttnShape& s);
// delta(B, H, T) = rowsum(dout * out) in fp32 (attention_backward.cu), for either dtype.
template <typename D>
void attention_delta(float* delta, const D* dout, const D* out, const AttnShape& s);

// acc[mt][nt] += A[row0 + 16 mt.., :] B[8 nt.., :]^T over the D columns: A (rows) and B (columns)
// are both padded tiles stored row by row (the Q K^T pattern); MT x kNT C fragments per warp.
template <int MT, int kNT, int D, int LD>
__device__ __forceinline__ void mma_rows_x_cols(float (&acc)[MT][kNT][4], const bf16_t* A, int row0, const bf16_t* B) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) load_a_frag<LD>(a[mt], A, row0 + mt * 16, kk * 16);
#pragma unroll
    for (int nt = 0; nt < kNT; nt += 2) {
      uint32_t b[4];
      load_b_frags_nk<LD>(b, B, nt * 8, kk * 16);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816(acc[mt][nt], a[mt], b[0], b[1]);
        mma_16816(acc[mt][nt + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// acc[mt][dt] += P B over the kK rows of B: P given as fp32 C fragments p[mt][nt] (16 MT rows x kK columns per
// warp, rounded to bf16 here), B a padded tile stored [k][n] with D = 8 kDT columns (V in O += P V, K in dQ += dS K,
// dO and Q in dV += P^T dO and dK += dS^T Q); MT x kDT C fragments per warp.
template <int MT, int kDT, int kK, int LD>
__device__ __forceinline__ void mma_cfrags_x_tile(float (&acc)[MT][kDT][4], const float (&p)[MT][kK / 8][4],
                                                  const bf16_t* B) {
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) c_to_a_frag(a[mt], p[mt][2 * kk], p[mt][2 * kk + 1]);
#pragma unroll
    for (int dt = 0; dt < kDT; dt += 2) {
      uint32_t b[4];
      load_b_frags_kn<LD>(b, B, kk * 16, dt * 8);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816(acc[mt][dt], a[mt], b[0], b[1]);
        mma_16816(acc[mt][dt + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

}  // namespace mt::ops::cuda::attn
