// Input embedding (vocab-parallel word table + learned positions for gpt2) and the output layer
// with the vocab-parallel cross-entropy loss. Rows at and past model.vocab_size are padding: they
// are never looked up and are masked out of the softmax, so padding and TP never change the loss.
#pragma once

#include <array>

#include "model/linear.h"

namespace mt {

class Embedding {
 public:
  Embedding(const ModelContext& ctx, ParamStore& store);
  // tokens int32 (B*T) -> x (rows_local, C): all B*T rows, or this rank's B*T/tp under sequence
  // parallelism. Positions t = row % T.
  Tensor forward(const Tensor& tokens, int64_t B, int64_t T, const StepContext& step) const;
  void backward(const Tensor& dx, const Tensor& tokens, int64_t B, int64_t T, const StepContext& step) const;
  Param* word_embeddings() const { return word_; }
  int64_t vocab_start() const;

 private:
  Tensor positions(int64_t row0, int64_t rows, int64_t T) const;
  Tensor make_positions(int64_t row0, int64_t rows, int64_t T) const;
  int64_t local_rows(int64_t B, int64_t T) const;
  int64_t first_row(int64_t B, int64_t T) const;
  const ModelContext* ctx_;
  Param* word_ = nullptr;
  Param* position_ = nullptr;
  mutable Tensor pos_cache_;  // positions of the last (row0, rows, T), on the model's device
  mutable std::array<int64_t, 3> pos_key_{};
};

// logits = h W^T over this rank's vocab slice, then vocab-parallel softmax cross-entropy.
// Registers a vocab-parallel (padded vocab, C) table named `name`.
Param* word_table(const ModelContext& ctx, ParamStore& store, const std::string& name);

class OutputLayer {
 public:
  // weight: the (padded vocab, C) table the logits use: the word embeddings (gpt2, tied) or
  // output_layer.weight (llama). Create it with word_table().
  OutputLayer(const ModelContext& ctx, Param* weight);
  struct Saved {
    Tensor logits;  // (N, Vl)
    Tensor lse;     // (N) global log-sum-exp
  };
  // h (rows_local, C), targets int32 (N = B*T). Adds the sum over the N tokens of -log p(target) (the same on every
  // TP rank) to loss_acc (fp64 (1), on the model's device: nothing waits for the device); per-token losses (N, fp64,
  // on the device) into `losses` if given.
  void forward(Saved& s, const Tensor& h, const Tensor& targets, Tensor& loss_acc, Tensor* losses = nullptr) const;
  // Returns dL/dh (rows_local, C) given dL/dloss_n = dloss_per_token for every token.
  Tensor backward(Saved& s, const Tensor& h, const Tensor& targets, double dloss_per_token) const;
  // Logits (rows_full, Vl) of this rank's vocab slice, without the loss (generation).
  Tensor logits(const Tensor& h) const { return linear_.forward(h); }

 private:
  const ModelContext* ctx_;
  ColumnParallelLinear linear_;
  int64_t vocab_start_, n_valid_;
};

}  // namespace mt
