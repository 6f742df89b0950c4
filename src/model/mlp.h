// The MLP slot of a decoder layer: an interface (forward/backward with the module's own saved state,
// parameters registered by its constructor) so that a layer can hold a different module per layer
// (layer_spec.h chooses: the dense MLP today; a mixture-of-experts module can implement the same interface).
#pragma once

#include <memory>
#include <string>

#include "model/linear.h"

namespace mt {

// What an MLP-slot module keeps from its forward for its backward (one per micro-batch in flight).
struct MLPState {
  virtual ~MLPState() = default;
  virtual int64_t nbytes() const = 0;  // bytes of the tensors kept (plan's estimate is checked against it)
};

class MLPModule {
 public:
  virtual ~MLPModule() = default;
  // x (rows_local, C) -> y (rows_local, C) [+ *residual]; sets *state to what backward needs. key: the rows' random
  // numbers (model_context.h), read by a module that draws any.
  virtual Tensor forward(std::shared_ptr<MLPState>& state, const Tensor& x, const RowKey& key,
                         const Tensor* residual = nullptr) const = 0;
  // dy (rows_local, C) -> dL/dx; x is the forward's input. Consumes and releases *state.
  virtual Tensor backward(const Tensor& dy, std::shared_ptr<MLPState>& state, const Tensor& x) const = 0;
  // Whether backward reads x (else the caller may pass it undefined and skip recomputing it).
  virtual bool backward_needs_input(const MLPState&) const { return true; }
};

// Dense MLP: linear_fc1 (column-parallel; swiglu: [gate; up], each split over TP) -> GELU or SwiGLU
// (model.activation) -> linear_fc2 (row-parallel). x (B*T, C) -> h (B*T, F_l or 2F_l) -> a (B*T, F_l) -> y.
// Biases on both linears with model.add_bias_linear.
class DenseMLP final : public MLPModule {
 public:
  DenseMLP(const std::string& prefix, const ModelContext& ctx, ParamStore& store);
  // a is the activation's output: GELU always keeps it (from the fc1 GEMM's epilogue); SwiGLU keeps it only when
  // RecomputePolicy::norm_act is false, else recomputes it from h inside the SwiGLU backward's pass, which costs
  // one extra write instead of keeping (B*T, F_l).
  // FP8 layers keep their linears' input copies (fc1_x, fc2_x): backward then needs neither x nor a.
  struct Saved final : MLPState {
    Tensor h, a;
    Fp8Saved fc1_x, fc2_x;
    int64_t nbytes() const override {
      return static_cast<int64_t>((h.defined() ? h.nbytes() : 0) + (a.defined() ? a.nbytes() : 0)) +
             fc1_x.nbytes() + fc2_x.nbytes();
    }
  };
  Tensor forward(std::shared_ptr<MLPState>& state, const Tensor& x, const RowKey& key,
                 const Tensor* residual = nullptr) const override;  // (draws nothing: key unused)
  // Consumes the state (swiglu: h is overwritten by its gradient).
  Tensor backward(const Tensor& dy, std::shared_ptr<MLPState>& state, const Tensor& x) const override;
  bool backward_needs_input(const MLPState& state) const override;

 private:
  const ModelContext* ctx_;
  bool swiglu_;
  int64_t ffn_local_;
  ColumnParallelLinear linear_fc1_;
  RowParallelLinear linear_fc2_;
};

}  // namespace mt
