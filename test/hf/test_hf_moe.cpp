// Mixtral and Qwen3-MoE (test/fixtures/hf/{MixtralForCausalLM,Qwen3MoeForCausalLM}, saved by transformers):
// config.json -> model section -> config.json gives the original's keys and values; every tensor of the
// fixture is named by exactly one rule, lands where transformers' layout says (router = gate, expert fc1 =
// [gate; up] as MixtralExperts / Qwen3MoeExperts chunk it) and comes back bit for bit; the router and
// sparse-layer keys map to our router options; transformers 5's fused expert tensors import to the same weights;
// bad MoE folders are refused naming the file and the key,
// writing nothing. (The logits against transformers' run through convert_import in test_hf_fixtures.cpp.)
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/hf_mapping.h"
#include "checkpoint/safetensors.h"
#include "config/config_loader.h"
#include "config/config_validate_moe.h"
#include "core/check.h"
#include "test/catch.h"
#include "test/hf/hf_test_util.h"
#include "checkpoint/checkpoint.h"
#include "train/convert.h"
#include "train/train_checkpoint.h"

using namespace mt;
namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

std::string fixture_dir(const std::string& arch) { return std::string(MT_SOURCE_DIR) + "/test/fixtures/hf/" + arch; }

json read_json(const std::string& path) { return json::parse(std::ifstream(path)); }

// config.json -> ArchSpec -> the model section -> ArchSpec of the model -> config.json on the original.
ojson config_round_trip(const json& j, const std::string& arch, hf::ArchSpec* parsed = nullptr, Config* cfg_out = nullptr,
                        const std::string& dtype = "float32") {
  const hf::ArchSpec a = hf::parse_config(j, "config.json", nullptr);
  Config cfg;
  cfg.model = hf::to_model_config(a, "config.json");
  const hf::ArchSpec b = hf::from_model_config(cfg, arch);
  if (parsed) *parsed = a;
  if (cfg_out) *cfg_out = cfg;
  return hf::make_config(b, dtype, ojson::parse(j.dump()));
}

std::vector<float> f32_of(const st::Archive::Entry& e) {
  REQUIRE(e.info->dtype == DType::F32);
  std::vector<float> v(static_cast<size_t>(shape_numel(e.info->shape)));
  std::memcpy(v.data(), e.file->data(*e.info), v.size() * sizeof(float));
  return v;
}

// Every tensor of the fixture through its rule: merged into our layout, checked by `check`, split back bit for bit.
void tensor_round_trip(const std::string& arch, const std::function<void(const hf::Rule&, const std::vector<float>&,
                                                                          const st::Archive&)>& check) {
  const std::string dir = fixture_dir(arch);
  const hf::ArchSpec a = hf::parse_config(read_json(dir + "/config.json"), "config.json", nullptr);
  st::Archive ar(dir);
  std::vector<std::string> skip;
  const std::vector<hf::Rule> rules = hf::mapping(a, &skip);
  std::multiset<std::string> named(skip.begin(), skip.end());
  for (const hf::Rule& r : rules) {
    INFO(arch << " " << r.ours);
    const auto shapes = hf::hf_shapes(r, a, r.shape);
    std::vector<std::vector<float>> src;
    for (size_t i = 0; i < r.hf.size(); ++i) {
      const st::Archive::Entry* e = ar.find(r.hf[i]);
      REQUIRE(e != nullptr);
      CHECK(e->info->shape == shapes[i]);
      src.push_back(f32_of(*e));
      named.insert(r.hf[i]);
    }
    std::vector<const float*> srcs;
    for (const auto& s : src) srcs.push_back(s.data());
    std::vector<float> ours(static_cast<size_t>(shape_numel(r.shape)), -1.f);
    hf::merge(r, a, r.shape, srcs, ours.data());
    check(r, ours, ar);
    std::vector<std::vector<float>> back;
    std::vector<float*> dsts;
    for (const auto& s : src) back.emplace_back(s.size(), -7.f);
    for (auto& b : back) dsts.push_back(b.data());
    hf::split(r, a, r.shape, ours.data(), dsts);
    for (size_t i = 0; i < src.size(); ++i) CHECK(std::memcmp(back[i].data(), src[i].data(), src[i].size() * 4) == 0);
  }
  for (const auto& [name, e] : ar.entries()) {
    INFO(arch << " tensor " << name << " named by one rule");
    CHECK(named.count(name) == 1);
  }
}

