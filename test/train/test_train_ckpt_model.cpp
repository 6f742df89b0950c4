// Issue #20 / #19 through the megatrain binary: a checkpoint whose tensors are not exactly the
// model's (num_layers 2 -> 1, another vocab_size with the same padded size) or whose training state
// lacks a key is refused with one line naming it, touching nothing; checkpoint.finetune: true loads
// the weights only (iteration 0, fresh optimizer and data position).
#include <nlohmann/json.hpp>

#include "catch.h"
#include "common/run_binary.h"
#include "core/sha256.h"

using namespace mt::test;

namespace {

const std::string kTiny = source_path("configs/ci/tiny-llama.yaml");

std::string args(const std::string& name, const std::string& extra = "") {
  const fs::path d = temp_dir() / name;
  return "train --config " + kTiny + " --set training.train_iters=2 --set training.eval_interval=0" +
         " --set logging.log_interval=1 --set checkpoint.dir=" + (d / "ckpt").string() +
         " --set logging.metrics_file=" + (d / "metrics.jsonl").string() + " " + extra;
}

// A 2-iteration run's checkpoint directory (made once).
fs::path source_ckpt() {
  static const fs::path ck = [] {
    REQUIRE(run_megatrain(args("model_src"), "model_src").code == 0);
    return temp_dir() / "model_src" / "ckpt";
  }();
  return ck;
}

void expect_refused(const std::string& extra, const std::vector<std::string>& words, const std::string& tag) {
  const fs::path ck = source_ckpt();
  const std::string before = fingerprint(ck);
  RunResult r = run_megatrain(args("model_src", "--set training.train_iters=4 " + extra), tag);
  INFO(r.err);
  CHECK(r.code != 0);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find("internal error") == std::string::npos);
  for (const std::string& w : words) CHECK(r.err.find(w) != std::string::npos);
  CHECK(fingerprint(ck) == before);
}

}  // namespace

TEST_CASE("resuming into a smaller model or another vocabulary is refused", "[e2e][checkpoint][model]") {
  expect_refused("--set model.num_layers=1", {"layers.1.", "does not have", "model.num_layers"}, "fewer_layers");
  // 120 pads to 128 like 128 does: the shapes match, the vocabulary does not.
  expect_refused("--set model.vocab_size=120", {"model.vocab_size 128", "120", "checkpoint.finetune"}, "vocab");
}

TEST_CASE("a training state without a key is a one-line error naming the manifest and the key",
          "[e2e][checkpoint][integrity]") {
  const fs::path src = source_ckpt();
  const fs::path ck = temp_dir() / "model_state" / "ckpt";
  fs::create_directories(ck.parent_path());
  fs::copy(src, ck, fs::copy_options::recursive);
  const fs::path dir = ck / "iter_0000002";
  auto m = nlohmann::json::parse(read_file(dir / "manifest.json"));
  m["state"].erase("optimizer_step");
  const std::string text = m.dump(1);
  std::ofstream(dir / "manifest.json", std::ios::trunc) << text;
  std::ofstream(dir / "DONE", std::ios::trunc) << "iter_0000002\nmanifest_sha256 " << mt::sha256_hex(text.data(), text.size())
                                               << "\n";
  const std::string before = fingerprint(ck);
  RunResult r = run_megatrain(args("model_state", "--set training.train_iters=4"), "state_key");
  CHECK(r.code != 0);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find((dir / "manifest.json").string()) != std::string::npos);
  CHECK(r.err.find("'optimizer_step'") != std::string::npos);
  CHECK(r.err.find("internal error") == std::string::npos);
  CHECK(fingerprint(ck) == before);
}

TEST_CASE("checkpoint.finetune loads the weights only: iteration 0, fresh optimizer and data position",
          "[e2e][checkpoint][finetune]") {
  const fs::path src = source_ckpt() / "iter_0000002";
  REQUIRE(run_megatrain(args("ft_fresh"), "ft_fresh").code == 0);
  // Finetuning needs an explicit checkpoint.
  RunResult bad = run_megatrain(args("ft_auto", "--set checkpoint.finetune=true"), "ft_auto");
  CHECK(bad.code != 0);
  CHECK(bad.err.find("checkpoint.load: PATH") != std::string::npos);
  // Another vocab_size with the same padded size is allowed when finetuning.
  RunResult r = run_megatrain(
      args("ft", "--set checkpoint.finetune=true --set model.vocab_size=120 --set checkpoint.load=" + src.string()), "ft");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("finetuning from the weights of " + src.string()) != std::string::npos);
  auto ft = read_metrics(temp_dir() / "ft" / "metrics.jsonl");
  auto fresh = read_metrics(temp_dir() / "ft_fresh" / "metrics.jsonl");
  REQUIRE(ft.size() == 2);  // iterations 1 and 2: it started at 0
  CHECK(ft.begin()->first == 1);
  CHECK(ft[1].loss != fresh[1].loss);  // the loaded weights, not the initialization
  auto state = nlohmann::json::parse(read_file(temp_dir() / "ft" / "ckpt" / "iter_0000002" / "manifest.json"))["state"];
  CHECK(state["iteration"] == 2);
  CHECK(state["optimizer_step"] == 2);             // a fresh optimizer: 2 steps, not 4
  CHECK(state["consumed_train_samples"] == 16);    // a fresh data position: 2 global batches of 8
}
