// Sharded checkpoints from one process (a world of one): round trip of every dtype with the training
// state, resharding (boxes saved one way, loaded another), the tiling check, keep_last, `latest`,
// interrupted and failed saves, and every corruption load must name.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/check.h"
#include "core/sha256.h"
#include "runtime/mpi_communicator.h"
#include "test/catch.h"

using namespace mt;
using namespace mt::ckpt;
namespace fs = std::filesystem;

namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> w = [] {
    mt::mpi_init(nullptr, nullptr);
    return make_world_communicator();
  }();
  return *w;
}

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/mt_test_ckpt_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& s) const { return path + "/" + s; }
};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void spit(const std::string& path, const std::string& s) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << s;
}

template <typename T, typename F>
Tensor make(const Shape& shape, F f) {
  Tensor t = Tensor::empty(shape, dtype_of<T>);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = f(i);
  return t;
}

ShardTensor whole(const std::string& name, const Tensor& t) { return {name, t.shape(), Shape(t.dim(), 0), t, true}; }

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

SaveRequest simple_request(const std::string& dir, int64_t iteration, float base, int keep_last = 0) {
  SaveRequest r;
  r.dir = dir;
  r.iteration = iteration;
  r.keep_last = keep_last;
  r.tensors.push_back(whole("w", make<float>({3, 4}, [&](int64_t i) { return base + float(i); })));
  r.state = {{"iteration", iteration}};
  return r;
}

