// Hugging Face interop and checkpoint inspection (`megatrain convert import|export`,
// `megatrain checkpoint inspect`). Both directions apply the mapping tables of
// checkpoint/hf_mapping.h to the model built on the CPU in fp32 on one rank, and write their output
// into a temporary folder renamed into place at the end: on any error nothing is left behind.
//
// An import writes OUT/ as a checkpoint.dir (OUT/latest -> iter_0000000: the weights, zero Adam
// moments, iteration 0) that `checkpoint.load: OUT` reads under any parallel layout, plus
//   OUT/model.yaml   a complete config whose model section reproduces the HF model (checkpoint.load:
//                    OUT with checkpoint.finetune: true)
//   OUT/hf/          the HF side files: config.json, generation_config.json, tokenizer files
//                    (tokenizer.json is named by model.yaml's data.tokenizer_file)
#pragma once

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/gpt_model.h"
#include "runtime/communicator.h"

namespace mt {

struct ImportOptions {
  std::string hf_dir;   // config.json + model.safetensors (or the sharded form)
  std::string output;   // must not exist
};
// Returns the notes (config.json keys ignored on purpose that hold something worth knowing).
std::vector<std::string> convert_import(const ImportOptions& opt, Communicator& world);

struct ExportOptions {
  std::string checkpoint;       // a checkpoint directory or a checkpoint.dir holding `latest`
  std::string output;           // must not exist
  std::string dtype;            // bf16 | fp16 | fp32; "" = the checkpoint's training.precision
  std::string max_shard_size = "5GB";
  std::string hf_config;        // the config.json to start from; "" = the one the import left, if found
};
void convert_export(const ExportOptions& opt);

// The tensors, the layout that saved a checkpoint, its iteration, state and config.
void checkpoint_inspect(const std::string& checkpoint, std::ostream& out);

// A whole model on the CPU in fp32 on one rank (conversion, tests): owns everything the model's
// context points at.
struct HostModel {
  Config cfg;
  DerivedConfig derived;
  ParallelState ps;
  ModelContext ctx;
  std::unique_ptr<ParamStore> store;
  std::unique_ptr<GPTModel> model;
};
// Builds it for `cfg` (parallel section reset to one rank); padded_vocab > 0 overrides the
// derived padded vocabulary (a checkpoint saved with another padding).
std::unique_ptr<HostModel> build_host_model(const Config& cfg, int padded_vocab = 0);

// Saves its weights (and zero Adam moments) as iteration 0 of checkpoint.dir `dir`, with
// `config_yaml` as the checkpoint's config. Returns the checkpoint path.
std::string save_host_model(HostModel& host, const std::string& dir, const std::string& config_yaml, Communicator& world);

}  // namespace mt
