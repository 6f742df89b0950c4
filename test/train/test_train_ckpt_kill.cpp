// Reliability suite, part 2 (issue #20 item 8): kill -9 during checkpoint saves, synchronous and
// asynchronous. Each run saves every iteration; it is killed the moment a save's temp directory
// appears (or a few ms later). Afterwards the newest complete checkpoint must open and load every
// tensor (checksums verified) and auto-resume must continue from it. Counted and asserted: 0 lost,
// 0 crashes; the counts are printed.
#include <cstdio>

#include "catch.h"
#include "checkpoint/checkpoint.h"
#include "common/run_binary.h"
#include "core/check.h"
#include "train/process.h"

using namespace mt::test;

namespace {

const std::string kTiny = source_path("configs/ci/tiny-llama.yaml");

// A somewhat larger model (about 1.4 M parameters, 17 MB per checkpoint) so that a save takes long
// enough to be hit.
std::string args(const fs::path& dir, bool async, int64_t iters) {
  return "train --config " + kTiny + " --set training.train_iters=" + std::to_string(iters) +
         " --set training.eval_interval=0 --set logging.log_interval=1 --set logging.metrics_file= " +
         "--set model.hidden_size=256 --set model.ffn_hidden_size=512 --set checkpoint.save_interval=1 " +
         "--set checkpoint.async_save=" + (async ? "true" : "false") + " --set checkpoint.dir=" + dir.string();
}

bool has_temp_dir(const fs::path& dir) {
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().find(".tmp-") != std::string::npos) return true;
  return false;
}

// "" when every tensor of the checkpoint loads (sha256 verified), else the error.
std::string load_everything(const std::string& path) {
  try {
    mt::ckpt::LoadedCheckpoint ck = mt::ckpt::open_checkpoint(path);
    for (const auto& [name, t] : ck.manifest.at("tensors").items()) {
      mt::DType dt;
      REQUIRE(mt::dtype_from_name(t.at("dtype").get<std::string>(), &dt));
      const mt::Shape shape = t.at("global_shape").get<mt::Shape>();
      mt::Tensor dst = mt::Tensor::empty(shape, dt);
      mt::ckpt::load_tensor(ck, name, shape, mt::Shape(shape.size(), 0), dst);
    }
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace

TEST_CASE("reliability: kill -9 during synchronous and asynchronous saves never loses the newest complete checkpoint",
          "[e2e][checkpoint][reliability]") {
  const int delays_ms[] = {0, 2, 10, 30};
  int kills[2] = {0, 0}, mid_save[2] = {0, 0}, recovered[2] = {0, 0}, lost = 0;
  for (bool async : {false, true}) {
    for (int delay : delays_ms) {
      INFO((async ? "async" : "sync") << " save, kill " << delay << " ms after its temp directory appeared");
      const fs::path dir = temp_dir() / ("kill_" + std::to_string(async) + "_" + std::to_string(delay));
      const std::string tag = "kill" + std::to_string(async) + std::to_string(delay);
      Proc p = spawn(args(dir, async, 100000), tag);
      // After the first save completed, wait for the next one to start.
      REQUIRE(wait_for(p, p.out, "saved checkpoint"));
      bool started = false;
      for (int i = 0; i < 60000 && !started; ++i) {
        started = has_temp_dir(dir);
        if (!started) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      REQUIRE(started);
      std::this_thread::sleep_for(std::chrono::milliseconds(delay));
      ::kill(p.pid, SIGKILL);
      CHECK(wait_exit(p) == 128 + SIGKILL);
      ++kills[async];
      mid_save[async] += has_temp_dir(dir);

      const auto complete = mt::ckpt::list_complete_checkpoints(dir.string());
      REQUIRE(!complete.empty());
      const std::string newest = complete.back().second;
      const std::string problem = load_everything(newest);
      CHECK(problem == "");
      RunResult r = run_megatrain(args(dir, async, complete.back().first + 1), tag + "_resume");
      const bool ok = problem.empty() && r.code == 0 &&
                      r.out.find("resumed from " + newest + " at iteration") != std::string::npos;
      CHECK(ok);
      recovered[async] += ok;
      lost += !ok;
    }
  }
  std::printf("reliability: kill -9 during saves: sync %d kills (%d inside a save), async %d kills (%d inside a save); "
              "newest complete checkpoint loaded and resumed %d of %d, lost %d\n",
              kills[0], mid_save[0], kills[1], mid_save[1], recovered[0] + recovered[1], kills[0] + kills[1], lost);
  CHECK(lost == 0);
  CHECK(recovered[0] + recovered[1] == kills[0] + kills[1]);
  CHECK(mid_save[0] + mid_save[1] > 0);  // the kills did land inside saves
}
