// Conversion end to end without fixtures: a tiny megatrain model (random weights) -> export ->
// import -> every tensor bit for bit and the logits identical; export again -> the same safetensors
// bytes per tensor and the same config.json. Bad HF folders (each made by breaking an exported one)
// -> an error naming the file and the problem, and no output folder.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <iterator>
#include <sstream>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/ckpt_util.h"
#include "checkpoint/safetensors.h"
#include "config/config_loader.h"
#include "core/check.h"
#include "runtime/mpi_communicator.h"
#include "test/catch.h"
#include "test/hf/hf_test_util.h"
#include "train/convert.h"
#include "train/train_checkpoint.h"

using namespace mt;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// A tiny model of `config` with random weights saved as a checkpoint in dir/ckpt.
std::unique_ptr<HostModel> make_model(const std::string& config, const std::string& dir, int vocab,
                                      std::vector<std::string> overrides = {}) {
  overrides.push_back("model.vocab_size=" + std::to_string(vocab));
  Config cfg = load_config(std::string(MT_SOURCE_DIR) + "/configs/ci/" + config, overrides);
  auto host = build_host_model(cfg);
  host->store->initialize(99, 0.5, cfg.model.num_layers);  // large values: a wrong mapping shows in the logits
  save_host_model(*host, dir + "/ckpt", config_to_yaml(cfg), hf_test::world());
  return host;
}

// The weights of a checkpoint loaded into a model of its config.
std::unique_ptr<HostModel> load_model(const std::string& path) {
  ckpt::LoadedCheckpoint ck = ckpt::open_checkpoint(ckpt::resolve_load_path(path, path));
  Config cfg = load_config_from_string(ck.config_yaml, "manifest");
  auto host = build_host_model(cfg);
  load_model_weights(ck, *host->store);
  return host;
}

void check_same_params(HostModel& a, HostModel& b) {
  auto pa = a.store->params(), pb = b.store->params();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i]->spec.name);
    REQUIRE(pa[i]->spec.name == pb[i]->spec.name);
    REQUIRE(pa[i]->spec.global_shape == pb[i]->spec.global_shape);
    Tensor ma = a.store->master(*pa[i]), mb = b.store->master(*pb[i]);
    CHECK(std::memcmp(ma.data<float>(), mb.data<float>(), ma.nbytes()) == 0);
  }
}

std::vector<float> logits_of(HostModel& h, const std::vector<int32_t>& ids) {
  Tensor l = h.model->logits(ids.data(), 1, static_cast<int64_t>(ids.size()));
  const int64_t V = h.cfg.model.vocab_size, Vp = l.size(1);
  std::vector<float> out;
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t v = 0; v < V; ++v) out.push_back(l.data<float>()[t * Vp + v]);
  return out;
}

}  // namespace

