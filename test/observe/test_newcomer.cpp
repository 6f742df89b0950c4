// What a newcomer sees (issue #20): the first log line at iteration 1 and each line averaging the
// iterations since the previous one (against a run that logs every iteration), the test split
// evaluated at the end of training (or a line saying why not), the end-of-run summary (against
// the metrics file), `generate` naming the checkpoint and iteration it loaded, one metrics record
// per iteration however often a job is re-run or resumed, and a misspelled subcommand named.
#include <cmath>

#include "catch.h"
#include "core/log.h"  // fmt
#include "data_tools/test_helpers.h"
#include "observe_runs.h"

using namespace mt::test;

namespace {

std::vector<nlohmann::json> of_kind(const std::vector<nlohmann::json>& records, const char* key) {
  std::vector<nlohmann::json> out;
  for (const auto& j : records)
    if (j.contains(key)) out.push_back(j);
  return out;
}

// The records with the timing fields dropped (they differ from run to run).
std::vector<nlohmann::json> without_timing(std::vector<nlohmann::json> records) {
  for (auto& j : records)
    for (const char* k : {"tokens_per_s", "ms_per_iter", "tflops_per_gpu", "mfu", "mem_gib", "comm_exposed_ms"})
      j.erase(k);
  return records;
}

}  // namespace

TEST_CASE("the first log line is at iteration 1, then every log_interval, each the mean since the last line",
          "[newcomer][e2e]") {
  const MainRun& run = main_run();
  INFO(run.log);
  REQUIRE(run.code == 0);
  CHECK_THAT(run.log, Catch::Contains("iter 1/12 |"));
  const auto every = per_iteration_run();
  REQUIRE(every.size() == 12);
  const auto train = of_kind(metrics_records(run.dir / "metrics.jsonl"), "loss");
  REQUIRE(train.size() == 4);
  const int64_t expect_it[4] = {1, 5, 10, 12}, from[4] = {1, 2, 6, 11};
  for (size_t k = 0; k < 4; ++k) {
    const int64_t it = expect_it[k];
    INFO("record at iteration " << it);
    REQUIRE(train[k]["iteration"].get<int64_t>() == it);
    double sum = 0;
    for (int64_t i = from[k]; i <= it; ++i) sum += every.at(i)["loss"].get<double>();
    CHECK(train[k]["loss"].get<double>() == Approx(sum / static_cast<double>(it - from[k] + 1)).epsilon(1e-12));
    CHECK(train[k]["grad_norm"].get<double>() == every.at(it)["grad_norm"].get<double>());
    CHECK(train[k]["consumed_samples"].get<int64_t>() == it * 8);
  }
}

TEST_CASE("the test split is evaluated once at the end of training", "[newcomer][e2e]") {
  const MainRun& run = main_run();
  INFO(run.log);
  REQUIRE(run.code == 0);
  const auto records = metrics_records(run.dir / "metrics.jsonl");
  const auto test = of_kind(records, "test_loss"), val = of_kind(records, "val_loss");
  REQUIRE(test.size() == 1);
  REQUIRE(val.size() == 2);
  CHECK(test[0]["iteration"].get<int64_t>() == 12);
  CHECK(records.back() == test[0]);  // after the last validation
  const double t = test[0]["test_loss"].get<double>(), v = val[1]["val_loss"].get<double>();
  // Mock data: every split is the same Markov chain, so the trained model's test and validation
  // losses agree closely, and both are well below the untrained ln(128) = 4.852.
  CHECK(std::abs(t - v) < 0.05);
  CHECK(t < std::log(128.0) - 0.2);
  CHECK_THAT(run.log, Catch::Contains(fmt::format("test at iter 12 | test loss {:.6f}", t)));

  // No test split: one line says so, and no record is written.
  RunResult r = run_megatrain(tiny_train_args("notest", "--set training.train_iters=2 --set data.split=[99,1,0] "
                                                        "--set checkpoint.dir="),
                              "notest");
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out + r.err, Catch::Contains("test: skipped, the test split is empty"));
  CHECK(of_kind(metrics_records(temp_dir() / "notest" / "metrics.jsonl"), "test_loss").empty());
}

TEST_CASE("the end-of-run summary gives the wall time, tokens, best validation loss and checkpoint",
          "[newcomer][e2e]") {
  const MainRun& run = main_run();
  INFO(run.log);
  REQUIRE(run.code == 0);
  const auto records = metrics_records(run.dir / "metrics.jsonl");
  const auto val = of_kind(records, "val_loss");
  REQUIRE(val.size() == 2);
  const auto& best = val[0]["val_loss"].get<double>() <= val[1]["val_loss"].get<double>() ? val[0] : val[1];
  // 12 iterations x 8 samples x 32 tokens.
  CHECK_THAT(run.log, Catch::Contains("run summary: finished | iteration 12/12 (12 in this run) | wall time 00:0"));
  CHECK_THAT(run.log, Catch::Contains("| 3072 tokens in this run, 3072 in all"));
  CHECK_THAT(run.log, Catch::Contains(fmt::format("best validation loss {:.6f} at iteration {}", best["val_loss"].get<double>(),
                                                  best["iteration"].get<int64_t>())));
  CHECK_THAT(run.log, Catch::Contains(fmt::format("test loss {:.6f}", of_kind(records, "test_loss")[0]["test_loss"].get<double>())));
  CHECK_THAT(run.log, Catch::Contains("run summary: last checkpoint " + (run.dir / "ckpt" / "iter_0000012").string()));
}

