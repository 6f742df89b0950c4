// Training progress: the log line every log_interval iterations and the JSON-lines metrics file.
// FLOPs follow DESIGN.md: model FLOPs per token = 6 N + 12 L h s (N = trainable parameters without
// learned position embeddings, a tied table once); MFU against 989.4 TFLOP/s (dense bf16 H100/H200).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "config/config.h"

namespace mt {

inline constexpr double kPeakFlopsPerGpu = 989.4e12;

int64_t model_flops_per_token(int64_t params_without_positions, const ModelConfig& m);

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
};

class MetricsWriter {
 public:
  MetricsWriter(const Config& cfg, const DerivedConfig& d, int64_t flops_per_token, bool gpu, bool write);
  ~MetricsWriter();
  // mem_gib: peak device memory, the largest over the ranks.
  void train(const IterationRecord& r, double mem_gib);
  void eval(int64_t iteration, double val_loss);

 private:
  const Config* cfg_;
  const DerivedConfig* d_;
  int64_t flops_per_token_;
  bool gpu_;
  std::FILE* file_ = nullptr;
};

}  // namespace mt
