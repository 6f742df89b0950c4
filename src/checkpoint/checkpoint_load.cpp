// resolve_load_path, open_checkpoint, load_tensor (checkpoint.h). open_checkpoint validates the
// whole manifest once and indexes it; load_tensor copies the intersection of the requested box with
// every shard that holds part of it (so any saved TP/PP/DP layout loads into any other), reading the
// shard files through read-only mappings and checking each shard tensor's sha256 the first time it
// is read in this process.
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>

#include "checkpoint/checkpoint.h"
#include "checkpoint/ckpt_util.h"
#include "core/edit_distance.h"
#include "core/log.h"
#include "core/sha256.h"

namespace mt::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;
using detail::Box;

namespace detail {

struct ShardRef {
  std::string file;  // name inside the checkpoint directory
  Box box;
  uint64_t byte_offset = 0, bytes = 0;
  std::string sha256;
};

struct TensorRef {
  DType dtype = DType::F32;
  Shape global_shape;
  std::vector<ShardRef> shards;
};

struct LoadIndex {
  std::unordered_map<std::string, TensorRef> tensors;
  std::mutex mu;
  std::set<std::pair<std::string, uint64_t>> verified;  // (file, byte_offset) whose sha256 matched
};

}  // namespace detail

namespace {

const char* kIncomplete = " is incomplete (no DONE marker): it was interrupted while saving; use the previous one or "
                          "checkpoint.load: none";

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}
bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

void require_complete(const fs::path& p) {
  MT_CHECK(is_dir(p), "checkpoint ", p.string(), " does not exist or is not a directory");
  MT_CHECK(is_file(p / "DONE"), "checkpoint ", p.string(), kIncomplete);
  MT_CHECK(is_file(p / "manifest.json"), "checkpoint ", p.string(), " has no manifest.json (not a megatrain checkpoint?)");
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// The checkpoint that DIR/latest names; it must exist and be complete.
std::string follow_latest(const fs::path& dir) {
  const fs::path latest = dir / "latest";
  const std::string name = trim(detail::read_text_file(latest.string()));
  MT_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "." && name != "..",
           "checkpoint: ", latest.string(), " should hold the name of a checkpoint directory (like iter_0000100), it holds '",
           name, "'");
  const fs::path target = dir / name;
  MT_CHECK(is_dir(target), "checkpoint: ", latest.string(), " names ", name, ", but ", target.string(),
           " does not exist (deleted?); set checkpoint.load to another checkpoint, or to none to start fresh");
  require_complete(target);
  return target.string();
}

std::string similar_names(const detail::LoadIndex& idx, const std::string& name) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const auto& [n, t] : idx.tensors) scored.emplace_back(edit_distance(name, n), n);
  std::sort(scored.begin(), scored.end());
  std::string out;
  for (size_t i = 0; i < scored.size() && i < 4; ++i) out += str_cat(i ? ", '" : "'", scored[i].second, "'");
  return out.empty() ? "it holds no tensors" : "closest: " + out;
}

Shape shape_field(const json& j, const char* key, size_t rank) {
  Shape s = j.at(key).get<Shape>();
  if (s.size() != rank) throw Error(str_cat("'", key, "' ", shape_str(s), " has rank ", s.size(), ", expected ", rank));
  for (int64_t v : s) {
    if (v < 0) throw Error(str_cat("'", key, "' ", shape_str(s), " is negative"));
  }
  return s;
}

// Parses and checks the manifest's tensors into idx; returns the bytes each shard file must hold.
std::map<std::string, uint64_t> index_manifest(const json& m, detail::LoadIndex* idx) {
  std::map<std::string, uint64_t> need;
  for (const auto& [name, t] : m.at("tensors").items()) {
    try {
      detail::TensorRef ref;
      const std::string dt = t.at("dtype").get<std::string>();
      if (!dtype_from_name(dt, &ref.dtype)) throw Error(str_cat("unknown dtype '", dt, "'"));
      ref.global_shape = t.at("global_shape").get<Shape>();
      const size_t rank = ref.global_shape.size();
      shape_field(t, "global_shape", rank);
      const Box domain{Shape(rank, 0), ref.global_shape};
      for (const json& s : t.at("shards")) {
        detail::ShardRef sh;
        sh.file = s.at("file").get<std::string>();
        if (sh.file.empty() || sh.file.find('/') != std::string::npos) throw Error(str_cat("bad file name '", sh.file, "'"));
        sh.box = {shape_field(s, "offset", rank), shape_field(s, "shape", rank)};
        sh.byte_offset = s.at("byte_offset").get<uint64_t>();
        sh.bytes = s.at("bytes").get<uint64_t>();
        sh.sha256 = s.at("sha256").get<std::string>();
        if (sh.bytes != static_cast<uint64_t>(detail::box_volume(sh.box)) * dtype_size(ref.dtype)) {
          throw Error(str_cat("shard ", detail::box_str(sh.box), " in ", sh.file, " has ", sh.bytes, " bytes, a ", dt,
                              " box of that shape has ", detail::box_volume(sh.box) * dtype_size(ref.dtype)));
        }
        Box inside;
        if (detail::box_volume(sh.box) > 0 && (!detail::box_intersect(sh.box, domain, &inside) || inside.len != sh.box.len)) {
          throw Error(str_cat("shard ", detail::box_str(sh.box), " lies outside the global shape ", shape_str(ref.global_shape)));
        }
        uint64_t& n = need[sh.file];
        n = std::max(n, sh.byte_offset + sh.bytes);
        ref.shards.push_back(std::move(sh));
      }
      idx->tensors.emplace(name, std::move(ref));
    } catch (const std::exception& e) {
      throw Error(str_cat("tensor '", name, "': ", e.what()));
    }
  }
  return need;
}

}  // namespace

