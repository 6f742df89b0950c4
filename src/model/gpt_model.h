// The decoder-only model, or the part of it one pipeline chunk holds: layers [layer_begin,
// layer_end), plus the embedding on the first chunk and the final norm + output layer + loss on
// the last. forward/backward run one micro-batch; MicroState keeps what backward needs, so a
// pipeline schedule can keep several micro-batches in flight.
#pragma once

#include <memory>
#include <vector>

#include "model/embedding.h"
#include "model/moe/moe_mlp.h"
#include "model/transformer_layer.h"

namespace mt {

struct ModelChunkSpec {
  int layer_begin = 0, layer_end = 0;  // global layer numbers
  bool pre_process = true;             // holds the embedding
  bool post_process = true;            // holds final norm, output layer and loss
};

class GPTModel {
 public:
  // Recompute follows ctx.recompute.
  GPTModel(const ModelContext& ctx, ParamStore& store, const ModelChunkSpec& spec);

  struct MicroState {
    int64_t B = 0, T = 0;
    Tensor tokens, labels;  // int32 (B*T), on the model's device
    std::vector<TransformerLayer::Saved> layers;
    Tensor final_in, final_out;
    Norm::Saved final_norm;
    OutputLayer::Saved head;
  };

  // Forward one micro-batch. tokens/labels: int32 host arrays of B*T. hidden_in: the previous
  // stage's output (B*T, C) unless pre_process. Returns this chunk's output (B*T, C) unless
  // post_process; then returns an undefined tensor and adds the sum of token losses to *loss_acc (fp64 (1), on the
  // model's device, so that nothing waits for the device).
  Tensor forward(MicroState& st, const int32_t* tokens, const int32_t* labels, int64_t B, int64_t T,
                 const Tensor& hidden_in, const StepContext& step, Tensor* loss_acc) const;
  // The same with the sum of token losses returned in *loss_sum (waits for the device): tests, one-off forwards.
  Tensor forward(MicroState& st, const int32_t* tokens, const int32_t* labels, int64_t B, int64_t T,
                 const Tensor& hidden_in, const StepContext& step, double* loss_sum) const;
  // Backward. post_process: d_out ignored, every token's loss has weight dloss_per_token.
  // Returns dL/d(hidden_in) unless pre_process (then undefined). Frees st.
  Tensor backward(MicroState& st, const Tensor& d_out, double dloss_per_token, const StepContext& step) const;

  // Inference on a whole model (pre_process and post_process on this rank): logits (B*T, Vl) for
  // every position of tokens (B*T int32 on the host). No dropout, nothing kept.
  Tensor logits(const int32_t* tokens, int64_t B, int64_t T) const;

  const ModelChunkSpec& spec() const { return spec_; }
  // This chunk's mixture-of-experts MLPs, in layer order (the trainer reads their routing statistics and drives
  // their routers' loss-gradient scale and expert bias).
  std::vector<MoEMLP*> moe_layers() const;

 private:
  // Element range of the store's flat buffers (ParamSyncHooks).
  struct FlatRange {
    int64_t begin = 0, end = 0;
  };
  // One module's parameters: registration indices [first, last) in the store, and (once the store is allocated)
  // their flat ranges: one per region of the store they occupy (an MoE layer spans the dense and the expert one).
  struct ModuleParams {
    size_t first = 0, last = 0;
    mutable std::vector<FlatRange> ranges;
    mutable bool resolved = false;
  };
  const std::vector<FlatRange>& ranges(const ModuleParams& m) const;
  void params_needed(const ModuleParams& m) const {
    if (ctx_->hooks)
      for (const FlatRange& r : ranges(m)) ctx_->hooks->params_needed(r.begin, r.end);
  }
  // After a module's backward: its parameters that got no gradient are zeroed (ParamStore::zero_unwritten), then
  // the hooks are told.
  void grads_accumulated(const ModuleParams& m) const {
    for (const FlatRange& r : ranges(m)) {
      store_->zero_unwritten(r.begin, r.end);
      if (ctx_->hooks) ctx_->hooks->grads_accumulated(r.begin, r.end);
    }
  }

  const ModelContext* ctx_;
  ParamStore* store_;
  ModuleParams embedding_range_, post_range_;
  std::vector<ModuleParams> layer_ranges_;
  ModelChunkSpec spec_;
  std::unique_ptr<Embedding> embedding_;
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  // Full recompute: layers [group_begin_[i], group_end_[i]) are recomputed together (keeping only
  // the first one's input); group_begin_[i] == -1 for layers kept in full.
  std::vector<int> group_begin_, group_end_;
  std::unique_ptr<Norm> final_norm_;
  std::unique_ptr<OutputLayer> output_;
  ActivationArena arena_;  // the MoE layers' kept SwiGLU outputs (Experts::keep_activation_in)
};

}  // namespace mt
