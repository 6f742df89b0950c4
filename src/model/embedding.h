// Input embedding (vocab-parallel word table + learned positions for gpt2) and the output layer
// with the vocab-parallel cross-entropy loss. Rows at and past model.vocab_size are padding: they
// are never looked up and are masked out of the softmax, so padding and TP never change the loss.
#pragma once

#include "model/linear.h"

namespace mt {

class Embedding {
 public:
  Embedding(const ModelContext& ctx, ParamStore& store);
  // tokens int32 (B*T) -> x (B*T, C). positions t = row % T.
  Tensor forward(const Tensor& tokens, int64_t B, int64_t T, const StepContext& step) const;
  void backward(const Tensor& dx, const Tensor& tokens, int64_t B, int64_t T, const StepContext& step) const;
  Param* word_embeddings() const { return word_; }
  int64_t vocab_start() const;

 private:
  Tensor positions(int64_t B, int64_t T) const;
  const ModelContext* ctx_;
  Param* word_ = nullptr;
  Param* position_ = nullptr;
};

// logits = h W^T over this rank's vocab slice, then vocab-parallel softmax cross-entropy.
class OutputLayer {
 public:
  // tied: the word-embedding table (gpt2); null: own output_layer.weight (llama).
  OutputLayer(const ModelContext& ctx, ParamStore& store, Param* tied);
  struct Saved {
    Tensor logits;  // (N, Vl)
    Tensor lse;     // (N) global log-sum-exp
  };
  // Returns the sum over the N tokens of -log p(target); per-token losses into `losses` if given.
  double forward(Saved& s, const Tensor& h, const Tensor& targets, Tensor* losses = nullptr) const;
  // dh (N, C) = gradient w.r.t. h given dL/dloss_n = dloss_per_token for every token.
  void backward(Tensor& dh, Saved& s, const Tensor& h, const Tensor& targets, double dloss_per_token) const;

 private:
  const ModelContext* ctx_;
  ColumnParallelLinear linear_;
  int64_t vocab_start_, n_valid_;
};

}  // namespace mt