std::vector<std::pair<int64_t, std::string>> list_complete_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    int64_t it = 0;
    if (detail::parse_iter_dir_name(entry.path().filename().string(), &it) && is_dir(entry.path()) &&
        is_file(entry.path() / "DONE"))
      out.emplace_back(it, entry.path().string());
  }
  MT_CHECK(!ec, "checkpoint: cannot list ", dir, ": ", ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

namespace {
// checkpoint.load: auto. The newest complete checkpoint in DIR, which is normally the one DIR/latest
// names. When latest is missing, dangling or stale (a crash between renaming a checkpoint into place
// and updating latest, or a deleted file) the newest complete checkpoint still wins, with a warning
// saying why: starting fresh there would overwrite complete checkpoints.
std::string resolve_auto(const fs::path& dir) {
  const auto complete = list_complete_checkpoints(dir.string());
  const fs::path latest = dir / "latest";
  std::error_code ec;
  const bool latest_present = fs::exists(fs::symlink_status(latest, ec));
  if (complete.empty()) {
    // Nothing complete to resume from: a latest that names something is still an error (the user
    // must decide), an empty DIR is a fresh start.
    if (latest_present) return follow_latest(dir);
    return "";
  }
  const std::string& newest = complete.back().second;
  const std::string newest_name = fs::path(newest).filename().string();
  std::string why;
  if (!latest_present) {
    why = str_cat(latest.string(), " is missing");
  } else if (!is_file(latest)) {
    why = str_cat(latest.string(), " is a dangling link or not a file");
  } else {
    std::string named;
    try {
      named = trim(detail::read_text_file(latest.string()));
    } catch (const Error& e) {
      why = e.what();
    }
    if (why.empty()) {
      if (named == newest_name) return newest;
      const fs::path target = dir / named;
      int64_t it = 0;
      if (!named.empty() && named.find('/') == std::string::npos && is_dir(target) && !is_file(target / "DONE") &&
          detail::parse_iter_dir_name(named, &it) && it > complete.back().first)
        require_complete(target);  // a newer, damaged checkpoint: refuse rather than silently go back
      why = named.empty()       ? str_cat(latest.string(), " is empty")
            : !is_dir(target) ? str_cat(latest.string(), " names '", named, "', which does not exist")
                            : str_cat(latest.string(), " names ", named, ", but ", newest_name,
                                      " is newer and complete (a crash before latest was updated?)");
    }
  }
  log::warn("checkpoint: resuming from {}, the newest complete checkpoint in {}: {}", newest, dir.string(), why);
  return newest;
}
}  // namespace

std::string resolve_load_path(const std::string& load, const std::string& dir) {
  if (load == "none" || load.empty()) return "";
  if (load == "auto") {
    if (dir.empty()) return "";
    return resolve_auto(dir);
  }
  const fs::path p = load;
  MT_CHECK(is_dir(p), "checkpoint.load: ", load, " does not exist or is not a directory");
  // A checkpoint directory itself, or a checkpoint.dir holding `latest`.
  if (!fs::exists(p / "manifest.json") && !fs::exists(p / "DONE") && fs::exists(p / "latest")) return follow_latest(p);
  require_complete(p);
  return p.string();
}

void refuse_overwrite(const std::string& dir, int64_t start_iteration) {
  const auto complete = list_complete_checkpoints(dir);
  if (complete.empty() || complete.back().first <= start_iteration) return;
  throw Error(str_cat("checkpoint.dir ", dir, " holds the complete checkpoint ", complete.back().second,
                      " (iteration ", complete.back().first, "), newer than this run's start at iteration ",
                      start_iteration, ", which later saves would overwrite: set checkpoint.load: auto (and "
                      "checkpoint.finetune: false) to resume from it, or choose another checkpoint.dir"));
}

namespace {
// The manifest checksum that DONE records ("manifest_sha256 <hex>" on its second line), "" if none.
std::string done_manifest_sha256(const std::string& done_path) {
  const std::string text = detail::read_text_file(done_path);
  const std::string key = "\nmanifest_sha256 ";
  const size_t at = text.find(key);
  if (at == std::string::npos) return "";
  return trim(text.substr(at + key.size(), 64));
}

// The shard tensors of each file must lie inside it without overlapping; with the file's size
// recorded, they must fill it exactly (a swapped or shifted byte_offset shows up here).
void check_file_layout(const detail::LoadIndex& idx, const json& files) {
  std::map<std::string, std::vector<std::tuple<uint64_t, uint64_t, std::string>>> ranges;
  for (const auto& [name, t] : idx.tensors)
    for (const detail::ShardRef& s : t.shards)
      if (s.bytes) ranges[s.file].emplace_back(s.byte_offset, s.bytes, name);
  for (auto& [file, r] : ranges) {
    std::sort(r.begin(), r.end());
    uint64_t end = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      const auto& [off, len, name] = r[i];
      if (off < end)
        throw Error(str_cat("tensor '", name, "' at byte ", off, " of ", file, " overlaps tensor '",
                            std::get<2>(r[i - 1]), "' (which ends at byte ", end, ")"));
      if (files.contains(file) && off != end)
        throw Error(str_cat("tensor '", name, "' starts at byte ", off, " of ", file, ", the previous one ends at ", end));
      end = off + len;
    }
    if (files.contains(file) && end != files[file].get<uint64_t>())
      throw Error(str_cat("the tensors of ", file, " end at byte ", end, ", the file should hold ", files[file].get<uint64_t>()));
  }
}
}  // namespace

