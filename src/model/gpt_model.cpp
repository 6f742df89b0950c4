#include "model/gpt_model.h"

#include <algorithm>

#include "tensor/ops.h"

namespace mt {

GPTModel::GPTModel(const ModelContext& ctx, ParamStore& store, const ModelChunkSpec& spec)
    : ctx_(&ctx), store_(&store), spec_(spec) {
  // Parameters are laid out in the flat buffers in registration order (per region): each module is one range of
  // each region it has parameters in (ranges()).
  auto range_from = [&store](size_t first) { return ModuleParams{first, store.num_params(), {}, false}; };
  size_t begin = store.num_params();
  if (spec.pre_process) embedding_ = std::make_unique<Embedding>(ctx, store);
  embedding_range_ = range_from(begin);
  for (int l = spec.layer_begin; l < spec.layer_end; ++l) {
    begin = store.num_params();
    layers_.push_back(std::make_unique<TransformerLayer>(l, ctx, store));
    layer_ranges_.push_back(range_from(begin));
  }
  const int n = static_cast<int>(layers_.size());
  group_begin_.assign(n, -1);
  group_end_.assign(n, -1);
  const RecomputePolicy& rp = ctx.recompute;
  if (rp.mode == RecomputePolicy::Mode::Full) {
    for (int i = 0; i < n; ++i) {
      if (rp.block) {
        if (i < rp.num_layers) group_begin_[i] = i, group_end_[i] = i + 1;
      } else {
        group_begin_[i] = i / rp.num_layers * rp.num_layers;
        group_end_[i] = std::min(n, group_begin_[i] + rp.num_layers);
      }
    }
  }
  const size_t begin_post = store.num_params();
  if (spec.post_process) {
    final_norm_ = std::make_unique<Norm>("decoder.final_layernorm", ctx.model->hidden_size, ctx, store);
    // Tied (untie_embeddings_and_output_weights false): the output layer reuses the word embeddings, the
    // same parameter when this rank holds the embedding, else a copy kept in sync over the embedding group
    // (first and last stage).
    Param* weight = nullptr;
    if (ctx.features().untie_embeddings_and_output_weights) {
      weight = word_table(ctx, store, "output_layer.weight");
    } else if ((weight = store.find("embedding.word_embeddings.weight")) == nullptr) {
      weight = word_table(ctx, store, "embedding.word_embeddings.weight");
      weight->spec.tied_copy = true;
    }
    output_ = std::make_unique<OutputLayer>(ctx, weight);
  }
  post_range_ = range_from(begin_post);
  // Each MoE layer's experts keep their SwiGLU output in the earlier MoE layers' expert gradients when the trainer
  // allows it (ModelContext::gradients_free_until_backward; the first MoE layer of the chunk recomputes it). Those
  // spans are consecutive in the store's expert region, so the arena runs through them without a gap.
  if (ctx.gradients_free_until_backward) {
    const Experts* earlier = nullptr;
    for (MoEMLP* m : moe_layers()) {
      Experts& e = m->layer().experts();
      e.keep_activation_in(&arena_, earlier == nullptr);
      earlier = &e;
    }
  }
}

const std::vector<GPTModel::FlatRange>& GPTModel::ranges(const ModuleParams& m) const {
  if (m.resolved) return m.ranges;
  MT_INTERNAL_ASSERT(store_->allocated(), "a model ran before its parameter store was allocated");
  // Parameters of one module are consecutive inside each region.
  for (bool expert : {false, true}) {
    FlatRange r{-1, -1};
    for (size_t i = m.first; i < m.last; ++i) {
      const Param* p = store_->param(i);
      if (p->spec.expert_parallel != expert) continue;
      const auto b = static_cast<int64_t>(p->flat_offset), e = b + p->value.numel();
      r.begin = r.begin < 0 ? b : std::min(r.begin, b);
      r.end = std::max(r.end, e);
    }
    if (r.begin >= 0) m.ranges.push_back(r);
  }
  m.resolved = true;
  return m.ranges;
}

std::vector<MoEMLP*> GPTModel::moe_layers() const {
  std::vector<MoEMLP*> out;
  for (const auto& l : layers_)
    if (auto* m = dynamic_cast<MoEMLP*>(&l->mlp())) out.push_back(m);
  return out;
}

namespace {
Tensor to_device_ids(const int32_t* ids, int64_t n, Device dev) {
  Tensor host = Tensor::empty({n}, DType::I32);
  std::copy(ids, ids + n, host.data<int32_t>());
  if (dev == Device::CPU) return host;
  Tensor d = Tensor::empty({n}, DType::I32, dev);
  upload(d, host);  // the host does not wait for the device
  return d;
}
}  // namespace

Tensor GPTModel::forward(MicroState& st, const int32_t* tokens, const int32_t* labels, int64_t B, int64_t T,
                         const Tensor& hidden_in, const StepContext& step, Tensor* loss_acc) const {
  st.B = B;
  st.T = T;
  // The ids go to the device first, through page-locked staging (tensor upload()): the host does not wait for the
  // device (the previous step's update) and goes on queueing the layers.
  if (spec_.post_process) st.labels = to_device_ids(labels, B * T, ctx_->device);
  Tensor x;
  if (spec_.pre_process) {
    st.tokens = to_device_ids(tokens, B * T, ctx_->device);
    params_needed(embedding_range_);
    x = embedding_->forward(st.tokens, B, T, step);
  } else {
    x = hidden_in;
  }
  st.layers.assign(layers_.size(), TransformerLayer::Saved{});
  for (size_t i = 0; i < layers_.size(); ++i) {
    params_needed(layer_ranges_[i]);
    x = layers_[i]->forward(st.layers[i], x, B, T, step);
    // Full recompute: once a group is done, keep only its first layer's input.
    if (group_end_[i] == static_cast<int>(i) + 1)
      for (int j = group_begin_[i]; j <= static_cast<int>(i); ++j) {
        if (j == group_begin_[i])
          TransformerLayer::drop(st.layers[j]);
        else
          st.layers[j] = TransformerLayer::Saved{};
      }
  }
  if (!spec_.post_process) return x;
  st.final_in = x;
  params_needed(post_range_);
  st.final_out = ctx_->empty(x.shape());
  final_norm_->forward(st.final_out, st.final_norm, x);
  output_->forward(st.head, st.final_out, st.labels, *loss_acc);
  return Tensor();
}

Tensor GPTModel::forward(MicroState& st, const int32_t* tokens, const int32_t* labels, int64_t B, int64_t T,
                         const Tensor& hidden_in, const StepContext& step, double* loss_sum) const {
  Tensor acc = Tensor::zeros({1}, DType::F64, ctx_->device);
  Tensor out = forward(st, tokens, labels, B, T, hidden_in, step, &acc);
  if (spec_.post_process) {
    Tensor host = Tensor::empty({1}, DType::F64);
    host.copy_from(acc);
    *loss_sum = host.data<double>()[0];
  }
  return out;
}

Tensor GPTModel::logits(const int32_t* tokens, int64_t B, int64_t T) const {
  MT_INTERNAL_ASSERT(spec_.pre_process && spec_.post_process, "logits() needs the whole model on one rank");
  StepContext step;
  step.training = false;
  Tensor x = embedding_->forward(to_device_ids(tokens, B * T, ctx_->device), B, T, step);
  for (const auto& layer : layers_) {
    TransformerLayer::Saved s;
    x = layer->forward(s, x, B, T, step);
  }
  Tensor h = ctx_->empty(x.shape());
  Norm::Saved ns;
  final_norm_->forward(h, ns, x);
  return output_->logits(h);
}

Tensor GPTModel::backward(MicroState& st, const Tensor& d_out, double dloss_per_token,
                          const StepContext& step) const {
  const int64_t B = st.B, T = st.T;
  Tensor dx;
  if (spec_.post_process) {
    Tensor dfinal = output_->backward(st.head, st.final_out, st.labels, dloss_per_token);
    dx = ctx_->zeros(st.final_in.shape());
    final_norm_->backward_accumulate(dx, dfinal, st.final_in, st.final_norm);
    grads_accumulated(post_range_);
  } else {
    dx = d_out.clone();
  }
  for (size_t i = layers_.size(); i-- > 0;) {
    if (!st.layers[i].complete) {
      // Recompute the whole group from its first layer's input, then go on backwards through it.
      const int g = group_begin_[i];
      MT_INTERNAL_ASSERT(g >= 0 && group_end_[i] == static_cast<int>(i) + 1, "layer ", i, " dropped outside a group");
      Tensor x = layers_[g]->recompute(st.layers[g], B, T, step);
      for (int j = g + 1; j <= static_cast<int>(i); ++j) x = layers_[j]->forward(st.layers[j], x, B, T, step);
    }
    layers_[i]->backward(dx, st.layers[i], B, T, step);
    grads_accumulated(layer_ranges_[i]);
  }
  if (spec_.pre_process) {
    embedding_->backward(dx, st.tokens, B, T, step);
    grads_accumulated(embedding_range_);
    st = MicroState{};
    return Tensor();
  }
  st = MicroState{};
  return dx;
}

}  // namespace mt
