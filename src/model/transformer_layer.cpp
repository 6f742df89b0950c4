#include "model/transformer_layer.h"

#include <string>

#include "core/counter_rng.h"
#include "tensor/ops.h"

namespace mt {

namespace {
std::string layer_prefix(int layer) { return "decoder.layers." + std::to_string(layer); }

// Norms of the residual stream see only this rank's rows under sequence parallelism: partial gradients.
bool sequence_parallel_grads(const ModelContext& c) { return c.ps->sequence_parallel && c.ps->tp_size > 1; }
}  // namespace

TransformerLayer::TransformerLayer(int layer_number, const ModelContext& ctx, ParamStore& store)
    : TransformerLayer(layer_number, layer_spec(ctx.features(), layer_number), ctx, store) {}

// Parameters are registered slot by slot (the flat buffer's order): norm, attention, norm, MLP.
TransformerLayer::TransformerLayer(int layer_number, const TransformerLayerSpec& spec, const ModelContext& ctx,
                                   ParamStore& store)
    : ctx_(&ctx),
      layer_(layer_number),
      input_layernorm_(layer_prefix(layer_number) + ".input_layernorm", ctx.model->hidden_size, spec.norm,
                       sequence_parallel_grads(ctx), ctx, store),
      self_attention_(layer_prefix(layer_number) + ".self_attention", spec.self_attention, ctx, store),
      pre_mlp_layernorm_(layer_prefix(layer_number) + ".pre_mlp_layernorm", ctx.model->hidden_size, spec.norm,
                         sequence_parallel_grads(ctx), ctx, store),
      mlp_(build_mlp(spec.mlp, layer_number, layer_prefix(layer_number) + ".mlp", ctx, store)) {}

Tensor TransformerLayer::norm_output(const Norm& norm, Tensor& kept, const Tensor& x) const {
  if (kept.defined()) return std::move(kept);  // released as soon as the caller is done with it
  Tensor y = ctx_->empty(x.shape());
  Norm::Saved stats;  // recomputed alongside, the same values as the kept ones
  norm.forward(y, stats, x);
  return y;
}

uint64_t TransformerLayer::site_seed(const StepContext& step, Site site) const {
  return rng::mix64(step.dropout_seed ^ rng::mix64(static_cast<uint64_t>(layer_) * 8 + static_cast<int>(site) + 1));
}

// Row (global sample, t) is numbered (first_sample + b) * T + t in every layout; under sequence parallelism this rank
// holds rows [tp_rank * rows, (tp_rank + 1) * rows) of the micro-batch.
int64_t TransformerLayer::first_row(const StepContext& step, int64_t T, int64_t rows) const {
  const int64_t row0 = ctx_->ps->sequence_parallel ? ctx_->ps->tp_rank * rows : 0;
  return step.first_sample * T + row0;
}

// Dropout offset of this rank's first row: element (row, c) is numbered row * C + c.
uint64_t TransformerLayer::dropout_offset(const StepContext& step, int64_t T, int64_t rows) const {
  return static_cast<uint64_t>(first_row(step, T, rows) * ctx_->model->hidden_size);
}

Tensor TransformerLayer::forward(Saved& s, const Tensor& x, int64_t B, int64_t T,
                                 const StepContext& step) const {
  const ModelContext& c = *ctx_;
  const int64_t rows = x.size(0), C = c.model->hidden_size;
  const double p = step.training ? c.model->dropout : 0.0;
  const uint64_t offset = dropout_offset(step, T, rows);
  s.x_in = x;
  // Without dropout the residual adds happen inside the output projections (x_mid = proj + x,
  // out = fc2 + x_mid); with dropout, dropout comes first and the adds are separate.
  const bool fuse = p == 0;
  Tensor ln1_out = c.empty({rows, C});
  input_layernorm_.forward(ln1_out, s.n1, x);
  if (!fuse) {
    Tensor attn_y = self_attention_.forward(s.attn, ln1_out, B, T);
    if (p > 0) ops::dropout_forward(attn_y, attn_y, p, site_seed(step, Site::AttentionDropout), offset);
    s.x_mid = c.empty({rows, C});
    ops::add(s.x_mid, x, attn_y);
  } else {
    s.x_mid = self_attention_.forward(s.attn, ln1_out, B, T, &x);
  }
  const bool keep_norm_outputs = !c.recompute.norm_act;
  if (keep_norm_outputs) s.ln1_out = ln1_out;
  ln1_out = Tensor();
  Tensor ln2_out = c.empty({rows, C});
  pre_mlp_layernorm_.forward(ln2_out, s.n2, s.x_mid);
  const RowKey key{site_seed(step, Site::Router), first_row(step, T, rows)};
  Tensor out;
  if (!fuse) {
    Tensor mlp_y = mlp_->forward(s.mlp, ln2_out, key);
    if (p > 0) ops::dropout_forward(mlp_y, mlp_y, p, site_seed(step, Site::MLPDropout), offset);
    out = c.empty({rows, C});
    ops::add(out, s.x_mid, mlp_y);
  } else {
    out = mlp_->forward(s.mlp, ln2_out, key, &s.x_mid);
  }
  if (keep_norm_outputs) s.ln2_out = ln2_out;
  s.complete = true;
  return out;
}

void TransformerLayer::drop(Saved& s) {
  Tensor keep = s.x_in;
  s = Saved{};
  s.x_in = keep;
}

Tensor TransformerLayer::recompute(Saved& s, int64_t B, int64_t T, const StepContext& step) const {
  Tensor x = s.x_in;
  return forward(s, x, B, T, step);
}

void TransformerLayer::backward(Tensor& dx, Saved& s, int64_t B, int64_t T, const StepContext& step) const {
  MT_INTERNAL_ASSERT(s.complete, "layer ", layer_, ": backward before its activations were recomputed");
  const double p = step.training ? ctx_->model->dropout : 0.0;
  const uint64_t offset = dropout_offset(step, T, dx.size(0));

  // MLP branch: dx holds dL/dx_out = dL/dx_mid (residual) + the path through the MLP.
  Tensor dy = dx;
  if (p > 0) {
    dy = ctx_->empty(dx.shape());
    ops::dropout_backward(dy, dx, p, site_seed(step, Site::MLPDropout), offset);
  }
  // The norm outputs are recomputed (or taken from the kept ones) only for a module that reads its input.
  Tensor ln2_out = mlp_->backward_needs_input(*s.mlp) ? norm_output(pre_mlp_layernorm_, s.ln2_out, s.x_mid) : Tensor();
  s.ln2_out = Tensor();
  Tensor dln2 = mlp_->backward(dy, s.mlp, ln2_out);  // frees s.mlp
  ln2_out = Tensor();
  pre_mlp_layernorm_.backward_accumulate(dx, dln2, s.x_mid, s.n2);  // dx = dL/dx_mid
  dln2 = Tensor();

  // Attention branch.
  dy = dx;
  if (p > 0) {
    dy = ctx_->empty(dx.shape());
    ops::dropout_backward(dy, dx, p, site_seed(step, Site::AttentionDropout), offset);
  }
  Tensor ln1_out =
      SelfAttention::backward_needs_input(s.attn) ? norm_output(input_layernorm_, s.ln1_out, s.x_in) : Tensor();
  s.ln1_out = Tensor();
  Tensor dln1 = self_attention_.backward(dy, s.attn, ln1_out, B, T);
  ln1_out = Tensor();
  input_layernorm_.backward_accumulate(dx, dln1, s.x_in, s.n1);  // dx = dL/dx_in
  s = Saved{};
}

}  // namespace mt