// Rewrites a fixture's per-expert tensors in transformers 5's fused layout (save_pretrained(save_original_format=
// False)): model.layers.L.mlp.gate.weight, mlp.experts.gate_up_proj [E, 2F, H] (expert e: [gate; up]) and
// mlp.experts.down_proj [E, H, F], as Mixtral/Qwen3MoeExperts.forward index them.
void fuse_experts(const std::string& file, bool mixtral) {
  hf_test::rewrite_tensors(file, [&](std::vector<hf_test::OwnedTensor>& ts) {
    auto take = [&](const std::string& name) {
      auto it = std::find_if(ts.begin(), ts.end(), [&](const auto& t) { return t.name == name; });
      REQUIRE(it != ts.end());
      hf_test::OwnedTensor t = std::move(*it);
      ts.erase(it);
      return t;
    };
    for (int l = 0; l < 3; ++l) {
      const std::string h = "model.layers." + std::to_string(l) + ".", m = h + (mixtral ? "block_sparse_moe." : "mlp.");
      if (std::none_of(ts.begin(), ts.end(), [&](const auto& t) { return t.name == m + "gate.weight"; })) continue;
      hf_test::OwnedTensor gate = take(m + "gate.weight");
      gate.name = h + "mlp.gate.weight";
      const int64_t E = gate.shape[0];
      hf_test::OwnedTensor gate_up{h + "mlp.experts.gate_up_proj", DType::F32, {}, {}}, down{h + "mlp.experts.down_proj", DType::F32, {}, {}};
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        hf_test::OwnedTensor g = take(x + (mixtral ? "w1" : "gate_proj") + ".weight");
        hf_test::OwnedTensor u = take(x + (mixtral ? "w3" : "up_proj") + ".weight");
        hf_test::OwnedTensor d = take(x + (mixtral ? "w2" : "down_proj") + ".weight");
        gate_up.shape = {E, 2 * g.shape[0], g.shape[1]};
        down.shape = {E, d.shape[0], d.shape[1]};
        for (const auto* t : {&g, &u}) gate_up.bytes.insert(gate_up.bytes.end(), t->bytes.begin(), t->bytes.end());
        down.bytes.insert(down.bytes.end(), d.bytes.begin(), d.bytes.end());
      }
      ts.push_back(std::move(gate));
      ts.push_back(std::move(gate_up));
      ts.push_back(std::move(down));
    }
  });
}

