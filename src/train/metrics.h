// Training progress: the log line every log_interval iterations and the JSON-lines metrics file.
// FLOPs as docs/ARCHITECTURE.md counts them: model FLOPs per token = 6 N + 12 L h s (N = trainable parameters without
// learned position embeddings, a tied table once); MFU against 989.4 TFLOP/s (dense bf16 H100/H200).
// Mixture of experts: N = N_active, the parameters one token uses: everything but the experts, plus
// moe_router_topk experts of each MoE layer (routers and shared experts count fully), as
// ../shared/reference/torch_moe.py counts them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "train/tensorboard_writer.h"

namespace mt {

inline constexpr double kPeakFlopsPerGpu = 989.4e12;

// params_without_positions: every parameter but the experts' (is_expert_param) and learned position embeddings;
// the active experts (active_expert_params) are added here.
int64_t model_flops_per_token(int64_t params_without_positions, const ModelConfig& m, const DerivedConfig& d);
// An expert weight of an MoE layer ("decoder.layers.N.mlp.experts.<e>.linear_fc1.weight"; not the shared experts).
bool is_expert_param(const std::string& name);
// The weights of one expert: fc1 (C -> 2F for SwiGLU, F for GELU) and fc2 (F -> C), no biases (model/moe/experts.h).
int64_t expert_params(const ModelConfig& m);
// moe_router_topk x expert_params over the MoE layers (config/config_validate_moe.h is_moe_layer); 0 when dense.
int64_t active_expert_params(const ModelConfig& m);

// One MoE layer's routing over the log interval's global batches (every rank's tokens).
struct MoELayerMetrics {
  int layer = 0;                              // global layer number
  double tokens_max = 0, tokens_mean = 0;     // routed slots per expert: the busiest expert's, the mean
  int64_t dropped = 0, slots = 0;             // slots dropped by the capacity / all slots (tokens x topk)
  double aux_loss = 0, z_loss = 0;            // mean over micro-batches and ranks of the losses' values (0: off)
  double load() const { return tokens_mean > 0 ? tokens_max / tokens_mean : 0.0; }  // max / mean, 1 = balanced
};

struct IterationRecord {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;
  double loss = 0;       // mean over the interval's iterations
  double grad_norm = 0;  // last iteration's
  double lr = 0;
  double ms_per_iter = 0;
  int64_t skipped = 0;   // iterations skipped (NaN/Inf or fp16 overflow) in the interval
  double loss_scale = 0; // fp16 only
  double comm_exposed_ms = 0;  // per iteration: the GPU compute stream waiting on communication (this rank)
  int64_t cuda_mallocs = 0;    // GPU: cudaMalloc calls of the caching allocator so far (this rank; the metrics file)
  std::vector<MoELayerMetrics> moe;  // mixture-of-experts layers (empty for a dense model)
};

class MetricsWriter {
 public:
  MetricsWriter(const Config& cfg, const DerivedConfig& d, int64_t flops_per_token, bool gpu, bool write);
  ~MetricsWriter();
  // mem_gib: peak device memory, the largest over the ranks.
  void train(const IterationRecord& r, double mem_gib);
  void eval(int64_t iteration, double val_loss);
  // The test split's loss at the end of training: {"iteration", "test_loss"}.
  void test(int64_t iteration, double test_loss);

  // Call once before the first record, with the iteration the run starts from (0, or the resumed
  // checkpoint's). The metrics file then holds one record per (kind, iteration): records past
  // `iteration` (from a run that went on after its last checkpoint, or an earlier run in the same
  // file) are removed, saying how many, and a record already in the file is not written again (a
  // finished job run again appends nothing). Opens logging.tensorboard_dir's event file.
  // keep_later (training.skip_train, which trains nothing): the file is left as it is, records past `iteration`
  // included, and new records are appended (still never one already there); no TensorBoard event file.
  void start(int64_t iteration, bool keep_later = false);
  // More TensorBoard scalars at a step (e.g. per-layer expert load); nothing without tensorboard_dir.
  void add_scalars(int64_t step, const Scalars& scalars);

  // The lowest validation loss of the metrics file and this run (iteration -1: none).
  std::pair<int64_t, double> best_val() const { return best_val_; }

 private:
  enum class Kind { Train, Val, Test };
  // Whether (kind, iteration) is new to the metrics file; marks it written.
  bool first_record(Kind kind, int64_t iteration);
  void note_val(int64_t iteration, double val_loss);
  const Config* cfg_;
  const DerivedConfig* d_;
  int64_t flops_per_token_;
  bool gpu_;
  bool write_;
  std::FILE* file_ = nullptr;
  std::set<std::pair<Kind, int64_t>> written_;
  std::pair<int64_t, double> best_val_{-1, 0.0};
  std::unique_ptr<TensorBoardWriter> tb_;
};

// The end-of-run block (rank 0 logs it).
struct RunSummary {
  int64_t first_iteration = 0;  // the iteration this run started from
  int64_t last_iteration = 0;
  int64_t train_iters = 0;
  double wall_seconds = 0;
  int64_t tokens_this_run = 0, tokens_total = 0;
  double last_loss = 0;
  std::pair<int64_t, double> best_val{-1, 0.0};
  bool has_test = false;
  double test_loss = 0;
  std::string last_checkpoint;  // "" = none
  std::string how_ended;        // "finished", "stopped by signal", ...
};
void log_run_summary(const RunSummary& s);

}  // namespace mt
