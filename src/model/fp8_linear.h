// The FP8 path of a linear layer Y = X W^T + b (training.fp8; model/linear.h's layers call it when their layer
// runs in FP8). Its three GEMMs take FP8 operands, each K-major (Hopper's FP8 GEMMs are "TN" only):
//   forward  Y  (N, OC)  = X (N, IC) . W (OC, IC)^T           operands X, W
//   dgrad    dX (N, IC)  = dY (N, OC) . (W^T) (IC, OC)^T      operands dY, W^T   (a transposed FP8 copy of W)
//   wgrad    dW (OC, IC) (+)= (dY^T) (OC, N) . (X^T) (IC, N)^T operands dY^T, X^T (transposed copies)
// Formats and scales by the recipe (tensor/fp8/fp8_recipe.h): X, W e4m3; dY e4m3 or e5m2 (hybrid). The amax of a
// tensor split over TP is reduced over TP (parallel/fp8_amax_reduce.h) before its scale is made. GEMM outputs are
// in the activation dtype (dW: the fp32 main grad on CUDA); biases and master weights as in the bf16 path.
// A training forward keeps X's transposed FP8 copy (Fp8Saved: made in the forward's cast pass, the wgrad operand), so
// backward neither re-reads nor needs X (the same codes as a recast: same input, same scale); without a kept copy
// backward quantizes X again. W's FP8 copies (row-wise for forward, transposed for dgrad) are made once per step,
// both in one pass, and kept (Fp8Context::weight_version).
#pragma once

#include <memory>
#include <string>

#include "model/model_context.h"
#include "tensor/fp8/fp8_ops.h"
#include "tensor/fp8/fp8_recipe.h"
#include "tensor/ops.h"

namespace mt {

// What an FP8 forward keeps for its backward (one per micro-batch in flight): X^T (IC, N) in FP8, 1 byte an element.
struct Fp8Saved {
  ops::Fp8Tensor xt;
  bool defined() const { return xt.data.defined(); }
  int64_t nbytes() const { return defined() ? static_cast<int64_t>(xt.data.nbytes() + xt.scale_inv.nbytes()) : 0; }
};

class Fp8Linear {
 public:
  // *_split: whether that tensor is split over the TP ranks (its amax then reduced over TP).
  struct Split {
    bool input = false, weight = true, grad = false;
  };
  Fp8Linear(Fp8Context& fp8, const std::string& name, Split split);
  ~Fp8Linear();
  // The FP8 path for linear `name` of ctx's model, or null when it stays in the activation dtype (fp8 off, not a
  // transformer layer's linear, or a layer fp8_first_last_layers_bf16 keeps out).
  static std::shared_ptr<Fp8Linear> make(const ModelContext& ctx, const std::string& name, Split split);

  // Whether the recipe scales each tensor by its current amax (tensorwise): a producer that can take the amax of
  // its output in its own pass hands it over as x_amax / dy_amax below (this rank's part: reduced here over TP).
  bool current_scaling() const;
  // y (N, OC) = x (N, IC) W^T + bias [+ residual (N, OC), in the GEMM's epilogue]; keep (if given): X's
  // transposed FP8 copy for backward, same pass.
  void forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias, const ParallelState& ps,
               Fp8Saved* keep = nullptr, Tensor* x_amax = nullptr, const Tensor* residual = nullptr) const;
  // dx (N, IC) = dy W (when dx), dw (+= with Accumulate) = dy^T x (when dw), db += column sums of dy. With a kept
  // copy (kept defined) x is not read and may be undefined.
  void backward(Tensor* dx, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& w,
                ops::GradMode dw_mode, const ParallelState& ps, const Fp8Saved* kept = nullptr,
                Tensor* dy_amax = nullptr) const;

 private:
  struct Quantized;
  // Row-wise (R, C) and/or transposed (C, R) FP8 copies of t (R, C) in role r, by the recipe.
  // amax: t's max |x| when its producer took it (tensorwise), else null.
  void quantize(Quantized& q, const Tensor& t, Fp8Role r, bool rowwise, bool transposed, bool split,
                const ParallelState& ps, Tensor* amax = nullptr) const;
  // W's FP8 copy (rows, or transposed) under the weight version it was made in (both made together).
  const ops::Fp8Tensor& weight_copy(const Tensor& w, bool transposed, const ParallelState& ps) const;
  Fp8Context* fp8_;
  int index_;
  Split split_;
  mutable std::unique_ptr<Quantized> w_cache_;
  mutable uint64_t w_version_ = ~0ull;
};

}  // namespace mt
