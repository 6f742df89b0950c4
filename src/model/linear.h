// Tensor-parallel linear layers (Megatron-Core's ColumnParallelLinear / RowParallelLinear).
//
//   Y = X A^T + b with A (out, in).
//   ColumnParallelLinear: A split by rows of A (output features) over TP: rank r holds A_r
//     (out/tp, in) and b_r; X is replicated (CopyToTP: gradient all-reduced in backward);
//     Y_r = X A_r^T + b_r is this rank's slice of the output features.
//   RowParallelLinear: A split along its input features: rank r holds A_r (out, in/tp) and
//     reads its slice X_r of the input; Y = sum_r X_r A_r^T (ReduceFromTP) + b, b replicated.
// Inputs/outputs are (rows, features); parameter gradients accumulate.
// With sequence parallelism the rows outside the TP region are split over TP ranks: the column-
// parallel layer all-gathers its input rows (GatherFromSP) and the row-parallel layer
// reduce-scatters its output rows (ReduceScatterToSP); without it, CopyToTP / ReduceFromTP.
// Backward re-gathers the saved (split) input instead of keeping the gathered copy.
// training.fp8: a transformer layer's linears run their three GEMMs through Fp8Linear (model/fp8_linear.h); the
// fused GELU / SwiGLU epilogues are then separate ops around the FP8 GEMMs.
#pragma once

#include <memory>
#include <string>

#include "model/fp8_linear.h"
#include "model/model_context.h"
#include "params/param_store.h"

namespace mt {

class ColumnParallelLinear {
 public:
  // chunks: the output features hold this many equal blocks, each split over TP ([gate; up]).
  ColumnParallelLinear(const std::string& name, int64_t in, int64_t out, bool bias, ParamInit init,
                       const ModelContext& ctx, ParamStore& store, int chunks = 1);
  ColumnParallelLinear(const std::string& name, Param* shared_weight, const ModelContext& ctx);  // tied
  // x (rows_local, in) -> y (rows_full, out_local). fp8_keep: where an FP8 layer keeps its input's FP8 copy for
  // backward (model/fp8_linear.h; left empty otherwise).
  Tensor forward(const Tensor& x, Fp8Saved* fp8_keep = nullptr) const;
  // The same followed by GELU: returns gelu(y), and y in *pre (fused into the GEMM where possible).
  Tensor forward_gelu(const Tensor& x, Tensor* pre) const;
  // dy (rows_full, out_local) -> dx shaped like x (skipped when need_dx is false: returns undefined). With a kept
  // FP8 copy (fp8_kept defined) x is not read and may be undefined.
  // dy_amax: dy's max |x| when its producer took it (fp8_current_scaling()).
  Tensor backward(const Tensor& dy, const Tensor& x, bool need_dx = true, const Fp8Saved* fp8_kept = nullptr,
                  Tensor* dy_amax = nullptr) const;
  // FP8 tensorwise (Fp8Linear::current_scaling): the layer can take its operands' amaxes from their producers.
  bool fp8_current_scaling() const { return fp8_ && fp8_->current_scaling(); }
  Tensor backward_overlapped(const Tensor& dy, const Tensor& x, bool need_dx) const;
  int64_t local_out() const { return weight_->local_shape[0]; }
  Param* weight() const { return weight_; }

 private:
  const ModelContext* ctx_;
  Param* weight_ = nullptr;
  Param* bias_ = nullptr;
  std::shared_ptr<Fp8Linear> fp8_;  // null: GEMMs in the activation dtype
};

class RowParallelLinear {
 public:
  RowParallelLinear(const std::string& name, int64_t in, int64_t out, bool bias, ParamInit init,
                    const ModelContext& ctx, ParamStore& store);
  // x (rows_full, in_local) -> y (rows_local, out), + *residual (rows_local, out) when given: inside the GEMM
  // when no TP reduction comes between (tp 1), else added after it.
  // x_amax: x's max |x| when its producer took it (fp8_current_scaling()).
  Tensor forward(const Tensor& x, const Tensor* residual = nullptr, Fp8Saved* fp8_keep = nullptr,
                 Tensor* x_amax = nullptr) const;
  // dy (rows_local, out) -> dx (rows_full, in_local)
  Tensor backward(const Tensor& dy, const Tensor& x, const Fp8Saved* fp8_kept = nullptr) const;
  // When x = gelu(pre): returns dL/dpre = gelu'(pre) * dx (fused into the dx GEMM where possible).
  Tensor backward_gelu(const Tensor& dy, const Tensor& x, const Tensor& pre) const;
  // When x = swiglu(h) and x was not kept: returns dL/dh (N, 2F_l), written over h (consumed), with x recomputed
  // from h for the weight gradient inside the SwiGLU backward's pass (ops::linear_backward_swiglu); FP8: from the
  // kept FP8 copy of x when there is one (fp8_kept), else x recomputed for its FP8 cast.
  // dh_amax (FP8 layers only): dh's max |x|, taken in the SwiGLU backward's pass (for linear_fc1's tensorwise cast).
  Tensor backward_swiglu(const Tensor& dy, Tensor& h, const Fp8Saved* fp8_kept = nullptr,
                         Tensor* dh_amax = nullptr) const;
  bool fp8_current_scaling() const { return fp8_ && fp8_->current_scaling(); }
  bool fp8() const { return fp8_ != nullptr; }
  int64_t local_in() const { return weight_->local_shape[1]; }

 private:
  const ModelContext* ctx_;
  Param* weight_ = nullptr;
  Param* bias_ = nullptr;
  std::shared_ptr<Fp8Linear> fp8_;  // null: GEMMs in the activation dtype
};

// LayerNorm (weight + bias) or RMSNorm (weight) over the last dim, replicated over TP.
class Norm {
 public:
  // The model's normalization (model.normalization) over the hidden dim of the residual stream.
  Norm(const std::string& name, int64_t hidden, const ModelContext& ctx, ParamStore& store);
  // A norm of the given kind over `dim`; partial_grad_over_tp: each TP rank sees only part of the rows the
  // weight applies to (sequence parallelism, or per-head norms of this rank's heads), so its gradient is a
  // partial sum that is all-reduced over TP.
  Norm(const std::string& name, int64_t dim, Normalization kind, bool partial_grad_over_tp, const ModelContext& ctx,
       ParamStore& store);
  struct Saved {
    Tensor mean, rstd;  // (N)
  };
  void forward(Tensor& y, Saved& s, const Tensor& x) const;
  // dx += d(norm)/dx . dy  (accumulates into the residual-stream gradient)
  void backward_accumulate(Tensor& dx, const Tensor& dy, const Tensor& x, const Saved& s) const;

 private:
  const ModelContext* ctx_;
  Param* weight_ = nullptr;
  Param* bias_ = nullptr;
};

}  // namespace mt
