// FP8 casts on CUDA (semantics: tensor/fp8/fp8_ops.h; reference: tensor/fp8/fp8_cpu.cpp). The float -> FP8 step is
// the hardware conversion __nv_cvt_float_to_fp8(v, __NV_SATFINITE, ...) (round to nearest even, saturating), which
// test/cuda checks bit for bit against the CPU emulation; scales come from fp8::scale_from_amax (fp8_format.h), the
// rule the CPU uses. Amaxes are maxima of |x| taken on the float bits (non-negative floats order as unsigned ints,
// so a NaN, above +inf, propagates) with atomicMax.
//   fp8_amax_kernel                 amax = max |x|
//   fp8_cast_rows_kernel            per-tensor codes (R, C), 8 elements a thread; amax fused (delayed)
//   fp8_patch_kernel                codes (R, C) and/or transposed (C, R), per-tensor (amax fused), 1x128 tiles or
//                                   128x128 blocks: a 128 x 128 patch a block, one read of x, the transposed copy
//                                   through shared memory
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

// ---------------------------------------------------------------- transposing casts: tensor, 1x128 tiles, 128x128 blocks
// One kernel for the three scalings (kMode = Fp8GemmOperand::scaling: 0 tensor, 1 tiles, 2 blocks): 256 threads over
// the 128 x 128 patch of x (R, C) at (r0, c0) = (128 blockIdx.y, 128 blockIdx.x); codes into out (R, C) and/or
// out_t (C, R) = the codes of x^T (either may be null, with its scales).
//   tensor: one scale for all (the given one, or from *amax), scale_inv[0] = scale_inv_t[0] = 1 / scale, and
//           amax_accum = max(amax_accum, max |x|) if given (delayed scaling's amax, fused);
//   tiles:  the patch holds 128 row tiles (scale_inv (R, ceil(C/128))) and 128 column tiles (scale_inv_t
//           (C, ceil(R/128))), each scaled by its own amax;
//   blocks: the patch is one 128x128 block with one scale (scale_inv (ceil(R/128), ceil(C/128)), scale_inv_t its
//           transpose).
// Load: the patch into shared memory with cp.async, 8 chunks of 8 elements (16 bytes of bf16) a thread, all in
// flight at once without holding registers (so 6 blocks fit on an SM): half-warp h takes rows h, h + 16, ...,
// h + 112, lane q of the half-warp columns 8 q .. 8 q + 7.
// Rows (with out): the same chunks from shared memory; a row tile's amax is a max over the 16 lanes; codes 8 bytes
// a lane (128 contiguous bytes a row).
// Columns (with out_t): the thread at warp w, lane p + 4 g takes the column pairs P = 4 w + p and P + 32, rows
// 16 g .. 16 g + 15 (4-byte shared loads of bf16): a column tile's amax is a max over the 8 lanes g; codes 16
// consecutive rows of an out_t row a store (128 contiguous bytes per column and warp).
// Shared layout: a row holds 64 column pairs, pair P of row j at position P ^ (4 (j / 16)) (an XOR swizzle that
// keeps a chunk's four pairs contiguous): the chunk accesses and the column loads each hit all 32 banks once.
// Values past the edges read as 0 and are not written.
constexpr int kPairs = kB / 2;
__device__ __forceinline__ int patch_pair(int j, int pair) { return j * kPairs + (pair ^ ((j >> 4) << 2)); }

// q = the codes of v * s, 4 to a word (byte k of the output is element k): the paired hardware conversion, which
// rounds each element exactly as to_fp8.
template <int N>
__device__ __forceinline__ void to_fp8_words(uint32_t (&q)[N / 4], const float (&v)[N], float s, fp8::Fp8Dtype t) {
  const __nv_fp8_interpretation_t f = t == fp8::Fp8Dtype::E4M3 ? __NV_E4M3 : __NV_E5M2;
#pragma unroll
  for (int k = 0; k < N; k += 4) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v[k] * s, v[k + 1] * s), __NV_SATFINITE, f);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v[k + 2] * s, v[k + 3] * s), __NV_SATFINITE, f);
    q[k / 4] = lo | (hi << 16);
  }
}

// 16-byte asynchronous copy global -> shared (cp.async, sm_80+); !valid: 16 zero bytes, src unread.
__device__ __forceinline__ void copy16_async(void* dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void copy_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }

template <typename D, int kMode>
__global__ void __launch_bounds__(256, sizeof(D) == 2 ? 6 : 3)
    fp8_patch_kernel(uint8_t* out, float* scale_inv, uint8_t* out_t, float* scale_inv_t, const D* x, int64_t R,
                     int64_t C, bool vec_in, bool vec_out, const float* amax, const float* scale, float* amax_accum,
                     int margin, fp8::Fp8Dtype t) {
  constexpr bool kTiles = kMode == 1, kBlocks = kMode == 2;
  extern __shared__ __align__(16) unsigned char smem[];
  D* patch = reinterpret_cast<D*>(smem);  // [kB][kB], swizzled pairs
  __shared__ uint32_t scratch[32];
  const int64_t r0 = int64_t(blockIdx.y) * kB, c0 = int64_t(blockIdx.x) * kB;
  const int64_t tiles_c = gridDim.x, tiles_r = gridDim.y;
  const float fmax = fp8::fp8_max(t);
  const int h = threadIdx.x / 16, q = threadIdx.x % 16;
  const int64_t c = c0 + 8 * q;
  const bool full_chunk = vec_in && c + 8 <= C;  // with vec_in (C % 8 == 0) a chunk is whole or past the edge
  // The patch into shared memory: all 8 chunks of a thread in flight at once, asynchronously (no registers held).
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int j = h + 16 * i;
    const int64_t r = r0 + j;
    D* dst = patch + 2 * patch_pair(j, 4 * q);
    if (vec_in) {
      const bool valid = r < R && full_chunk;
      constexpr int kPer = 16 / sizeof(D);
#pragma unroll
      for (int b = 0; b < 8 / kPer; ++b) copy16_async(dst + b * kPer, valid ? x + r * C + c + b * kPer : x, valid);
    } else {
      D v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = (r < R && c + k < C) ? x[r * C + c + k] : from_float<D>(0.0f);
      store_vec<8>(dst, v);
    }
  }
  copy_async_wait_all();
  __syncthreads();
  // Chunk i of this thread (row h + 16 i) as floats, and their max |x| bits.
  auto row_chunk = [&](int i, float (&v)[8]) {
    D d[8];
    load_vec<8>(d, patch + 2 * patch_pair(h + 16 * i, 4 * q));
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      v[k] = to_float(d[k]);
      m = max(m, abs_bits(v[k]));
    }
    return m;
  };
  // The scale shared by the whole patch (tensor, blocks).
  float s_block = 1.0f;
  if constexpr (!kTiles) {
    uint32_t m = 0;
    if (kBlocks || amax_accum) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float v[8];
        m = max(m, row_chunk(i, v));
      }
      m = block_max_u(m, scratch);
    }
    if constexpr (kBlocks) {
      s_block = fp8::scale_from_amax(__uint_as_float(m), fmax, 0, true);
      if (threadIdx.x == 0) {
        if (scale_inv) scale_inv[blockIdx.y * tiles_c + blockIdx.x] = 1.0f / s_block;
        if (scale_inv_t) scale_inv_t[blockIdx.x * tiles_r + blockIdx.y] = 1.0f / s_block;
      }
    } else {
      s_block = tensor_scale(amax, scale, margin, t);
      if (threadIdx.x == 0) {
        if (blockIdx.x == 0 && blockIdx.y == 0) {
          if (scale_inv) *scale_inv = 1.0f / s_block;
          if (scale_inv_t) *scale_inv_t = 1.0f / s_block;
        }
        if (amax_accum) atomicMax(reinterpret_cast<unsigned int*>(amax_accum), m);
      }
    }
  }
  if (out) {
#pragma unroll 2
    for (int i = 0; i < 8; ++i) {
      const int64_t r = r0 + h + 16 * i;
      float v[8];
      uint32_t m = row_chunk(i, v);
      float s = s_block;
      if constexpr (kTiles) {
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));  // within the half-warp
        s = fp8::scale_from_amax(__uint_as_float(m), fmax, 0, true);
        if (q == 0 && r < R) scale_inv[r * tiles_c + blockIdx.x] = 1.0f / s;
      }
      if (r >= R) continue;
      uint32_t w[2];
      to_fp8_words<8>(w, v, s, t);
      if (full_chunk) {
        *reinterpret_cast<uint2*>(out + r * C + c) = make_uint2(w[0], w[1]);
      } else {
        for (int k = 0; k < 8 && c + k < C; ++k) out[r * C + c + k] = static_cast<uint8_t>(w[k / 4] >> (8 * (k % 4)));
      }
    }
  }
  if (!out_t) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, p = lane % 4, g = lane / 4;
  const int64_t r = r0 + 16 * g;
  // Column e of the pairs (rows r ..), scale s: its 16 codes into out_t row col.
  auto emit = [&](int64_t col, const D (&pr)[16][2], int e, float s) {
    float v[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = to_float(pr[i][e]);
    uint32_t w[4];
    to_fp8_words<16>(w, v, s, t);
    if (vec_out && r + 16 <= R) {
      *reinterpret_cast<uint4*>(out_t + col * R + r) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
      for (int k = 0; k < 16 && r + k < R; ++k) out_t[col * R + r + k] = static_cast<uint8_t>(w[k / 4] >> (8 * (k % 4)));
    }
  };
#pragma unroll
  for (int it = 0; it < 2; ++it) {
    const int P = 4 * warp + p + 32 * it;
    D pr[16][2];  // rows 16 g + i, columns 2 P and 2 P + 1
    uint32_t m0 = 0, m1 = 0;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      load_vec<2>(pr[i], patch + 2 * patch_pair(16 * g + i, P));
      m0 = max(m0, abs_bits(to_float(pr[i][0])));
      m1 = max(m1, abs_bits(to_float(pr[i][1])));
    }
    float s0 = s_block, s1 = s_block;
    if constexpr (kTiles) {
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) {  // over the 8 lanes g
        m0 = max(m0, __shfl_xor_sync(0xffffffffu, m0, o));
        m1 = max(m1, __shfl_xor_sync(0xffffffffu, m1, o));
      }
      s0 = fp8::scale_from_amax(__uint_as_float(m0), fmax, 0, true);
      s1 = fp8::scale_from_amax(__uint_as_float(m1), fmax, 0, true);
    }
    const int64_t col = c0 + 2 * P;
    if (col < C) {
      if (kTiles && g == 0) scale_inv_t[col * tiles_r + blockIdx.y] = 1.0f / s0;
      emit(col, pr, 0, s0);
    }
    if (col + 1 < C) {
      if (kTiles && g == 0) scale_inv_t[(col + 1) * tiles_r + blockIdx.y] = 1.0f / s1;
      emit(col + 1, pr, 1, s1);
    }
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