TEST_CASE("convert: megatrain -> HF -> megatrain -> HF returns every tensor bit for bit", "[convert]") {
  struct Case {
    std::string config;
    std::vector<std::string> overrides;
  };
  // Llama (+ llama3 rope scaling), GPT-2, Qwen2 (qkv bias, tied), Qwen3 (q/k norms, head dim 24).
  const std::vector<Case> cases = {
      {"tiny-llama.yaml", {}},
      {"tiny-llama.yaml", {"model.rope_scaling=true", "model.rope_scaling_original_max_position_embeddings=16"}},
      {"tiny-gpt2.yaml", {}},
      {"qwen2-tiny.yaml", {}},
      {"qwen3-tiny.yaml", {}},
      {"llama-gpt2features-tiny.yaml", {}}};  // GPT-2 by its features: exported as GPT2LMHeadModel
  for (const Case& c : cases) {
    const std::string config = c.config;
    DYNAMIC_SECTION(config << " " << c.overrides.size()) {
      hf_test::TempDir d;
      auto orig = make_model(config, d.path, 120, c.overrides);  // padded to 128: the padding rows stay out of HF
      ExportOptions ex;
      ex.checkpoint = d.path + "/ckpt";
      ex.output = d.path + "/hf";
      convert_export(ex);
      REQUIRE(fs::exists(d.path + "/hf/model.safetensors"));
      REQUIRE(fs::exists(d.path + "/hf/config.json"));
      REQUIRE(fs::exists(d.path + "/hf/generation_config.json"));
      st::Archive ar(d.path + "/hf");
      const bool gpt2 = config == "tiny-gpt2.yaml" || config == "llama-gpt2features-tiny.yaml";
      const st::Archive::Entry* emb = ar.find(gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight");
      REQUIRE(emb != nullptr);
      CHECK(emb->info->shape == Shape{120, 64});

      ImportOptions im;
      im.hf_dir = d.path + "/hf";
      im.output = d.path + "/imp";
      convert_import(im, hf_test::world());
      REQUIRE(fs::exists(d.path + "/imp/model.yaml"));
      REQUIRE(fs::exists(d.path + "/imp/hf/config.json"));
      Config yaml_cfg = load_config(d.path + "/imp/model.yaml");  // a config that validates
      CHECK(yaml_cfg.model.vocab_size == 120);
      CHECK(yaml_cfg.checkpoint.load == fs::absolute(d.path + "/imp").string());
      CHECK(yaml_cfg.checkpoint.finetune);
      auto back = load_model(d.path + "/imp");
      check_same_params(*orig, *back);
      const std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9, 2, 6, 5, 119, 0};
      CHECK(logits_of(*orig, ids) == logits_of(*back, ids));

      ex.checkpoint = d.path + "/imp";
      ex.output = d.path + "/hf2";
      convert_export(ex);
      st::Archive a1(d.path + "/hf"), a2(d.path + "/hf2");
      REQUIRE(a1.entries().size() == a2.entries().size());
      for (const auto& [name, e] : a1.entries()) {
        INFO(name);
        const st::Archive::Entry* f = a2.find(name);
        REQUIRE(f != nullptr);
        REQUIRE(f->info->shape == e.info->shape);
        REQUIRE(f->info->dtype == e.info->dtype);
        CHECK(std::memcmp(f->file->data(*f->info), e.file->data(*e.info), e.info->end - e.info->begin) == 0);
      }
      CHECK(json::parse(std::ifstream(d.path + "/hf/config.json")) == json::parse(std::ifstream(d.path + "/hf2/config.json")));

      // bf16 and sharded export of the same checkpoint: bf16 of each fp32 value, in 3+ files.
      ex.output = d.path + "/hf3";
      ex.dtype = "bf16";
      ex.max_shard_size = "20KB";
      convert_export(ex);
      CHECK(fs::exists(d.path + "/hf3/model.safetensors.index.json"));
      st::Archive a3(d.path + "/hf3");
      for (const auto& [name, e] : a1.entries()) {
        const st::Archive::Entry* f = a3.find(name);
        REQUIRE(f != nullptr);
        REQUIRE(f->info->dtype == DType::BF16);
        const float* src = reinterpret_cast<const float*>(e.file->data(*e.info));
        const uint16_t* dst = reinterpret_cast<const uint16_t*>(f->file->data(*f->info));
        for (int64_t i = 0; i < shape_numel(e.info->shape); ++i) REQUIRE(dst[i] == bf16(src[i]).bits);
      }
      CHECK(json::parse(std::ifstream(d.path + "/hf3/config.json"))["dtype"] == "bfloat16");
      // The sharded bf16 model imports (model.yaml: precision bf16) and exports back bit for bit.
      im.hf_dir = d.path + "/hf3/";
      im.output = d.path + "/imp3/";
      convert_import(im, hf_test::world());
      CHECK(load_config(d.path + "/imp3/model.yaml").training.precision == "bf16");
      ex = ExportOptions{};
      ex.checkpoint = d.path + "/imp3";
      ex.output = d.path + "/hf4";
      ex.max_shard_size = "20KB";
      convert_export(ex);
      st::Archive a4(d.path + "/hf4");
      REQUIRE(a4.entries().size() == a3.entries().size());
      for (const auto& [name, e] : a3.entries()) {
        const st::Archive::Entry* f = a4.find(name);
        REQUIRE(f != nullptr);
        REQUIRE(f->info->dtype == DType::BF16);
        CHECK(std::memcmp(f->file->data(*f->info), e.file->data(*e.info), e.info->end - e.info->begin) == 0);
      }
      CHECK(json::parse(std::ifstream(d.path + "/hf4/config.json")) == json::parse(std::ifstream(d.path + "/hf3/config.json")));
    }
  }
}

