// Builds tiny fp64 models for gradient checks: config, derived sizes, a single-rank parallel state.
#pragma once

#include <memory>
#include <random>

#include "config/config_loader.h"
#include "model/gpt_model.h"

namespace mt::test {

inline Config tiny_config(const std::string& arch) {
  Config c;
  c.model.arch = arch;
  c.model.num_layers = 2;
  c.model.hidden_size = 16;
  c.model.num_attention_heads = 4;
  c.model.num_query_groups = arch == "llama" ? 2 : 4;
  c.model.ffn_hidden_size = arch == "llama" ? 24 : 32;
  c.model.vocab_size = 27;  // padded to 32: exercises the masked padding rows
  c.model.make_vocab_size_divisible_by = 16;
  c.model.seq_length = 6;
  c.model.init_method_std = 0.3;  // large enough that every path carries gradient
  c.training.micro_batch_size = 2;
  c.training.global_batch_size = 2;
  c.training.train_iters = 1;
  return c;
}

struct TinyModel {
  Config cfg;
  DerivedConfig d;
  ParallelState ps;
  ModelContext ctx;
  std::unique_ptr<ParamStore> store;
  std::unique_ptr<GPTModel> model;

  // gradients_free: ModelContext::gradients_free_until_backward (the trainer's promise; the caller keeps it).
  TinyModel(const Config& c, RecomputePolicy recompute = {}, uint64_t seed = 7, bool gradients_free = false) : cfg(c) {
    d = derive_config(cfg, 1);
    ctx.model = &cfg.model;
    ctx.derived = &d;
    ctx.ps = &ps;
    ctx.dtype = DType::F64;
    ctx.recompute = recompute;
    ctx.gradients_free_until_backward = gradients_free;
    store = std::make_unique<ParamStore>(0, 1);
    model = std::make_unique<GPTModel>(ctx, *store, ModelChunkSpec{0, cfg.model.num_layers, true, true});
    store->allocate(DType::F64, Device::CPU);
    store->initialize(seed, cfg.model.init_method_std, cfg.model.num_layers);
  }
};

inline std::vector<int32_t> random_tokens(int64_t n, int vocab, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int> u(0, vocab - 1);
  std::vector<int32_t> v(n);
  for (auto& t : v) t = u(g);
  return v;
}

}  // namespace mt::test
