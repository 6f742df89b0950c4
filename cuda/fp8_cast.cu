// FP8 casts on CUDA (semantics: tensor/fp8/fp8_ops.h; reference: tensor/fp8/fp8_cpu.cpp). The float -> FP8 step is
// the hardware conversion __nv_cvt_float_to_fp8(v, __NV_SATFINITE, ...) (round to nearest even, saturating), which
// test/cuda checks bit for bit against the CPU emulation; scales come from fp8::scale_from_amax (fp8_format.h), the
// rule the CPU uses. Amaxes are maxima of |x| taken on the float bits (non-negative floats order as unsigned ints,
// so a NaN, above +inf, propagates) with atomicMax.
//   fp8_amax_kernel                 amax = max |x|
//   fp8_cast_rows_kernel            per-tensor codes (R, C), 8 elements a thread; amax fused (delayed)
//   fp8_cast_transpose_kernel       per-tensor codes (R, C) and/or (C, R) through a 64x64 shared tile; amax fused
//   fp8_tiles_rows_kernel           1x128 tiles along rows: a warp per tile
//   fp8_tiles_cols_kernel           1x128 tiles along columns, written transposed (C, R): 128 x 32 patch a block
//   fp8_tiles_both_kernel           both of the above from one read of x: 128 x 128 patch a block through shared memory
//   fp8_blocks_kernel               128x128 blocks: amax, then codes (R, C) and (C, R) from a shared tile
#include <cuda_fp8.h>

#include "cuda/fp8_cuda.h"
#include "cuda/kernel_utils.cuh"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {

constexpr int kB = 128;

__device__ __forceinline__ uint8_t to_fp8(float v, fp8::Fp8Dtype t) {
  return static_cast<uint8_t>(
      __nv_cvt_float_to_fp8(v, __NV_SATFINITE, t == fp8::Fp8Dtype::E4M3 ? __NV_E4M3 : __NV_E5M2));
}
// abs_bits, warp_max_u, block_max_u: cuda/kernel_utils.cuh.

// The tensor's scale: the delayed one, or the current one from its amax.
__device__ __forceinline__ float tensor_scale(const float* amax, const float* scale, int margin, fp8::Fp8Dtype t) {
  return scale ? *scale : fp8::scale_from_amax(*amax, fp8::fp8_max(t), margin, false);
}

// ---------------------------------------------------------------- amax
template <typename D>
__global__ void fp8_amax_kernel(float* amax, const D* x, int64_t n) {
  __shared__ uint32_t scratch[32];
  uint32_t m = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i * 8 < n; i += stride) {
    if ((i + 1) * 8 <= n) {
      D v[8];
      load_vec<8>(v, x + i * 8);
#pragma unroll
      for (int k = 0; k < 8; ++k) m = max(m, abs_bits(to_float(v[k])));
    } else {
      for (int64_t j = i * 8; j < n; ++j) m = max(m, abs_bits(to_float(x[j])));
    }
  }
  m = block_max_u(m, scratch);
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(amax), m);
}

// ---------------------------------------------------------------- per-tensor casts
template <typename D>
__global__ void fp8_cast_rows_kernel(uint8_t* out, float* scale_inv, const D* x, int64_t n, const float* amax,
                                     const float* scale, float* amax_accum, int margin, fp8::Fp8Dtype t) {
  __shared__ uint32_t scratch[32];
  const float s = tensor_scale(amax, scale, margin, t);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / s;
  uint32_t m = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i * 8 < n; i += stride) {
    if ((i + 1) * 8 <= n) {
      D v[8];
      load_vec<8>(v, x + i * 8);
      uint8_t q[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float f = to_float(v[k]);
        m = max(m, abs_bits(f));
        q[k] = to_fp8(f * s, t);
      }
      *reinterpret_cast<uint2*>(out + i * 8) = *reinterpret_cast<const uint2*>(q);
    } else {
      for (int64_t j = i * 8; j < n; ++j) {
        const float f = to_float(x[j]);
        m = max(m, abs_bits(f));
        out[j] = to_fp8(f * s, t);
      }
    }
  }
  if (amax_accum) {
    m = block_max_u(m, scratch);
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(amax_accum), m);
  }
}

