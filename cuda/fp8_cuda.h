// CUDA FP8 ops (tensor/fp8/fp8_ops.h has the semantics; tensor/fp8/fp8_cpu.cpp the reference), on raw device
// pointers, T = float or mt::bf16. Declarations only (plain header). cuda/fp8_cast.cu: casts; cuda/fp8_gemm.cu: the
// cuBLASLt FP8 GEMM. All on the backend's current stream, no synchronization.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/fp8_format.h"

namespace mt::ops::cuda {

// amax[0] = max |x| (overwrite).
template <typename T> void fp8_amax_cuda(float* amax, const T* x, int64_t n);
// Per-tensor cast of x (R, C): scale = *scale, or scale_from_amax(*amax, fmax, margin) when scale is null;
// out (R, C) and/or out_t (C, R) codes; scale_inv[0] = 1 / scale; amax_accum[0] = max(amax_accum[0], max |x|) if set.
template <typename T>
void fp8_quantize_tensor_cuda(uint8_t* out, uint8_t* out_t, float* scale_inv, const T* x, int64_t R, int64_t C,
                              const float* amax, const float* scale, float* amax_accum, int margin, fp8::Fp8Dtype t);
// 1x128 tiles along rows of x (R, C), or (transpose) along its columns into out (C, R); scale_inv per tile.
template <typename T>
void fp8_quantize_tiles_cuda(uint8_t* out, float* scale_inv, const T* x, int64_t R, int64_t C, bool transpose,
                             fp8::Fp8Dtype t);
// Both of the above in one pass: out (R, C) tiles along rows, out_t (C, R) tiles along x's columns.
template <typename T>
void fp8_quantize_tiles_both_cuda(uint8_t* out, float* scale_inv, uint8_t* out_t, float* scale_inv_t, const T* x,
                                  int64_t R, int64_t C, fp8::Fp8Dtype t);
// 128x128 blocks: out (R, C) and/or out_t (C, R), scale_inv (ceil(R/128), ceil(C/128)) and/or its transpose.
template <typename T>
void fp8_quantize_blocks_cuda(uint8_t* out, uint8_t* out_t, float* scale_inv, float* scale_inv_t, const T* x,
                              int64_t R, int64_t C, fp8::Fp8Dtype t);
template <typename T>
void fp8_dequantize_cuda(T* out, const uint8_t* codes, const float* scale_inv, int64_t R, int64_t K,
                         int64_t block_rows, int64_t block_cols, fp8::Fp8Dtype t);

// One K-major FP8 operand: codes (rows, k); scaling 0 tensor, 1 tiles 1x128, 2 blocks 128x128.
struct Fp8GemmOperand {
  const uint8_t* data;
  const float* scale_inv;
  fp8::Fp8Dtype dtype;
  int scaling;
  int64_t rows, k;
};
// out (M, N) row-major (= or +=) = deq(a) (M, K) deq(b) (N, K)^T [+ bias (N)] [+ residual (M, N): cuBLASLt's C];
// T = float or bf16 (bias, residual: T); fast_accum: cuBLASLt's fast FP8 accumulation (tensor scaling only).
template <typename T>
void fp8_gemm_cuda(T* out, const Fp8GemmOperand& a, const Fp8GemmOperand& b, const T* bias, bool accumulate,
                   bool fast_accum, const T* residual = nullptr);
// test/cuda only: the same with candidate `layout` (0 = the one fp8_gemm_cuda uses) of the block scales handed to
// cuBLASLt (cuda/fp8_gemm.cu, Note [FP8 block scale layout]); T = float.
template <typename T>
void fp8_gemm_cuda_scale_layout(T* out, const Fp8GemmOperand& a, const Fp8GemmOperand& b, bool accumulate, int layout);

}  // namespace mt::ops::cuda
