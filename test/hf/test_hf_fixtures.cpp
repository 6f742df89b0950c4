// Models saved by transformers (test/fixtures/hf/<Architecture>/, made by
// test/fixtures/make_hf_fixtures.py): import -> megatrain's logits equal transformers' to 1e-4 and
// its greedy continuation is the same; import -> export gives every tensor back bit for bit and a
// config.json with the original's keys and values. A fixture folder that is absent is SKIPPED.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "config/config_loader.h"
#include "core/check.h"
#include "test/catch.h"
#include "test/hf/hf_test_util.h"
#include "train/convert.h"
#include "train/train_checkpoint.h"

using namespace mt;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string fixture_dir(const std::string& arch) { return std::string(MT_SOURCE_DIR) + "/test/fixtures/hf/" + arch; }

std::unique_ptr<HostModel> load_model(const std::string& path) {
  ckpt::LoadedCheckpoint ck = ckpt::open_checkpoint(ckpt::resolve_load_path(path, path));
  Config cfg = load_config_from_string(ck.config_yaml, "manifest");
  auto host = build_host_model(cfg);
  load_model_weights(ck, *host->store);
  return host;
}

void check_fixture(const std::string& arch) {
  const std::string src = fixture_dir(arch);
  if (!fs::exists(src + "/expected.json")) {
    std::printf("SKIPPED %s: no fixture in %s (run test/fixtures/make_hf_fixtures.py)\n", arch.c_str(), src.c_str());
    return;
  }
  hf_test::TempDir d;
  ImportOptions im;
  im.hf_dir = src;
  im.output = d.path + "/imp";
  convert_import(im, hf_test::world());
  const json expected = json::parse(std::ifstream(src + "/expected.json"));
  const std::vector<int32_t> ids = expected.at("input_ids").get<std::vector<int32_t>>();
  auto host = load_model(d.path + "/imp");

  // Logits of every position, the real vocabulary only.
  const int64_t T = static_cast<int64_t>(ids.size());
  Tensor l = host->model->logits(ids.data(), 1, T);
  const int64_t V = host->cfg.model.vocab_size, Vp = l.size(1);
  const auto& want = expected.at("logits");
  REQUIRE(static_cast<int64_t>(want.size()) == T);
  double worst = 0;
  for (int64_t t = 0; t < T; ++t) {
    REQUIRE(static_cast<int64_t>(want[t].size()) == V);
    for (int64_t v = 0; v < V; ++v) {
      const double w = want[t][v].get<double>(), got = l.data<float>()[t * Vp + v];
      worst = std::max(worst, std::abs(w - got) / std::max(1.0, std::abs(w)));
    }
  }
  INFO(arch << ": largest logit difference " << worst);
  CHECK(worst <= 1e-4);

  // Greedy continuation.
  std::vector<int32_t> seq = ids;
  for (size_t i = 0; i < expected.at("greedy_continuation").size(); ++i) {
    Tensor lg = host->model->logits(seq.data(), 1, static_cast<int64_t>(seq.size()));
    const float* last = lg.data<float>() + (seq.size() - 1) * lg.size(1);
    seq.push_back(static_cast<int32_t>(std::max_element(last, last + V) - last));
  }
  CHECK(std::vector<int32_t>(seq.begin() + T, seq.end()) == expected.at("greedy_continuation").get<std::vector<int32_t>>());

  // Export: every tensor bit for bit, config.json's keys and values.
  ExportOptions ex;
  ex.checkpoint = d.path + "/imp";
  ex.output = d.path + "/exp";
  convert_export(ex);
  st::Archive a(src), b(d.path + "/exp");
  for (const auto& [name, e] : a.entries()) {
    INFO(arch << " tensor " << name);
    const st::Archive::Entry* f = b.find(name);
    REQUIRE(f != nullptr);
    REQUIRE(f->info->shape == e.info->shape);
    REQUIRE(f->info->dtype == e.info->dtype);
    CHECK(std::memcmp(f->file->data(*f->info), e.file->data(*e.info), e.info->end - e.info->begin) == 0);
  }
  CHECK(b.entries().size() == a.entries().size());
  CHECK(json::parse(std::ifstream(d.path + "/exp/config.json")) == json::parse(std::ifstream(src + "/config.json")));
}

}  // namespace

TEST_CASE("hf fixtures: LlamaForCausalLM (llama3 rope scaling)", "[hf_fixtures]") { check_fixture("LlamaForCausalLM"); }
TEST_CASE("hf fixtures: MistralForCausalLM", "[hf_fixtures]") { check_fixture("MistralForCausalLM"); }
TEST_CASE("hf fixtures: Qwen2ForCausalLM", "[hf_fixtures]") { check_fixture("Qwen2ForCausalLM"); }
TEST_CASE("hf fixtures: Qwen3ForCausalLM", "[hf_fixtures]") { check_fixture("Qwen3ForCausalLM"); }
TEST_CASE("hf fixtures: GPT2LMHeadModel", "[hf_fixtures]") { check_fixture("GPT2LMHeadModel"); }
TEST_CASE("hf fixtures: MixtralForCausalLM (4 experts, top-2)", "[hf_fixtures]") { check_fixture("MixtralForCausalLM"); }
TEST_CASE("hf fixtures: Qwen3MoeForCausalLM (a dense layer, q/k norms)", "[hf_fixtures]") {
  check_fixture("Qwen3MoeForCausalLM");
}
