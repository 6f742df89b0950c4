// Bridges the model/optimizer state and the sharded checkpoint format: which tensors a rank
// saves (every parameter box it holds: value, exp_avg, exp_avg_sq) and how it restores them.
#pragma once

#include <functional>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "params/param_store.h"
#include "optim/adamw.h"
#include "runtime/parallel_state.h"

namespace mt {

// Model state that is not a parameter (the optimizer never sees it) but a resumed run needs: the MoE routers'
// expert bias (<layer>.mlp.router.expert_bias). 1-D, identical on every rank of its pipeline stage: saved by data
// rank 0 / tensor rank 0, loaded by every rank that holds it.
struct StateBuffer {
  std::string name;
  Tensor* tensor = nullptr;
};

// One tensor box a rank saves: its checkpoint name and place, and `source`, a view of the local tensor
// holding it (on the training device; contiguous).
struct SavedBox {
  std::string name;
  Shape global_shape, offset;
  Tensor source;
  // Defined for the fp32 master weights held as halves (bf16 without the distributed optimizer): source is then the
  // box's high halves (the store's bf16 values) and lo its low halves (U16); what is saved is their join, fp32
  // (joined_to_host, or the snapshot joining on its side stream).
  Tensor lo;
};
// A host fp32 tensor of box b's master weights joined from its halves (b.lo defined), through a device buffer of at
// most kJoinPiece elements when they are on a GPU.
Tensor joined_to_host(const SavedBox& b);
inline constexpr int64_t kJoinPiece = int64_t{16} << 20;
// Box b's master weights (b.lo defined, on a GPU) joined a piece of at most kJoinPiece elements at a time into buf
// (fp32 on their device, min(kJoinPiece, numel) elements or more, launches on the current stream): out(first element,
// piece) after each piece, which must copy it out before the next piece overwrites buf (the same stream, or at once).
void join_box_pieces(const SavedBox& b, const Tensor& buf, const std::function<void(int64_t, const Tensor&)>& out);
// What a rank saves, in shard order: every parameter box it owns (the fp32 master value, exp_avg, exp_avg_sq;
// replicas are written by one rank). `keep` (optional) receives the tensors the moments' views point into (under
// the distributed optimizer fresh buffers gathered over DP): keep them alive while the views are read.
// shapes_only: the parameter boxes' sources are meta tensors of the shapes and dtypes a save writes (no data, no
// gathers, no collectives): for sizing the snapshot's buffers.
std::vector<SavedBox> saved_boxes(ParamStore& store, const AdamW& opt, const ParallelState& ps,
                                  std::vector<Tensor>* keep,
                                  const std::vector<StateBuffer>& buffers = {}, bool shapes_only = false);

// The synchronous save's request: saved_boxes as host tensors (views of host state on the CPU, copies from a
// GPU). Training must not change them until the save returns (checkpoint.async_save: train/checkpoint_snapshot.h).
ckpt::SaveRequest training_save_request(const std::string& dir, int64_t iteration, int keep_last, ParamStore& store,
                                        const AdamW& opt, const ParallelState& ps, const nlohmann::json& state,
                                        const std::string& config_yaml,
                                        const std::vector<StateBuffer>& buffers = {});

std::string save_training_checkpoint(const std::string& dir, int64_t iteration, int keep_last, ParamStore& store,
                                     const AdamW& opt, const ParallelState& ps, const nlohmann::json& state,
                                     const std::string& config_yaml, const std::vector<StateBuffer>& buffers = {});

// The training state a checkpoint records (manifest.json "state"). Throws mt::Error naming the
// manifest and the key when one is missing or of the wrong type.
struct TrainingState {
  int64_t iteration = 0, consumed_train_samples = 0, optimizer_step = 0, skipped_iterations = 0;
};
TrainingState read_training_state(const ckpt::LoadedCheckpoint& ck);

// Refuses a checkpoint whose tensors are not exactly the model's: a parameter of the model that it
// lacks, a tensor that no rank's model has (say num_layers 2 -> 1), or a different model.vocab_size
// (even with the same padded size; allowed when finetuning). mt::Error names the checkpoint and the
// tensor or key. Collective over `world` (every rank calls it).
// (buffers: the state buffers this rank holds; the checkpoint must have them too.)
void check_checkpoint_matches_model(const ckpt::LoadedCheckpoint& ck, const ParamStore& store, int64_t vocab_size,
                                    bool finetune, Communicator& world, const std::vector<StateBuffer>& buffers = {});

// Restores only the parameter values (inference, conversion).
void load_model_weights(const ckpt::LoadedCheckpoint& ck, ParamStore& store);

// Restores values and moments of every local parameter from `ck` (any layout that saved it).
// The state buffers alone (finetuning: with load_model_weights).
void load_state_buffers(const ckpt::LoadedCheckpoint& ck, const std::vector<StateBuffer>& buffers);

// And the state buffers.
void load_training_checkpoint(const ckpt::LoadedCheckpoint& ck, ParamStore& store, AdamW& opt,
                              const std::vector<StateBuffer>& buffers = {});

}  // namespace mt