TEST_CASE("convert: export refuses a model no supported architecture has", "[convert]") {
  hf_test::TempDir d;
  make_model("tiny-llama.yaml", d.path, 128, {"model.normalization=layernorm"});  // layernorm + swiglu
  ExportOptions ex;
  ex.checkpoint = d.path + "/ckpt";
  ex.output = d.path + "/hf";
  CHECK_THROWS_WITH(convert_export(ex), Catch::Contains("no Hugging Face architecture"));
  CHECK(!fs::exists(d.path + "/hf"));
}

TEST_CASE("convert: export refuses to write over a folder; inspect prints the checkpoint", "[convert]") {
  hf_test::TempDir d;
  make_model("tiny-llama.yaml", d.path, 128);
  ExportOptions ex;
  ex.checkpoint = d.path + "/ckpt";
  ex.output = d.path + "/ckpt";
  CHECK_THROWS_WITH(convert_export(ex), Catch::Contains("already exists"));
  std::ostringstream os;
  checkpoint_inspect(d.path + "/ckpt", os);
  CHECK_THAT(os.str(), Catch::Contains("iteration 0") && Catch::Contains("tensor 1 x pipeline 1") &&
                           Catch::Contains("decoder.layers.1.self_attention.linear_qkv.weight") &&
                           Catch::Contains("[128, 64]") && Catch::Contains("config:\n") && Catch::Contains("\nmodel:\n  arch: llama"));
}