// 256 threads over a 64 x 64 tile of x (R, C) at (r0, c0): chunks of 8 consecutive elements of a row (16-byte loads
// when C % 8 == 0), codes written row-wise 8 bytes at a time and kept in a shared tile, then written transposed,
// 8 bytes of an out_t row (8 consecutive r) at a time when R % 8 == 0. Scalar fallbacks at ragged edges.
constexpr int kT = 64;
template <typename D>
__global__ void fp8_cast_transpose_kernel(uint8_t* out, uint8_t* out_t, float* scale_inv, const D* x, int64_t R,
                                          int64_t C, const float* amax, const float* scale, float* amax_accum,
                                          int margin, fp8::Fp8Dtype t) {
  __shared__ uint8_t tile[kT][kT + 8];
  __shared__ uint32_t scratch[32];
  const float s = tensor_scale(amax, scale, margin, t);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *scale_inv = 1.0f / s;
  const int64_t r0 = int64_t(blockIdx.y) * kT, c0 = int64_t(blockIdx.x) * kT;
  const bool vec_in = C % 8 == 0, vec_out = R % 8 == 0;
  uint32_t m = 0;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int id = threadIdx.x + 256 * j, lr = id / 8, lc = (id % 8) * 8;
    const int64_t r = r0 + lr, c = c0 + lc;
    if (r >= R || c >= C) continue;
    uint8_t q[8] = {};
    if (vec_in && c + 8 <= C) {
      D v[8];
      load_vec<8>(v, x + r * C + c);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float f = to_float(v[k]);
        m = max(m, abs_bits(f));
        q[k] = to_fp8(f * s, t);
      }
      if (out) *reinterpret_cast<uint2*>(out + r * C + c) = *reinterpret_cast<const uint2*>(q);
    } else {
      for (int k = 0; k < 8 && c + k < C; ++k) {
        const float f = to_float(x[r * C + c + k]);
        m = max(m, abs_bits(f));
        q[k] = to_fp8(f * s, t);
        if (out) out[r * C + c + k] = q[k];
      }
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) tile[lr][lc + k] = q[k];  // entries past the edge are never read
  }
  if (out_t) {
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int id = threadIdx.x + 256 * j, lc = id / 8, lr = (id % 8) * 8;
      const int64_t c = c0 + lc, r = r0 + lr;
      if (c >= C || r >= R) continue;
      uint8_t q[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) q[k] = tile[lr + k][lc];
      if (vec_out && r + 8 <= R) {
        *reinterpret_cast<uint2*>(out_t + c * R + r) = *reinterpret_cast<const uint2*>(q);
      } else {
        for (int k = 0; k < 8 && r + k < R; ++k) out_t[c * R + r + k] = q[k];
      }
    }
  }
  if (amax_accum) {
    m = block_max_u(m, scratch);
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(amax_accum), m);
  }
}

// ---------------------------------------------------------------- 1x128 tiles
// A warp per (row, tile): lane l holds elements 4 l .. 4 l + 3 of the tile.
template <typename D>
__global__ void fp8_tiles_rows_kernel(uint8_t* out, float* scale_inv, const D* x, int64_t R, int64_t C,
                                      fp8::Fp8Dtype t) {
  const int64_t tiles = (C + kB - 1) / kB;
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= R * tiles) return;
  const int64_t r = w / tiles, b = w % tiles;
  float v[4];
  uint32_t m = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t c = b * kB + lane * 4 + k;
    v[k] = c < C ? to_float(x[r * C + c]) : 0.0f;
    m = max(m, abs_bits(v[k]));
  }
  m = warp_max_u(m);
  const float s = fp8::scale_from_amax(__uint_as_float(m), fp8::fp8_max(t), 0, true);
  if (lane == 0) scale_inv[r * tiles + b] = 1.0f / s;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t c = b * kB + lane * 4 + k;
    if (c < C) out[r * C + c] = to_fp8(v[k] * s, t);
  }
}

