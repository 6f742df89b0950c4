// checkpoint.async_save (issue #20 item 7) through the megatrain binary: the same losses and the same
// shard bytes as a synchronous save, and a run stopped after an async save resumes from it
// bit-exactly.
#include "catch.h"
#include "common/run_binary.h"
#include "train/ckpt_run.h"

using namespace mt::test;

namespace {
// The shared checkpointing run (ckpt_run.h).
std::string args(const std::string& name, const std::string& extra = "") { return ckpt_run_args(name, extra); }
std::map<int64_t, StepMetrics> losses(const std::string& name) { return ckpt_run_losses(name); }
}  // namespace

TEST_CASE("async_save writes the same checkpoints as a synchronous save, and resume from one is bit-exact",
          "[e2e][checkpoint][async]") {
  REQUIRE(run_megatrain(args("async_sync"), "async_sync").code == 0);
  RunResult a = run_megatrain(args("async_bg", "--set checkpoint.async_save=true"), "async_bg");
  REQUIRE(a.code == 0);
  CHECK(a.out.find("writing in the background") != std::string::npos);
  auto sync = losses("async_sync"), bg = losses("async_bg");
  REQUIRE(sync.size() == 6);
  for (auto& [it, v] : sync) {
    INFO("iteration " << it);
    CHECK(bg[it] == v);
  }
  for (const char* it : {"iter_0000002", "iter_0000004", "iter_0000006"}) {
    INFO(it);
    const fs::path s = temp_dir() / "async_sync" / "ckpt" / it, b = temp_dir() / "async_bg" / "ckpt" / it;
    REQUIRE(fs::exists(b / "DONE"));
    CHECK(read_file(s / "shard_r00000.bin") == read_file(b / "shard_r00000.bin"));
    CHECK(read_file(s / "shard_r00000.json") == read_file(b / "shard_r00000.json"));
  }
  CHECK(read_file(temp_dir() / "async_bg" / "ckpt" / "latest") == "iter_0000006\n");

  // Stopped at 4 right after an async save (it is committed before the exit), resumed to 6.
  REQUIRE(run_megatrain(args("async_resume", "--set checkpoint.async_save=true --set training.exit_interval=4"),
                        "async_resume_1").code == 0);
  REQUIRE(fs::exists(temp_dir() / "async_resume" / "ckpt" / "iter_0000004" / "DONE"));
  RunResult r = run_megatrain(args("async_resume", "--set checkpoint.async_save=true"), "async_resume_2");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("resumed from " + (temp_dir() / "async_resume" / "ckpt" / "iter_0000004").string()) !=
        std::string::npos);
  auto res = losses("async_resume");
  REQUIRE(res.size() == 6);
  for (auto& [it, v] : sync) {
    INFO("iteration " << it);
    CHECK(res[it] == v);
  }
}

TEST_CASE("an async save that cannot write fails the run at the next sync point, naming the path",
          "[e2e][checkpoint][async]") {
  const fs::path d = temp_dir() / "async_fail";
  fs::create_directories(d);
  std::ofstream(d / "ckpt") << "a file where the checkpoint directory should be";
  RunResult r = run_megatrain(args("async_fail", "--set checkpoint.async_save=true"), "async_fail");
  CHECK(r.code != 0);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find((d / "ckpt").string()) != std::string::npos);
  CHECK(r.err.find("internal error") == std::string::npos);
}