LoadedCheckpoint open_checkpoint(const std::string& path) {
  require_complete(path);
  const std::string mpath = (fs::path(path) / "manifest.json").string();
  const std::string done_path = (fs::path(path) / "DONE").string();
  const std::string mtext = detail::read_text_file(mpath);
  const std::string want_sha = done_manifest_sha256(done_path);
  json m;
  try {
    m = json::parse(mtext);
  } catch (const json::exception& e) {
    throw Error(str_cat("checkpoint ", path, ": ", mpath, " is not valid JSON: ", e.what()));
  }
  MT_CHECK(m.is_object() && m.value("format", "") == "megatrain-checkpoint", "checkpoint ", path, ": ", mpath,
           " is not a megatrain checkpoint manifest (no format: megatrain-checkpoint)");
  LoadedCheckpoint ck;
  ck.path = path;
  ck.index = std::make_shared<detail::LoadIndex>();
  std::map<std::string, uint64_t> need;
  try {
    const int version = m.at("version").get<int>();
    MT_CHECK(version == 1 || version == 2, "format version ", version,
             " is not supported (this megatrain reads versions 1 and 2; ",
             version > 2 ? "it was written by a newer megatrain)" : "unknown version)");
    // Version 2 records the manifest's checksum in DONE (version 1, older megatrains, did not).
    if (version >= 2) {
      MT_CHECK(!want_sha.empty(), "format version 2, but ", done_path,
               " records no manifest_sha256 (DONE was edited or replaced)");
      MT_CHECK(sha256_hex(mtext.data(), mtext.size()) == want_sha,
               "its checksum does not match the manifest_sha256 that ", done_path,
               " records: the manifest was edited or is corrupt; load another checkpoint");
    }
    ck.iteration = m.at("iteration").get<int64_t>();
    ck.world_size = m.at("world_size").get<int>();
    ck.state = m.value("state", json());
    ck.config_yaml = m.value("config_yaml", std::string());
    // The iteration agrees with the directory name and the training state.
    int64_t dir_it = 0;
    fs::path norm = fs::path(path).lexically_normal();
    if (norm.filename().empty()) norm = norm.parent_path();  // a trailing '/'
    if (detail::parse_iter_dir_name(norm.filename().string(), &dir_it))
      MT_CHECK(dir_it == ck.iteration, "'iteration' ", ck.iteration, " does not match the directory name (iteration ",
               dir_it, ")");
    if (ck.state.is_object() && ck.state.contains("iteration"))
      MT_CHECK(ck.state["iteration"] == m["iteration"], "'state.iteration' ", ck.state["iteration"].dump(),
               " does not match 'iteration' ", ck.iteration);
    need = index_manifest(m, ck.index.get());
    check_file_layout(*ck.index, m.value("files", json::object()));
  } catch (const std::exception& e) {
    throw Error(str_cat("checkpoint ", path, ": ", mpath, " is malformed: ", e.what()));
  }
  // Every shard file is there with the size the manifest records (or at least the bytes it needs).
  const json files = m.value("files", json::object());
  for (const auto& [file, bytes] : need) {
    const std::string fpath = (fs::path(path) / file).string();
    struct stat st {};
    MT_CHECK(::stat(fpath.c_str(), &st) == 0, "checkpoint ", path, ": shard file ", fpath, " is missing: ",
             detail::errno_text(errno));
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    const uint64_t expect = files.contains(file) ? files[file].get<uint64_t>() : bytes;
    MT_CHECK(size >= expect, "checkpoint ", path, ": shard file ", fpath, " is truncated: it has ", size,
             " bytes, the manifest needs ", expect);
    MT_CHECK(size == expect || !files.contains(file), "checkpoint ", path, ": shard file ", fpath, " has ", size,
             " bytes, the manifest says ", expect, " (overwritten by something else?)");
  }
  ck.manifest = std::move(m);
  return ck;
}