// Block (32, 8) over rows [r0, r0 + 128) x columns [c0, c0 + 32) of x; out (C, R) row c holds column c of x, with one
// tile (and scale) per 128 rows of x.
template <typename D>
__global__ void fp8_tiles_cols_kernel(uint8_t* out, float* scale_inv, const D* x, int64_t R, int64_t C,
                                      fp8::Fp8Dtype t) {
  __shared__ float patch[kB][33];
  const int64_t r0 = int64_t(blockIdx.y) * kB, c0 = int64_t(blockIdx.x) * 32;
  const int64_t tiles = (R + kB - 1) / kB;
  for (int j = threadIdx.y; j < kB; j += 8) {
    const int64_t r = r0 + j, c = c0 + threadIdx.x;
    patch[j][threadIdx.x] = (r < R && c < C) ? to_float(x[r * C + c]) : 0.0f;
  }
  __syncthreads();
  // warp y handles columns y, y + 8, y + 16, y + 24 of the patch; lane l rows 4 l .. 4 l + 3.
  for (int cc = threadIdx.y; cc < 32; cc += 8) {
    const int64_t c = c0 + cc;
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) m = max(m, abs_bits(patch[threadIdx.x * 4 + k][cc]));
    m = warp_max_u(m);
    if (c >= C) continue;
    const float s = fp8::scale_from_amax(__uint_as_float(m), fp8::fp8_max(t), 0, true);
    if (threadIdx.x == 0) scale_inv[c * tiles + blockIdx.y] = 1.0f / s;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t r = r0 + threadIdx.x * 4 + k;
      if (r < R) out[c * R + r] = to_fp8(patch[threadIdx.x * 4 + k][cc] * s, t);
    }
  }
}

