// Reliability suite, part 1 (issue #20 item 8): every way a checkpoint directory can be damaged is
// either refused with an mt::Error naming a file of the checkpoint (nothing loaded), or, for `latest`,
// recovered by resuming from the newest complete checkpoint. Counted and asserted: all handled,
// none loaded wrong, no crash (an InternalError or any other exception counts as a crash).
#include <cstdio>
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
using nlohmann::json;

namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> w = [] {
    mt::mpi_init(nullptr, nullptr);
    return make_world_communicator();
  }();
  return *w;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void spit(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary | std::ios::trunc) << s; }

// Three tensors of different dtypes and sizes; values depend on the iteration.
SaveRequest request(const std::string& dir, int64_t it) {
  SaveRequest r;
  r.dir = dir;
  r.iteration = it;
  auto add = [&](const std::string& name, Shape shape, DType dt) {
    Tensor t = Tensor::empty(shape, dt);
    const int64_t salt = static_cast<int64_t>(r.tensors.size()) * 13;  // each tensor its own bytes
    for (int64_t i = 0; i < static_cast<int64_t>(t.nbytes()); ++i) static_cast<uint8_t*>(t.raw())[i] = static_cast<uint8_t>(i * 7 + it + salt);
    r.tensors.push_back({name, shape, Shape(shape.size(), 0), t, true});
  };
  add("w", {8, 16}, DType::F32);
  add("w/exp_avg", {8, 16}, DType::F32);
  add("b", {16}, DType::BF16);
  r.state = {{"iteration", it}, {"consumed_train_samples", it * 8}};
  return r;
}

// Opens `path` and reads every tensor, comparing it with what iteration `it` saved. Returns "" when
// everything loaded and matched, "refused: <message>" on an mt::Error, "wrong" when something loaded
// with other values, "crash: <message>" on any other exception.
std::string load_all(const std::string& path, int64_t it) {
  try {
    LoadedCheckpoint ck = open_checkpoint(path);
    const SaveRequest want = request("", it);
    for (const ShardTensor& t : want.tensors) {
      Tensor got = Tensor::empty(t.global_shape, t.data.dtype());
      load_tensor(ck, t.name, t.global_shape, t.offset, got);
      if (std::memcmp(got.raw(), t.data.raw(), t.data.nbytes()) != 0) return "wrong";
    }
    if (ck.iteration != it) return "wrong";
    return "";
  } catch (const InternalError& e) {
    return std::string("crash: ") + e.what();
  } catch (const Error& e) {
    return std::string("refused: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("crash: ") + e.what();
  }
}

void edit_manifest(const fs::path& ck, const std::function<void(json&)>& f, bool fix_sum) {
  json m = json::parse(slurp(ck / "manifest.json"));
  f(m);
  const std::string text = m.dump(1);
  spit(ck / "manifest.json", text);
  if (fix_sum) spit(ck / "DONE", ck.filename().string() + "\nmanifest_sha256 " + sha256_hex(text.data(), text.size()) + "\n");
}

struct Case {
  std::string name;
  std::function<void(const fs::path& dir, const fs::path& newest)> damage;
  bool recover;  // true: auto-resume must still load the newest complete checkpoint (iteration 20)
};

}  // namespace

