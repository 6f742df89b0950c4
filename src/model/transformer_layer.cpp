#include "model/transformer_layer.h"

#include "tensor/cpu/counter_rng.h"
#include "tensor/ops.h"

namespace mt {

namespace {
std::string layer_prefix(int layer) { return "decoder.layers." + std::to_string(layer); }
}  // namespace

TransformerLayer::TransformerLayer(int layer_number, const ModelContext& ctx, ParamStore& store, bool recompute)
    : ctx_(&ctx),
      layer_(layer_number),
      recompute_(recompute),
      input_layernorm_(layer_prefix(layer_number) + ".input_layernorm", ctx.model->hidden_size, ctx, store),
      self_attention_(layer_prefix(layer_number) + ".self_attention", ctx, store),
      pre_mlp_layernorm_(layer_prefix(layer_number) + ".pre_mlp_layernorm", ctx.model->hidden_size, ctx, store),
      mlp_(layer_prefix(layer_number) + ".mlp", ctx, store) {}

uint64_t TransformerLayer::dropout_seed(const StepContext& step, int site) const {
  return rng::mix64(step.dropout_seed ^ rng::mix64(static_cast<uint64_t>(layer_) * 8 + site + 1));
}

Tensor TransformerLayer::forward_full(Saved& s, const Tensor& x, int64_t B, int64_t T,
                                      const StepContext& step) const {
  const ModelContext& c = *ctx_;
  const int64_t C = c.model->hidden_size;
  const double p = step.training ? c.model->dropout : 0.0;
  const uint64_t offset = static_cast<uint64_t>(step.first_sample) * static_cast<uint64_t>(T * C);
  s.x_in = x;
  s.ln1_out = c.empty({B * T, C});
  input_layernorm_.forward(s.ln1_out, s.n1, x);
  Tensor attn_y = c.empty({B * T, C});
  self_attention_.forward(attn_y, s.attn, s.ln1_out, B, T);
  if (p > 0) ops::dropout_forward(attn_y, attn_y, p, dropout_seed(step, 0), offset);
  s.x_mid = c.empty({B * T, C});
  ops::add(s.x_mid, x, attn_y);
  s.ln2_out = c.empty({B * T, C});
  pre_mlp_layernorm_.forward(s.ln2_out, s.n2, s.x_mid);
  Tensor mlp_y = c.empty({B * T, C});
  mlp_.forward(mlp_y, s.mlp, s.ln2_out);
  if (p > 0) ops::dropout_forward(mlp_y, mlp_y, p, dropout_seed(step, 1), offset);
  Tensor out = c.empty({B * T, C});
  ops::add(out, s.x_mid, mlp_y);
  s.complete = true;
  return out;
}

Tensor TransformerLayer::forward(Saved& s, const Tensor& x, int64_t B, int64_t T, const StepContext& step) const {
  Tensor out = forward_full(s, x, B, T, step);
  if (recompute_) {
    Tensor keep = s.x_in;
    s = Saved{};
    s.x_in = keep;
  }
  return out;
}

void TransformerLayer::backward(Tensor& dx, Saved& s, int64_t B, int64_t T, const StepContext& step) const {
  const ModelContext& c = *ctx_;
  if (!s.complete) forward_full(s, s.x_in, B, T, step);  // full recompute
  const int64_t C = c.model->hidden_size;
  const double p = step.training ? c.model->dropout : 0.0;
  const uint64_t offset = static_cast<uint64_t>(step.first_sample) * static_cast<uint64_t>(T * C);

  // MLP branch: dx holds dL/dx_out = dL/dx_mid (residual) + path through the MLP.
  Tensor dy = c.empty({B * T, C});
  if (p > 0)
    ops::dropout_backward(dy, dx, p, dropout_seed(step, 1), offset);
  else
    dy.copy_from(dx);
  Tensor dln2 = c.empty({B * T, C});
  mlp_.backward(dln2, dy, s.mlp, s.ln2_out);
  pre_mlp_layernorm_.backward_accumulate(dx, dln2, s.x_mid, s.n2);  // dx = dL/dx_mid

  // Attention branch.
  if (p > 0)
    ops::dropout_backward(dy, dx, p, dropout_seed(step, 0), offset);
  else
    dy.copy_from(dx);
  Tensor dln1 = c.empty({B * T, C});
  self_attention_.backward(dln1, dy, s.attn, s.ln1_out, B, T);
  input_layernorm_.backward_accumulate(dx, dln1, s.x_in, s.n1);  // dx = dL/dx_in
  s = Saved{};
}

}  // namespace mt
