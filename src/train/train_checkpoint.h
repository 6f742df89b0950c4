// Bridges the model/optimizer state and the sharded checkpoint format: which tensors a rank
// saves (every parameter box it holds: value, exp_avg, exp_avg_sq) and how it restores them.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "params/param_store.h"
#include "optim/adamw.h"
#include "runtime/parallel_state.h"

namespace mt {

// One tensor box a rank saves: its checkpoint name and place, and `source`, a view of the local tensor
// holding it (on the training device; contiguous).
struct SavedBox {
  std::string name;
  Shape global_shape, offset;
  Tensor source;
};
// What a rank saves, in shard order: every parameter box it owns (the fp32 master value, exp_avg, exp_avg_sq;
// replicas are written by one rank). `keep` (optional) receives the tensors the moments' views point into (under
// the distributed optimizer fresh buffers gathered over DP): keep them alive while the views are read.
std::vector<SavedBox> saved_boxes(ParamStore& store, const AdamW& opt, const ParallelState& ps,
                                  std::vector<Tensor>* keep);

// The synchronous save's request: saved_boxes as host tensors (views of host state on the CPU, copies from a
// GPU). Training must not change them until the save returns (checkpoint.async_save: train/checkpoint_snapshot.h).
ckpt::SaveRequest training_save_request(const std::string& dir, int64_t iteration, int keep_last, ParamStore& store,
                                        const AdamW& opt, const ParallelState& ps, const nlohmann::json& state,
                                        const std::string& config_yaml);

std::string save_training_checkpoint(const std::string& dir, int64_t iteration, int keep_last, ParamStore& store,
                                     const AdamW& opt, const ParallelState& ps, const nlohmann::json& state,
                                     const std::string& config_yaml);

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
void check_checkpoint_matches_model(const ckpt::LoadedCheckpoint& ck, const ParamStore& store, int64_t vocab_size,
                                    bool finetune, Communicator& world);

// Restores only the parameter values (inference, conversion).
void load_model_weights(const ckpt::LoadedCheckpoint& ck, ParamStore& store);

// Restores values and moments of every local parameter from `ck` (any layout that saved it).
void load_training_checkpoint(const ckpt::LoadedCheckpoint& ck, ParamStore& store, AdamW& opt);

}  // namespace mt
