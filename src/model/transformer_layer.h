// One pre-norm decoder layer, assembled from its slots as layer_spec(layer_number) fills them
// (Megatron-Core's TransformerLayer):
//   x_mid = x + dropout(self_attention(input_layernorm(x)))
//   x_out = x_mid + dropout(mlp(pre_mlp_layernorm(x_mid)))
// Everything backward needs is kept per micro-batch in Saved (the pipeline keeps several in
// flight); model/kept_tensors.h describes it for `megatrain plan` (test/plan checks the two agree). Under full recompute the model drops a layer's Saved but its input (complete = false)
// and has the layer recompute it before backward. The norm outputs are kept only when
// training.recompute_norm_act is false; by default backward recomputes each from the kept norm input
// (one (rows, C) read and write) just before the weight gradient that needs it.
#pragma once

#include "model/layer_spec.h"

namespace mt {

class TransformerLayer {
 public:
  TransformerLayer(int layer_number, const ModelContext& ctx, ParamStore& store);
  TransformerLayer(int layer_number, const TransformerLayerSpec& spec, const ModelContext& ctx, ParamStore& store);
  struct Saved {
    Tensor x_in, x_mid;
    Tensor ln1_out, ln2_out;  // the norm outputs, when kept (RecomputePolicy::norm_act false)
    Norm::Saved n1, n2;
    SelfAttention::Saved attn;
    std::shared_ptr<MLPState> mlp;  // the MLP slot module's own state
    bool complete = false;  // false when dropped for recompute
  };
  // x (rows, C) -> returns x_out (rows, C); rows = B*T, or B*T/tp under sequence parallelism.
  // Keeps a reference to x in s.
  Tensor forward(Saved& s, const Tensor& x, int64_t B, int64_t T, const StepContext& step) const;
  // Keeps only the input (full recompute); recompute() rebuilds the rest and returns the output.
  static void drop(Saved& s);
  Tensor recompute(Saved& s, int64_t B, int64_t T, const StepContext& step) const;
  // dx: on entry dL/dx_out, on return dL/dx (updated in place). s must be complete. Frees s.
  void backward(Tensor& dx, Saved& s, int64_t B, int64_t T, const StepContext& step) const;
  int layer_number() const { return layer_; }
  MLPModule& mlp() const { return *mlp_; }

 private:
  // A seed per (step, layer, site) for the layer's random numbers: the two dropouts, the router's forced logits.
  enum class Site { AttentionDropout = 0, MLPDropout = 1, Router = 2 };
  uint64_t site_seed(const StepContext& step, Site site) const;
  // The norm output backward needs: the kept one (moved out of `kept`), or norm(x) recomputed (the same
  // kernel and inputs as forward: the same values).
  Tensor norm_output(const Norm& norm, Tensor& kept, const Tensor& x) const;
  // The global index of this rank's first row (RowKey::first_row), and the dropout offset of its first element.
  int64_t first_row(const StepContext& step, int64_t T, int64_t rows) const;
  uint64_t dropout_offset(const StepContext& step, int64_t T, int64_t rows) const;

  const ModelContext* ctx_;
  int layer_;
  Norm input_layernorm_;
  SelfAttention self_attention_;
  Norm pre_mlp_layernorm_;
  std::unique_ptr<MLPModule> mlp_;
};

}  // namespace mt
