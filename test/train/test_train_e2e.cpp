// End to end through the megatrain binary (as a user runs it): a tiny Llama config on mock data
// trains with falling loss, two runs with one seed log identical losses, a run stopped and resumed
// from its checkpoint logs bit-identical losses to one that never stopped, and bad input (a
// misspelled key, a truncated .idx) ends in a one-line error and a non-zero exit without touching
// existing checkpoints.
#include "catch.h"
#include "common/run_binary.h"
#include "data/indexed_dataset.h"

using namespace mt::test;

namespace {

const std::string kTiny = source_path("configs/ci/tiny-llama.yaml");

std::string train_args(const std::string& name, const std::string& extra = "") {
  const fs::path d = temp_dir() / name;
  return "train --config " + kTiny + " --set training.train_iters=40 --set logging.log_interval=1" +
         " --set checkpoint.dir=" + (d / "ckpt").string() + " --set logging.metrics_file=" +
         (d / "metrics.jsonl").string() + " " + extra;
}

std::map<int64_t, StepMetrics> losses(const std::string& name) { return read_metrics(temp_dir() / name / "metrics.jsonl"); }

}  // namespace

TEST_CASE("training is deterministic, the loss falls, and resume is bit-exact", "[e2e]") {
  REQUIRE(run_megatrain(train_args("a"), "a").code == 0);
  REQUIRE(run_megatrain(train_args("b"), "b").code == 0);
  auto a = losses("a"), b = losses("b");
  REQUIRE(a.size() == 40);
  for (auto& [it, v] : a) {
    INFO("iteration " << it);
    CHECK(v == b[it]);  // loss and grad norm bit-identical
  }
  // Mock data is learnable: the loss falls clearly from ln(128) = 4.85.
  CHECK(a[1].loss > 4.6);
  CHECK(a[40].loss < a[1].loss - 0.9);

  // Stopped at 20 by exit_interval (a checkpoint is written), then resumed to 40.
  REQUIRE(run_megatrain(train_args("c", "--set training.exit_interval=20"), "c1").code == 0);
  REQUIRE(fs::exists(temp_dir() / "c" / "ckpt" / "iter_0000020" / "DONE"));
  REQUIRE(run_megatrain(train_args("c"), "c2").code == 0);
  auto c = losses("c");
  REQUIRE(c.size() == 40);
  for (int64_t it = 1; it <= 40; ++it) {
    INFO("iteration " << it);
    CHECK(c[it] == a[it]);
  }
}

TEST_CASE("a misspelled key is a one-line error that leaves checkpoints untouched", "[e2e][errors]") {
  REQUIRE(run_megatrain(train_args("d", "--set training.train_iters=4"), "d").code == 0);
  const fs::path ck = temp_dir() / "d" / "ckpt";
  const std::string before = fingerprint(ck);
  std::string text = read_file(kTiny);
  auto pos = text.find("hidden_size");
  REQUIRE(pos != std::string::npos);
  text.replace(pos, 11, "hiden_size");
  const fs::path bad = temp_dir() / "typo.yaml";
  std::ofstream(bad) << text;
  RunResult r = run_megatrain("train --config " + bad.string() + " --set checkpoint.dir=" + ck.string(), "typo");
  CHECK(r.code != 0);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find("hiden_size") != std::string::npos);
  CHECK(r.err.find("hidden_size") != std::string::npos);
  CHECK(r.err.find(bad.string()) != std::string::npos);
  CHECK(fingerprint(ck) == before);
}

namespace {
// A small indexed dataset (40 documents, token ids below the tiny config's vocabulary of 128).
fs::path write_tiny_dataset(const std::string& name) {
  const fs::path prefix = temp_dir() / name;
  mt::data::IndexedDatasetWriter w(prefix.string(), mt::DType::U16);
  std::vector<int32_t> doc;
  for (int d = 0; d < 40; ++d) {
    doc.clear();
    for (int i = 0; i < 50 + d; ++i) doc.push_back((d * 7 + i * 3) % 127);
    w.add_item(doc.data(), static_cast<int64_t>(doc.size()));
    w.end_document();
  }
  w.finalize();
  return prefix;
}
}  // namespace

TEST_CASE("megatrain-data build-index prepares the cache that training then loads", "[e2e][data]") {
  const fs::path prefix = write_tiny_dataset("indexed_text_document");
  // The same config and overrides for both (the cache is keyed by the sample counts they imply).
  const std::string sets = " --set data.mock=false --set data.paths=[" + prefix.string() +
                           "] --set data.split=[90,10,0] --set training.train_iters=4";
  const std::string tool = std::string(MT_BINARY_DIR) + "/megatrain-data build-index --config " + kTiny + sets + " > " +
                           (temp_dir() / "index.out").string() + " 2>&1";
  REQUIRE(std::system(tool.c_str()) == 0);
  RunResult r = run_megatrain(train_args("idx", sets), "idx");
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK((r.out + r.err).find("index loaded from cache") != std::string::npos);
  CHECK((r.out + r.err).find("index built") == std::string::npos);
}

