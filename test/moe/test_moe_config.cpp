// The model.moe_* keys: defaults (dense), every key parsed, MoE keys without experts refused by name, the
// cross-field checks (parallel.expert included), which layers are MoE layers.
#include <string>

#include "catch.h"
#include "config/config_loader.h"
#include "config/config_validate_moe.h"
#include "model/moe/moe_options.h"

namespace {
const char* kBase = R"(model:
  num_layers: 4
  hidden_size: 64
  num_attention_heads: 4
  ffn_hidden_size: 128
  vocab_size: 100
  seq_length: 16
training:
  train_iters: 1
data:
  mock: true
)";

std::string error_of(const std::vector<std::string>& overrides) {
  try {
    mt::load_config_from_string(kBase, "x.yaml", overrides);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("moe config: dense by default, MoE keys need experts", "[moe][config]") {
  const mt::Config c = mt::load_config_from_string(kBase, "x.yaml");
  CHECK(c.model.num_experts == 0);
  CHECK(c.model.moe_router_topk == 2);
  CHECK(c.model.moe_layer_freq == std::vector<double>{1});
  CHECK(c.model.moe_router_load_balancing_type == "aux_loss");
  CHECK_FALSE(mt::is_moe_layer(c.model, 0));
  CHECK_THAT(error_of({"model.moe_aux_loss_coeff=0.01"}),
             Catch::Contains("model.moe_aux_loss_coeff is set but model.num_experts is 0"));
  CHECK_THAT(error_of({"model.moe_router_score_function=sigmoid"}),
             Catch::Contains("model.moe_router_score_function is set"));
  CHECK_THAT(error_of({"model.moe_router_score_function=cosine"}), Catch::Contains("moe_router_score_function"));
  CHECK_THAT(error_of({"parallel.expert=2"}), Catch::Contains("parallel.expert"));
  CHECK_THAT(error_of({"model.moe_router_force_load_balancing=true"}),
             Catch::Contains("model.moe_router_force_load_balancing is set but model.num_experts is 0"));
}

TEST_CASE("moe config: forced balanced routing needs experts and no context parallelism", "[moe][config]") {
  const std::vector<std::string> sets = {"model.num_experts=8", "model.moe_ffn_hidden_size=32",
                                         "model.moe_router_force_load_balancing=true"};
  mt::Config c = mt::load_config_from_string(kBase, "x.yaml", sets);
  CHECK(c.model.moe_router_force_load_balancing);
  CHECK(mt::moe_options(c.model).force_load_balancing);
  CHECK_FALSE(mt::moe_options(mt::load_config_from_string(kBase, "x.yaml", {sets[0], sets[1]}).model)
                  .force_load_balancing);
  // accepted with expert, tensor (sequence parallel) and data parallelism
  c.parallel.expert = 2;
  c.parallel.tensor = 2;
  c.parallel.sequence_parallel = true;
  CHECK_NOTHROW(mt::derive_config(c, 8));
  // refused with context parallelism: a context rank's rows are not contiguous in the sequence
  c.parallel = mt::ParallelConfig{};
  c.parallel.context = 2;
  try {
    mt::derive_config(c, 2);
    FAIL("forced balancing with parallel.context 2 accepted");
  } catch (const std::exception& e) {
    const std::string m = e.what();
    CHECK_THAT(m, Catch::Contains("model.moe_router_force_load_balancing with parallel.context (2) > 1 is not "
                                  "supported"));
    CHECK_THAT(m, Catch::Contains("set parallel.context: 1 or remove model.moe_router_force_load_balancing"));
    CHECK(m.find('\n') == std::string::npos);
  }
}

TEST_CASE("moe config: cross-field checks, layer pattern", "[moe][config]") {
  const std::vector<std::string> moe = {"model.num_experts=8", "model.moe_ffn_hidden_size=32"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), moe.begin(), moe.end());
    return error_of(more);
  };
  CHECK_THAT(with({"model.moe_router_topk=9"}), Catch::Contains("model.moe_router_topk (9) must be at most"));
  CHECK_THAT(error_of({"model.num_experts=8"}), Catch::Contains("model.moe_ffn_hidden_size is required"));
  CHECK_THAT(with({"model.moe_layer_freq=[1,0,1]"}), Catch::Contains("lists 3 layers but model.num_layers is 4"));
  CHECK_THAT(with({"model.moe_layer_freq=[1,0,2,1]"}), Catch::Contains("entries must be 0 (dense) or 1"));
  CHECK_THAT(with({"model.moe_layer_freq=1.5"}), Catch::Contains("whole number"));
  CHECK_THAT(with({"model.moe_router_score_function=sigmoid", "model.moe_router_pre_softmax=true"}),
             Catch::Contains("softmax only"));
  CHECK_THAT(with({"model.moe_router_load_balancing_type=seq_aux_loss"}), Catch::Contains("moe_aux_loss_coeff > 0"));
  // keys that act only with another one are refused alone, not ignored
  CHECK_THAT(with({"model.moe_router_load_balancing_type=none", "model.moe_aux_loss_coeff=0.01"}),
             Catch::Contains("model.moe_aux_loss_coeff is set but model.moe_router_load_balancing_type is none"));
  CHECK(with({"model.moe_router_load_balancing_type=none"}).empty());
  CHECK_THAT(with({"model.moe_router_bias_update_rate=0.01"}),
             Catch::Contains("model.moe_router_bias_update_rate is set but model.moe_router_enable_expert_bias is false"));
  CHECK(with({"model.moe_router_enable_expert_bias=true", "model.moe_router_bias_update_rate=0.01"}).empty());
  CHECK(with({}).empty());
  CHECK_THAT(with({"parallel.expert=3"}), Catch::Contains("model.num_experts (8) must be divisible by parallel.expert (3)"));
  CHECK_THAT(with({"parallel.tensor=2"}), Catch::Contains("need parallel.sequence_parallel: true"));
  CHECK(with({"parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.expert=2"}).empty());
  // expert x expert-data regroup data x context: world 4 = data 4 fits expert 2 and 4, world 2 not expert 4
  mt::Config c = mt::load_config_from_string(kBase, "x.yaml", {"model.num_experts=8", "model.moe_ffn_hidden_size=32",
                                                               "parallel.expert=4"});
  CHECK(mt::derive_config(c, 4).features.moe_layers == std::vector<bool>{true, true, true, true});
  try {
    mt::derive_config(c, 2);
    FAIL("expert 4 over 2 ranks accepted");
  } catch (const std::exception& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("parallel.expert (4) must divide data-parallel (2"));
  }
  c.model.moe_layer_freq = {2};
  c.parallel.expert = 1;
  CHECK(mt::derive_config(c, 1).features.moe_layers == std::vector<bool>{true, false, true, false});
  // which layers are MoE
  mt::ModelConfig m;
  m.num_layers = 4;
  m.num_experts = 8;
  m.moe_layer_freq = {2};
  CHECK(mt::is_moe_layer(m, 0));
  CHECK_FALSE(mt::is_moe_layer(m, 1));
  CHECK(mt::is_moe_layer(m, 2));
  m.moe_layer_freq = {0, 0, 1, 1};  // DeepSeek: the first layers dense
  CHECK_FALSE(mt::is_moe_layer(m, 1));
  CHECK(mt::is_moe_layer(m, 3));
  // the layer's options from the config
  m.arch = "gpt2";
  m.seq_length = 32;
  m.moe_router_topk = 3;
  m.moe_ffn_hidden_size = 48;
  m.moe_router_score_function = "sigmoid";
  m.moe_router_load_balancing_type = "seq_aux_loss";
  m.moe_expert_capacity_factor = 1.25;
  const mt::MoEOptions o = mt::moe_options(m);
  CHECK(o.num_experts == 8);
  CHECK(o.topk == 3);
  CHECK(o.ffn_hidden_size == 48);
  CHECK_FALSE(o.swiglu);
  CHECK(o.sigmoid);
  CHECK(o.load_balancing == "seq_aux_loss");
  CHECK(o.capacity_factor == 1.25);
  CHECK(o.seq_length == 32);
}
