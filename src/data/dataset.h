// What training reads: datasets of fixed-length samples (seq_length + 1 tokens), the train/valid/
// test datasets built from the config, and a prefetching batch loader whose position (consumed
// samples) is saved in checkpoints and restored exactly.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"

namespace mt::data {

// A sequence of samples, each seq_length + 1 token ids (inputs = [0, L), labels = [1, L+1)).
class SampleDataset {
 public:
  virtual ~SampleDataset() = default;
  virtual int64_t size() const = 0;
  virtual int seq_length() const = 0;
  // out: seq_length + 1 ids. idx may exceed size(): it wraps (idx % size()).
  virtual void get(int64_t idx, int32_t* out) const = 0;
  virtual std::string describe() const = 0;  // one line for the start-up log
};

enum class Split { Train = 0, Valid = 1, Test = 2 };

struct Datasets {
  std::shared_ptr<SampleDataset> train, valid, test;  // valid/test null: split weight 0 or no samples
};

// Builds the datasets of the config: mock (data.mock) or the weighted blend of data.paths, split
// by data.split, each with enough samples for the given counts (several epochs if needed).
// A single prefix is one GPTDataset (no blend). valid/test are null when their data.split weight
// is 0 or their sample count is 0. Token ids are checked against model.vocab_size: the first 64M
// tokens of each .bin at open, and every sample as it is read (an error names the file).
// Sample indices are cached (data.cache_dir, or PREFIX_DIR/megatrain_cache) and reused.
Datasets build_datasets(const Config& cfg, const DerivedConfig& derived, int64_t train_samples,
                        int64_t valid_samples, int64_t test_samples);

// The sample counts Megatron asks for: train = train_iters * G; valid = (number of evaluations)
// * eval_iters * G, with one evaluation every eval_interval iterations plus the final one
// (eval_interval 0: only the final one); test = eval_iters * G (G = global batch size).
struct SampleCounts {
  int64_t train = 0, valid = 0, test = 0;
};
SampleCounts megatron_sample_counts(const Config& cfg, const DerivedConfig& derived);

// Builds (or checks) every sample-index cache that training with this config will load, using
// megatron_sample_counts: run it once ahead of a large job so that ranks do not build it each.
void build_sample_index_cache(const Config& cfg, const DerivedConfig& derived);

// One micro-batch: tokens and labels, (micro_batch_size, seq_length) int32 each, row-major.
struct MicroBatch {
  int64_t first_sample = 0;  // global index of row 0 (for dropout/debugging)
  int rows = 0, seq_length = 0;
  std::vector<int32_t> tokens, labels;
};

// Prefetching loader over one dataset. Iteration k reads the global batch of samples
// [start + k*G, start + (k+1)*G) (G = global batch); micro-batch i of DP rank r holds samples
// start + k*G + i*M*dp + r*M + [0, M)  (M = micro batch), as Megatron's pretraining sampler.
class BatchLoader {
 public:
  BatchLoader(std::shared_ptr<SampleDataset> ds, int global_batch, int micro_batch, int dp_rank, int dp_size,
              int64_t consumed_samples, int prefetch);
  ~BatchLoader();
  // The micro-batches of this rank for the next global batch (global_batch / (micro_batch*dp) of them).
  std::vector<MicroBatch> next();
  int64_t consumed_samples() const;  // samples of all ranks consumed by next() so far
 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt::data