TEST_CASE("convert: bad HF folders are refused, naming the file and the problem, writing nothing", "[convert]") {
  hf_test::TempDir d;
  make_model("tiny-llama.yaml", d.path, 128);
  ExportOptions ex;
  ex.checkpoint = d.path + "/ckpt";
  ex.output = d.path + "/good";
  convert_export(ex);
  const std::string st_file = "/model.safetensors";

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
    if (err.empty()) return err;
    CHECK(!fs::exists(d.path + "/out"));
    for (const auto& e : fs::directory_iterator(d.path))  // no temporary folder left either
      CHECK(e.path().filename().string().rfind("out", 0) != 0);
    return err;
  };
  auto variant = [&](const std::string& name) {
    const std::string p = d.path + "/" + name;
    fs::copy(d.path + "/good", p);
    return p;
  };
  auto edit_config = [&](const std::string& dir, const std::function<void(json&)>& f) {
    json j = json::parse(std::ifstream(dir + "/config.json"));
    f(j);
    std::ofstream(dir + "/config.json") << j.dump(2);
  };

  SECTION("the good one imports, its tokenizer.json named by model.yaml and exported again") {
    std::ofstream(d.path + "/good/tokenizer.json") << "{\"model\": \"stand-in\"}";
    CHECK(import_error(d.path + "/good").empty());
    Config c = load_config(d.path + "/out/model.yaml");
    CHECK(c.data.tokenizer_type == "hf-json");
    CHECK(c.data.tokenizer_file == fs::absolute(d.path + "/out/hf/tokenizer.json").string());
    CHECK(fs::exists(c.data.tokenizer_file));
    ExportOptions ex2;
    ex2.checkpoint = d.path + "/out";
    ex2.output = d.path + "/again";
    convert_export(ex2);
    std::ifstream t(d.path + "/again/tokenizer.json");
    CHECK(std::string(std::istreambuf_iterator<char>(t), {}) == "{\"model\": \"stand-in\"}");
  }
  SECTION("truncated safetensors") {
    std::string p = variant("trunc");
    fs::resize_file(p + st_file, fs::file_size(p + st_file) - 100);
    CHECK_THAT(import_error(p), Catch::Contains(p + st_file) && Catch::Contains("truncated"));
  }
  SECTION("overlapping offsets") {
    std::string p = variant("overlap");
    hf_test::edit_header(p + st_file, [](json& h) {
      // The second tensor in data order starts inside the first.
      std::vector<std::pair<uint64_t, std::string>> order;
      for (auto it = h.begin(); it != h.end(); ++it)
        if (it.key() != "__metadata__") order.push_back({it.value()["data_offsets"][0].get<uint64_t>(), it.key()});
      std::sort(order.begin(), order.end());
      json& t = h[order[1].second]["data_offsets"];
      const uint64_t n = t[1].get<uint64_t>() - t[0].get<uint64_t>();
      t = {4, 4 + n};
    });
    CHECK_THAT(import_error(p), Catch::Contains(p + st_file) && Catch::Contains("overlaps"));
  }
  SECTION("a dtype megatrain does not read") {
    std::string p = variant("dtype");
    hf_test::edit_header(p + st_file, [](json& h) { h["model.norm.weight"]["dtype"] = "I32"; });
    CHECK_THAT(import_error(p), Catch::Contains(p + st_file) && Catch::Contains("'model.norm.weight' has dtype I32"));
  }
  SECTION("a missing tensor") {
    std::string p = variant("missing");
    hf_test::rewrite_tensors(p + st_file, [](std::vector<hf_test::OwnedTensor>& ts) {
      ts.erase(std::remove_if(ts.begin(), ts.end(), [](auto& t) { return t.name == "model.layers.1.mlp.up_proj.weight"; }),
               ts.end());
    });
    CHECK_THAT(import_error(p), Catch::Contains(p + st_file) && Catch::Contains("'model.layers.1.mlp.up_proj.weight' is missing"));
  }
  SECTION("an extra tensor") {
    std::string p = variant("extra");
    hf_test::rewrite_tensors(p + st_file, [](std::vector<hf_test::OwnedTensor>& ts) {
      hf_test::OwnedTensor t = ts[0];
      t.name = "model.layers.2.input_layernorm.weight";
      ts.push_back(t);
    });
    CHECK_THAT(import_error(p), Catch::Contains(p + st_file) && Catch::Contains("'model.layers.2.input_layernorm.weight'") &&
                                    Catch::Contains("does not have"));
  }
  SECTION("a shape that does not match config.json") {
    std::string p = variant("shape");
    edit_config(p, [](json& j) { j["intermediate_size"] = 128; });
    CHECK_THAT(import_error(p), Catch::Contains(p + st_file) && Catch::Contains("'model.layers.0.mlp.gate_proj.weight' has shape [96, 64]") &&
                                    Catch::Contains("config.json implies [128, 64]"));
  }
  SECTION("an unsupported architecture") {
    std::string p = variant("arch");
    edit_config(p, [](json& j) { j["architectures"] = {"GemmaForCausalLM"}; });
    CHECK_THAT(import_error(p), Catch::Contains(p + "/config.json") && Catch::Contains("GemmaForCausalLM"));
  }
  SECTION("an unsupported config key: Mistral's sliding window") {
    std::string p = variant("window");
    edit_config(p, [](json& j) {
      j["architectures"] = {"MistralForCausalLM"};
      j["model_type"] = "mistral";
      j.erase("mlp_bias");
      j["sliding_window"] = 4096;
    });
    CHECK_THAT(import_error(p), Catch::Contains(p + "/config.json") && Catch::Contains("'sliding_window' = 4096"));
  }
  SECTION("an unknown config key") {
    std::string p = variant("key");
    edit_config(p, [](json& j) { j["partial_rotary_factor"] = 0.5; });
    CHECK_THAT(import_error(p), Catch::Contains(p + "/config.json") && Catch::Contains("'partial_rotary_factor'"));
  }
}