// 256 threads (8 warps) over the 128 x 128 patch of x at (r0, c0) = (128 blockIdx.y, 128 blockIdx.x), which holds
// 128 row tiles and 128 column tiles. Pass 1: warp w takes rows w, w + 8, ... (kRowsInFlight loads issued before
// their math); lane l columns 4 l .. 4 l + 3 (one vector load): the row tile's amax (a warp max), its codes into
// out (R, C), 4 bytes a lane, and the values (as D: exact) into shared memory. Pass 2: warp w takes columns w,
// w + 8, ...; lane l rows l, l + 32, l + 64, l + 96 (row stride 130 elements: bf16 lanes in 32 banks): the column
// tile's amax and its codes into out_t (C, R), 32 consecutive bytes a store. Values past the edges read as 0 and
// are not written.
constexpr int kTilesStride = kB + 2;  // elements per shared row
constexpr int kRowsInFlight = 4;
template <typename D>
__global__ void __launch_bounds__(256) fp8_tiles_both_kernel(uint8_t* out, float* scale_inv, uint8_t* out_t,
                                                             float* scale_inv_t, const D* x, int64_t R, int64_t C,
                                                             fp8::Fp8Dtype t) {
  extern __shared__ __align__(16) unsigned char smem[];
  D* patch = reinterpret_cast<D*>(smem);  // [kB][kTilesStride]
  const int64_t r0 = int64_t(blockIdx.y) * kB, c0 = int64_t(blockIdx.x) * kB;
  const int64_t tiles_c = (C + kB - 1) / kB, tiles_r = (R + kB - 1) / kB;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool vec = C % 4 == 0;
  const int64_t c = c0 + lane * 4;
  for (int j0 = warp; j0 < kB; j0 += 8 * kRowsInFlight) {
    D d[kRowsInFlight][4];
#pragma unroll
    for (int i = 0; i < kRowsInFlight; ++i) {
      const int64_t r = r0 + j0 + 8 * i;
#pragma unroll
      for (int k = 0; k < 4; ++k) d[i][k] = from_float<D>(0.0f);
      if (r >= R) continue;
      if (vec && c + 4 <= C) {
        load_vec<4>(d[i], x + r * C + c);
      } else {
        for (int k = 0; k < 4; ++k)
          if (c + k < C) d[i][k] = x[r * C + c + k];
      }
    }
#pragma unroll
    for (int i = 0; i < kRowsInFlight; ++i) {
      const int j = j0 + 8 * i;
      const int64_t r = r0 + j;
      float v[4];
      uint32_t m = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        v[k] = to_float(d[i][k]);
        m = max(m, abs_bits(v[k]));
        patch[j * kTilesStride + lane * 4 + k] = d[i][k];
      }
      m = warp_max_u(m);
      if (r >= R) continue;
      const float s = fp8::scale_from_amax(__uint_as_float(m), fp8::fp8_max(t), 0, true);
      if (lane == 0) scale_inv[r * tiles_c + blockIdx.x] = 1.0f / s;
      uint8_t q[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) q[k] = to_fp8(v[k] * s, t);
      if (vec && c + 4 <= C) {
        *reinterpret_cast<uint32_t*>(out + r * C + c) = *reinterpret_cast<const uint32_t*>(q);
      } else {
        for (int k = 0; k < 4 && c + k < C; ++k) out[r * C + c + k] = q[k];
      }
    }
  }
  __syncthreads();
  for (int cc = warp; cc < kB; cc += 8) {
    const int64_t col = c0 + cc;
    float v[4];
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[k] = to_float(patch[(lane + 32 * k) * kTilesStride + cc]);
      m = max(m, abs_bits(v[k]));
    }
    m = warp_max_u(m);
    if (col >= C) continue;
    const float s = fp8::scale_from_amax(__uint_as_float(m), fp8::fp8_max(t), 0, true);
    if (lane == 0) scale_inv_t[col * tiles_r + blockIdx.y] = 1.0f / s;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t r = r0 + lane + 32 * k;
      if (r < R) out_t[col * R + r] = to_fp8(v[k] * s, t);
    }
  }
}

// ---------------------------------------------------------------- 128x128 blocks
// Block (32, 8) per 128 x 128 block: its amax, then the codes into a shared tile, written row-wise and transposed.
template <typename D>
__global__ void fp8_blocks_kernel(uint8_t* out, uint8_t* out_t, float* scale_inv, float* scale_inv_t, const D* x,
                                  int64_t R, int64_t C, fp8::Fp8Dtype t) {
  __shared__ uint8_t tile[kB][kB + 4];
  __shared__ uint32_t scratch[32];
  const int64_t bi = blockIdx.y, bj = blockIdx.x, br = gridDim.y, bc = gridDim.x;
  const int64_t r0 = bi * kB, c0 = bj * kB;
  uint32_t m = 0;
  for (int j = threadIdx.y; j < kB; j += 8)
    for (int k = threadIdx.x; k < kB; k += 32) {
      const int64_t r = r0 + j, c = c0 + k;
      if (r < R && c < C) m = max(m, abs_bits(to_float(x[r * C + c])));
    }
  m = block_max_u(m, scratch);
  const float s = fp8::scale_from_amax(__uint_as_float(m), fp8::fp8_max(t), 0, true);
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    if (scale_inv) scale_inv[bi * bc + bj] = 1.0f / s;
    if (scale_inv_t) scale_inv_t[bj * br + bi] = 1.0f / s;
  }
  for (int j = threadIdx.y; j < kB; j += 8)
    for (int k = threadIdx.x; k < kB; k += 32) {
      const int64_t r = r0 + j, c = c0 + k;
      if (r < R && c < C) {
        const uint8_t q = to_fp8(to_float(x[r * C + c]) * s, t);
        tile[j][k] = q;
        if (out) out[r * C + c] = q;
      }
    }
  if (!out_t) return;
  __syncthreads();
  for (int k = threadIdx.y; k < kB; k += 8)
    for (int j = threadIdx.x; j < kB; j += 32) {
      const int64_t r = r0 + j, c = c0 + k;
      if (r < R && c < C) out_t[c * R + r] = tile[j][k];
    }
}