namespace {
// fp8_patch_kernel<kMode> over x (R, C): 16-byte loads where C % 8 == 0 (and aligned), 16-byte stores of out_t
// where R % 16 == 0; scalar accesses otherwise. amax, scale, amax_accum, margin: tensor scaling only.
template <int kMode, typename T>
void launch_patch(uint8_t* out, float* scale_inv, uint8_t* out_t, float* scale_inv_t, const T* x, int64_t R,
                  int64_t C, fp8::Fp8Dtype t, const float* amax = nullptr, const float* scale = nullptr,
                  float* amax_accum = nullptr, int margin = 0) {
  if (R * C == 0) return;
  constexpr size_t smem = sizeof(T) * kB * kB;  // bf16: 32 KB; fp32: 64 KB
  const auto kernel = fp8_patch_kernel<dev_t<T>, kMode>;
  ensure_dynamic_smem(kernel, smem);
  const bool vec_in = C % 8 == 0 && aligned(x, 16) && (!out || aligned(out, 8));
  const bool vec_out = R % 16 == 0 && (!out_t || aligned(out_t, 16));
  const dim3 grid(static_cast<unsigned>((C + kB - 1) / kB), static_cast<unsigned>((R + kB - 1) / kB));
  kernel<<<grid, 256, smem, current_stream()>>>(out, scale_inv, out_t, scale_inv_t, dev(x), R, C, vec_in, vec_out,
                                                amax, scale, amax_accum, margin, t);
  MT_CUDA_CHECK_LAUNCH(kMode == 0 ? "fp8_patch_kernel (tensor)"
                                  : kMode == 1 ? "fp8_patch_kernel (tiles)" : "fp8_patch_kernel (blocks)");
}
}  // namespace

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
void fp8_quantize_tensor_cuda(uint8_t* out, uint8_t* out_t, float* scale_inv, float* scale_inv_t, const T* x,
                              int64_t R, int64_t C, const float* amax, const float* scale, float* amax_accum,
                              int margin, fp8::Fp8Dtype t) {
  cudaStream_t s = current_stream();
  if (R * C == 0) return;
  if (!out_t && aligned(x, 16) && aligned(out, 8)) {
    fp8_cast_rows_kernel<<<grid_for((R * C + 7) / 8, 256), 256, 0, s>>>(out, scale_inv, dev(x), R * C, amax, scale,
                                                                         amax_accum, margin, t);
    MT_CUDA_CHECK_LAUNCH("fp8_cast_rows_kernel");
    return;
  }
  launch_patch<0>(out, scale_inv, out_t, scale_inv_t, x, R, C, t, amax, scale, amax_accum, margin);
}

template <typename T>
void fp8_quantize_tiles_cuda(uint8_t* out, float* scale_inv, const T* x, int64_t R, int64_t C, bool transpose,
                             fp8::Fp8Dtype t) {
  if (transpose)
    launch_patch<1>(nullptr, nullptr, out, scale_inv, x, R, C, t);
  else
    launch_patch<1>(out, scale_inv, nullptr, nullptr, x, R, C, t);
}

template <typename T>
void fp8_quantize_tiles_both_cuda(uint8_t* out, float* scale_inv, uint8_t* out_t, float* scale_inv_t, const T* x,
                                  int64_t R, int64_t C, fp8::Fp8Dtype t) {
  launch_patch<1>(out, scale_inv, out_t, scale_inv_t, x, R, C, t);
}

template <typename T>
void fp8_quantize_blocks_cuda(uint8_t* out, uint8_t* out_t, float* scale_inv, float* scale_inv_t, const T* x,
                              int64_t R, int64_t C, fp8::Fp8Dtype t) {
  launch_patch<2>(out, scale_inv, out_t, scale_inv_t, x, R, C, t);
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
  template void fp8_quantize_tensor_cuda<T>(uint8_t*, uint8_t*, float*, float*, const T*, int64_t, int64_t,       \
                                            const float*, const float*, float*, int, fp8::Fp8Dtype);              \
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