TEST_CASE("generate names the checkpoint and iteration it loaded", "[newcomer][e2e]") {
  // A tokenizer of 273 tokens, so the model's vocabulary is 512.
  const fs::path dir = temp_dir() / "gen";
  fs::create_directories(dir);
  dt_test::write_file(dir / "tokenizer.json", dt_test::small_tokenizer_json(dt_test::Style::kGpt2).dump());
  RunResult t = run_megatrain(tiny_train_args("gen", "--set training.train_iters=3 --set model.vocab_size=512"), "gen_train");
  INFO(t.out << t.err);
  REQUIRE(t.code == 0);
  RunResult g = run_megatrain("generate --checkpoint " + (dir / "ckpt").string() + " --prompt hello --max-new-tokens 3 " +
                                  "--tokenizer-type hf-json --tokenizer-file " + (dir / "tokenizer.json").string(),
                              "gen");
  INFO(g.out << g.err);
  REQUIRE(g.code == 0);
  CHECK(g.out.rfind("hello", 0) == 0);
  CHECK_THAT(g.err, Catch::Contains("loaded checkpoint " + (dir / "ckpt" / "iter_0000003").string() + " (iteration 3,"));
  // a tokenizer flag the chosen tokenizer does not read is refused, not ignored
  RunResult bad = run_megatrain("generate --checkpoint " + (dir / "ckpt").string() + " --prompt hello " +
                                    "--tokenizer-type hf-json --tokenizer-file " + (dir / "tokenizer.json").string() +
                                    " --vocab-file encoder.json",
                                "gen_bad");
  CHECK(bad.code == 1);
  CHECK_THAT(bad.err, Catch::Contains("--vocab-file is read by the gpt2-bpe tokenizer, not hf-json"));
  // so is a sampling flag beside greedy decoding
  RunResult greedy = run_megatrain("generate --checkpoint " + (dir / "ckpt").string() + " --prompt hello " +
                                       "--temperature 0 --top-k 5 --tokenizer-type hf-json --tokenizer-file " +
                                       (dir / "tokenizer.json").string(),
                                   "gen_greedy");
  CHECK(greedy.code == 1);
  CHECK_THAT(greedy.err, Catch::Contains("generate: --top-k is given but --temperature 0 is greedy"));
}

TEST_CASE("re-running or resuming a job leaves one metrics record per iteration", "[newcomer][e2e]") {
  const fs::path dir = temp_dir() / "dup";
  const fs::path file = dir / "metrics.jsonl";
  const std::string args = tiny_train_args("dup", "--set training.train_iters=8 --set logging.log_interval=2 "
                                                  "--set training.eval_interval=4 --set checkpoint.save_interval=4 "
                                                  "--set checkpoint.keep_last=0");
  REQUIRE(run_megatrain(args, "dup1").code == 0);
  const std::string first = read_file(file);
  const auto records = metrics_records(file);
  REQUIRE(records.size() == 5 + 2 + 1);  // train at 1, 2, 4, 6, 8; val at 4, 8; test at 8

  // The finished job again: nothing to do, nothing appended.
  RunResult again = run_megatrain(args, "dup2");
  INFO(again.out << again.err);
  REQUIRE(again.code == 0);
  CHECK_THAT(again.out + again.err, Catch::Contains("training already done"));
  CHECK(read_file(file) == first);

  // A run that went on past its last checkpoint (iteration 4) and died: its records past 4 are
  // replaced by those of the resumed run, the same values (resume is bit-exact).
  fs::remove_all(dir / "ckpt" / "iter_0000008");
  std::ofstream(dir / "ckpt" / "latest", std::ios::trunc) << "iter_0000004\n";
  RunResult resumed = run_megatrain(args, "dup3");
  INFO(resumed.out << resumed.err);
  REQUIRE(resumed.code == 0);
  CHECK_THAT(resumed.out + resumed.err, Catch::Contains("removed 4 record(s) past iteration 4"));
  CHECK(without_timing(metrics_records(file)) == without_timing(records));
}

TEST_CASE("a misspelled subcommand is named with the closest one", "[newcomer][cli]") {
  RunResult r = run_megatrain("trian --config " + tiny_config(), "trian");
  CHECK(r.code != 0);
  CHECK(count_lines(r.err) == 1);
  CHECK_THAT(r.err, Catch::Contains("unknown command 'trian'; did you mean 'train'?"));
  RunResult g = run_megatrain("genrate --prompt x", "genrate");
  CHECK(g.code != 0);
  CHECK_THAT(g.err, Catch::Contains("did you mean 'generate'?"));
  RunResult far = run_megatrain("xyzzy", "xyzzy");
  CHECK(far.code != 0);
  CHECK_THAT(far.err, Catch::Contains("unknown command 'xyzzy' (commands: train, config, plan, generate"));
}