// ---------------------------------------------------------------- dequantize
template <typename D>
__global__ void fp8_dequantize_kernel(D* out, const uint8_t* codes, const float* scale_inv, int64_t R, int64_t K,
                                      int64_t block_rows, int64_t block_cols, fp8::Fp8Dtype t) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= R * K) return;
  const int64_t r = i / K, k = i % K, bc = (K + block_cols - 1) / block_cols;
  out[i] = from_float<D>(fp8::fp8_to_float(codes[i], t) * scale_inv[(r / block_rows) * bc + k / block_cols]);
}

unsigned grid_for(int64_t threads, int block) {
  const int64_t want = (threads + block - 1) / block;
  const int64_t cap = int64_t(context().sm_count) * 16;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(want, cap)));
}

}  // namespace

// ---------------------------------------------------------------- launchers

template <typename T>
void fp8_amax_cuda(float* amax, const T* x, int64_t n) {
  cudaStream_t s = current_stream();
  MT_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), s));
  if (n == 0) return;
  MT_CHECK(aligned(x, 16), "fp8_amax_cuda: x must be 16-byte aligned");
  fp8_amax_kernel<<<grid_for((n + 7) / 8, 256), 256, 0, s>>>(amax, dev(x), n);
  MT_CUDA_CHECK_LAUNCH("fp8_amax_kernel");
}

template <typename T>
void fp8_quantize_tensor_cuda(uint8_t* out, uint8_t* out_t, float* scale_inv, const T* x, int64_t R, int64_t C,
                              const float* amax, const float* scale, float* amax_accum, int margin, fp8::Fp8Dtype t) {
  cudaStream_t s = current_stream();
  if (R * C == 0) return;
  if (!out_t && aligned(x, 16) && aligned(out, 8)) {
    fp8_cast_rows_kernel<<<grid_for((R * C + 7) / 8, 256), 256, 0, s>>>(out, scale_inv, dev(x), R * C, amax, scale,
                                                                         amax_accum, margin, t);
    MT_CUDA_CHECK_LAUNCH("fp8_cast_rows_kernel");
    return;
  }
  MT_CHECK(aligned(x, 16) && (!out || aligned(out, 8)) && (!out_t || aligned(out_t, 8)),
           "fp8_quantize_tensor_cuda: x must be 16-byte and the codes 8-byte aligned");
  const dim3 grid(static_cast<unsigned>((C + kT - 1) / kT), static_cast<unsigned>((R + kT - 1) / kT));
  fp8_cast_transpose_kernel<<<grid, 256, 0, s>>>(out, out_t, scale_inv, dev(x), R, C, amax, scale, amax_accum, margin,
                                                 t);
  MT_CUDA_CHECK_LAUNCH("fp8_cast_transpose_kernel");
}

template <typename T>
void fp8_quantize_tiles_cuda(uint8_t* out, float* scale_inv, const T* x, int64_t R, int64_t C, bool transpose,
                             fp8::Fp8Dtype t) {
  cudaStream_t s = current_stream();
  if (R * C == 0) return;
  if (!transpose) {
    const int64_t warps = R * ((C + kB - 1) / kB);
    fp8_tiles_rows_kernel<<<static_cast<unsigned>((warps * 32 + 255) / 256), 256, 0, s>>>(out, scale_inv, dev(x), R,
                                                                                          C, t);
    MT_CUDA_CHECK_LAUNCH("fp8_tiles_rows_kernel");
    return;
  }
  const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>((R + kB - 1) / kB)), block(32, 8);
  fp8_tiles_cols_kernel<<<grid, block, 0, s>>>(out, scale_inv, dev(x), R, C, t);
  MT_CUDA_CHECK_LAUNCH("fp8_tiles_cols_kernel");
}