TEST_CASE("reliability: every checkpoint corruption is refused naming a file, or recovered", "[checkpoint][reliability]") {
  auto flip = [](const fs::path& f, size_t at) {
    std::string b = slurp(f);
    b[at % b.size()] ^= 0x20;
    spit(f, b);
  };
  const std::vector<Case> cases = {
      {"truncated shard", [](auto&, auto& n) { fs::resize_file(n / "shard_r00000.bin", 100); }, false},
      {"shard cut by one byte", [](auto&, auto& n) { fs::resize_file(n / "shard_r00000.bin", fs::file_size(n / "shard_r00000.bin") - 1); }, false},
      {"shard with bytes appended", [](auto&, auto& n) { std::ofstream(n / "shard_r00000.bin", std::ios::app) << "xx"; }, false},
      {"flipped byte in the first tensor", [&](auto&, auto& n) { flip(n / "shard_r00000.bin", 3); }, false},
      {"flipped byte in the second tensor", [&](auto&, auto& n) { flip(n / "shard_r00000.bin", 8 * 16 * 4 + 5); }, false},
      {"flipped byte in the last tensor", [&](auto&, auto& n) { flip(n / "shard_r00000.bin", 8 * 16 * 8 + 31); }, false},
      {"missing shard file", [](auto&, auto& n) { fs::remove(n / "shard_r00000.bin"); }, false},
      {"missing DONE", [](auto&, auto& n) { fs::remove(n / "DONE"); }, false},
      {"empty DONE", [](auto&, auto& n) { spit(n / "DONE", ""); }, false},
      {"DONE with another manifest checksum", [](auto&, auto& n) { spit(n / "DONE", "iter_0000020\nmanifest_sha256 " + std::string(64, 'a') + "\n"); }, false},
      {"missing manifest", [](auto&, auto& n) { fs::remove(n / "manifest.json"); }, false},
      {"truncated manifest", [](auto&, auto& n) { fs::resize_file(n / "manifest.json", 50); }, false},
      {"flipped byte in the manifest", [&](auto&, auto& n) { flip(n / "manifest.json", 200); }, false},
      {"edited state.iteration (checksum kept)", [](auto&, auto& n) { edit_manifest(n, [](json& m) { m["state"]["iteration"] = 19; }, false); }, false},
      {"edited state.iteration (checksum updated)", [](auto&, auto& n) { edit_manifest(n, [](json& m) { m["state"]["iteration"] = 19; }, true); }, false},
      {"edited iteration (checksum updated)", [](auto&, auto& n) { edit_manifest(n, [](json& m) { m["iteration"] = 19; m["state"]["iteration"] = 19; }, true); }, false},
      {"swapped offsets and checksums", [](auto&, auto& n) { edit_manifest(n, [](json& m) {
         auto& a = m["tensors"]["w"]["shards"][0]; auto& b = m["tensors"]["w/exp_avg"]["shards"][0];
         std::swap(a["byte_offset"], b["byte_offset"]); std::swap(a["sha256"], b["sha256"]); }, false); }, false},
      {"swapped offsets (checksum updated)", [](auto&, auto& n) { edit_manifest(n, [](json& m) {
         std::swap(m["tensors"]["w"]["shards"][0]["byte_offset"], m["tensors"]["w/exp_avg"]["shards"][0]["byte_offset"]); }, true); }, false},
      {"overlapping offsets (checksum updated)", [](auto&, auto& n) { edit_manifest(n, [](json& m) {
         m["tensors"]["w/exp_avg"]["shards"][0]["byte_offset"] = 4; }, true); }, false},
      {"changed dtype (checksum updated)", [](auto&, auto& n) { edit_manifest(n, [](json& m) { m["tensors"]["b"]["dtype"] = "fp16"; }, true); }, false},
      {"changed global shape (checksum updated)", [](auto&, auto& n) { edit_manifest(n, [](json& m) {
         m["tensors"]["w"]["global_shape"] = {16, 8}; m["tensors"]["w"]["shards"][0]["shape"] = {16, 8}; }, true); }, false},
      {"missing tensor key (checksum updated)", [](auto&, auto& n) { edit_manifest(n, [](json& m) { m["tensors"]["w"]["shards"][0].erase("sha256"); }, true); }, false},
      {"latest deleted", [](auto& d, auto&) { fs::remove(d / "latest"); }, true},
      {"latest a dangling link", [](auto& d, auto&) { fs::remove(d / "latest"); fs::create_symlink(d / "nowhere", d / "latest"); }, true},
      {"latest names a deleted checkpoint", [](auto& d, auto&) { spit(d / "latest", "iter_0000030\n"); }, true},
      {"latest stale (crash before it was updated)", [](auto& d, auto&) { spit(d / "latest", "iter_0000010\n"); }, true},
      {"latest empty", [](auto& d, auto&) { spit(d / "latest", ""); }, true},
      {"interrupted newer save left behind", [](auto& d, auto&) { fs::create_directories(d / "iter_0000030.tmp-x");
         spit(d / "iter_0000030.tmp-x" / "shard_r00000.bin", "partial"); }, true},
  };
  int handled = 0, wrong = 0, crashes = 0;
  for (const Case& c : cases) {
    INFO(c.name);
    char tmpl[] = "/tmp/mt_test_rel_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    const fs::path dir = tmpl;
    save_checkpoint(request(dir, 10), world());
    const fs::path newest = save_checkpoint(request(dir, 20), world());
    c.damage(dir, newest);
    std::string outcome;
    try {
      const std::string path = resolve_load_path("auto", dir.string());
      outcome = c.recover ? (path == newest.string() ? load_all(path, 20) : "wrong: resolved " + path)
                          : load_all(path.empty() ? newest.string() : path, 20);
    } catch (const InternalError& e) {
      outcome = std::string("crash: ") + e.what();
    } catch (const Error& e) {
      outcome = std::string("refused: ") + e.what();
    }
    UNSCOPED_INFO(c.name << " -> " << (outcome.empty() ? "loaded" : outcome));
    const bool ok = c.recover ? outcome.empty()
                              : outcome.rfind("refused: ", 0) == 0 && outcome.find(dir.string()) != std::string::npos;
    CHECK(ok);
    handled += ok;
    wrong += outcome.rfind("wrong", 0) == 0 || (!c.recover && outcome.empty());
    crashes += outcome.rfind("crash", 0) == 0;
    fs::remove_all(dir);
  }
  std::printf("reliability: checkpoint corruption cases %zu, handled %d (refused naming the file, or resumed from the "
              "newest complete checkpoint), loaded wrong %d, crashes %d\n",
              cases.size(), handled, wrong, crashes);
  CHECK(handled == static_cast<int>(cases.size()));
  CHECK(wrong == 0);
  CHECK(crashes == 0);
}