float load_first(const std::string& path) {
  LoadedCheckpoint ck = open_checkpoint(path);
  Tensor t = Tensor::empty({3, 4}, DType::F32);
  load_tensor(ck, "w", {3, 4}, {0, 0}, t);
  return t.data<float>()[0];
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("checkpoint round trip: fp32, fp64, int64, bf16, a scalar, state and config", "[checkpoint]") {
  TempDir tmp;
  const std::string dir = tmp / "run/ckpt";  // created by the save
  SaveRequest req;
  req.dir = dir;
  req.iteration = 10;
  Tensor f32 = make<float>({3, 5}, [](int64_t i) { return 0.5f * float(i) - 3.f; });
  Tensor f64 = make<double>({4}, [](int64_t i) { return 1e300 / double(i + 1); });
  Tensor i64 = make<int64_t>({2, 2, 2}, [](int64_t i) { return (int64_t(1) << 40) + i; });
  Tensor b16 = make<bf16>({7, 3}, [](int64_t i) { return bf16(float(i) / 7.f); });
  Tensor scalar = make<float>({}, [](int64_t) { return 42.f; });
  req.tensors = {whole("embedding.weight", f32), whole("layers.0.norm/exp_avg", f64), whole("step_counts", i64),
                 whole("layers.0.attn.qkv.weight", b16), whole("loss_scale", scalar)};
  req.state = {{"iteration", 10}, {"consumed_samples", 640}, {"rng", {1, 2, 3}}};
  req.config_yaml = "model:\n  num_layers: 2\n";
  const std::string path = save_checkpoint(req, world());
  CHECK(path == dir + "/iter_0000010");
  CHECK(slurp(dir + "/latest") == "iter_0000010\n");
  CHECK(entries(dir) == std::vector<std::string>{"iter_0000010", "latest"});
  CHECK(entries(path) == std::vector<std::string>{"DONE", "manifest.json", "shard_r00000.bin", "shard_r00000.json"});
  CHECK(resolve_load_path("auto", dir) == path);
  CHECK(resolve_load_path(path, "elsewhere") == path);
  CHECK(resolve_load_path(dir, "") == path);  // a checkpoint.dir holding `latest`
  CHECK(resolve_load_path("none", dir) == "");

  LoadedCheckpoint ck = open_checkpoint(path);
  CHECK(ck.iteration == 10);
  CHECK(ck.world_size == 1);
  CHECK(ck.state == req.state);
  CHECK(ck.config_yaml == req.config_yaml);
  CHECK(ck.manifest["format"] == "megatrain-checkpoint");
  CHECK(ck.manifest["version"] == 2);
  CHECK(ck.manifest["tensors"]["embedding.weight"]["shards"].size() == 1);
  CHECK(ck.manifest["tensors"]["embedding.weight"]["dtype"] == "fp32");
  CHECK(has_tensor(ck, "step_counts"));
  CHECK_FALSE(has_tensor(ck, "step_count"));
  for (const ShardTensor& s : req.tensors) {
    Tensor out = Tensor::zeros(s.data.shape(), s.data.dtype());
    load_tensor(ck, s.name, s.global_shape, s.offset, out);
    CHECK(same_bytes(out, s.data));
  }

  Tensor out = Tensor::zeros({3, 5}, DType::F32);
  CHECK_THROWS_WITH(load_tensor(ck, "embedding.weight", {3, 6}, {0, 0}, out),
                    "checkpoint " + path + ": tensor 'embedding.weight' has global shape [3, 5], the model expects [3, 6]");
  Tensor wrong = Tensor::zeros({3, 5}, DType::BF16);
  CHECK_THROWS_WITH(load_tensor(ck, "embedding.weight", {3, 5}, {0, 0}, wrong),
                    Catch::Contains("is fp32, the model expects bf16"));
  CHECK_THROWS_WITH(load_tensor(ck, "embeding.weight", {3, 5}, {0, 0}, out),
                    Catch::Contains("has no tensor 'embeding.weight'") && Catch::Contains("'embedding.weight'"));
}

TEST_CASE("resharding: a tensor saved as 4 boxes loads as any other box", "[checkpoint]") {
  TempDir tmp;
  const Shape g{8, 6};
  auto val = [](int64_t r, int64_t c) { return float(r * 100 + c); };
  auto box = [&](int64_t r0, int64_t c0, int64_t nr, int64_t nc) {
    Tensor t = Tensor::empty({nr, nc}, DType::F32);
    for (int64_t r = 0; r < nr; ++r)
      for (int64_t c = 0; c < nc; ++c) t.data<float>()[r * nc + c] = val(r0 + r, c0 + c);
    return ShardTensor{"fc1.weight", g, {r0, c0}, t, true};
  };
  SaveRequest req;
  req.dir = tmp.path;
  req.iteration = 3;
  // An uneven tiling (as if TP split the columns differently in each pipeline half), plus a
  // replica that is not the owner (never written).
  req.tensors = {box(0, 0, 4, 3), box(0, 3, 4, 3), box(4, 0, 4, 2), box(4, 2, 4, 4)};
  ShardTensor replica = box(0, 0, 4, 3);
  replica.owner = false;
  req.tensors.push_back(replica);
  const std::string path = save_checkpoint(req, world());
  LoadedCheckpoint ck = open_checkpoint(path);
  CHECK(ck.manifest["tensors"]["fc1.weight"]["shards"].size() == 4);

  const std::vector<std::pair<Shape, Shape>> wants = {
      {{0, 0}, {8, 6}},  // the whole
      {{2, 0}, {4, 6}},  // a row slice crossing the row border
      {{0, 1}, {8, 3}},  // a column slice crossing both column borders
      {{3, 2}, {2, 2}},  // a block touching all four boxes
      {{5, 5}, {1, 1}},  // one element
  };
  for (const auto& [off, shape] : wants) {
    CAPTURE(shape_str(off), shape_str(shape));
    Tensor out = Tensor::zeros(shape, DType::F32);
    load_tensor(ck, "fc1.weight", g, off, out);
    bool ok = true;
    for (int64_t r = 0; r < shape[0]; ++r)
      for (int64_t c = 0; c < shape[1]; ++c) ok = ok && out.data<float>()[r * shape[1] + c] == val(off[0] + r, off[1] + c);
    CHECK(ok);
  }
}

TEST_CASE("the tiling check refuses overlapping or missing shards, and the failed save changes nothing",
          "[checkpoint]") {
  TempDir tmp;
  const std::string good = save_checkpoint(simple_request(tmp.path, 1, 0.f), world());
  auto part = [](int64_t r0, int64_t nr) {
    return ShardTensor{"w", {4, 2}, {r0, 0}, Tensor::zeros({nr, 2}, DType::F32), true};
  };
  SaveRequest overlap;
  overlap.dir = tmp.path;
  overlap.iteration = 2;
  overlap.tensors = {part(0, 3), part(2, 2)};
  CHECK_THROWS_AS(save_checkpoint(overlap, world()), InternalError);
  CHECK_THROWS_WITH(save_checkpoint(overlap, world()), Catch::Contains("'w'") && Catch::Contains("overlap"));
  SaveRequest gap = overlap;
  gap.tensors = {part(0, 1), part(2, 2)};
  CHECK_THROWS_WITH(save_checkpoint(gap, world()), Catch::Contains("gap"));
  SaveRequest dtypes = overlap;
  dtypes.tensors = {part(0, 2), {"w", {4, 2}, {2, 0}, Tensor::zeros({2, 2}, DType::F64), true}};
  CHECK_THROWS_AS(save_checkpoint(dtypes, world()), InternalError);
  // Nothing of the failed saves is left; latest still names the good one.
  CHECK(entries(tmp.path) == std::vector<std::string>{"iter_0000001", "latest"});
  CHECK(resolve_load_path("auto", tmp.path) == good);
}

TEST_CASE("keep_last deletes the oldest, latest follows the newest", "[checkpoint]") {
  TempDir tmp;
  for (int64_t it : {100, 200, 300}) {
    save_checkpoint(simple_request(tmp.path, it, float(it), 2), world());
    CHECK(slurp(tmp / "latest") == checkpoint_dir_name(it) + "\n");
  }
  CHECK(entries(tmp.path) == std::vector<std::string>{"iter_0000200", "iter_0000300", "latest"});
  CHECK(load_first(resolve_load_path("auto", tmp.path)) == 300.f);
  // keep_last = 0 keeps everything.
  save_checkpoint(simple_request(tmp.path, 400, 400.f, 0), world());
  CHECK(entries(tmp.path).size() == 4);
}

TEST_CASE("an interrupted save leaves the previous checkpoint in charge; the next save cleans up", "[checkpoint]") {
  TempDir tmp;
  const std::string prev = save_checkpoint(simple_request(tmp.path, 5, 5.f), world());
  // A save of iteration 6 that died after writing part of its shard: never renamed.
  fs::create_directories(tmp / "iter_0000006.tmp-abc");
  spit(tmp / "iter_0000006.tmp-abc/shard_r00000.bin", "partial");
  CHECK(slurp(tmp / "latest") == "iter_0000005\n");
  CHECK(resolve_load_path("auto", tmp.path) == prev);
  CHECK(load_first(prev) == 5.f);
  // Loading the leftover on purpose says what it is.
  CHECK_THROWS_WITH(resolve_load_path(tmp / "iter_0000006.tmp-abc", ""), Catch::Contains("is incomplete (no DONE marker)"));
  // The next save removes leftovers of iterations up to its own, but not newer ones.
  fs::create_directories(tmp / "iter_0000009.tmp-def");
  save_checkpoint(simple_request(tmp.path, 7, 7.f), world());
  CHECK(entries(tmp.path) ==
        std::vector<std::string>{"iter_0000005", "iter_0000007", "iter_0000009.tmp-def", "latest"});
}

TEST_CASE("a checkpoint without DONE is refused with the message", "[checkpoint]") {
  TempDir tmp;
  const std::string path = save_checkpoint(simple_request(tmp.path, 1, 1.f), world());
  fs::remove(path + "/DONE");
  const std::string msg = "checkpoint " + path +
                          " is incomplete (no DONE marker): it was interrupted while saving; use the previous one or "
                          "checkpoint.load: none";
  CHECK_THROWS_WITH(open_checkpoint(path), msg);
  CHECK_THROWS_WITH(resolve_load_path(path, ""), msg);
  CHECK_THROWS_WITH(resolve_load_path("auto", tmp.path), msg);
}

TEST_CASE("a flipped bit is a checksum mismatch naming the file and the tensor", "[checkpoint]") {
  TempDir tmp;
  const std::string path = save_checkpoint(simple_request(tmp.path, 1, 1.f), world());
  const std::string bin = path + "/shard_r00000.bin";
  // Each shard tensor is verified once per opened checkpoint: a handle that already read it does
  // not hash it again.
  LoadedCheckpoint early = open_checkpoint(path);
  Tensor t = Tensor::empty({3, 4}, DType::F32);
  load_tensor(early, "w", {3, 4}, {0, 0}, t);
  std::string bytes = slurp(bin);
  bytes[13] ^= 0x04;
  spit(bin, bytes);
  CHECK_NOTHROW(load_tensor(early, "w", {3, 4}, {0, 0}, t));
  LoadedCheckpoint ck = open_checkpoint(path);  // the size is right: only reading finds it
  CHECK_THROWS_WITH(load_tensor(ck, "w", {3, 4}, {0, 0}, t),
                    Catch::Contains("checksum mismatch") && Catch::Contains(bin) && Catch::Contains("'w'"));
  // A slice of it too (the whole shard tensor is verified before any of it is used).
  Tensor row = Tensor::empty({1, 4}, DType::F32);
  CHECK_THROWS_WITH(load_tensor(ck, "w", {3, 4}, {2, 0}, row), Catch::Contains("checksum mismatch"));
}

TEST_CASE("a truncated or missing shard file is named", "[checkpoint]") {
  TempDir tmp;
  const std::string path = save_checkpoint(simple_request(tmp.path, 1, 1.f), world());
  const std::string bin = path + "/shard_r00000.bin";
  fs::resize_file(bin, 40);
  CHECK_THROWS_WITH(open_checkpoint(path), Catch::Contains(bin) && Catch::Contains("truncated"));
  fs::remove(bin);
  CHECK_THROWS_WITH(open_checkpoint(path), Catch::Contains(bin) && Catch::Contains("missing"));
  spit(path + "/manifest.json", "{\"format\": \"megatrain-checkpoint\", ");
  CHECK_THROWS_WITH(open_checkpoint(path), Catch::Contains(path + "/manifest.json") && Catch::Contains("not valid JSON"));
}

TEST_CASE("resolve_load_path: no checkpoint is a fresh start, a dangling latest with nothing complete is an error",
          "[checkpoint]") {
  TempDir tmp;
  CHECK(resolve_load_path("auto", tmp.path) == "");
  CHECK(resolve_load_path("auto", tmp / "not_yet_created") == "");
  spit(tmp / "latest", "iter_0000042\n");
  CHECK_THROWS_WITH(resolve_load_path("auto", tmp.path),
                    Catch::Contains("names iter_0000042") && Catch::Contains("does not exist"));
  CHECK_THROWS_WITH(resolve_load_path(tmp / "nowhere", ""), Catch::Contains("does not exist"));
}

// Issue #20: with latest missing, dangling or stale, auto-resume must still find the newest complete
// checkpoint (a fresh start would overwrite it).
TEST_CASE("auto-resume finds the newest complete checkpoint when latest is missing, dangling or stale",
          "[checkpoint][safety]") {
  TempDir tmp;
  save_checkpoint(simple_request(tmp.path, 10, 10.f), world());
  const std::string newest = save_checkpoint(simple_request(tmp.path, 20, 20.f), world());
  // An incomplete, newer one (interrupted before its DONE) never counts.
  fs::create_directories(tmp / "iter_0000030.tmp-abc");
  SECTION("latest deleted") { fs::remove(tmp / "latest"); }
  SECTION("latest a dangling link") {
    fs::remove(tmp / "latest");
    fs::create_symlink(tmp / "gone", tmp / "latest");
  }
  SECTION("latest names a deleted checkpoint") { spit(tmp / "latest", "iter_0000025\n"); }
  SECTION("crash between the rename and latest: latest names the previous one") { spit(tmp / "latest", "iter_0000010\n"); }
  SECTION("latest empty") { spit(tmp / "latest", ""); }
  CHECK(resolve_load_path("auto", tmp.path) == newest);
  CHECK(load_first(resolve_load_path("auto", tmp.path)) == 20.f);
  // The first checkpoint of a run renamed into place, latest never written.
  TempDir first;
  const std::string only = save_checkpoint(simple_request(first.path, 5, 5.f), world());
  fs::remove(first / "latest");
  CHECK(resolve_load_path("auto", first.path) == only);
}

TEST_CASE("a newer checkpoint that latest names but lacks DONE is refused, not skipped", "[checkpoint][safety]") {
  TempDir tmp;
  save_checkpoint(simple_request(tmp.path, 10, 10.f), world());
  const std::string p20 = save_checkpoint(simple_request(tmp.path, 20, 20.f), world());
  fs::remove(p20 + "/DONE");
  CHECK_THROWS_WITH(resolve_load_path("auto", tmp.path), Catch::Contains(p20) && Catch::Contains("no DONE marker"));
}

TEST_CASE("refuse_overwrite: a run never starts below a complete checkpoint of its checkpoint.dir",
          "[checkpoint][safety]") {
  TempDir tmp;
  CHECK_NOTHROW(refuse_overwrite(tmp.path, 0));
  CHECK_NOTHROW(refuse_overwrite(tmp / "absent", 0));
  const std::string p = save_checkpoint(simple_request(tmp.path, 20, 20.f), world());
  CHECK_NOTHROW(refuse_overwrite(tmp.path, 20));
  CHECK_NOTHROW(refuse_overwrite(tmp.path, 30));
  CHECK_THROWS_WITH(refuse_overwrite(tmp.path, 0), Catch::Contains(p) && Catch::Contains("checkpoint.load: auto"));
  CHECK_THROWS_WITH(refuse_overwrite(tmp.path, 10), Catch::Contains("iteration 20"));
  // Incomplete directories are not checkpoints.
  fs::remove(p + "/DONE");
  CHECK_NOTHROW(refuse_overwrite(tmp.path, 0));
}

TEST_CASE("keep_last never deletes the checkpoint just saved or a newer one", "[checkpoint][safety]") {
  TempDir tmp;
  for (int64_t it : {10, 20, 30}) save_checkpoint(simple_request(tmp.path, it, float(it)), world());
  save_checkpoint(simple_request(tmp.path, 15, 15.f, 1), world());  // keep_last 1, but 20 and 30 are newer
  CHECK(entries(tmp.path) == std::vector<std::string>{"iter_0000015", "iter_0000020", "iter_0000030", "latest"});
}

TEST_CASE("a re-save of the same iteration replaces it", "[checkpoint]") {
  TempDir tmp;
  const std::string a = save_checkpoint(simple_request(tmp.path, 8, 1.f), world());
  LoadedCheckpoint before = open_checkpoint(a);
  const std::string b = save_checkpoint(simple_request(tmp.path, 8, 2.f), world());
  CHECK(a == b);
  CHECK(load_first(b) == 2.f);
  // A handle opened on the replaced checkpoint notices that the files changed under it.
  Tensor t = Tensor::empty({3, 4}, DType::F32);
  CHECK_THROWS_WITH(load_tensor(before, "w", {3, 4}, {0, 0}, t), Catch::Contains("checksum mismatch"));
  CHECK(entries(tmp.path) == std::vector<std::string>{"iter_0000008", "latest"});
  CHECK(slurp(tmp / "latest") == "iter_0000008\n");
}

TEST_CASE("a save that cannot write is an error naming the path and leaves latest alone", "[checkpoint]") {
  TempDir tmp;
  const std::string good = save_checkpoint(simple_request(tmp.path, 1, 1.f), world());
  spit(tmp / "blocker", "a file where a directory should be");
  CHECK_THROWS_WITH(save_checkpoint(simple_request(tmp / "blocker/ckpt", 2, 2.f), world()),
                    Catch::Contains(tmp / "blocker/ckpt"));
  CHECK_THROWS_AS(save_checkpoint(simple_request(tmp / "blocker/ckpt", 2, 2.f), world()), Error);
  // A shard that is not on the host or has a mismatched shape is a bug of the caller.
  SaveRequest bad = simple_request(tmp.path, 2, 2.f);
  bad.tensors[0].offset = {0};
  CHECK_THROWS_AS(save_checkpoint(bad, world()), InternalError);
  CHECK(entries(tmp.path) == std::vector<std::string>{"blocker", "iter_0000001", "latest"});
  CHECK(resolve_load_path("auto", tmp.path) == good);
}

namespace {
// A checkpoint with two same-size tensors "a" (all 1) and "b" (all 2), and its manifest rewritten by
// `edit` with DONE's manifest checksum either kept (the edit is caught by it) or updated to match
// (the cross-checks must catch it on their own).
std::string edited_checkpoint(const TempDir& tmp, const std::function<void(nlohmann::json&)>& edit, bool fix_sum) {
  SaveRequest r;
  r.dir = tmp.path;
  r.iteration = 3;
  r.tensors.push_back(whole("a", make<float>({2, 2}, [](int64_t) { return 1.f; })));
  r.tensors.push_back(whole("b", make<float>({2, 2}, [](int64_t) { return 2.f; })));
  r.state = {{"iteration", 3}};
  const std::string path = save_checkpoint(r, world());
  nlohmann::json m = nlohmann::json::parse(slurp(path + "/manifest.json"));
  edit(m);
  const std::string text = m.dump(1);
  spit(path + "/manifest.json", text);
  if (fix_sum) spit(path + "/DONE", "iter_0000003\nmanifest_sha256 " + sha256_hex(text.data(), text.size()) + "\n");
  return path;
}
}  // namespace

TEST_CASE("the manifest is checksummed in DONE and cross-checked: edits are refused before anything loads",
          "[checkpoint][integrity]") {
  auto swap_field = [](const char* field) {
    return [field](nlohmann::json& m) {
      std::swap(m["tensors"]["a"]["shards"][0][field], m["tensors"]["b"]["shards"][0][field]);
    };
  };
  for (bool fix_sum : {false, true}) {
    INFO("DONE's checksum updated: " << fix_sum);
    {
      TempDir tmp;
      const std::string p = edited_checkpoint(tmp, [](nlohmann::json& m) { m["state"]["iteration"] = 2; }, fix_sum);
      CHECK_THROWS_WITH(open_checkpoint(p), Catch::Contains(p + "/manifest.json") &&
                                                Catch::Contains(fix_sum ? "state.iteration" : "manifest_sha256"));
    }
    {
      TempDir tmp;
      const std::string p = edited_checkpoint(
          tmp, [](nlohmann::json& m) { m["iteration"] = 4, m["state"]["iteration"] = 4; }, fix_sum);
      CHECK_THROWS_WITH(open_checkpoint(p), Catch::Contains(fix_sum ? "directory name" : "manifest_sha256"));
    }
    {
      TempDir tmp;
      const std::string p = edited_checkpoint(
          tmp, [](nlohmann::json& m) { m["tensors"]["b"]["shards"][0]["byte_offset"] = 8; }, fix_sum);
      CHECK_THROWS_WITH(open_checkpoint(p), Catch::Contains(fix_sum ? "overlaps" : "manifest_sha256"));
    }
  }
  // Offsets and checksums swapped together: every shard still hashes right, only DONE's manifest
  // checksum tells that "a" would load "b"'s values.
  TempDir tmp;
  const std::string p = edited_checkpoint(
      tmp,
      [&](nlohmann::json& m) {
        swap_field("byte_offset")(m);
        swap_field("sha256")(m);
      },
      false);
  CHECK_THROWS_WITH(open_checkpoint(p), Catch::Contains("manifest_sha256") && Catch::Contains(p + "/DONE"));
  // Offsets alone swapped, checksum fixed: the per-tensor checksum refuses the read.
  TempDir tmp2;
  const std::string p2 = edited_checkpoint(tmp2, swap_field("byte_offset"), true);
  LoadedCheckpoint ck = open_checkpoint(p2);
  Tensor t = Tensor::empty({2, 2}, DType::F32);
  CHECK_THROWS_WITH(load_tensor(ck, "a", {2, 2}, {0, 0}, t), Catch::Contains("checksum mismatch") && Catch::Contains("'a'"));
  // DONE without the checksum line (an old-format DONE) on a version 2 manifest.
  TempDir tmp3;
  const std::string p3 = edited_checkpoint(tmp3, [](nlohmann::json&) {}, false);
  spit(p3 + "/DONE", "iter_0000003\n");
  CHECK_THROWS_WITH(open_checkpoint(p3), Catch::Contains("records no manifest_sha256"));
}

TEST_CASE("AsyncSave: the snapshot is written in the background and committed by finish()", "[checkpoint][async]") {
  TempDir tmp;
  save_checkpoint(simple_request(tmp.path, 1, 1.f), world());
  SaveRequest req = simple_request(tmp.path, 2, 2.f);
  {
    AsyncSave save(req, world());
    // Until finish() nothing outside the temp directory changes.
    CHECK(slurp(tmp / "latest") == "iter_0000001\n");
    CHECK(!fs::exists(tmp / "iter_0000002"));
    CHECK(save.finish() == tmp / "iter_0000002");
  }
  CHECK(slurp(tmp / "latest") == "iter_0000002\n");
  CHECK(load_first(tmp / "iter_0000002") == 2.f);
  // An error on the writing thread comes out of finish() and leaves nothing behind.
  SaveRequest bad = simple_request(tmp.path, 3, 3.f);
  bad.tensors[0].offset = {0};
  AsyncSave failing(bad, world());
  CHECK_THROWS_AS(failing.finish(), InternalError);
  CHECK(entries(tmp.path) == std::vector<std::string>{"iter_0000001", "iter_0000002", "latest"});
  // A process that dies before finish() (the destructor never commits) leaves latest alone.
  { AsyncSave abandoned(simple_request(tmp.path, 4, 4.f), world()); }
  CHECK(slurp(tmp / "latest") == "iter_0000002\n");
  CHECK(!fs::exists(tmp / "iter_0000004"));
  CHECK(resolve_load_path("auto", tmp.path) == tmp / "iter_0000002");
}
