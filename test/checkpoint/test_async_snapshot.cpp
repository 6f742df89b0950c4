// checkpoint.async_save's snapshot (train/checkpoint_snapshot.h): the checkpoint an async save writes while
// training goes on equals, bit for bit, a synchronous save of the same iteration. The writer is held back until
// the optimizer has stepped on (so a snapshot that aliased the live weights or moments would write the newer
// values), and the host buffers are reused by a second save.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "optim/adamw.h"
#include "params/param_store.h"
#include "runtime/mpi_communicator.h"
#include "test/catch.h"
#include "train/checkpoint_snapshot.h"
#include "train/train_checkpoint.h"

using namespace mt;
namespace fs = std::filesystem;

namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> w = [] {
    mt::mpi_init(nullptr, nullptr);
    return make_world_communicator();
  }();
  return *w;
}

std::string slurp(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

struct Training {
  ParamStore store{0, 1};
  ParallelState ps;
  OptimizerConfig cfg;
  std::unique_ptr<AdamW> opt;
  uint32_t rng = 12345;
  explicit Training(DType dtype = DType::F32) {
    ParamSpec w;
    w.name = "layers.0.w";
    w.global_shape = {6, 5};
    store.add(w);
    ParamSpec b;
    b.name = "layers.0.b";
    b.global_shape = {7};
    store.add(b);
    store.allocate(dtype, Device::CPU);
    float* v = store.flat_master().data<float>();
    for (int64_t i = 0; i < store.flat_master().numel(); ++i) v[i] = next();
    store.sync_values_from_master(0, store.padded_numel());
    ps.world = &world();
    opt = std::make_unique<AdamW>(store, cfg, ps, false);
    opt->take_master();  // (bf16: the master weights as halves; the save joins them)
  }
  // the weights as the model reads them, as bytes
  std::string values() {
    const Tensor& v = store.flat_values();
    return {static_cast<const char*>(v.raw()), v.nbytes()};
  }
  float next() {
    rng = rng * 1664525u + 1013904223u;
    return static_cast<float>((rng >> 8) & 0xffff) / 65536.0f - 0.5f;
  }
  void step() {
    float* g = store.flat_grads().data<float>();
    double sq = 0;
    for (int64_t i = 0; i < store.flat_grads().numel(); ++i) {
      g[i] = next();
      sq += static_cast<double>(g[i]) * g[i];
    }
    opt->step(1e-2, 1.0, std::sqrt(sq));
  }
};

nlohmann::json state(int64_t it) { return {{"iteration", it}, {"consumed_train_samples", it}, {"optimizer_step", it}}; }

void check_same(const fs::path& a, const fs::path& b) {
  REQUIRE(fs::exists(b / "DONE"));
  CHECK(slurp(a / "shard_r00000.bin") == slurp(b / "shard_r00000.bin"));
  CHECK(slurp(a / "shard_r00000.json") == slurp(b / "shard_r00000.json"));
  CHECK(slurp(a / "manifest.json") == slurp(b / "manifest.json"));
}

}  // namespace

TEST_CASE("async save: a snapshot written while training steps on equals a synchronous save bit for bit",
          "[checkpoint][async]") {
  char tmpl[] = "/tmp/mt_test_snapshot_XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const fs::path tmp = tmpl;
  for (const DType dtype : {DType::F32, DType::BF16}) {  // bf16: the master weights held as halves (SavedBox::lo)
    INFO("dtype " << dtype_name(dtype));
    const fs::path dir = tmp / dtype_name(dtype);
    Training t(dtype);
    CheckpointSnapshot snap;
    const size_t reserved = snap.reserve(t.store, *t.opt, t.ps);  // (from the shapes alone)
    CHECK(reserved >= size_t(3 * (30 + 7) * 4));
    for (int64_t it = 1; it <= 2; ++it) t.step();

    for (int64_t it : {2, 5}) {  // the second save reuses the host buffers
      INFO("iteration " << it);
      const std::string sync_path =
          save_training_checkpoint((dir / "sync").string(), it, 0, t.store, *t.opt, t.ps, state(it), "model: {}\n");
      ckpt::SaveRequest req =
          snap.take((dir / "async").string(), it, 0, t.store, *t.opt, t.ps, state(it), "model: {}\n");
      CHECK(snap.bytes() == reserved);  // the reservation was not too small (take would have grown it)
      // Hold the writer until training has changed every saved value (weights and both moments).
      std::promise<void> stepped;
      std::shared_future<void> go = stepped.get_future().share();
      auto inner = req.wait_ready;
      req.wait_ready = [go, inner] {
        go.wait();
        if (inner) inner();
      };
      ckpt::AsyncSave save(std::move(req), world());
      const std::string before = t.values();
      for (int k = 0; k < 3; ++k) {
        snap.before_update();
        t.step();
      }
      CHECK(t.values() != before);
      stepped.set_value();
      const std::string path = save.finish();
      CHECK(fs::path(path).filename() == fs::path(sync_path).filename());
      check_same(sync_path, path);
      // And the checkpoint is not the current state (the test would pass vacuously if the steps changed nothing).
      const std::string now =
          save_training_checkpoint((dir / "now").string(), it, 0, t.store, *t.opt, t.ps, state(it), "model: {}\n");
      CHECK(slurp(fs::path(now) / "shard_r00000.bin") != slurp(fs::path(path) / "shard_r00000.bin"));
    }
  }
  fs::remove_all(tmp);
}
