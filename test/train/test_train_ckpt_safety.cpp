// Issue #20 through the megatrain binary: a run never overwrites a complete checkpoint. With
// DIR/latest deleted, dangling or stale, auto-resume continues from the newest complete checkpoint
// (bit-exact, and it says so); a run that would start below a complete checkpoint is refused
// without touching anything.
#include "catch.h"
#include "common/run_binary.h"
#include "train/ckpt_run.h"

using namespace mt::test;

namespace {
// The shared checkpointing run (ckpt_run.h).
std::string args(const std::string& name, const std::string& extra = "") { return ckpt_run_args(name, extra); }
std::map<int64_t, StepMetrics> losses(const std::string& name) { return ckpt_run_losses(name); }
}  // namespace

TEST_CASE("auto-resume with latest missing, dangling or stale continues from the newest complete checkpoint",
          "[e2e][checkpoint][safety]") {
  static std::map<int64_t, StepMetrics> ref;
  if (ref.empty()) {
    REQUIRE(run_megatrain(args("safety_ref"), "safety_ref").code == 0);
    ref = losses("safety_ref");
    REQUIRE(ref.size() == 6);
  }
  std::string name, what;
  SECTION("deleted") { name = "safety_deleted"; }
  SECTION("dangling link") { name = "safety_dangling"; }
  SECTION("stale: a crash between renaming iter_0000004 and updating latest") { name = "safety_stale"; }
  const fs::path ck = temp_dir() / name / "ckpt";
  REQUIRE(run_megatrain(args(name, "--set training.exit_interval=4"), name + "_1").code == 0);
  REQUIRE(fs::exists(ck / "iter_0000004" / "DONE"));
  const std::string before = fingerprint(ck / "iter_0000004");
  fs::remove(ck / "latest");
  if (name == "safety_dangling") fs::create_symlink(ck / "iter_0000009", ck / "latest");
  if (name == "safety_stale") std::ofstream(ck / "latest") << "iter_0000002\n";
  RunResult r = run_megatrain(args(name), name + "_2");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("resuming from " + (ck / "iter_0000004").string()) != std::string::npos);
  CHECK(r.out.find("resumed from " + (ck / "iter_0000004").string() + " at iteration 4") != std::string::npos);
  auto got = losses(name);
  REQUIRE(got.size() == 6);
  for (int64_t it = 1; it <= 6; ++it) {
    INFO("iteration " << it);
    CHECK(got[it] == ref[it]);  // 5 and 6 continue bit-exactly
  }
  CHECK(fingerprint(ck / "iter_0000004") == before);
  CHECK(read_file(ck / "latest") == "iter_0000006\n");
}

TEST_CASE("a run that would overwrite a complete checkpoint is refused and touches nothing", "[e2e][checkpoint][safety]") {
  const fs::path ck = temp_dir() / "safety_refuse" / "ckpt";
  REQUIRE(run_megatrain(args("safety_refuse", "--set training.train_iters=2"), "safety_refuse_1").code == 0);
  const std::string before = fingerprint(ck);
  for (const std::string extra : {"--set checkpoint.load=none", "--set checkpoint.load=none --set checkpoint.keep_last=1"}) {
    RunResult r = run_megatrain(args("safety_refuse", extra), "safety_refuse_2");
    CHECK(r.code != 0);
    CHECK(count_lines(r.err) == 1);
    CHECK(r.err.find((ck / "iter_0000002").string()) != std::string::npos);
    CHECK(r.err.find("checkpoint.load: auto") != std::string::npos);
    CHECK(fingerprint(ck) == before);
  }
}
