// Model features (config/model_features.h): model.arch is a preset for the feature keys left unset, a key
// written in the config wins, null means unset, the resolved features follow, and invalid combinations are
// refused with one line naming the key and the fix.
#include <string>
#include <vector>

#include "catch.h"
#include "config/config_loader.h"
#include "config/config_schema.h"
#include "config/model_features.h"
#include "config_test_util.h"

using mt::test::contains;
using mt::test::error_of;
using mt::test::kBaseYaml;

namespace {

mt::Config load(const std::vector<std::string>& overrides) {
  return mt::load_config_from_string(kBaseYaml, "configs/f.yaml", overrides);
}

mt::ModelFeatures features(const std::vector<std::string>& overrides) {
  return mt::resolve_model_features(load(overrides));
}

std::string load_error(const std::vector<std::string>& overrides) {
  const std::string msg = error_of([&] { mt::derive_config(load(overrides), 1); });
  INFO(msg);
  CHECK(mt::test::one_line(msg));
  CHECK(contains(msg, "configs/f.yaml"));
  return msg;
}

}  // namespace

TEST_CASE("features: the arch presets fill unset keys", "[config][features]") {
  using namespace mt;
  const ModelFeatures l = features({});
  CHECK(l.normalization == Normalization::RMSNorm);
  CHECK(l.activation == Activation::SwiGLU);
  CHECK_FALSE(l.add_bias_linear);
  CHECK_FALSE(l.qkv_bias);
  CHECK(l.position_embedding == PositionEmbedding::RoPE);
  CHECK(l.untie_embeddings_and_output_weights);
  CHECK(l.kv_channels == 16);  // 64 / 4
  const ModelFeatures g = features({"model.arch=gpt2"});
  CHECK(g.normalization == Normalization::LayerNorm);
  CHECK(g.activation == Activation::GELU);
  CHECK(g.add_bias_linear);
  CHECK(g.qkv_bias);
  CHECK(g.position_embedding == PositionEmbedding::LearnedAbsolute);
  CHECK_FALSE(g.untie_embeddings_and_output_weights);
  // Nothing is written back: the unset keys stay unset in the Config.
  const Config c = load({"model.arch=gpt2"});
  CHECK_FALSE(c.model.normalization.has_value());
  CHECK_FALSE(c.model.untie_embeddings_and_output_weights.has_value());
}

TEST_CASE("features: an explicit key beats the preset; null is unset", "[config][features]") {
  using namespace mt;
  const ModelFeatures f = features({"model.arch=gpt2", "model.normalization=rmsnorm", "model.activation=swiglu",
                                    "model.add_bias_linear=false", "model.position_embedding_type=rope",
                                    "model.untie_embeddings_and_output_weights=true", "model.kv_channels=32"});
  CHECK(f.normalization == Normalization::RMSNorm);
  CHECK(f.activation == Activation::SwiGLU);
  CHECK_FALSE(f.add_bias_linear);
  CHECK(f.position_embedding == PositionEmbedding::RoPE);
  CHECK(f.untie_embeddings_and_output_weights);
  CHECK(f.kv_channels == 32);
  CHECK(derive_config(load({"model.kv_channels=32"}), 1).head_dim == 32);
  // add_qkv_bias only adds the linear_qkv bias
  const ModelFeatures q = features({"model.add_qkv_bias=true"});
  CHECK(q.qkv_bias);
  CHECK_FALSE(q.add_bias_linear);
  // the value false is a value: it beats the gpt2 preset's true
  CHECK_FALSE(features({"model.arch=gpt2", "model.add_bias_linear=false"}).add_bias_linear);
  // null (YAML) unsets an earlier value: the preset again
  const Config c = load({"model.normalization=layernorm", "model.normalization=null"});
  CHECK_FALSE(c.model.normalization.has_value());
  CHECK(resolve_model_features(c).normalization == Normalization::RMSNorm);
}

TEST_CASE("features: config_to_yaml keeps set and unset keys apart; the reference says preset", "[config][features]") {
  const mt::Config c = load({"model.activation=gelu", "model.add_bias_linear=false"});
  const std::string yaml = mt::config_to_yaml(c);
  CHECK(contains(yaml, "  activation: gelu\n"));
  CHECK(contains(yaml, "  add_bias_linear: false\n"));
  CHECK(contains(yaml, "  normalization: null\n"));
  const mt::Config back = mt::load_config_from_string(yaml, "back.yaml");
  CHECK(mt::config_fields_equal(back, c));
  CHECK_FALSE(back.model.normalization.has_value());
  CHECK(*back.model.activation == "gelu");
  const std::string md = mt::config_reference_markdown();
  CHECK(contains(md, "| `model.normalization` | one of layernorm, rmsnorm | `preset (arch)` |"));
}

TEST_CASE("features: invalid values and combinations are refused naming the key", "[config][features]") {
  std::string m = load_error({"model.rope_scaling=true", "model.position_embedding_type=learned_absolute"});
  CHECK(contains(m, "model.rope_scaling: true needs model.position_embedding_type rope"));
  m = load_error({"model.kv_channels=15"});
  CHECK(contains(m, "head_dim = model.kv_channels = 15 must be even for RoPE"));
  CHECK(contains(m, "set an even model.kv_channels"));
  m = load_error({"model.arch=gpt2", "model.activation=swiglu", "model.ffn_hidden_size=0"});
  CHECK(contains(m, "model.ffn_hidden_size is required for model.activation swiglu"));
  m = load_error({"model.rope_scaling=true", "model.rope_scaling_low_freq_factor=4", "model.rope_scaling_high_freq_factor=2"});
  CHECK(contains(m, "model.rope_scaling_high_freq_factor (2.0) must be greater than model.rope_scaling_low_freq_factor"));
  // keys that act only with another one are refused alone, not ignored: the scaling's without rope_scaling, the
  // base without RoPE
  m = load_error({"model.rope_scaling_factor=4"});
  CHECK(contains(m, "model.rope_scaling_factor is set but model.rope_scaling is false"));
  m = load_error({"model.rope_scaling_original_max_position_embeddings=64"});
  CHECK(contains(m, "model.rope_scaling_original_max_position_embeddings is set but model.rope_scaling is false"));
  CHECK(mt::derive_config(load({"model.rope_scaling=true", "model.rope_scaling_factor=4"}), 1).world_size == 1);
  m = load_error({"model.position_embedding_type=learned_absolute", "model.rope_theta=500000"});
  CHECK(contains(m, "model.rope_theta is set but model.position_embedding_type is learned_absolute"));
  m = error_of([] { load({"model.normalization=batchnorm"}); });
  CHECK(contains(m, "model.normalization"));
  CHECK(contains(m, "layernorm, rmsnorm"));
  m = load_error({"model.hidden_size=60", "model.num_attention_heads=8"});
  CHECK(contains(m, "model.kv_channels"));
  // with kv_channels set, hidden_size need not be a multiple of the heads
  CHECK(mt::derive_config(load({"model.hidden_size=60", "model.num_attention_heads=8", "model.kv_channels=8",
                                "model.num_query_groups=0"}),
                          1)
            .head_dim == 8);
}
