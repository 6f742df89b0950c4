// save_checkpoint and AsyncSave (checkpoint.h). Three phases, each ending in a collective agreement so that an
// error on any rank becomes the same exception on every rank (no rank left waiting in a barrier):
//   1. rank 0 creates DIR and DIR/iter_N.tmp-<nonce>/, and broadcasts the nonce;
//   2. every rank writes and fsyncs shard_rRRRRR.bin + shard_rRRRRR.json there;
//   3. rank 0 merges the shard JSONs into manifest.json (checking that every tensor's shards tile
//      it exactly once), writes DONE, renames the directory into place, updates `latest` (temp file
//      + rename), then deletes checkpoints beyond keep_last and stale leftovers of earlier saves.
// Until the rename in phase 3 nothing outside the temp directory changes, so a failure or a crash
// leaves the previous checkpoint and `latest` as they were.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "checkpoint/checkpoint.h"
#include "checkpoint/ckpt_util.h"
#include "core/log.h"
#include "core/sha256.h"

namespace mt::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;
using detail::Box;

static_assert(std::endian::native == std::endian::little, "shard files are little-endian raw bytes");

namespace {

constexpr int kShardWriters = 4;  // threads writing one shard file (detail::write_file_durable)

struct Failure {
  int kind = 0;  // 0 none, 1 mt::Error (or any std::exception), 2 mt::InternalError
  std::string msg;
};

template <typename F>
Failure capture(F&& f) {
  try {
    f();
  } catch (const InternalError& e) {
    return {2, e.what()};
  } catch (const std::exception& e) {
    return {1, e.what()};
  }
  return {};
}

// Collective: when any rank failed, every rank throws the error of the lowest failing rank (the
// others prefix it with that rank). Also a barrier.
void agree(Communicator& world, const Failure& f) {
  const int64_t first = world.all_reduce_int(f.kind ? world.rank() : INT_MAX, ReduceOp::Min);
  if (first == INT_MAX) return;
  constexpr size_t kMax = 2048;
  std::vector<uint8_t> buf(kMax, 0);
  if (world.rank() == first) {
    buf[0] = static_cast<uint8_t>(f.kind);
    std::memcpy(buf.data() + 1, f.msg.data(), std::min(f.msg.size(), kMax - 2));
  }
  Tensor t = Tensor::from_blob(buf.data(), {static_cast<int64_t>(kMax)}, DType::U8);
  world.broadcast(t, static_cast<int>(first));
  std::string msg = world.rank() == first ? f.msg
                                          : str_cat("checkpoint save failed on rank ", first, ": ",
                                                    reinterpret_cast<const char*>(buf.data() + 1));
  if (buf[0] == 2) throw InternalError(msg);
  throw Error(msg);
}

std::string make_nonce() {
  std::random_device rd;
  uint64_t v = (uint64_t(rd()) << 32) ^ rd() ^
               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
               (uint64_t(::getpid()) << 17);
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

void create_dirs(const fs::path& p) {
  std::error_code ec;
  fs::create_directories(p, ec);
  MT_CHECK(!ec, "checkpoint: cannot create directory ", p.string(), ": ", ec.message());
}

std::string shard_stem(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "shard_r%05d", rank);
  return buf;
}

// Phase 2 on one rank: validates the owned tensors, hashes them and writes the two shard files.
void write_shard(const SaveRequest& req, int rank, const fs::path& tmp) {
  std::vector<const ShardTensor*> own;
  for (const ShardTensor& t : req.tensors) {
    if (!t.owner) continue;
    MT_INTERNAL_ASSERT(!t.name.empty(), "checkpoint tensor without a name");
    MT_INTERNAL_ASSERT(t.data.defined() && t.data.device() == Device::CPU, "checkpoint tensor '", t.name,
                       "' must be a defined host tensor");
    MT_INTERNAL_ASSERT(t.offset.size() == t.global_shape.size() && t.data.shape().size() == t.global_shape.size(),
                       "checkpoint tensor '", t.name, "': offset ", shape_str(t.offset), " and data ", t.data.str(),
                       " do not match global shape ", shape_str(t.global_shape));
    own.push_back(&t);
  }
  std::vector<std::string> sums(own.size());
#pragma omp parallel for schedule(dynamic)
  for (size_t i = 0; i < own.size(); ++i) {
    const Tensor& d = own[i]->data;
    sums[i] = sha256_hex(d.nbytes() ? d.raw() : nullptr, d.nbytes());
  }
  const std::string stem = shard_stem(rank);
  json entries = json::array();
  std::vector<detail::Chunk> chunks;
  uint64_t pos = 0;
  for (size_t i = 0; i < own.size(); ++i) {
    const ShardTensor& t = *own[i];
    const uint64_t n = t.data.nbytes();
    entries.push_back({{"name", t.name},
                       {"dtype", dtype_name(t.data.dtype())},
                       {"global_shape", t.global_shape},
                       {"offset", t.offset},
                       {"shape", t.data.shape()},
                       {"byte_offset", pos},
                       {"bytes", n},
                       {"sha256", sums[i]}});
    if (n) chunks.push_back({t.data.raw(), n});
    pos += n;
  }
  // Four write streams: one stream of the GPU machine's disk flushed 0.9 GB/s, four 1.9 GB/s (ckpt_util.h).
  detail::write_file_durable((tmp / (stem + ".bin")).string(), chunks, kShardWriters);
  json meta = {{"rank", rank}, {"iteration", req.iteration}, {"bin_bytes", pos}, {"tensors", std::move(entries)}};
  detail::write_file_durable((tmp / (stem + ".json")).string(), meta.dump(1));
}

// Phase 3, rank 0: the manifest from the shard JSONs of all ranks.
json merge_manifest(const SaveRequest& req, int world_size, const fs::path& tmp) {
  json tensors = json::object();
  json files = json::object();
  for (int r = 0; r < world_size; ++r) {
    const std::string stem = shard_stem(r);
    const std::string path = (tmp / (stem + ".json")).string();
    json meta;
    try {
      meta = json::parse(detail::read_text_file(path));
    } catch (const json::exception& e) {
      throw Error(str_cat("checkpoint: ", path, " is not valid JSON: ", e.what()));
    }
    for (const json& e : meta.at("tensors")) {
      const std::string name = e.at("name").get<std::string>();
      json& t = tensors[name];
      if (t.is_null()) {
        t = {{"dtype", e.at("dtype")}, {"global_shape", e.at("global_shape")}, {"shards", json::array()}};
      }
      MT_INTERNAL_ASSERT(t["dtype"] == e.at("dtype") && t["global_shape"] == e.at("global_shape"), "checkpoint tensor '",
                         name, "' is saved as ", t["dtype"].get<std::string>(), t["global_shape"].dump(), " and as ",
                         e.at("dtype").get<std::string>(), e.at("global_shape").dump(), " (rank ", r, ")");
      t["shards"].push_back({{"file", stem + ".bin"},
                             {"offset", e.at("offset")},
                             {"shape", e.at("shape")},
                             {"byte_offset", e.at("byte_offset")},
                             {"bytes", e.at("bytes")},
                             {"sha256", e.at("sha256")}});
    }
    if (!meta.at("tensors").empty()) files[stem + ".bin"] = meta.at("bin_bytes");
  }
  // Every tensor's shards must tile its global shape exactly once: a gap or an overlap means the
  // caller marked owners wrongly (a bug, not bad input).
  for (auto& [name, t] : tensors.items()) {
    Box domain{Shape(t["global_shape"].size(), 0), t["global_shape"].get<Shape>()};
    std::vector<Box> boxes;
    for (const json& s : t["shards"]) boxes.push_back({s["offset"].get<Shape>(), s["shape"].get<Shape>()});
    std::string problem = detail::tiling_problem(domain, boxes);
    MT_INTERNAL_ASSERT(problem.empty(), "checkpoint tensor '", name, "' global shape ",
                       shape_str(domain.len), ": ", problem);
  }
  return {{"format", "megatrain-checkpoint"},
          {"version", 2},
          {"iteration", req.iteration},
          {"world_size", world_size},
          {"state", req.state},
          {"config_yaml", req.config_yaml},
          {"files", std::move(files)},
          {"tensors", std::move(tensors)}};
}

// Moves tmp to final. When final exists (a re-save of the same iteration) the two are swapped
// atomically where the filesystem allows it (renameat2 RENAME_EXCHANGE), else the old one is moved
// aside first; either way the old copy ends under a leftover name and is deleted afterwards.
void move_into_place(const fs::path& tmp, const fs::path& final_path, const std::string& nonce) {
  std::error_code ec;
  if (!fs::exists(final_path, ec)) {
    if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
      throw Error(str_cat("checkpoint: renaming ", tmp.string(), " to ", final_path.string(),
                          " failed: ", detail::errno_text(errno)));
    }
    return;
  }
#ifdef RENAME_EXCHANGE
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) == 0) {
    detail::remove_tree_quiet(tmp.string());  // now holds the old checkpoint
    return;
  }
