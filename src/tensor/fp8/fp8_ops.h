// FP8 ops: quantization (casts with their scales and amaxes) and the FP8 GEMM, with a CPU reference
// (src/tensor/fp8/fp8_cpu.cpp: exact FP8 rounding, fp32/fp64 math) and a CUDA version (cuda/fp8_*.cu: cast kernels,
// cuBLASLt FP8 GEMM with scale pointers / block scale modes). Shapes in the legend of tensor/ops.h.
//
// An FP8 GEMM operand is K-major (Hopper's FP8 tensor cores take only the "TN" layout): codes (R, K), uint8, and
// the inverse scales that turn codes back into values, value = decode(code) * scale_inv:
//   Tensor:        scale_inv (1)
//   Tile1x128:     scale_inv (R, ceil(K/128)): one per 128 consecutive elements of a row (activations, gradients)
//   Block128x128:  scale_inv (ceil(R/128), ceil(K/128)): one per 128x128 block (weights)
// Scales come from amaxes by fp8::scale_from_amax (fp8_format.h); blockwise scales are powers of 2.
#pragma once

#include "core/fp8_format.h"
#include "tensor/tensor.h"

namespace mt::ops {

enum class Fp8Scaling { Tensor, Tile1x128, Block128x128 };

struct Fp8Tensor {
  Tensor data;       // U8 (R, K)
  Tensor scale_inv;  // F32, per the scaling
  fp8::Fp8Dtype dtype = fp8::Fp8Dtype::E4M3;
  Fp8Scaling scaling = Fp8Scaling::Tensor;
  int64_t rows() const { return data.size(0); }
  int64_t k() const { return data.size(1); }
  // Uninitialized codes (R, K) and scale_inv of the scaling's shape, on `device`.
  static Fp8Tensor empty(int64_t R, int64_t K, fp8::Fp8Dtype t, Fp8Scaling s, Device device);
};

inline constexpr int64_t kFp8Block = 128;

// amax (F32 (1), x's device) = max |x| over x (any shape; NaN propagates).
void fp8_amax(Tensor& amax, const Tensor& x);

// Per-tensor quantization of x (R, C): codes = cast(x * scale), scale_inv = 1 / scale, with
//   current scaling (scale == null): scale = scale_from_amax(*amax, fmax, margin) computed on the device;
//   delayed (scale given): that scale, and amax_accum (F32 (1), if given) = max(amax_accum, max |x|) in the same pass.
// out: codes (R, C); out_t: the transposed codes (C, R) (the K-major copy a GEMM with K = R needs); either may be
// null. Both get the same scale_inv.
void fp8_quantize_tensor(Fp8Tensor* out, Fp8Tensor* out_t, const Tensor& x, const Tensor* amax, const Tensor* scale,
                         Tensor* amax_accum, int margin);

// 1x128 tiles: transpose false: out (R, C), tiles along each row; true: out (C, R) = x^T, tiles along x's columns
// (128 consecutive rows of x). Each tile's scale from its own amax (power of 2).
void fp8_quantize_tiles(Fp8Tensor& out, const Tensor& x, bool transpose);
// Both at once (one read of x on CUDA): out (R, C) as transpose false, out_t (C, R) as transpose true.
void fp8_quantize_tiles(Fp8Tensor& out, Fp8Tensor& out_t, const Tensor& x);

// 128x128 blocks of x (R, C): out (R, C) and/or out_t (C, R); out_t's scale_inv is out's transposed.
void fp8_quantize_blocks(Fp8Tensor* out, Fp8Tensor* out_t, const Tensor& x);

// out (R, K) (fp32/fp64 on CPU; fp32/bf16 on CUDA) = decode(codes) * scale_inv.
void fp8_dequantize(Tensor& out, const Fp8Tensor& q);

// out (M, N) = deq(a) (M, K) @ deq(b) (N, K)^T [+ bias (N)] [+ residual (M, N), out's dtype: added in the GEMM's
// epilogue, before the rounding to out's dtype]; accumulate: out += (bias and residual must be null).
// CPU: dequantize both, then the fp32/fp64 GEMM. CUDA: cuBLASLt FP8 GEMM, fp32 accumulation, out bf16 or fp32.
// (a, b) scalings: (Tensor, Tensor), (Tile1x128, Block128x128), (Tile1x128, Tile1x128), (Block128x128, Tile1x128).
// fast_accum (tensor scaling): CUDA may accumulate in the tensor cores' faster, less precise mode (the forward GEMM's
// choice in TransformerEngine); the CPU ignores it (its reference is exact either way).
void fp8_gemm(Tensor& out, const Fp8Tensor& a, const Fp8Tensor& b, const Tensor* bias, bool accumulate,
              bool fast_accum = false, const Tensor* residual = nullptr);

}  // namespace mt::ops
