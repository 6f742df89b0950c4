// One pre-norm decoder layer, described by its slots (Megatron-Core's TransformerLayer):
//   x_mid = x + dropout(self_attention(input_layernorm(x)))
//   x_out = x_mid + dropout(mlp(pre_mlp_layernorm(x_mid)))
// Everything backward needs is kept per micro-batch in Saved (the pipeline keeps several in
// flight). With full recompute, forward keeps only x and backward re-runs the forward first.
#pragma once

#include "model/attention.h"

namespace mt {

class TransformerLayer {
 public:
  TransformerLayer(int layer_number, const ModelContext& ctx, ParamStore& store, bool recompute);
  struct Saved {
    Tensor x_in, x_mid, ln1_out, ln2_out;
    Norm::Saved n1, n2;
    SelfAttention::Saved attn;
    MLP::Saved mlp;
    bool complete = false;  // false when dropped for recompute
  };
  // x (rows, C) -> returns x_out (rows, C); rows = B*T, or B*T/tp under sequence parallelism.
  // Keeps a reference to x in s.
  Tensor forward(Saved& s, const Tensor& x, int64_t B, int64_t T, const StepContext& step) const;
  // dx: on entry dL/dx_out, on return dL/dx (updated in place). Frees s.
  void backward(Tensor& dx, Saved& s, int64_t B, int64_t T, const StepContext& step) const;
  int layer_number() const { return layer_; }

 private:
  Tensor forward_full(Saved& s, const Tensor& x, int64_t B, int64_t T, const StepContext& step) const;
  uint64_t dropout_seed(const StepContext& step, int site) const;
  uint64_t dropout_offset(const StepContext& step, int64_t T, int64_t rows) const;

  const ModelContext* ctx_;
  int layer_;
  bool recompute_;
  Norm input_layernorm_;
  SelfAttention self_attention_;
  Norm pre_mlp_layernorm_;
  MLP mlp_;
};

}  // namespace mt