#endif
  const fs::path aside = final_path.string() + ".old-" + nonce;
  if (::rename(final_path.c_str(), aside.c_str()) != 0) {
    throw Error(str_cat("checkpoint: moving the old ", final_path.string(), " aside failed: ",
                        detail::errno_text(errno)));
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    int err = errno;
    if (::rename(aside.c_str(), final_path.c_str()) != 0) {
      log::error("checkpoint: could not move {} back to {}", aside.string(), final_path.string());
    }
    throw Error(str_cat("checkpoint: renaming ", tmp.string(), " to ", final_path.string(),
                        " failed: ", detail::errno_text(err)));
  }
  detail::remove_tree_quiet(aside.string());
}

// After `latest` names the new checkpoint: deletes the oldest complete checkpoints beyond
// keep_last (never the new one or a newer one) and leftovers of interrupted or replaced saves up to
// this iteration. Problems here only warn: the new checkpoint is already safe.
void prune(const fs::path& dir, int64_t iteration, int keep_last, const std::string& nonce) {
  std::error_code ec;
  std::vector<std::pair<int64_t, fs::path>> complete;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    int64_t it = 0;
    if (detail::parse_iter_dir_name(name, &it)) {
      if (fs::exists(entry.path() / "DONE", ec)) complete.emplace_back(it, entry.path());
    } else if (detail::parse_leftover_dir_name(name, &it) && it <= iteration) {
      detail::remove_tree_quiet(entry.path().string());
    } else if (name.rfind("latest.tmp-", 0) == 0) {
      fs::remove(entry.path(), ec);
    }
  }
  if (ec) log::warn("checkpoint: listing {} to delete old checkpoints failed: {}", dir.string(), ec.message());
  if (keep_last <= 0) return;
  std::sort(complete.begin(), complete.end());
  size_t excess = complete.size() > static_cast<size_t>(keep_last) ? complete.size() - keep_last : 0;
  for (size_t i = 0; i < excess && complete[i].first < iteration; ++i) {
    // Renamed first, so that a crash mid-delete never leaves a complete-looking, half-deleted one.
    const fs::path doomed = complete[i].second.string() + ".old-" + nonce;
    if (::rename(complete[i].second.c_str(), doomed.c_str()) != 0) {
      log::warn("checkpoint: could not delete old checkpoint {}: {}", complete[i].second.string(),
                detail::errno_text(errno));
      continue;
    }
    detail::remove_tree_quiet(doomed.string());
  }
}

}  // namespace

