// The mapping tables' transforms against layouts written out by hand, merge -> split = identity,
// and config.json parsing (keys used, refused, ignored on purpose; make_config reproduces them).
#include <numeric>
#include <vector>

#include "checkpoint/hf_mapping.h"
#include "core/check.h"
#include "test/catch.h"

using namespace mt;
using namespace mt::hf;
using json = nlohmann::json;

namespace {

ArchSpec small_llama() {
  ArchSpec a;
  a.architecture = "LlamaForCausalLM", a.model_type = "llama";
  a.num_layers = 1, a.hidden_size = 3, a.num_heads = 4, a.num_kv_heads = 2, a.head_dim = 2, a.ffn_hidden_size = 2;
  a.vocab_size = 5, a.max_positions = 8;
  return a;
}

const Rule& rule_for(const std::vector<Rule>& rules, const char* ours) {
  for (const Rule& r : rules)
    if (r.ours == ours) return r;
  FAIL("no rule for " << ours);
  return rules[0];
}

// Our tensor from the HF tensors through merge, then back through split: the same values.
void round_trip(const Rule& r, const ArchSpec& a, const std::vector<int64_t>& our_shape, std::vector<float>& ours,
                std::vector<std::vector<float>>& hf) {
  auto shapes = hf_shapes(r, a, our_shape);
  hf.clear();
  float v = 1;
  for (const auto& s : shapes) {
    int64_t n = 1;
    for (int64_t x : s) n *= x;
    hf.emplace_back(static_cast<size_t>(n));
    for (float& x : hf.back()) x = v++;
  }
  int64_t n = 1;
  for (int64_t x : our_shape) n *= x;
  ours.assign(static_cast<size_t>(n), -1.f);
  std::vector<const float*> srcs;
  for (auto& h : hf) srcs.push_back(h.data());
  merge(r, a, our_shape, srcs, ours.data());
  std::vector<std::vector<float>> back(hf.size());
  std::vector<float*> dsts;
  for (size_t i = 0; i < hf.size(); ++i) back[i].assign(hf[i].size(), -7.f), dsts.push_back(back[i].data());
  split(r, a, our_shape, ours.data(), dsts);
  CHECK(back == hf);
}

}  // namespace

TEST_CASE("hf mapping: llama q/k/v merge into per-group rows and gate/up into fc1", "[hf]") {
  ArchSpec a = small_llama();
  const auto rules = mapping(a, nullptr);
  std::vector<float> ours;
  std::vector<std::vector<float>> hf;
  // qkv: 4 heads in 2 groups, head dim 2, hidden 3: q [8, 3], k [4, 3], v [4, 3] -> ours [16, 3].
  const Rule& qkv = rule_for(rules, "decoder.layers.0.self_attention.linear_qkv.weight");
  CHECK(hf_shapes(qkv, a, {16, 3}) == std::vector<std::vector<int64_t>>{{8, 3}, {4, 3}, {4, 3}});
  round_trip(qkv, a, {16, 3}, ours, hf);
  // Our rows by hand: group 0 = q rows 0..3, k rows 0..1, v rows 0..1; group 1 = q rows 4..7, k 2..3, v 2..3.
  std::vector<std::pair<int, int>> expect = {{0, 0}, {0, 1}, {0, 2}, {0, 3}, {1, 0}, {1, 1}, {2, 0}, {2, 1},
                                             {0, 4}, {0, 5}, {0, 6}, {0, 7}, {1, 2}, {1, 3}, {2, 2}, {2, 3}};
  for (size_t row = 0; row < expect.size(); ++row)
    for (int c = 0; c < 3; ++c) CHECK(ours[row * 3 + c] == hf[expect[row].first][expect[row].second * 3 + c]);
  // fc1 = [gate; up]
  const Rule& fc1 = rule_for(rules, "decoder.layers.0.mlp.linear_fc1.weight");
  round_trip(fc1, a, {4, 3}, ours, hf);
  for (int row = 0; row < 4; ++row)
    for (int c = 0; c < 3; ++c) CHECK(ours[row * 3 + c] == hf[row / 2][(row % 2) * 3 + c]);
  // Untied: lm_head maps to output_layer with vocabulary rows.
  CHECK(rule_for(rules, "output_layer.weight").vocab_rows);
}

