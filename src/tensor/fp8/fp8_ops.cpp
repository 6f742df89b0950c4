// The FP8 ops (fp8_ops.h): shape/dtype checks, then the CPU reference (fp8_cpu.cpp) or the CUDA backend.
#include "tensor/fp8/fp8_ops.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "tensor/cpu/cpu_ops.h"
#include "tensor/fp8/fp8_cpu.h"
#if defined(MEGATRAIN_HAVE_CUDA)
#include "cuda/cuda_ops.h"
#include "cuda/fp8_cuda.h"
#endif

namespace mt::ops {

namespace {

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

Shape scale_shape(int64_t R, int64_t K, Fp8Scaling s) {
  switch (s) {
    case Fp8Scaling::Tensor: return {1};
    case Fp8Scaling::Tile1x128: return {R, cdiv(K, kFp8Block)};
    case Fp8Scaling::Block128x128: return {cdiv(R, kFp8Block), cdiv(K, kFp8Block)};
  }
  return {1};
}

// (block rows, block cols) of a scaling for an (R, K) operand.
std::pair<int64_t, int64_t> block_of(const Fp8Tensor& q) {
  switch (q.scaling) {
    case Fp8Scaling::Tensor: return {q.rows() > 0 ? q.rows() : 1, q.k() > 0 ? q.k() : 1};
    case Fp8Scaling::Tile1x128: return {1, kFp8Block};
    case Fp8Scaling::Block128x128: return {kFp8Block, kFp8Block};
  }
  return {1, 1};
}

void check_operand(const char* op, const Fp8Tensor& q, Device dev) {
  MT_INTERNAL_ASSERT(q.data.defined() && q.data.dtype() == DType::U8 && q.data.dim() == 2 && q.data.device() == dev,
                     "op ", op, ": FP8 codes ", q.data.str(), " should be uint8 (R, K) on ", device_name(dev));
  MT_INTERNAL_ASSERT(q.scale_inv.defined() && q.scale_inv.dtype() == DType::F32 &&
                         q.scale_inv.shape() == scale_shape(q.rows(), q.k(), q.scaling) && q.scale_inv.device() == dev,
                     "op ", op, ": scale_inv ", q.scale_inv.str(), " does not fit codes ", q.data.str());
}

// Calls f(float{}) / f(double{}) on CPU, f(float{}) / f(bf16{}) on CUDA, for the dtype of t.
template <typename F>
void dispatch(const char* op, const Tensor& t, F&& f) {
  const DType d = t.dtype();
  if (t.device() == Device::CPU && d == DType::F32) return f(float{});
  if (t.device() == Device::CPU && d == DType::F64) return f(double{});
#if defined(MEGATRAIN_HAVE_CUDA)
  if (t.device() == Device::CUDA && d == DType::F32) return f(float{});
  if (t.device() == Device::CUDA && d == DType::BF16) return f(bf16{});
#endif
  MT_CHECK(false, "op ", op, " is not supported on device ", device_name(t.device()), " for ", dtype_name(d));
}

#if defined(MEGATRAIN_HAVE_CUDA)
cuda::Fp8GemmOperand gemm_operand(const Fp8Tensor& q) {
  return {q.data.data<uint8_t>(), q.scale_inv.data<float>(), q.dtype, static_cast<int>(q.scaling), q.rows(), q.k()};
}
#endif

}  // namespace

Fp8Tensor Fp8Tensor::empty(int64_t R, int64_t K, fp8::Fp8Dtype t, Fp8Scaling s, Device device) {
  Fp8Tensor q;
  q.data = Tensor::empty({R, K}, DType::U8, device);
  q.scale_inv = Tensor::empty(scale_shape(R, K, s), DType::F32, device);
  q.dtype = t;
  q.scaling = s;
  return q;
}

void fp8_amax(Tensor& amax, const Tensor& x) {
  const char* op = "fp8_amax";
  MT_INTERNAL_ASSERT(amax.dtype() == DType::F32 && amax.numel() == 1 && amax.device() == x.device(), "op ", op,
                     ": amax ", amax.str(), " should be fp32 (1) on x's device");
  dispatch(op, x, [&](auto z) {
    using T = decltype(z);
    if (x.device() == Device::CPU) {
      if constexpr (!std::is_same_v<T, bf16>) amax.data<float>()[0] = fp8cpu::amax_cpu<T>(x.data<T>(), x.numel());
      return;
    }
#if defined(MEGATRAIN_HAVE_CUDA)
    const cuda::OpTimer timer(op, x.numel());
    if constexpr (!std::is_same_v<T, double>) cuda::fp8_amax_cuda<T>(amax.data<float>(), x.data<T>(), x.numel());
#endif
  });
}

void fp8_quantize_tensor(Fp8Tensor* out, Fp8Tensor* out_t, const Tensor& x, const Tensor* amax, const Tensor* scale,
                         Tensor* amax_accum, int margin) {
  const char* op = "fp8_quantize_tensor";
  MT_INTERNAL_ASSERT(x.dim() == 2 && (out || out_t) && (amax || scale), "op ", op, ": bad arguments for x ", x.str());
  const int64_t R = x.size(0), C = x.size(1);
  Fp8Tensor* first = out ? out : out_t;
  if (out) MT_INTERNAL_ASSERT(out->rows() == R && out->k() == C, "op ", op, ": out ", out->data.str(), " vs x ", x.str());
  if (out_t)
    MT_INTERNAL_ASSERT(out_t->rows() == C && out_t->k() == R, "op ", op, ": out_t ", out_t->data.str(), " vs x ", x.str());
  for (Fp8Tensor* q : {out, out_t})
    if (q) {
      MT_INTERNAL_ASSERT(q->scaling == Fp8Scaling::Tensor && q->dtype == first->dtype, "op ", op, ": operand kinds");
      check_operand(op, *q, x.device());
    }
  const fp8::Fp8Dtype t = first->dtype;
  dispatch(op, x, [&](auto z) {
    using T = decltype(z);
    if (x.device() == Device::CPU) {
      if constexpr (!std::is_same_v<T, bf16>) {
        const float s = scale ? scale->data<float>()[0]
                              : fp8::scale_from_amax(amax->data<float>()[0], fp8::fp8_max(t), margin, false);
        fp8cpu::quantize_tensor_cpu<T>(out ? out->data.data<uint8_t>() : nullptr,
                                       out_t ? out_t->data.data<uint8_t>() : nullptr, x.data<T>(), R, C, s, t);
        for (Fp8Tensor* q : {out, out_t})
          if (q) q->scale_inv.data<float>()[0] = 1.0f / s;
        if (amax_accum) {
          float& a = amax_accum->data<float>()[0];
          const float m = fp8cpu::amax_cpu<T>(x.data<T>(), x.numel());
          a = (std::isnan(a) || std::isnan(m)) ? NAN : std::max(a, m);
        }
      }
      return;
    }
#if defined(MEGATRAIN_HAVE_CUDA)
    const cuda::OpTimer timer(out && out_t ? "fp8_quantize_tensor rows+t" : out ? "fp8_quantize_tensor rows"
                                                                              : "fp8_quantize_tensor t",
                              R, C);
    if constexpr (!std::is_same_v<T, double>) {
      cuda::fp8_quantize_tensor_cuda<T>(out ? out->data.data<uint8_t>() : nullptr,
                                        out_t ? out_t->data.data<uint8_t>() : nullptr,
                                        first->scale_inv.data<float>(), x.data<T>(), R, C,
                                        amax ? amax->data<float>() : nullptr, scale ? scale->data<float>() : nullptr,
                                        amax_accum ? amax_accum->data<float>() : nullptr, margin, t);
      if (out && out_t) out_t->scale_inv.copy_from(out->scale_inv);
    }
#endif
  });
}

void fp8_quantize_tiles(Fp8Tensor& out, const Tensor& x, bool transpose) {
  const char* op = "fp8_quantize_tiles";
  const int64_t R = x.size(0), C = x.size(1);
  MT_INTERNAL_ASSERT(out.scaling == Fp8Scaling::Tile1x128 && out.rows() == (transpose ? C : R) &&
                         out.k() == (transpose ? R : C), "op ", op, ": out ", out.data.str(), " vs x ", x.str());
  check_operand(op, out, x.device());
  dispatch(op, x, [&](auto z) {
    using T = decltype(z);
    if (x.device() == Device::CPU) {
      if constexpr (!std::is_same_v<T, bf16>)
        fp8cpu::quantize_tiles_cpu<T>(out.data.data<uint8_t>(), out.scale_inv.data<float>(), x.data<T>(), R, C,
                                      transpose, out.dtype);
      return;
    }
#if defined(MEGATRAIN_HAVE_CUDA)
    const cuda::OpTimer timer(transpose ? "fp8_quantize_tiles t" : "fp8_quantize_tiles rows", R, C);
    if constexpr (!std::is_same_v<T, double>)
      cuda::fp8_quantize_tiles_cuda<T>(out.data.data<uint8_t>(), out.scale_inv.data<float>(), x.data<T>(), R, C,
                                       transpose, out.dtype);
#endif
  });
}

void fp8_quantize_tiles(Fp8Tensor& out, Fp8Tensor& out_t, const Tensor& x) {
  const char* op = "fp8_quantize_tiles";
  const int64_t R = x.size(0), C = x.size(1);
  MT_INTERNAL_ASSERT(out.scaling == Fp8Scaling::Tile1x128 && out_t.scaling == Fp8Scaling::Tile1x128 &&
                         out.rows() == R && out.k() == C && out_t.rows() == C && out_t.k() == R,
                     "op ", op, ": out ", out.data.str(), ", out_t ", out_t.data.str(), " vs x ", x.str());
  if (x.device() == Device::CPU) {  // the reference: each orientation on its own
    fp8_quantize_tiles(out, x, false);
    fp8_quantize_tiles(out_t, x, true);
    return;
  }
  check_operand(op, out, x.device());
  check_operand(op, out_t, x.device());
  MT_INTERNAL_ASSERT(out.dtype == out_t.dtype, "op ", op, ": both copies in one format");
  dispatch(op, x, [&](auto z) {
    using T = decltype(z);
#if defined(MEGATRAIN_HAVE_CUDA)
    const cuda::OpTimer timer("fp8_quantize_tiles rows+t", R, C);
    if constexpr (!std::is_same_v<T, double>)
      cuda::fp8_quantize_tiles_both_cuda<T>(out.data.data<uint8_t>(), out.scale_inv.data<float>(),
                                            out_t.data.data<uint8_t>(), out_t.scale_inv.data<float>(), x.data<T>(), R,
                                            C, out.dtype);
#else
    (void)sizeof(T);
#endif
  });
}

void fp8_quantize_blocks(Fp8Tensor* out, Fp8Tensor* out_t, const Tensor& x) {
  const char* op = "fp8_quantize_blocks";
  const int64_t R = x.size(0), C = x.size(1);
  MT_INTERNAL_ASSERT(out || out_t, "op ", op, ": no output");
  if (out) MT_INTERNAL_ASSERT(out->rows() == R && out->k() == C, "op ", op, ": out ", out->data.str());
  if (out_t) MT_INTERNAL_ASSERT(out_t->rows() == C && out_t->k() == R, "op ", op, ": out_t ", out_t->data.str());
  for (Fp8Tensor* q : {out, out_t})
    if (q) {
      MT_INTERNAL_ASSERT(q->scaling == Fp8Scaling::Block128x128, "op ", op, ": scaling");
      check_operand(op, *q, x.device());
    }
  const fp8::Fp8Dtype t = out ? out->dtype : out_t->dtype;
  uint8_t* o = out ? out->data.data<uint8_t>() : nullptr;
  uint8_t* ot = out_t ? out_t->data.data<uint8_t>() : nullptr;
  float* s = out ? out->scale_inv.data<float>() : nullptr;
  float* st = out_t ? out_t->scale_inv.data<float>() : nullptr;
  dispatch(op, x, [&](auto z) {
    using T = decltype(z);
    if (x.device() == Device::CPU) {
      if constexpr (!std::is_same_v<T, bf16>) fp8cpu::quantize_blocks_cpu<T>(o, ot, s, st, x.data<T>(), R, C, t);
      return;
    }
#if defined(MEGATRAIN_HAVE_CUDA)
    const cuda::OpTimer timer(op, R, C);
    if constexpr (!std::is_same_v<T, double>) cuda::fp8_quantize_blocks_cuda<T>(o, ot, s, st, x.data<T>(), R, C, t);
#endif
  });
}

void fp8_dequantize(Tensor& out, const Fp8Tensor& q) {
  const char* op = "fp8_dequantize";
  check_operand(op, q, out.device());
  MT_INTERNAL_ASSERT(out.numel() == q.data.numel(), "op ", op, ": out ", out.str(), " vs codes ", q.data.str());
  const auto [br, bc] = block_of(q);
  dispatch(op, out, [&](auto z) {
    using T = decltype(z);
    if (out.device() == Device::CPU) {
      if constexpr (!std::is_same_v<T, bf16>)
        fp8cpu::dequantize_cpu<T>(out.data<T>(), q.data.data<uint8_t>(), q.scale_inv.data<float>(), q.rows(), q.k(),
                                  br, bc, q.dtype);
      return;
    }
#if defined(MEGATRAIN_HAVE_CUDA)
    if constexpr (!std::is_same_v<T, double>)
      cuda::fp8_dequantize_cuda<T>(out.data<T>(), q.data.data<uint8_t>(), q.scale_inv.data<float>(), q.rows(), q.k(),
                                   br, bc, q.dtype);
#endif
  });
}

void fp8_gemm(Tensor& out, const Fp8Tensor& a, const Fp8Tensor& b, const Tensor* bias, bool accumulate,
              bool fast_accum, const Tensor* residual) {
  const char* op = "fp8_gemm";
  check_operand(op, a, out.device());
  check_operand(op, b, out.device());
  const int64_t M = a.rows(), N = b.rows(), K = a.k();
  MT_INTERNAL_ASSERT(b.k() == K && out.dim() == 2 && out.size(0) == M && out.size(1) == N, "op ", op, ": out ",
                     out.str(), ", a ", a.data.str(), ", b ", b.data.str());
  MT_INTERNAL_ASSERT(!(accumulate && bias), "op ", op, ": a bias with accumulate");
  MT_INTERNAL_ASSERT(!(a.dtype == fp8::Fp8Dtype::E5M2 && b.dtype == fp8::Fp8Dtype::E5M2), "op ", op,
                     ": e5m2 x e5m2 has no FP8 GEMM");
  if (bias) MT_INTERNAL_ASSERT(bias->numel() == N && bias->dtype() == out.dtype(), "op ", op, ": bias ", bias->str());
  MT_INTERNAL_ASSERT(!(accumulate && residual), "op ", op, ": a residual with accumulate");
  if (residual)
    MT_INTERNAL_ASSERT(residual->numel() == M * N && residual->dtype() == out.dtype() &&
                           residual->device() == out.device(),
                       "op ", op, ": residual ", residual->str(), " vs out ", out.str());
  (void)fast_accum;
  dispatch(op, out, [&](auto z) {
    using T = decltype(z);
    if (out.device() == Device::CPU) {
      if constexpr (!std::is_same_v<T, bf16>) {
        // The reference: dequantize both operands, then the GEMM of their values.
        Tensor da = Tensor::empty({M, K}, out.dtype()), db = Tensor::empty({N, K}, out.dtype());
        fp8_dequantize(da, a);
        fp8_dequantize(db, b);
        T* o = out.data<T>();
        const bool add = bias != nullptr || residual != nullptr;  // out = bias + residual, then += the product
        if (add)
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n)
              o[m * N + n] = (bias ? bias->data<T>()[n] : T(0)) + (residual ? residual->data<T>()[m * N + n] : T(0));
        cpu::gemm_cpu<T>(false, true, M, N, K, T(1), da.data<T>(), K, db.data<T>(), K,
                         (accumulate || add) ? T(1) : T(0), o, N);
      }
      return;
    }
#if defined(MEGATRAIN_HAVE_CUDA)
    const bool fast = fast_accum && a.scaling == Fp8Scaling::Tensor;
    const cuda::OpTimer timer(a.scaling == Fp8Scaling::Tensor ? (fast ? "fp8_gemm tensor fast" : "fp8_gemm tensor")
                                                              : "fp8_gemm blocks",
                              M, N, K);
    if constexpr (!std::is_same_v<T, double>)
      cuda::fp8_gemm_cuda<T>(out.data<T>(), gemm_operand(a), gemm_operand(b), bias ? bias->data<T>() : nullptr,
                             accumulate, fast, residual ? residual->data<T>() : nullptr);
#endif
  });
}

}  // namespace mt::ops
