// Issue #20, nan_policy skip: a run whose every update is non-finite stops after
// training.nan_max_skips in a row (one error line, non-zero exit) instead of ending "last loss nan"
// with exit 0; the skipped iterations write no new checkpoint of unchanged weights; a non-finite
// validation loss is written as null, not dropped.
#include "catch.h"
#include "common/run_binary.h"

using namespace mt::test;

namespace {

const std::string kTiny = source_path("configs/ci/tiny-llama.yaml");

std::string nan_args(const std::string& name, const std::string& extra) {
  const fs::path d = temp_dir() / name;
  // lr 1e30: the first update blows the weights up, every later loss is NaN.
  return "train --config " + kTiny + " --set logging.log_interval=1 --set optimizer.lr=1e30 " +
         "--set optimizer.warmup_iters=0 --set training.nan_policy=skip --set checkpoint.dir=" + (d / "ckpt").string() +
         " --set logging.metrics_file=" + (d / "metrics.jsonl").string() + " " + extra;
}

std::vector<nlohmann::json> records(const std::string& name) {
  std::ifstream f(temp_dir() / name / "metrics.jsonl");
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));  // throws on nan / inf
  return out;
}

}  // namespace

TEST_CASE("nan_policy skip stops after training.nan_max_skips non-finite iterations in a row", "[e2e][nan]") {
  RunResult r = run_megatrain(nan_args("nanstop", "--set training.train_iters=40 --set training.nan_max_skips=5 "
                                                  "--set checkpoint.save_interval=1 --set training.eval_iters=0"),
                              "nanstop");
  INFO(r.err);
  CHECK(r.code == 1);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find("training.nan_max_skips = 5") != std::string::npos);
  // Iteration 1 updates (and is saved), 2..5 are skipped, the 5th in a row (iteration 6) stops.
  const auto recs = records("nanstop");
  REQUIRE(recs.size() == 5);
  CHECK(recs[0]["skipped"] == 0);
  for (size_t i = 1; i < recs.size(); ++i) CHECK(recs[i]["skipped"] == 1);
  // Only the checkpoint of the one real update: skipped iterations do not save the same weights again.
  int checkpoints = 0;
  for (const auto& e : fs::directory_iterator(temp_dir() / "nanstop" / "ckpt"))
    if (e.path().filename().string().rfind("iter_", 0) == 0) ++checkpoints;
  CHECK(checkpoints == 1);
  CHECK(fs::exists(temp_dir() / "nanstop" / "ckpt" / "iter_0000001"));
}

TEST_CASE("a non-finite validation loss is logged and written as null", "[e2e][nan]") {
  RunResult r = run_megatrain(nan_args("nanval", "--set training.train_iters=3 --set training.eval_interval=2 "
                                                 "--set training.eval_iters=1 --set checkpoint.dir="),
                              "nanval");
  INFO(r.err);
  REQUIRE(r.code == 0);
  int val = 0;
  for (const auto& j : records("nanval")) {
    if (!j.contains("val_loss")) continue;
    ++val;
    CHECK(j["val_loss"].is_null());
  }
  CHECK(val == 2);  // iteration 2 and the end (3)
  const std::string log = r.out + r.err;
  const size_t at = log.find("validation at iter 2 | val loss ");
  REQUIRE(at != std::string::npos);
  CHECK(log.substr(at, 60).find("nan") != std::string::npos);
}

TEST_CASE("training.nan_max_skips must be at least 1", "[e2e][nan]") {
  RunResult r = run_megatrain(nan_args("nanzero", "--set training.nan_max_skips=0"), "nanzero");
  CHECK(r.code == 1);
  CHECK(r.err.find("training.nan_max_skips") != std::string::npos);
}