TEST_CASE("hf mapping: GPT-2 Conv1D transposes and c_attn's [Q|K|V] per head", "[hf]") {
  ArchSpec a;
  a.architecture = "GPT2LMHeadModel", a.model_type = "gpt2", a.gpt2 = true, a.tied = true;
  a.num_layers = 1, a.hidden_size = 4, a.num_heads = 2, a.num_kv_heads = 2, a.head_dim = 2, a.ffn_hidden_size = 6;
  std::vector<std::string> skip;
  const auto rules = mapping(a, &skip);
  CHECK(std::find(skip.begin(), skip.end(), "transformer.h.0.attn.bias") != skip.end());
  std::vector<float> ours;
  std::vector<std::vector<float>> hf;
  // c_fc: HF [in 4, out 6], ours [6, 4] = its transpose.
  const Rule& fc1 = rule_for(rules, "decoder.layers.0.mlp.linear_fc1.weight");
  CHECK(hf_shapes(fc1, a, {6, 4}) == std::vector<std::vector<int64_t>>{{4, 6}});
  round_trip(fc1, a, {6, 4}, ours, hf);
  for (int o = 0; o < 6; ++o)
    for (int i = 0; i < 4; ++i) CHECK(ours[o * 4 + i] == hf[0][i * 6 + o]);
  // c_attn: HF [4, 12] = [in, Q|K|V]; ours [12, 4] rows per head: [q_h; k_h; v_h].
  const Rule& qkv = rule_for(rules, "decoder.layers.0.self_attention.linear_qkv.weight");
  round_trip(qkv, a, {12, 4}, ours, hf);
  for (int h = 0; h < 2; ++h)
    for (int part = 0; part < 3; ++part)
      for (int j = 0; j < 2; ++j)
        for (int i = 0; i < 4; ++i) {
          const int our_row = h * 6 + part * 2 + j, hf_col = part * 4 + h * 2 + j;
          CHECK(ours[our_row * 4 + i] == hf[0][i * 12 + hf_col]);
        }
  const Rule& bias = rule_for(rules, "decoder.layers.0.self_attention.linear_qkv.bias");
  round_trip(bias, a, {12}, ours, hf);
  CHECK(ours[2] == hf[0][4]);  // head 0's k starts at HF element 4 (after Q's 4)
}

TEST_CASE("hf config: parse, refuse, ignore on purpose, and write back", "[hf]") {
  json j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", 300},
            {"hidden_size", 64}, {"intermediate_size", 128}, {"num_hidden_layers", 2},
            {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16}, {"hidden_act", "silu"},
            {"max_position_embeddings", 128}, {"rms_norm_eps", 1e-6}, {"initializer_range", 0.02},
            {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 50000.0}}}, {"attention_bias", false},
            {"attention_dropout", 0.0}, {"mlp_bias", false}, {"tie_word_embeddings", false}, {"bos_token_id", 1},
            {"eos_token_id", 2}, {"dtype", "float32"}, {"transformers_version", "5.0.0"}, {"use_cache", true},
            {"pretraining_tp", 1}};
  std::vector<std::string> notes;
  ArchSpec a = parse_config(j, "m/config.json", &notes);
  CHECK(a.num_kv_heads == 2);
  CHECK(a.rope_theta == 50000.0);
  ModelConfig m = to_model_config(a, "m/config.json");
  Config cfg;
  cfg.model = m;
  CHECK(m.arch == "llama");
  CHECK(m.num_query_groups == 2);
  CHECK(m.seq_length == 128);
  // Written back over the original: the same keys and values.
  nlohmann::ordered_json base = nlohmann::ordered_json::parse(j.dump());
  CHECK(json::parse(make_config(from_model_config(cfg, "LlamaForCausalLM"), "float32", base).dump()) == j);

  auto error = [](json c) {
    try {
      parse_config(c, "m/config.json", nullptr);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  json bad = j;
  bad["some_new_feature"] = 3;
  CHECK_THAT(error(bad), Catch::Contains("m/config.json") && Catch::Contains("'some_new_feature'"));
  bad = j;
  bad["hidden_act"] = "gelu";
  CHECK_THAT(error(bad), Catch::Contains("'hidden_act' = \"gelu\""));
  bad = j;
  bad["architectures"] = {"FalconForCausalLM"};
  CHECK_THAT(error(bad), Catch::Contains("'architectures'") && Catch::Contains("FalconForCausalLM"));
  bad = j;
  bad["architectures"] = {"MistralForCausalLM"};
  bad["model_type"] = "mistral";
  bad.erase("attention_bias");
  bad.erase("mlp_bias");
  bad["sliding_window"] = 4096;
  CHECK_THAT(error(bad), Catch::Contains("'sliding_window' = 4096"));
  bad["sliding_window"] = nullptr;
  CHECK(error(bad).empty());
  bad = j;
  bad["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"rope_theta", 1e4}};
  CHECK_THAT(error(bad), Catch::Contains("rope_type 'yarn'"));
  bad = j;
  bad.erase("vocab_size");
  CHECK_THAT(error(bad), Catch::Contains("'vocab_size' is missing"));
}
