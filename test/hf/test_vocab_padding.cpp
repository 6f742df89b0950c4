// Checkpoints are free of their vocabulary padding: a model whose padded vocabulary differs from
// the one that saved (another make_vocab_size_divisible_by or parallel.tensor) loads the valid rows
// and zero padding rows, and computes the same logits.
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/config_loader.h"
#include "tensor/ops.h"
#include "test/catch.h"
#include "test/hf/hf_test_util.h"
#include "train/convert.h"
#include "train/train_checkpoint.h"

using namespace mt;

TEST_CASE("checkpoint: a load with another vocabulary padding copies the valid rows", "[vocab_padding]") {
  for (const char* config : {"tiny-llama.yaml", "tiny-gpt2.yaml"}) {
    DYNAMIC_SECTION(config) {
      hf_test::TempDir d;
      const std::string path = std::string(MT_SOURCE_DIR) + "/configs/ci/" + config;
      Config cfg = load_config(path, {"model.vocab_size=120"});  // padded to 128 (multiple of 16)
      auto saved = build_host_model(cfg);
      saved->store->initialize(7, 0.5, cfg.model.num_layers);
      save_host_model(*saved, d.path, config_to_yaml(cfg), hf_test::world());

      for (int divisible : {48, 8}) {  // padded 144 (more rows) and 120 (none)
        Config cfg2 = load_config(path, {"model.vocab_size=120", "model.make_vocab_size_divisible_by=" + std::to_string(divisible)});
        auto loaded = build_host_model(cfg2);
        REQUIRE(loaded->derived.padded_vocab_size == (divisible == 48 ? 144 : 120));
        ops::fill_(loaded->store->flat_master(), 3.0);  // whatever was there before
        ckpt::LoadedCheckpoint ck = ckpt::open_checkpoint(ckpt::resolve_load_path(d.path, d.path));
        load_model_weights(ck, *loaded->store);
        for (Param* p : loaded->store->params()) {
          INFO(p->spec.name);
          Tensor a = saved->store->master(*saved->store->find(p->spec.name));
          Tensor b = loaded->store->master(*p);
          const int64_t rows = std::min(a.size(0), b.size(0));
          const int64_t width = a.numel() / a.size(0);
          const int64_t valid = p->spec.valid_rows >= 0 ? p->spec.valid_rows : rows;
          CHECK(std::memcmp(a.data<float>(), b.data<float>(), static_cast<size_t>(valid * width) * 4) == 0);
          for (int64_t i = valid * width; i < b.numel(); ++i) REQUIRE(b.data<float>()[i] == 0.0f);
        }
        const std::vector<int32_t> ids = {1, 5, 119, 0, 64};
        Tensor la = saved->model->logits(ids.data(), 1, 5), lb = loaded->model->logits(ids.data(), 1, 5);
        for (int64_t t = 0; t < 5; ++t)
          for (int64_t v = 0; v < 120; ++v) REQUIRE(la.data<float>()[t * la.size(1) + v] == lb.data<float>()[t * lb.size(1) + v]);
      }
      // Anything but the vocabulary rows must still match.
      Config other = load_config(path, {"model.vocab_size=120", "model.hidden_size=32"});
      auto bad = build_host_model(other);
      ckpt::LoadedCheckpoint ck = ckpt::open_checkpoint(ckpt::resolve_load_path(d.path, d.path));
      CHECK_THROWS_WITH(load_model_weights(ck, *bad->store), Catch::Contains("global shape"));
    }
  }
}
