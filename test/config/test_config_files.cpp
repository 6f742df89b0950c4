// Config files: the shipped configs load and derive; file-level errors; the reference table.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "catch.h"
#include "config/config_loader.h"
#include "config/config_schema.h"
#include "config_test_util.h"

using mt::test::contains;
using mt::test::error_of;

namespace fs = std::filesystem;

namespace {

std::string shipped(const std::string& rel) { return std::string(MT_SOURCE_DIR) + "/configs/" + rel; }

fs::path temp_dir() {
  const fs::path dir = fs::path(MT_BINARY_DIR) / "test_config_tmp";
  fs::create_directories(dir);
  return dir;
}

}  // namespace

TEST_CASE("configs: every shipped config loads, round-trips and derives for one rank", "[config]") {
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(std::string(MT_SOURCE_DIR) + "/configs"))
    if (e.is_regular_file() && e.path().extension() == ".yaml") files.push_back(e.path());
  CHECK(files.size() >= 7);
  for (const fs::path& f : files) {
    INFO(f.string());
    const std::string msg = error_of([&] {
      const mt::Config c = mt::load_config(f.string());
      // the fewest ranks its layout needs: 1, or a plan-only config's (configs/plan/) tensor x pipeline x context x
      // expert (data parallel = expert)
      const mt::ParallelConfig& p = c.parallel;
      mt::derive_config(c, p.tensor * p.pipeline * p.context * p.expert);
      const mt::Config back = mt::load_config_from_string(mt::config_to_yaml(c), "dump");
      if (!mt::config_fields_equal(c, back)) throw mt::Error("round trip differs");
    });
    CHECK(msg == "<no mt::Error thrown>");
  }
}

TEST_CASE("configs: shipped model shapes", "[config]") {
  mt::Config c = mt::load_config(shipped("gpt2-124m.yaml"));
  mt::DerivedConfig d = mt::derive_config(c, 1);
  CHECK(c.model.arch == "gpt2");
  CHECK(c.model.num_layers == 12);
  CHECK(c.model.hidden_size == 768);
  CHECK(d.num_query_groups == 12);
  CHECK(d.ffn_hidden_size == 3072);
  CHECK(d.padded_vocab_size == 50304);
  CHECK(c.training.micro_batch_size == 32);
  CHECK(c.model.seq_length == 1024);
  CHECK(c.checkpoint.dir == "runs/gpt2-124m");

  c = mt::load_config(shipped("gpt2-350m.yaml"));
  d = mt::derive_config(c, 1);
  CHECK(c.model.num_layers == 24);
  CHECK(c.model.hidden_size == 1024);
  CHECK(d.padded_vocab_size == 50304);
  CHECK(c.training.micro_batch_size == 16);

  c = mt::load_config(shipped("llama-1b.yaml"));
  d = mt::derive_config(c, 1);
  CHECK(c.model.num_layers == 16);
  CHECK(c.model.num_query_groups == 8);
  CHECK(c.model.ffn_hidden_size == 8192);
  CHECK(d.padded_vocab_size == 32000);
  CHECK(c.training.micro_batch_size == 8);
  CHECK(c.model.seq_length == 2048);

  c = mt::load_config(shipped("llama-3b.yaml"));
  d = mt::derive_config(c, 1);
  CHECK(c.model.num_layers == 28);
  CHECK(c.model.hidden_size == 3072);
  CHECK(c.model.num_attention_heads == 24);
  CHECK(d.head_dim == 128);
  CHECK(c.training.micro_batch_size == 4);

  c = mt::load_config(shipped("quickstart-mock.yaml"));
  d = mt::derive_config(c, 1);
  CHECK(c.training.device == "cpu");
  CHECK(c.training.precision == "fp32");
  CHECK(d.num_microbatches == 4);
  CHECK(d.padded_vocab_size == 512);
  CHECK(c.logging.metrics_file == "runs/quickstart-mock/metrics.jsonl");

  // The real-text quickstart: GPT-2's tokenizer, the data the quickstart script writes.
  c = mt::load_config(shipped("quickstart.yaml"));
  d = mt::derive_config(c, 1);
  CHECK(c.model.arch == "gpt2");
  CHECK(d.padded_vocab_size == 50304);
  CHECK(c.data.tokenizer_type == "gpt2-bpe");
  REQUIRE(c.data.paths.size() == 1);
  CHECK(c.data.paths[0].second == "data/quickstart/bible_text_document");

  // The CI configs also fit the usual multi-rank test layouts.
  for (const char* name : {"ci/tiny-gpt2.yaml", "ci/tiny-llama.yaml"}) {
    INFO(name);
    c = mt::load_config(shipped(name));
    CHECK(mt::derive_config(c, 1).global_batch_size == 8);
    c = mt::load_config(shipped(name), {"parallel.tensor=2", "parallel.pipeline=2", "parallel.sequence_parallel=true"});
    CHECK(mt::derive_config(c, 8).data_parallel_size == 2);
    // tensor 4: gpt2's 4 heads split; llama's 2 query groups cannot (train refuses it, so derive does)
    c = mt::load_config(shipped(name), {"parallel.tensor=4"});
    if (c.model.arch == "gpt2") {
      CHECK(mt::derive_config(c, 4).data_parallel_size == 1);
    } else {
      CHECK(mt::test::contains(error_of([&] { mt::derive_config(c, 4); }),
                               "must be divisible by parallel.tensor (4)"));
    }
    // context 2: their 32 tokens split into 4 chunks
    c = mt::load_config(shipped(name), {"parallel.context=2"});
    CHECK(mt::derive_config(c, 2).data_parallel_size == 1);
  }
}

TEST_CASE("configs: file errors name the file", "[config]") {
  std::string m = error_of([] { mt::load_config("configs/does-not-exist.yaml"); });
  CHECK(contains(m, "config configs/does-not-exist.yaml: file not found (looked for /"));
  m = error_of([] { mt::load_config(temp_dir().string()); });
  CHECK(contains(m, ": is a directory, not a YAML file"));

  const fs::path bad = temp_dir() / "bad.yaml";
  std::ofstream(bad) << "model:\n  num_layers: 2\n  hidden_size: [64\n";
  m = error_of([&] { mt::load_config(bad.string()); });
  INFO(m);
  CHECK(contains(m, "config " + bad.string() + ": YAML syntax error at line "));
  CHECK(mt::test::one_line(m));

  const fs::path typo = temp_dir() / "typo.yaml";
  std::ofstream(typo) << "model:\n  num_layers: 2\n  hiden_size: 64\n";
  m = error_of([&] { mt::load_config(typo.string()); });
  CHECK(contains(m, "config " + typo.string() + ": unknown key 'model.hiden_size'; did you mean 'model.hidden_size'? (line 3)"));
}

TEST_CASE("configs: the reference table lists every key", "[config]") {
  const std::string md = mt::config_reference_markdown();
  CHECK(md.rfind("| key | type | default | meaning |\n|---|---|---|---|\n", 0) == 0);
  for (const mt::ConfigField& f : mt::config_fields()) CHECK(contains(md, "| `" + f.path + "` |"));
  CHECK(contains(md, "| `model.num_layers` | int >= 1 | **required** | transformer layers |"));
  CHECK(contains(md, "| `model.arch` | one of gpt2, llama | `llama` |"));
  CHECK(contains(md, "| `model.dropout` | double in [0, 1) | `0.0` |"));
  CHECK(contains(md, "`--tensor-model-parallel-size`"));
  std::size_t lines = 0;
  for (char ch : md) lines += ch == '\n';
  CHECK(lines == mt::config_fields().size() + 2);
}
