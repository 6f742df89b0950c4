// training.skip_train (Megatron's --skip-train): evaluate a checkpoint and exit. The validation and test losses
// of the loaded weights equal the ones the training run logged at that iteration (same batches, same recipe);
// nothing is trained or written to the checkpoint directory; the weights can be evaluated under another recipe
// (here the FP8 emulation), which gives another loss; an older checkpoint's evaluation keeps the run's later
// metrics records and TensorBoard steps; skip_train with nothing to evaluate is a config error.
#include <map>

#include "catch.h"
#include "common/run_binary.h"

using namespace mt::test;

namespace {

const std::string kTiny = source_path("configs/ci/tiny-llama.yaml");

// iteration -> {val_loss, test_loss} of a metrics file (NaN where absent).
std::map<int64_t, std::pair<double, double>> eval_records(const fs::path& file) {
  std::map<int64_t, std::pair<double, double>> out;
  std::ifstream f(file);
  std::string line;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    const int64_t it = j["iteration"].get<int64_t>();
    auto& e = out.try_emplace(it, std::nan(""), std::nan("")).first->second;
    if (j.contains("val_loss")) e.first = j["val_loss"].get<double>();
    if (j.contains("test_loss")) e.second = j["test_loss"].get<double>();
  }
  return out;
}

// name -> (size, write time) of every file under DIR.
std::map<std::string, std::pair<uintmax_t, fs::file_time_type>> listing(const fs::path& dir) {
  std::map<std::string, std::pair<uintmax_t, fs::file_time_type>> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[e.path().string()] = {e.file_size(), e.last_write_time()};
  return out;
}

}  // namespace

TEST_CASE("training.skip_train evaluates a checkpoint: the losses its run logged, nothing written", "[e2e][skip_train]") {
  const fs::path d = temp_dir() / "skip_train";
  const std::string common = "train --config " + kTiny + " --set training.eval_iters=2 --set checkpoint.dir=" +
                             (d / "ckpt").string() + " ";
  RunResult r = run_megatrain(common + "--set training.train_iters=6 --set training.eval_interval=3 "
                                       "--set checkpoint.save_interval=6 --set logging.metrics_file=" +
                                  (d / "train.jsonl").string(),
                              "skip_train_run");
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto trained = eval_records(d / "train.jsonl");
  REQUIRE(trained.count(6));
  REQUIRE(std::isfinite(trained.at(6).first));
  REQUIRE(std::isfinite(trained.at(6).second));
  const auto before = listing(d / "ckpt");

  r = run_megatrain(common + "--set training.train_iters=6 --set training.skip_train=true --set logging.metrics_file=" +
                        (d / "eval.jsonl").string(),
                    "skip_train_eval");
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto evaluated = eval_records(d / "eval.jsonl");
  REQUIRE(evaluated.size() == 1);  // no training records
  REQUIRE(evaluated.count(6));
  CHECK(evaluated.at(6).first == trained.at(6).first);
  CHECK(evaluated.at(6).second == trained.at(6).second);
  CHECK(listing(d / "ckpt") == before);

  // The same weights under the FP8 emulation: a finite loss, not the fp32 one.
  r = run_megatrain(common + "--set training.train_iters=6 --set training.skip_train=true --set training.fp8=tensorwise "
                             "--set logging.metrics_file=" + (d / "eval_fp8.jsonl").string(),
                    "skip_train_fp8");
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto fp8 = eval_records(d / "eval_fp8.jsonl");
  REQUIRE(fp8.count(6));
  CHECK(std::isfinite(fp8.at(6).first));
  CHECK(fp8.at(6).first != trained.at(6).first);
  CHECK(std::abs(fp8.at(6).first - trained.at(6).first) < 0.05 * trained.at(6).first);
  CHECK(listing(d / "ckpt") == before);
}

TEST_CASE("training.skip_train of an older checkpoint keeps the run's metrics records", "[e2e][skip_train]") {
  // A training run resumed from iteration 3 would drop the file's records past 3; skip_train trains nothing, so
  // it keeps them, and the validation record of iteration 3 is already there (not written twice).
  const fs::path d = temp_dir() / "skip_train_older";
  const std::string common = "train --config " + kTiny + " --set training.eval_iters=2 --set checkpoint.dir=" +
                             (d / "ckpt").string() + " --set logging.metrics_file=" + (d / "metrics.jsonl").string() +
                             " --set training.train_iters=6 --set training.eval_interval=3 --set logging.tensorboard_dir=" +
                             (d / "tb").string() + " ";
  RunResult r = run_megatrain(common + "--set checkpoint.save_interval=3", "skip_train_older_run");
  INFO(r.err);
  REQUIRE(r.code == 0);
  const std::string before = read_file(d / "metrics.jsonl");
  const auto tb_before = listing(d / "tb");
  REQUIRE(tb_before.size() == 1);
  REQUIRE(eval_records(d / "metrics.jsonl").count(6));
  r = run_megatrain(common + "--set training.skip_train=true --set checkpoint.load=" +
                        (d / "ckpt" / "iter_0000003").string(),
                    "skip_train_older_eval");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("validation at iter 3") != std::string::npos);
  // Every record kept as it was; only what the file lacked is appended: the test split at iteration 3.
  const std::string after = read_file(d / "metrics.jsonl");
  REQUIRE(after.rfind(before, 0) == 0);
  const auto added = nlohmann::json::parse(after.substr(before.size()));
  CHECK(added["iteration"] == 3);
  CHECK(added.contains("test_loss"));
  // No event file: its SessionLog START at iteration 4 would make TensorBoard drop the run's steps 4-6.
  CHECK(listing(d / "tb") == tb_before);
}

TEST_CASE("training.skip_train with eval_iters 0 is a config error naming both keys", "[e2e][skip_train]") {
  const RunResult r = run_megatrain("train --config " + kTiny + " --set training.skip_train=true "
                                    "--set training.eval_iters=0 --set checkpoint.dir=",
                                    "skip_train_noeval");
  INFO(r.err);
  CHECK(r.code != 0);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find("training.skip_train") != std::string::npos);
  CHECK(r.err.find("training.eval_iters") != std::string::npos);
}
