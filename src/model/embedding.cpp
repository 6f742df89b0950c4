#include "model/embedding.h"

#include <algorithm>

#include "parallel/mappings.h"
#include "core/counter_rng.h"
#include "core/rope_params.h"
#include "tensor/ops.h"

namespace mt {

Param* word_table(const ModelContext& ctx, ParamStore& store, const std::string& name) {
  ParamSpec s;
  s.name = name;
  s.global_shape = {ctx.derived->padded_vocab_size, ctx.model->hidden_size};
  s.partition_dim = 0;
  s.init = ParamInit::Normal;
  s.kind = ParamKind::Embedding;
  s.valid_rows = ctx.model->vocab_size;
  return store.add(s);
}

namespace {
DType stat_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }
bool sp(const ModelContext& c) { return c.ps->sequence_parallel && c.ps->tp_size > 1; }
}  // namespace

Embedding::Embedding(const ModelContext& ctx, ParamStore& store) : ctx_(&ctx) {
  word_ = word_table(ctx, store, "embedding.word_embeddings.weight");
  if (ctx.features().position_embedding == PositionEmbedding::LearnedAbsolute) {
    ParamSpec s;
    s.name = "embedding.position_embeddings.weight";
    s.global_shape = {ctx.model->seq_length, ctx.model->hidden_size};
    s.kind = ParamKind::Embedding;
    s.sequence_parallel_grad = sp(ctx);  // added on this rank's rows only
    position_ = store.add(s);
  }
}

int64_t Embedding::local_rows(int64_t B, int64_t T) const { return sp(*ctx_) ? B * T / ctx_->ps->tp_size : B * T; }
int64_t Embedding::first_row(int64_t B, int64_t T) const { return sp(*ctx_) ? ctx_->ps->tp_rank * local_rows(B, T) : 0; }

int64_t Embedding::vocab_start() const { return ctx_->ps->tp_rank * word_->local_shape[0]; }

Tensor Embedding::positions(int64_t row0, int64_t rows, int64_t T) const {
  // Cached on the device: a host-to-device copy in backward would wait for the whole backward.
  if (pos_cache_.defined() && pos_key_ == std::array<int64_t, 3>{row0, rows, T}) return pos_cache_;
  pos_key_ = {row0, rows, T};
  pos_cache_ = make_positions(row0, rows, T);
  return pos_cache_;
}

Tensor Embedding::make_positions(int64_t row0, int64_t rows, int64_t T) const {
  Tensor pos = Tensor::empty({rows}, DType::I32);
  int32_t* p = pos.data<int32_t>();
  // The true positions of the local sequence (two chunks of it under context parallelism).
  const RopePositions at = context_chunk_positions(T, ctx_->ps->cp_size, ctx_->ps->cp_rank);
  for (int64_t i = 0; i < rows; ++i) p[i] = static_cast<int32_t>(at((row0 + i) % T));
  if (ctx_->device == Device::CPU) return pos;
  Tensor d = Tensor::empty({rows}, DType::I32, ctx_->device);
  d.copy_from(pos);
  return d;
}

Tensor Embedding::forward(const Tensor& tokens, int64_t B, int64_t T, const StepContext& step) const {
  const ModelContext& c = *ctx_;
  const int64_t C = c.model->hidden_size, rows = local_rows(B, T), row0 = first_row(B, T);
  Tensor full = c.empty({B * T, C});
  ops::embedding_forward(full, tokens, word_->value, vocab_start());  // this rank's vocab slice only
  Tensor x;
  if (sp(c)) {
    x = ReduceScatterToSP::forward(full, *c.ps);
  } else {
    ReduceFromTP::forward(full, *c.ps);
    x = full;
  }
  if (position_) {
    Tensor px = c.empty({rows, C});
    ops::embedding_forward(px, positions(row0, rows, T), position_->value, 0);
    ops::add_(x, px);
  }
  const double p = step.training ? c.model->dropout : 0.0;
  if (p > 0)
    ops::dropout_forward(x, x, p, rng::mix64(step.dropout_seed ^ 0x5eedull),
                         static_cast<uint64_t>((step.first_sample * T + row0) * C));
  return x;
}

void Embedding::backward(const Tensor& dx_in, const Tensor& tokens, int64_t B, int64_t T,
                         const StepContext& step) const {
  const ModelContext& c = *ctx_;
  const int64_t C = c.model->hidden_size, rows = local_rows(B, T), row0 = first_row(B, T);
  const double p = step.training ? c.model->dropout : 0.0;
  Tensor dx = dx_in;
  if (p > 0) {
    dx = c.empty(dx_in.shape());
    ops::dropout_backward(dx, dx_in, p, rng::mix64(step.dropout_seed ^ 0x5eedull),
                          static_cast<uint64_t>((step.first_sample * T + row0) * C));
  }
  if (position_) {
    prepare_grad_accumulate(*position_);
    ops::embedding_backward(position_->grad, dx, positions(row0, rows, T), 0);
  }
  // ReduceFromTP::backward is the identity; under SP the rows are gathered back first.
  Tensor dfull = sp(c) ? ReduceScatterToSP::backward(dx, *c.ps) : dx;
  prepare_grad_accumulate(*word_);
  ops::embedding_backward(word_->grad, dfull, tokens, vocab_start());
}

// ---------------------------------------------------------------- output layer

OutputLayer::OutputLayer(const ModelContext& ctx, Param* weight)
    : ctx_(&ctx), linear_("output_layer", weight, ctx) {
  const int64_t vl = linear_.local_out();
  vocab_start_ = ctx.ps->tp_rank * vl;
  n_valid_ = std::clamp<int64_t>(ctx.model->vocab_size - vocab_start_, 0, vl);
}

void OutputLayer::forward(Saved& s, const Tensor& h, const Tensor& targets, Tensor& loss_acc, Tensor* losses) const {
  const ModelContext& c = *ctx_;
  s.logits = linear_.forward(h);  // (N, Vl): rows gathered under SP
  const int64_t N = s.logits.size(0);
  // Statistics in fp32 (fp64 for fp64 logits) on the model's device, combined over TP ranks there.
  const DType st = stat_dtype(c.dtype);
  Tensor se = Tensor::empty({N}, st, c.device), tl = Tensor::empty({N}, st, c.device);
  s.lse = Tensor::empty({N}, st, c.device);
  ops::cross_entropy_stats(s.lse, se, tl, s.logits, targets, vocab_start_, n_valid_);
  Tensor loss = Tensor::empty({N}, DType::F64, c.device);
  combine_vocab_parallel_ce(s.lse, se, tl, loss, *c.ps);  // s.lse: the row maxima become the log-sum-exp
  ops::sum_accumulate(loss_acc, loss);
  if (losses) *losses = loss;
}

Tensor OutputLayer::backward(Saved& s, const Tensor& h, const Tensor& targets, double dloss_per_token) const {
  const ModelContext& c = *ctx_;
  const int64_t N = s.logits.size(0);
  Tensor dloss = Tensor::empty({N}, s.lse.dtype(), c.device);
  ops::fill_(dloss, dloss_per_token);
  ops::cross_entropy_backward(s.logits, s.logits, targets, s.lse, dloss, vocab_start_, n_valid_);  // in place
  Tensor dh = linear_.backward(s.logits, h);
  s = Saved{};
  return dh;
}

}  // namespace mt