bool equal_rows(const std::vector<float>& ours, int64_t row0, const std::vector<float>& hf) {
  return std::memcmp(ours.data() + row0, hf.data(), hf.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("hf moe: config.json keys map to the MoE model section and back", "[hf_moe]") {
  SECTION("Mixtral: every layer MoE, renormalized top-k, per-expert intermediate_size") {
    const json j = read_json(fixture_dir("MixtralForCausalLM") + "/config.json");
    hf::ArchSpec a;
    Config cfg;
    CHECK(json::parse(config_round_trip(j, "MixtralForCausalLM", &a, &cfg).dump()) == j);
    const ModelConfig& m = cfg.model;
    CHECK(m.num_experts == 4);
    CHECK(m.moe_router_topk == 2);
    CHECK(m.moe_ffn_hidden_size == 48);
    CHECK(m.moe_layer_freq == std::vector<double>{1});
    CHECK(m.moe_router_score_function == "softmax");
    CHECK(!m.moe_router_pre_softmax);  // Mixtral: softmax, top-k, renormalize = softmax over the k logits
    CHECK(m.moe_aux_loss_coeff == 0.02);
    CHECK(m.kv_channels == 16);
    CHECK(!m.qk_layernorm);
  }
  SECTION("Qwen3-MoE: mlp_only_layers -> moe_layer_freq list, norm_topk_prob, num_local_experts") {
    const json j = read_json(fixture_dir("Qwen3MoeForCausalLM") + "/config.json");
    Config cfg;
    CHECK(json::parse(config_round_trip(j, "Qwen3MoeForCausalLM", nullptr, &cfg).dump()) == j);
    const ModelConfig& m = cfg.model;
    CHECK(m.num_experts == 4);
    CHECK(m.moe_ffn_hidden_size == 24);
    CHECK(m.ffn_hidden_size == 64);  // the dense layer's
    CHECK(m.moe_layer_freq == std::vector<double>{1, 0, 1});
    CHECK(!m.moe_router_pre_softmax);
    CHECK(m.qk_layernorm);
  }
  SECTION("Qwen3-MoE: norm_topk_prob false is moe_router_pre_softmax (softmax over all E, not renormalized)") {
    json j = read_json(fixture_dir("Qwen3MoeForCausalLM") + "/config.json");
    j["norm_topk_prob"] = false;
    Config cfg;
    CHECK(json::parse(config_round_trip(j, "Qwen3MoeForCausalLM", nullptr, &cfg).dump()) == j);
    CHECK(cfg.model.moe_router_pre_softmax);
  }
  SECTION("Qwen3-MoE: decoder_sparse_step (layer l sparse when (l + 1) % step == 0) and Qwen's num_experts") {
    json j = read_json(fixture_dir("Qwen3MoeForCausalLM") + "/config.json");
    j["decoder_sparse_step"] = 2;
    j["mlp_only_layers"] = json::array();
    j.erase("num_local_experts");
    j["num_experts"] = 4;
    j["num_hidden_layers"] = 4;
    j["layer_types"] = std::vector<std::string>(4, "full_attention");
    Config cfg;
    CHECK(json::parse(config_round_trip(j, "Qwen3MoeForCausalLM", nullptr, &cfg).dump()) == j);
    CHECK(cfg.model.moe_layer_freq == std::vector<double>{0, 1, 0, 1});
    for (int l = 0; l < 4; ++l) CHECK(is_moe_layer(cfg.model, l) == (l % 2 == 1));
    // Without the original: step 1 and the dense layers listed, the same layers.
    const json fresh = json::parse(hf::make_config(hf::from_model_config(cfg, ""), "float32", ojson()).dump());
    CHECK(fresh["architectures"][0] == "Qwen3MoeForCausalLM");
    CHECK(fresh["decoder_sparse_step"] == 1);
    CHECK(fresh["mlp_only_layers"] == json({0, 2}));
    CHECK(fresh["num_experts"] == 4);
    CHECK(!fresh.contains("num_local_experts"));
    const hf::ArchSpec again = hf::parse_config(fresh, "fresh", nullptr);
    CHECK(again.moe_layer == std::vector<bool>{false, true, false, true});
  }
  SECTION("a fresh Mixtral config.json parses back to the same model") {
    const json j = read_json(fixture_dir("MixtralForCausalLM") + "/config.json");
    Config cfg;
    config_round_trip(j, "MixtralForCausalLM", nullptr, &cfg);
    const json fresh = json::parse(hf::make_config(hf::from_model_config(cfg, ""), "float32", ojson()).dump());
    CHECK(fresh["architectures"][0] == "MixtralForCausalLM");
    CHECK(fresh["num_local_experts"] == 4);
    CHECK(fresh["intermediate_size"] == 48);
    Config again;
    again.model = hf::to_model_config(hf::parse_config(fresh, "fresh", nullptr), "fresh");
    CHECK(config_to_yaml(again) == config_to_yaml(cfg));
  }
}

TEST_CASE("hf moe: export refuses MoE models neither Mixtral nor Qwen3-MoE holds", "[hf_moe]") {
  Config cfg;
  config_round_trip(read_json(fixture_dir("MixtralForCausalLM") + "/config.json"), "MixtralForCausalLM", nullptr, &cfg);
  auto refusal = [](const Config& c, const std::string& arch = "") {
    try {
      hf::from_model_config(c, arch);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(refusal(cfg).empty());
  auto with = [&](const std::function<void(ModelConfig&)>& f) {
    Config c = cfg;
    f(c.model);
    return refusal(c);
  };
  CHECK_THAT(with([](ModelConfig& m) { m.moe_shared_expert_intermediate_size = 32; }),
             Catch::Contains("model.moe_shared_expert_intermediate_size"));
  CHECK_THAT(with([](ModelConfig& m) { m.moe_router_score_function = "sigmoid"; }),
             Catch::Contains("model.moe_router_score_function"));
  CHECK_THAT(with([](ModelConfig& m) { m.moe_router_enable_expert_bias = true; }),
             Catch::Contains("model.moe_router_enable_expert_bias"));
  CHECK_THAT(with([](ModelConfig& m) { m.moe_router_topk_scaling_factor = 2.5; }),
             Catch::Contains("model.moe_router_topk_scaling_factor"));
  CHECK_THAT(with([](ModelConfig& m) { m.moe_layer_freq = {1, 0}; }),
             Catch::Contains("dense layers") && Catch::Contains("MixtralForCausalLM"));
  CHECK_THAT(with([](ModelConfig& m) { m.moe_router_pre_softmax = true; }), Catch::Contains("moe_router_pre_softmax"));
  CHECK_THAT(refusal(cfg, "Qwen3MoeForCausalLM"), Catch::Contains("MixtralForCausalLM, not of Qwen3MoeForCausalLM"));
  Config dense = cfg;
  dense.model.num_experts = 0;
  CHECK_THAT(refusal(dense, "MixtralForCausalLM"), Catch::Contains("no experts"));
}

TEST_CASE("hf moe: Mixtral tensors: gate -> router, w1/w3 -> fc1 [gate; up], w2 -> fc2, bit for bit back", "[hf_moe]") {
  int experts_seen = 0;
  tensor_round_trip("MixtralForCausalLM", [&](const hf::Rule& r, const std::vector<float>& ours, const st::Archive& ar) {
    const std::string pre = "decoder.layers.1.mlp.";
    if (r.ours == pre + "router.weight") {
      CHECK(r.shape == std::vector<int64_t>{4, 32});
      CHECK(equal_rows(ours, 0, f32_of(*ar.find("model.layers.1.block_sparse_moe.gate.weight"))));
    }
    if (r.ours == pre + "experts.3.linear_fc1.weight") {
      ++experts_seen;
      CHECK(r.shape == std::vector<int64_t>{96, 32});
      CHECK(equal_rows(ours, 0, f32_of(*ar.find("model.layers.1.block_sparse_moe.experts.3.w1.weight"))));
      CHECK(equal_rows(ours, 48 * 32, f32_of(*ar.find("model.layers.1.block_sparse_moe.experts.3.w3.weight"))));
    }
    if (r.ours == pre + "experts.3.linear_fc2.weight") {
      ++experts_seen;
      CHECK(r.shape == std::vector<int64_t>{32, 48});
      CHECK(equal_rows(ours, 0, f32_of(*ar.find("model.layers.1.block_sparse_moe.experts.3.w2.weight"))));
    }
  });
  CHECK(experts_seen == 2);
}

TEST_CASE("hf moe: Qwen3-MoE tensors: sparse layers' experts, the dense layer's MLP, q/k norms", "[hf_moe]") {
  std::set<std::string> seen;
  tensor_round_trip("Qwen3MoeForCausalLM", [&](const hf::Rule& r, const std::vector<float>& ours, const st::Archive& ar) {
    seen.insert(r.ours);
    if (r.ours == "decoder.layers.2.mlp.experts.1.linear_fc1.weight") {
      CHECK(equal_rows(ours, 0, f32_of(*ar.find("model.layers.2.mlp.experts.1.gate_proj.weight"))));
      CHECK(equal_rows(ours, 24 * 32, f32_of(*ar.find("model.layers.2.mlp.experts.1.up_proj.weight"))));
    }
    if (r.ours == "decoder.layers.1.mlp.linear_fc1.weight") {
      CHECK(r.shape == std::vector<int64_t>{128, 32});
      CHECK(equal_rows(ours, 64 * 32, f32_of(*ar.find("model.layers.1.mlp.up_proj.weight"))));
    }
  });
  CHECK(seen.count("decoder.layers.0.mlp.router.weight"));
  CHECK(seen.count("decoder.layers.2.mlp.experts.3.linear_fc2.weight"));
  CHECK(!seen.count("decoder.layers.1.mlp.router.weight"));  // mlp_only_layers [1]
  CHECK(seen.count("decoder.layers.0.self_attention.q_layernorm.weight"));
}

TEST_CASE("hf moe: bad MoE folders are refused, naming the file and the key, writing nothing", "[hf_moe]") {
  hf_test::TempDir d;
  auto variant = [&](const std::string& arch, const std::string& name) {
    const std::string p = d.path + "/" + name;
    fs::create_directories(p);
    for (const char* f : {"config.json", "model.safetensors"}) fs::copy(fixture_dir(arch) + "/" + f, p + "/" + f);
    fs::permissions(p + "/model.safetensors", fs::perms::owner_write, fs::perm_options::add);
    return p;
  };
  auto edit_config = [&](const std::string& dir, const std::function<void(json&)>& f) {
    json j = read_json(dir + "/config.json");
    f(j);
    std::ofstream(dir + "/config.json") << j.dump(2);
  };
  auto import_error = [&](const std::string& hf) {
    ImportOptions im;
    im.hf_dir = hf;
    im.output = d.path + "/out";
    std::string err;
    try {
      convert_import(im, hf_test::world());
    } catch (const Error& e) {
      err = e.what();
    }
    CHECK(!fs::exists(d.path + "/out"));
    for (const auto& e : fs::directory_iterator(d.path)) CHECK(e.path().filename().string().rfind("out", 0) != 0);
    return err;
  };
  const std::string st_file = "/model.safetensors";

  SECTION("a missing expert tensor") {
    const std::string p = variant("MixtralForCausalLM", "missing");
    hf_test::rewrite_tensors(p + st_file, [](std::vector<hf_test::OwnedTensor>& ts) {
      ts.erase(std::remove_if(ts.begin(), ts.end(),
                              [](auto& t) { return t.name == "model.layers.1.block_sparse_moe.experts.2.w3.weight"; }),
               ts.end());
    });
    CHECK_THAT(import_error(p), Catch::Contains(p + st_file) &&
                                    Catch::Contains("'model.layers.1.block_sparse_moe.experts.2.w3.weight' is missing") &&
                                    Catch::Contains("'num_local_experts' = 4"));
  }
  SECTION("config.json counts more experts than the file holds") {
    const std::string p = variant("MixtralForCausalLM", "more");
    edit_config(p, [](json& j) { j["num_local_experts"] = 8; });
    // the router's rows first: gate.weight is [4, 32], config.json implies [8, 32]
    CHECK_THAT(import_error(p), Catch::Contains("'model.layers.0.block_sparse_moe.gate.weight' has shape [4, 32]") &&
                                    Catch::Contains(p + "/config.json 'num_local_experts' = 8"));
  }
  SECTION("config.json counts fewer experts than the file holds") {
    const std::string p = variant("Qwen3MoeForCausalLM", "fewer");
    edit_config(p, [](json& j) { j["num_local_experts"] = 3; });
    // the router's rows first: gate.weight is [4, 32], config.json implies [3, 32]
    CHECK_THAT(import_error(p), Catch::Contains(p + st_file) && Catch::Contains("'model.layers.0.mlp.gate.weight' has shape [4, 32]") &&
                                    Catch::Contains("implies [3, 32]") && Catch::Contains("'num_local_experts' = 3"));
  }
  SECTION("an expert tensor the config does not have (a dense layer's experts)") {
    const std::string p = variant("Qwen3MoeForCausalLM", "extra");
    hf_test::rewrite_tensors(p + st_file, [](std::vector<hf_test::OwnedTensor>& ts) {
      for (auto& t : ts)
        if (t.name == "model.layers.1.mlp.gate_proj.weight") {
          hf_test::OwnedTensor x = t;
          x.name = "model.layers.1.mlp.experts.0.gate_proj.weight";
          ts.push_back(x);
          break;
        }
    });
    CHECK_THAT(import_error(p), Catch::Contains(p + st_file) &&
                                    Catch::Contains("'model.layers.1.mlp.experts.0.gate_proj.weight' that Qwen3MoeForCausalLM") &&
                                    Catch::Contains("does not have"));
  }
  SECTION("fused expert tensors whose shape config.json does not give") {
    const std::string p = variant("MixtralForCausalLM", "fused");
    fuse_experts(p + st_file, true);
    edit_config(p, [](json& j) { j["intermediate_size"] = 40; });
    CHECK_THAT(import_error(p), Catch::Contains(p + st_file) &&
                                    Catch::Contains("'model.layers.0.mlp.experts.gate_up_proj' has shape [4, 96, 32]") &&
                                    Catch::Contains("implies [4, 80, 32]") && Catch::Contains("'intermediate_size' = 40"));
  }
  SECTION("router jitter noise") {
    const std::string p = variant("MixtralForCausalLM", "jitter");
    edit_config(p, [](json& j) { j["router_jitter_noise"] = 0.1; });
    CHECK_THAT(import_error(p), Catch::Contains(p + "/config.json") && Catch::Contains("'router_jitter_noise' = 0.1"));
  }
  SECTION("a Qwen3-MoE key in a Mixtral config.json") {
    const std::string p = variant("MixtralForCausalLM", "key");
    edit_config(p, [](json& j) { j["norm_topk_prob"] = false; });
    CHECK_THAT(import_error(p), Catch::Contains(p + "/config.json") && Catch::Contains("'norm_topk_prob'") &&
                                    Catch::Contains("not supported by megatrain's import of MixtralForCausalLM"));
  }
  SECTION("num_experts and num_local_experts disagree") {
    const std::string p = variant("Qwen3MoeForCausalLM", "disagree");
    edit_config(p, [](json& j) { j["num_experts"] = 8; });
    CHECK_THAT(import_error(p), Catch::Contains(p + "/config.json") && Catch::Contains("'num_experts' (8)") &&
                                    Catch::Contains("disagree"));
  }
  SECTION("mlp_only_layers out of range and top-k over the experts") {
    const std::string p = variant("Qwen3MoeForCausalLM", "range");
    edit_config(p, [](json& j) { j["mlp_only_layers"] = {3}; });
    CHECK_THAT(import_error(p), Catch::Contains("'mlp_only_layers' holds 3"));
    edit_config(p, [](json& j) { j["mlp_only_layers"] = {1}, j["num_experts_per_tok"] = 5; });
    CHECK_THAT(import_error(p), Catch::Contains("'num_experts_per_tok' = 5"));
  }
}

TEST_CASE("hf moe: transformers 5's fused expert tensors import to the same weights; export writes per-expert ones",
          "[hf_moe]") {
  for (const std::string arch : {"MixtralForCausalLM", "Qwen3MoeForCausalLM"}) {
    INFO(arch);
    hf_test::TempDir d;
    fs::create_directories(d.path + "/fused");
    for (const char* f : {"config.json", "model.safetensors"})
      fs::copy(fixture_dir(arch) + "/" + f, d.path + "/fused/" + f);
    fs::permissions(d.path + "/fused/model.safetensors", fs::perms::owner_write, fs::perm_options::add);
    fuse_experts(d.path + "/fused/model.safetensors", arch == "MixtralForCausalLM");
    REQUIRE(st::Archive(d.path + "/fused").find("model.layers.0.mlp.experts.gate_up_proj") != nullptr);
    for (const auto& [src, out] : {std::pair<std::string, std::string>{fixture_dir(arch), d.path + "/imp"},
                                   {d.path + "/fused", d.path + "/imp-fused"}}) {
      ImportOptions im;
      im.hf_dir = src;
      im.output = out;
      convert_import(im, hf_test::world());
    }
    // the two checkpoints hold the same tensors, bit for bit
    ckpt::LoadedCheckpoint x = ckpt::open_checkpoint(ckpt::resolve_load_path(d.path + "/imp", d.path + "/imp"));
    ckpt::LoadedCheckpoint y = ckpt::open_checkpoint(ckpt::resolve_load_path(d.path + "/imp-fused", d.path + "/imp-fused"));
    auto host_x = build_host_model(load_config_from_string(x.config_yaml, "x"));
    auto host_y = build_host_model(load_config_from_string(y.config_yaml, "y"));
    load_model_weights(x, *host_x->store);
    load_model_weights(y, *host_y->store);
    const auto px = host_x->store->params(), py = host_y->store->params();
    REQUIRE(px.size() == py.size());
    for (size_t i = 0; i < px.size(); ++i) {
      INFO(px[i]->spec.name);
      REQUIRE(px[i]->spec.name == py[i]->spec.name);
      Tensor mx = host_x->store->master(*px[i]), my = host_y->store->master(*py[i]);
      CHECK(std::memcmp(mx.data<float>(), my.data<float>(), mx.nbytes()) == 0);
    }
    // export: the per-expert tensors of the fixture, bit for bit
    ExportOptions ex;
    ex.checkpoint = d.path + "/imp-fused";
    ex.output = d.path + "/exp";
    convert_export(ex);
    st::Archive want(fixture_dir(arch)), got(d.path + "/exp");
    CHECK(got.entries().size() == want.entries().size());
    for (const auto& [name, e] : want.entries()) {
      INFO(name);
      const st::Archive::Entry* f = got.find(name);
      REQUIRE(f != nullptr);
      REQUIRE(f->info->shape == e.info->shape);
      CHECK(std::memcmp(f->file->data(*f->info), e.file->data(*e.info), e.info->end - e.info->begin) == 0);
    }
  }
}

TEST_CASE("hf moe: config.json of the published Mixtral-8x7B and Qwen3-30B-A3B shapes (transformers 4 style)", "[hf_moe]") {
  // Keys as those models' own config.json files have them (rope_theta, torch_dtype, no layer_types).
  const json mixtral = json::parse(R"({
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0",
    "use_cache": true, "vocab_size": 32000})");
  const json qwen = json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})");
  Config cm, cq;
  CHECK(json::parse(config_round_trip(mixtral, "MixtralForCausalLM", nullptr, &cm, "bfloat16").dump()) == mixtral);
  CHECK(json::parse(config_round_trip(qwen, "Qwen3MoeForCausalLM", nullptr, &cq, "bfloat16").dump()) == qwen);
  CHECK(cm.model.num_experts == 8);
  CHECK(cm.model.moe_ffn_hidden_size == 14336);
  CHECK(cm.model.num_query_groups == 8);
  CHECK(cq.model.num_experts == 128);
  CHECK(cq.model.moe_router_topk == 8);
  CHECK(cq.model.moe_ffn_hidden_size == 768);
  CHECK(cq.model.moe_layer_freq == std::vector<double>{1});
  CHECK(cq.model.kv_channels == 128);
  // and the model sections validate as megatrain configs
  cm.training.train_iters = cq.training.train_iters = 1;
  cm.data.mock = cq.data.mock = true;
  CHECK_NOTHROW(load_config_from_string(config_to_yaml(cm), "mixtral.yaml"));
  CHECK_NOTHROW(load_config_from_string(config_to_yaml(cq), "qwen3moe.yaml"));
}
