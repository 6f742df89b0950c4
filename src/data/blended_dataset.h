// Megatron-Core's BlendedDataset (megatron/core/datasets/blended_dataset.py): a weighted mix of
// several datasets. Sample i of the blend is sample dataset_sample_index[i] of dataset
// dataset_index[i]. The indices come from Megatron's greedy build_blending_indices: for each
// output sample, take the dataset whose achieved count lags its share the most, i.e. the largest
// weight[d] * max(i, 1) - count[d] (the first one on ties), so every prefix of the blend follows
// the weights as closely as whole samples allow. Each dataset is built with
// ceil(ceil(weight * N) * 1.005) samples (Megatron's 0.5% mid-level surplus), enough for its share.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/index_cache.h"

namespace mt::data {

// Megatron's _get_size_per_split_per_dataset for one split.
int64_t blended_component_size(double normalized_weight, int64_t size);

// Megatron's build_blending_indices (weights normalized); outputs have `size` entries.
void build_blending_indices(const std::vector<double>& weights, int64_t size, std::vector<int16_t>* dataset_index,
                            std::vector<int64_t>* dataset_sample_index);

class BlendedDataset : public SampleDataset {
 public:
  // weights: any positive numbers (normalized here). cache_dir "" = no cache. cache_key
  // identifies the components (their own cache keys / descriptions).
  BlendedDataset(std::vector<std::shared_ptr<SampleDataset>> datasets, std::vector<double> weights, int64_t size,
                 const std::string& cache_dir, const std::string& cache_key);

  int64_t size() const override { return size_; }
  int seq_length() const override { return datasets_[0]->seq_length(); }
  void get(int64_t idx, int32_t* out) const override;
  std::string describe() const override;

  const Array<int16_t>& dataset_index() const { return dataset_index_; }
  const Array<int64_t>& dataset_sample_index() const { return dataset_sample_index_; }
  const std::vector<std::shared_ptr<SampleDataset>>& datasets() const { return datasets_; }
  bool loaded_from_cache() const { return loaded_from_cache_; }

 private:
  std::vector<std::shared_ptr<SampleDataset>> datasets_;
  std::vector<double> weights_;
  int64_t size_ = 0;
  Array<int16_t> dataset_index_;
  Array<int64_t> dataset_sample_index_;
  bool loaded_from_cache_ = false;
};

}  // namespace mt::data
