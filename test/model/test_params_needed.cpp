// The model's parameter waits (ParamSyncHooks::params_needed, model/gpt_model.h), which order its reads after the
// optimizer update beside the forward (optim/adamw.h) and the distributed optimizer's all-gathers: every parameter
// is read only after its range was asked for, and an MoE layer's experts are asked for only once its attention has
// run (the attention runs beside the experts' update). Checked through the values: the hooks put a range's real
// values in place only when it is asked for (every parameter starts as something else), and, when a layer's
// experts are asked for, spoil that layer's attention weights. The forward's loss equals the plain model's bit for
// bit only if both hold; the same spoiling one step earlier (at the layer's dense range) must change it.
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "catch.h"
#include "model_fixture.h"
#include "params/param_sync_hooks.h"

using namespace mt;
using namespace mt::test;

namespace {

// Two MoE layers after a dense one; 4 experts, top-2.
Config tiny_moe() {
  Config c = tiny_config("llama");
  c.model.num_layers = 3;
  c.model.num_experts = 4;
  c.model.moe_router_topk = 2;
  c.model.moe_ffn_hidden_size = 8;
  c.model.moe_layer_freq = {0, 1, 1};
  return c;
}

// "decoder.layers.<n>." of a transformer layer's parameter name, else ""
std::string layer_prefix(const std::string& name) {
  const std::string k = "decoder.layers.";
  if (name.rfind(k, 0) != 0) return "";
  return name.substr(0, name.find('.', k.size()) + 1);
}

// Hands out parameter values when their range is asked for.
struct HandOut : ParamSyncHooks {
  ParamStore* store = nullptr;
  std::vector<double> real;                      // the store's values before the forward
  std::vector<std::pair<int64_t, int64_t>> asked;  // the ranges, in order
  bool spoil_at_experts = true;                  // false: spoil the attention when its layer's dense range comes
  int spoiled = 0;                               // attention parameters spoiled

  void params_needed(int64_t begin, int64_t end) override {
    asked.emplace_back(begin, end);
    double* v = store->flat_values().data<double>();
    std::memcpy(v + begin, real.data() + begin, sizeof(double) * size_t(end - begin));
    for (Param* p : store->params()) {
      const auto at = static_cast<int64_t>(p->flat_offset);
      if (at < begin || at >= end) continue;
      // the range's first parameter names its layer and region
      const bool experts = p->spec.expert_parallel;
      if (experts != spoil_at_experts) continue;
      const std::string layer = layer_prefix(p->spec.name);
      if (layer.empty()) break;  // the embedding, the final norm and output
      for (Param* q : store->params())
        if (q->spec.name.rfind(layer + "self_attention.", 0) == 0) {
          for (int64_t i = 0; i < q->value.numel(); ++i) q->value.data<double>()[i] = 0.5;
          ++spoiled;
        }
      break;
    }
  }
  void grads_accumulated(int64_t, int64_t) override {}
};

double loss_of(TinyModel& m, const std::vector<int32_t>& tokens, const std::vector<int32_t>& labels) {
  GPTModel::MicroState st;
  StepContext step;
  double loss = 0;
  m.model->forward(st, tokens.data(), labels.data(), m.cfg.training.micro_batch_size, m.cfg.model.seq_length,
                   Tensor(), step, &loss);
  return loss;
}

}  // namespace

TEST_CASE("an MoE layer's experts are waited for after its attention, every parameter after its wait",
          "[model][moe][update]") {
  const Config c = tiny_moe();
  const int64_t n = c.training.micro_batch_size * c.model.seq_length;
  const std::vector<int32_t> tokens = random_tokens(n, c.model.vocab_size, 3),
                             labels = random_tokens(n, c.model.vocab_size, 4);
  TinyModel plain(c);
  const double expected = loss_of(plain, tokens, labels);
  REQUIRE(std::isfinite(expected));

  for (const bool at_experts : {true, false}) {
    TinyModel m(c);
    HandOut hooks;
    hooks.store = m.store.get();
    hooks.spoil_at_experts = at_experts;
    const Tensor& flat = m.store->flat_values();
    hooks.real.assign(flat.data<double>(), flat.data<double>() + flat.numel());
    // every parameter starts as something the forward must not read
    for (int64_t i = 0; i < m.store->local_numel(); ++i) m.store->flat_values().data<double>()[i] = std::nan("");
    m.ctx.hooks = &hooks;
    const double loss = loss_of(m, tokens, labels);
    INFO("attention spoiled when the layer's " << (at_experts ? "experts" : "dense parameters") << " are asked for");
    // two MoE layers' attention (linear_qkv, linear_proj) when their experts come; all three layers' otherwise
    CHECK(hooks.spoiled == (at_experts ? 2 : 3) * 2);
    if (at_experts) {
      CHECK(std::memcmp(&loss, &expected, sizeof loss) == 0);
      // embedding, then per layer its dense range and (MoE layers) its experts, then the final norm and output
      const size_t moe_layers = 2;
      CHECK(hooks.asked.size() == 1 + c.model.num_layers + moe_layers + 1);
      int64_t covered = 0;
      for (const auto& [b, e] : hooks.asked) covered += e - b;
      CHECK(covered == m.store->local_numel());
    } else {
      CHECK(std::memcmp(&loss, &expected, sizeof loss) != 0);  // the spoiling reaches the loss when it comes first
    }
  }
}