std::string checkpoint_dir_name(int64_t iteration) { return detail::iter_dir_name(iteration); }

namespace {

// Phase 1 (collective): rank 0 makes DIR and the temp directory; returns the nonce.
std::string begin_save(const SaveRequest& req, Communicator& world) {
  MT_CHECK(!req.dir.empty(), "checkpoint.dir is empty: set checkpoint.dir to save checkpoints");
  MT_INTERNAL_ASSERT(req.iteration >= 0, "checkpoint iteration ", req.iteration);
  const std::string name = detail::iter_dir_name(req.iteration);
  std::vector<uint8_t> nonce_buf(16, 0);
  agree(world, capture([&] {
          if (world.rank() != 0) return;
          const std::string nonce = make_nonce();
          std::memcpy(nonce_buf.data(), nonce.data(), 16);
          create_dirs(fs::path(req.dir) / (name + ".tmp-" + nonce));
        }));
  Tensor nt = Tensor::from_blob(nonce_buf.data(), {16}, DType::U8);
  world.broadcast(nt, 0);
  return std::string(reinterpret_cast<const char*>(nonce_buf.data()), 16);
}

fs::path temp_path(const SaveRequest& req, const std::string& nonce) {
  return fs::path(req.dir) / (detail::iter_dir_name(req.iteration) + ".tmp-" + nonce);
}

// Phase 2 (local, any thread): this rank's shard. (create_dirs is a no-op on a shared filesystem;
// without one the merge reports the missing shard files.)
Failure write_phase(const SaveRequest& req, int rank, const std::string& nonce) {
  return capture([&] {
    const fs::path tmp = temp_path(req, nonce);
    create_dirs(tmp);
    write_shard(req, rank, tmp);
  });
}

// Phase 3 (collective): agree on phase 2, then rank 0 commits.
std::string commit_save(const SaveRequest& req, Communicator& world, const std::string& nonce, const Failure& written) {
  const int rank = world.rank();
  const fs::path dir = req.dir;
  const std::string name = detail::iter_dir_name(req.iteration);
  const fs::path final_path = dir / name;
  const fs::path tmp = temp_path(req, nonce);
  try {
    agree(world, written);
  } catch (...) {
    if (rank == 0) detail::remove_tree_quiet(tmp.string());
    throw;
  }
  bool renamed = false;
  Failure f = capture([&] {
    if (rank != 0) return;
    const std::string manifest = merge_manifest(req, world.size(), tmp).dump(1);
    detail::write_file_durable((tmp / "manifest.json").string(), manifest);
    // DONE holds the manifest's checksum: load refuses an edited or damaged manifest.
    detail::write_file_durable((tmp / "DONE").string(),
                               str_cat(name, "\nmanifest_sha256 ", sha256_hex(manifest.data(), manifest.size()), "\n"));
    detail::fsync_dir(tmp.string());
    move_into_place(tmp, final_path, nonce);
    renamed = true;
    detail::fsync_dir(dir.string());
    const fs::path latest_tmp = dir / ("latest.tmp-" + nonce);
    detail::write_file_durable(latest_tmp.string(), name + "\n");
    if (::rename(latest_tmp.c_str(), (dir / "latest").c_str()) != 0) {
      throw Error(str_cat("checkpoint: renaming ", latest_tmp.string(), " to ", (dir / "latest").string(),
                          " failed: ", detail::errno_text(errno)));
    }
    detail::fsync_dir(dir.string());
    prune(dir, req.iteration, req.keep_last, nonce);
  });
  try {
    agree(world, f);
  } catch (...) {
    if (rank == 0 && !renamed) detail::remove_tree_quiet(tmp.string());
    throw;
  }
  return final_path.string();
}

}  // namespace

