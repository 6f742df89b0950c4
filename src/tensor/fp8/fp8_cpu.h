// CPU reference of the FP8 ops (tensor/fp8/fp8_ops.h), on raw contiguous pointers; T = float or double. Every value
// is scaled and rounded in float (x * scale as a float product, then fp8_format.h's cast), as the CUDA kernels do.
#pragma once

#include <cstdint>

#include "core/fp8_format.h"

namespace mt::ops::fp8cpu {

template <typename T> float amax_cpu(const T* x, int64_t n);
// codes of x (R, C) with one scale; out (R, C) and/or out_t (C, R); amax of x returned.
template <typename T>
void quantize_tensor_cpu(uint8_t* out, uint8_t* out_t, const T* x, int64_t R, int64_t C, float scale, fp8::Fp8Dtype t);
// 1x128 tiles along rows of x (R, C) (transpose: along columns, out (C, R)); scale_inv per tile.
template <typename T>
void quantize_tiles_cpu(uint8_t* out, float* scale_inv, const T* x, int64_t R, int64_t C, bool transpose, fp8::Fp8Dtype t);
// 128x128 blocks; scale_inv (ceil(R/128), ceil(C/128)), scale_inv_t its transpose (either output may be null).
template <typename T>
void quantize_blocks_cpu(uint8_t* out, uint8_t* out_t, float* scale_inv, float* scale_inv_t, const T* x, int64_t R,
                         int64_t C, fp8::Fp8Dtype t);
// out (R, K) = decode(codes) * scale_inv[block of (r, k)]; block rows/cols: 1 x K (tensor), 1 x 128, 128 x 128.
template <typename T>
void dequantize_cpu(T* out, const uint8_t* codes, const float* scale_inv, int64_t R, int64_t K, int64_t block_rows,
                    int64_t block_cols, fp8::Fp8Dtype t);

}  // namespace mt::ops::fp8cpu
