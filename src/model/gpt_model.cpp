#include "model/gpt_model.h"

#include "tensor/ops.h"

namespace mt {

GPTModel::GPTModel(const ModelContext& ctx, ParamStore& store, const ModelChunkSpec& spec, bool full_recompute)
    : ctx_(&ctx), spec_(spec) {
  if (spec.pre_process) embedding_ = std::make_unique<Embedding>(ctx, store);
  for (int l = spec.layer_begin; l < spec.layer_end; ++l)
    layers_.push_back(std::make_unique<TransformerLayer>(l, ctx, store, full_recompute));
  if (spec.post_process) {
    final_norm_ = std::make_unique<Norm>("decoder.final_layernorm", ctx.model->hidden_size, ctx, store);
    // gpt2 ties the output layer to the word embeddings: the same parameter when this rank holds
    // the embedding, else a copy kept in sync over the embedding group (first and last stage).
    Param* weight = nullptr;
    if (ctx.llama()) {
      weight = word_table(ctx, store, "output_layer.weight");
    } else if ((weight = store.find("embedding.word_embeddings.weight")) == nullptr) {
      weight = word_table(ctx, store, "embedding.word_embeddings.weight");
      weight->spec.tied_copy = true;
    }
    output_ = std::make_unique<OutputLayer>(ctx, weight);
  }
}

namespace {
Tensor to_device_ids(const int32_t* ids, int64_t n, Device dev) {
  Tensor host = Tensor::empty({n}, DType::I32);
  std::copy(ids, ids + n, host.data<int32_t>());
  if (dev == Device::CPU) return host;
  Tensor d = Tensor::empty({n}, DType::I32, dev);
  d.copy_from(host);
  return d;
}
}  // namespace

Tensor GPTModel::forward(MicroState& st, const int32_t* tokens, const int32_t* labels, int64_t B, int64_t T,
                         const Tensor& hidden_in, const StepContext& step, double* loss_sum) const {
  st.B = B;
  st.T = T;
  Tensor x;
  if (spec_.pre_process) {
    st.tokens = to_device_ids(tokens, B * T, ctx_->device);
    x = embedding_->forward(st.tokens, B, T, step);
  } else {
    x = hidden_in;
  }
  st.layers.assign(layers_.size(), TransformerLayer::Saved{});
  for (size_t i = 0; i < layers_.size(); ++i) x = layers_[i]->forward(st.layers[i], x, B, T, step);
  if (!spec_.post_process) return x;
  st.labels = to_device_ids(labels, B * T, ctx_->device);
  st.final_in = x;
  st.final_out = ctx_->empty(x.shape());
  final_norm_->forward(st.final_out, st.final_norm, x);
  *loss_sum = output_->forward(st.head, st.final_out, st.labels);
  return Tensor();
}

Tensor GPTModel::backward(MicroState& st, const Tensor& d_out, double dloss_per_token,
                          const StepContext& step) const {
  const int64_t B = st.B, T = st.T;
  Tensor dx;
  if (spec_.post_process) {
    Tensor dfinal = output_->backward(st.head, st.final_out, st.labels, dloss_per_token);
    dx = ctx_->zeros(st.final_in.shape());
    final_norm_->backward_accumulate(dx, dfinal, st.final_in, st.final_norm);
  } else {
    dx = d_out.clone();
  }
  for (size_t i = layers_.size(); i-- > 0;) layers_[i]->backward(dx, st.layers[i], B, T, step);
  if (spec_.pre_process) {
    embedding_->backward(dx, st.tokens, B, T, step);
    st = MicroState{};
    return Tensor();
  }
  st = MicroState{};
  return dx;
}

}  // namespace mt