std::string save_checkpoint(const SaveRequest& req, Communicator& world) {
  const std::string nonce = begin_save(req, world);
  Failure ready = capture([&] {
    if (req.wait_ready) req.wait_ready();
  });
  return commit_save(req, world, nonce, ready.kind ? ready : write_phase(req, world.rank(), nonce));
}

AsyncSave::AsyncSave(SaveRequest req, Communicator& world) : req_(std::move(req)), world_(world) {
  nonce_ = begin_save(req_, world_);
  thread_ = std::thread([this] {
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    Failure f = capture([&] {
      if (req_.wait_ready) req_.wait_ready();
    });
    const auto t1 = Clock::now();
    if (!f.kind) f = write_phase(req_, world_.rank(), nonce_);
    const auto t2 = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    copy_wait_s_ = std::chrono::duration<double>(t1 - t0).count();
    write_s_ = std::chrono::duration<double>(t2 - t1).count();
    failure_kind_ = f.kind;
    failure_msg_ = std::move(f.msg);
    done_ = true;
  });
}

AsyncSave::~AsyncSave() {
  if (thread_.joinable()) thread_.join();
}

bool AsyncSave::written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

std::string AsyncSave::finish() {
  MT_INTERNAL_ASSERT(thread_.joinable(), "AsyncSave::finish called twice");
  thread_.join();
  return commit_save(req_, world_, nonce_, Failure{failure_kind_, failure_msg_});
}

}  // namespace mt::ckpt