bool has_tensor(const LoadedCheckpoint& ck, const std::string& name) {
  MT_INTERNAL_ASSERT(ck.index != nullptr, "LoadedCheckpoint ", ck.path, " was not made by open_checkpoint");
  return ck.index->tensors.count(name) > 0;
}

void load_tensor(const LoadedCheckpoint& ck, const std::string& name, const Shape& global_shape,
                 const Shape& offset, Tensor& dst) {
  MT_INTERNAL_ASSERT(ck.index != nullptr, "LoadedCheckpoint ", ck.path, " was not made by open_checkpoint");
  detail::LoadIndex& idx = *ck.index;
  auto it = idx.tensors.find(name);
  MT_CHECK(it != idx.tensors.end(), "checkpoint ", ck.path, " has no tensor '", name, "' (", similar_names(idx, name),
           ")");
  const detail::TensorRef& t = it->second;
  MT_CHECK(t.global_shape == global_shape, "checkpoint ", ck.path, ": tensor '", name, "' has global shape ",
           shape_str(t.global_shape), ", the model expects ", shape_str(global_shape));
  MT_CHECK(t.dtype == dst.dtype(), "checkpoint ", ck.path, ": tensor '", name, "' is ", dtype_name(t.dtype),
           ", the model expects ", dtype_name(dst.dtype()));
  MT_INTERNAL_ASSERT(dst.defined() && dst.device() == Device::CPU, "load_tensor '", name, "' needs a host tensor");
  const Box want{offset, dst.shape()};
  const Box domain{Shape(global_shape.size(), 0), global_shape};
  Box inside;
  MT_INTERNAL_ASSERT(offset.size() == global_shape.size() && dst.shape().size() == global_shape.size() &&
                         (dst.numel() == 0 || (detail::box_intersect(want, domain, &inside) && inside.len == want.len)),
                     "load_tensor '", name, "': ", detail::box_str(want), " is not inside ", shape_str(global_shape));
  if (dst.numel() == 0) return;

  // The shards holding part of the box must cover it exactly once.
  std::vector<std::pair<const detail::ShardRef*, Box>> parts;
  std::vector<Box> regions;
  for (const detail::ShardRef& s : t.shards) {
    Box region;
    if (detail::box_intersect(s.box, want, &region)) {
      parts.emplace_back(&s, region);
      regions.push_back(region);
    }
  }
  const std::string problem = detail::tiling_problem(want, regions);
  MT_CHECK(problem.empty(), "checkpoint ", ck.path, ": tensor '", name, "': the saved shards do not cover the requested ",
           detail::box_str(want), " exactly: ", problem);

  const size_t elem = dtype_size(t.dtype);
  for (const auto& [s, region] : parts) {
    const std::string fpath = (fs::path(ck.path) / s->file).string();
    detail::MappedRange map(fpath, s->byte_offset, s->bytes);
    const auto key = std::make_pair(s->file, s->byte_offset);
    bool verified;
    {
      std::lock_guard<std::mutex> lock(idx.mu);
      verified = idx.verified.count(key) > 0;
    }
    if (!verified) {
      Sha256 h;
      h.update(map.data(), map.size());
      MT_CHECK(h.finish_hex() == s->sha256, "checkpoint ", ck.path, ": checksum mismatch in shard file ", fpath,
               " for tensor '", name, "' (", detail::box_str(s->box),
               "): the file is corrupt; load another checkpoint");
      std::lock_guard<std::mutex> lock(idx.mu);
      idx.verified.insert(key);
    }
    detail::copy_box(map.data(), s->box, dst.raw(), want, region, elem);
  }
}

}  // namespace mt::ckpt