template <typename T>
void fp8_quantize_tiles_both_cuda(uint8_t* out, float* scale_inv, uint8_t* out_t, float* scale_inv_t, const T* x,
                                  int64_t R, int64_t C, fp8::Fp8Dtype t) {
  if (R * C == 0) return;
  MT_CHECK(C % 4 != 0 || (aligned(x, 4 * sizeof(T)) && aligned(out, 4)),
           "fp8_quantize_tiles_both_cuda: x and the codes must be aligned to 4 elements");
  constexpr size_t smem = sizeof(T) * kB * kTilesStride;  // fp32: 66 KB, above the 48 KB default
  static const bool attr = [] {
    MT_CUDA_CHECK(cudaFuncSetAttribute(fp8_tiles_both_kernel<dev_t<T>>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
    return true;
  }();
  (void)attr;
  const dim3 grid(static_cast<unsigned>((C + kB - 1) / kB), static_cast<unsigned>((R + kB - 1) / kB));
  fp8_tiles_both_kernel<<<grid, 256, smem, current_stream()>>>(out, scale_inv, out_t, scale_inv_t, dev(x), R, C, t);
  MT_CUDA_CHECK_LAUNCH("fp8_tiles_both_kernel");
}

template <typename T>
void fp8_quantize_blocks_cuda(uint8_t* out, uint8_t* out_t, float* scale_inv, float* scale_inv_t, const T* x,
                              int64_t R, int64_t C, fp8::Fp8Dtype t) {
  if (R * C == 0) return;
  const dim3 grid(static_cast<unsigned>((C + kB - 1) / kB), static_cast<unsigned>((R + kB - 1) / kB)), block(32, 8);
  fp8_blocks_kernel<<<grid, block, 0, current_stream()>>>(out, out_t, scale_inv, scale_inv_t, dev(x), R, C, t);
  MT_CUDA_CHECK_LAUNCH("fp8_blocks_kernel");
}

template <typename T>
void fp8_dequantize_cuda(T* out, const uint8_t* codes, const float* scale_inv, int64_t R, int64_t K,
                         int64_t block_rows, int64_t block_cols, fp8::Fp8Dtype t) {
  if (R * K == 0) return;
  fp8_dequantize_kernel<<<static_cast<unsigned>((R * K + 255) / 256), 256, 0, current_stream()>>>(
      dev(out), codes, scale_inv, R, K, block_rows, block_cols, t);
  MT_CUDA_CHECK_LAUNCH("fp8_dequantize_kernel");
}

#define MT_INSTANTIATE(T)                                                                                         \
  template void fp8_amax_cuda<T>(float*, const T*, int64_t);                                                      \
  template void fp8_quantize_tensor_cuda<T>(uint8_t*, uint8_t*, float*, const T*, int64_t, int64_t, const float*, \
                                            const float*, float*, int, fp8::Fp8Dtype);                            \
  template void fp8_quantize_tiles_cuda<T>(uint8_t*, float*, const T*, int64_t, int64_t, bool, fp8::Fp8Dtype);    \
  template void fp8_quantize_tiles_both_cuda<T>(uint8_t*, float*, uint8_t*, float*, const T*, int64_t, int64_t,   \
                                                fp8::Fp8Dtype);                                                   \
  template void fp8_quantize_blocks_cuda<T>(uint8_t*, uint8_t*, float*, float*, const T*, int64_t, int64_t,       \
                                            fp8::Fp8Dtype);                                                       \
  template void fp8_dequantize_cuda<T>(T*, const uint8_t*, const float*, int64_t, int64_t, int64_t, int64_t,      \
                                       fp8::Fp8Dtype);
MT_INSTANTIATE(float)
MT_INSTANTIATE(mt::bf16)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cuda