TEST_CASE("a truncated .idx is a one-line error that leaves checkpoints untouched", "[e2e][errors]") {
  const fs::path prefix = write_tiny_dataset("tiny_text_document");
  const std::string data_args = "--set data.mock=false --set data.paths=[" + prefix.string() +
                                "] --set data.split=[1,0,0] --set training.eval_iters=0";
  REQUIRE(run_megatrain(train_args("e", data_args + " --set training.train_iters=4"), "e").code == 0);
  const fs::path ck = temp_dir() / "e" / "ckpt";
  const std::string before = fingerprint(ck);
  const fs::path idx = prefix.string() + ".idx";
  fs::resize_file(idx, fs::file_size(idx) - 9);
  RunResult r = run_megatrain(train_args("e", data_args + " --set training.train_iters=8"), "e2");
  CHECK(r.code != 0);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find(".idx") != std::string::npos);
  CHECK(fingerprint(ck) == before);
}

// Settings are config keys: an environment switch of an earlier version is refused, not ignored, and
// training.attention_backend: cudnn is refused on the CPU; one line each, a non-zero exit.
TEST_CASE("removed environment switches and attention_backend cudnn on the CPU are one-line errors", "[e2e][errors]") {
  const std::string short_run = "--set training.train_iters=2 --set training.eval_iters=0";
  RunResult r = run_megatrain(train_args("env1", short_run), "env1", 0, "MT_NORM_BWD=rows");
  CHECK(r.code != 0);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find("environment variable MT_NORM_BWD=rows is no longer read") != std::string::npos);
  r = run_megatrain(train_args("env2", short_run), "env2", 0, "MT_ATTENTION=own");
  CHECK(r.code != 0);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find("set training.attention_backend (auto, cudnn or own) instead") != std::string::npos);
  r = run_megatrain(
      train_args("env3", short_run + " --set training.device=cpu --set training.attention_backend=cudnn"), "env3");
  CHECK(r.code != 0);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find("training.attention_backend is cudnn but training.device is cpu") != std::string::npos);
  // own and auto run on the CPU (its reference attention either way).
  CHECK(run_megatrain(train_args("env4", short_run + " --set training.attention_backend=own"), "env4").code == 0);
}

TEST_CASE("the README's config reference is what the binary generates", "[e2e][docs]") {
  RunResult r = run_megatrain("config --reference", "reference");
  REQUIRE(r.code == 0);
  REQUIRE(r.out.find("| `model.num_layers` |") != std::string::npos);
  CHECK(read_file(source_path("README.md")).find(r.out) != std::string::npos);
  // it reads no config: one given beside it is refused, not ignored
  RunResult both = run_megatrain("config --reference --config " + source_path("configs/ci/tiny-gpt2.yaml"), "reference2");
  CHECK(both.code == 1);
  CHECK(both.err.find("--reference prints the key reference and reads no config; remove --config") != std::string::npos);
}

TEST_CASE("--version and --help", "[e2e][cli]") {
  RunResult v = run_megatrain("--version", "version");
  CHECK(v.code == 0);
  CHECK(v.out.rfind("megatrain ", 0) == 0);
  CHECK(run_megatrain("train --help", "help").code == 0);
  CHECK(run_megatrain("train", "nocfg").code != 0);
}

TEST_CASE("skipped iterations keep the metrics file strict JSON (null for a non-finite loss or norm)",
          "[e2e][metrics]") {
  // lr 1e30: the first update blows the weights up, every later loss is NaN and nan_policy skip skips it.
  RunResult r = run_megatrain(train_args("nanskip", "--set training.train_iters=4 --set optimizer.lr=1e30 "
                                                    "--set optimizer.warmup_iters=0 --set training.nan_policy=skip "
                                                    "--set checkpoint.dir="),
                              "nanskip");
  REQUIRE(r.code == 0);
  std::ifstream f(temp_dir() / "nanskip" / "metrics.jsonl");
  std::string line;
  int records = 0, skipped = 0;
  while (std::getline(f, line)) {
    INFO(line);
    const auto j = nlohmann::json::parse(line);  // throws on inf / nan
    if (j.contains("val_loss")) {  // the final validation of NaN weights: null, not dropped
      CHECK(j["val_loss"].is_null());
      continue;
    }
    ++records;
    if (j["skipped"].get<int64_t>() == 0) {
      CHECK(j["loss"].is_number());
      continue;
    }
    ++skipped;
    CHECK(j["loss"].is_null());
    CHECK(j["grad_norm"].is_null());
  }
  CHECK(records == 4);
  CHECK(skipped >= 1);
}
