// Sharded checkpoints (docs/ARCHITECTURE.md):
//   DIR/iter_0000100/                 one complete checkpoint
//       shard_r00000.bin              this rank's slices, raw little-endian, concatenated
//       shard_r00000.json             what shard_r00000.bin holds (written by its rank)
//       manifest.json                 merged by rank 0: global names, shapes, dtypes, the slice each
//                                     shard holds (offset+length per dim), byte offsets, sha256 per
//                                     tensor, the resolved config, the iteration, the training state
//       DONE                          written last
//   DIR/latest                        text: the name of the newest complete checkpoint ("iter_0000100")
// A save writes DIR/iter_0000100.tmp-<nonce>/ first and renames it when every rank is done, then
// updates `latest` (temp file + rename) and deletes the oldest beyond keep_last. A crash at any
// point leaves the previous checkpoint and `latest` intact.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/communicator.h"
#include "tensor/tensor.h"

namespace mt::ckpt {

// One tensor slice held by this rank. The global tensor `name` has shape global_shape; this rank
// holds the box [offset[d], offset[d] + data.shape()[d]) in each dimension d.
// Several ranks may hold the same box (replicas): `owner` marks the one that writes it.
struct ShardTensor {
  std::string name;          // global, e.g. "layers.3.mlp.fc1.weight/exp_avg"
  Shape global_shape;
  Shape offset;              // same rank as global_shape
  Tensor data;               // host tensor (fp32/fp64/bf16/int...), contiguous
  bool owner = true;
};

struct SaveRequest {
  std::string dir;           // checkpoint.dir
  int64_t iteration = 0;
  int keep_last = 0;         // 0 = keep all
  std::vector<ShardTensor> tensors;
  nlohmann::json state;      // training state (iteration, consumed samples, loss scale, ...)
  std::string config_yaml;   // resolved config, stored in the manifest
  // async_save: blocks until the tensors' host data is complete (their device->host copies may still be in
  // flight when the request is made); the writer calls it before reading them. Empty: the data is ready.
  std::function<void()> wait_ready;
};

// Collective over `world`: every rank calls it. Returns the final checkpoint path.
std::string save_checkpoint(const SaveRequest& req, Communicator& world);

// checkpoint.async_save: the same save with phase 2 (each rank writing its shard) on a background
// thread. The constructor (collective) creates the temp directory; the tensors of `req` must be
// host copies that nothing else changes (a snapshot). written() says whether this rank's shard is
// on disk; finish() (collective) waits for it, then agrees and commits (manifest, DONE, rename,
// latest, prune) exactly as save_checkpoint does, throwing the agreed error of any rank. A process
// killed before finish() leaves only a temp directory: the newest complete checkpoint is untouched.
class AsyncSave {
 public:
  AsyncSave(SaveRequest req, Communicator& world);
  ~AsyncSave();  // waits for the thread; never commits
  AsyncSave(const AsyncSave&) = delete;
  AsyncSave& operator=(const AsyncSave&) = delete;
  bool written() const;
  std::string finish();
  int64_t iteration() const { return req_.iteration; }
  // After finish(): seconds the background thread spent waiting for the snapshot's copies, and writing.
  double copy_wait_seconds() const { return copy_wait_s_; }
  double write_seconds() const { return write_s_; }

 private:
  SaveRequest req_;
  Communicator& world_;
  std::string nonce_;
  std::thread thread_;
  mutable std::mutex mu_;
  bool done_ = false;
  int failure_kind_ = 0;
  std::string failure_msg_;
  double copy_wait_s_ = 0, write_s_ = 0;
};

// Resolves checkpoint.load: "auto" -> the newest complete checkpoint in DIR (the one DIR/latest
// names; when latest is missing, dangling or stale the newest complete one still wins, with a
// warning saying why), "" when DIR holds none; "none" -> ""; else PATH (a checkpoint directory, or
// a DIR holding `latest`). Throws mt::Error if an explicit path is not a complete checkpoint (no
// DONE / no manifest), or latest names a checkpoint that is damaged and nothing newer is complete.
std::string resolve_load_path(const std::string& load, const std::string& dir);

// The complete checkpoints in DIR (iter_N directories holding DONE), by iteration, oldest first.
std::vector<std::pair<int64_t, std::string>> list_complete_checkpoints(const std::string& dir);

// A run that starts at start_iteration and saves into DIR must never replace a complete checkpoint:
// throws mt::Error naming it when DIR holds a complete checkpoint of a later iteration.
void refuse_overwrite(const std::string& dir, int64_t start_iteration);

namespace detail {
struct LoadIndex;  // parsed manifest + the shard tensors whose sha256 was verified (checkpoint_load.cpp)
}

struct LoadedCheckpoint {
  std::string path;
  int64_t iteration = 0;
  nlohmann::json state;
  nlohmann::json manifest;
  std::string config_yaml;                    // the resolved config the checkpoint was saved with
  int world_size = 0;                         // ranks that saved it
  std::shared_ptr<detail::LoadIndex> index;   // set by open_checkpoint; shared by copies (thread-safe)
};

// Reads the manifest (validating it). Throws mt::Error naming the file on anything wrong.
LoadedCheckpoint open_checkpoint(const std::string& path);

// Fills `dst` (a host tensor of shape dst_box_shape at `offset` into the global tensor `name`)
// from whichever shards hold that box, verifying sha256 of every shard tensor it reads and the
// global shape. Works for any layout that saved it (resharding). Throws mt::Error naming the
// checkpoint, the tensor and what is wrong.
void load_tensor(const LoadedCheckpoint& ck, const std::string& name, const Shape& global_shape,
                 const Shape& offset, Tensor& dst);

// Whether the checkpoint holds tensor `name` (e.g. optimizer state that an older run did not save).
bool has_tensor(const LoadedCheckpoint& ck, const std::string& name);
// The name of the checkpoint directory of an iteration: "iter_0000100".
std::string checkpoint_dir_name(int64_t iteration);

}  // namespace mt::ckpt
