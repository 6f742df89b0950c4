// Megatron-Core's GPTDataset (megatron/core/datasets/gpt_dataset.py) over one indexed dataset.
//
// The documents of one split (a contiguous range of document ids) are read as one token stream:
//   document_index  the document ids in reading order: for each epoch, every document of the
//                   range once, shuffled (one shuffle per epoch); as many epochs as it takes to
//                   give num_samples samples.
//   sample_index    (position in document_index, token offset in that document) where each sample
//                   starts, n_samples + 1 pairs. Sample i holds the seq_length + 1 tokens
//                   [i*L, i*L + L + 1) of the stream: consecutive samples overlap by one token (the
//                   last label of one is the first input of the next). The stream's tail that does
//                   not fill a sample is dropped.
//   shuffle_index   a permutation of the samples. When the last epoch is needed for less than 80%
//                   of its samples, the samples of the earlier epochs and those of the last are
//                   shuffled separately (Megatron's separate_final_epoch), so the partial last
//                   epoch does not mix into the rest.
// get(i) reads sample shuffle_index[i % size()].
//
// Differences from Megatron, on purpose: shuffles use our own generator (std::mt19937_64 seeded
// from data seed, the dataset's file name and the split, with a portable Fisher-Yates), not
// numpy's, so orders differ from Megatron's for the same seed; the document order is shuffled per
// epoch (every document once per epoch) where Megatron shuffles all epochs together; a document
// of several sequences is read as the concatenation of its sequences (Megatron indexes sequences by
// document id, the same thing when each document is one sequence, as preprocess writes it).
//
// The three arrays are cached on disk (index_cache.h) under cache_dir as
// NAME-SPLIT-HASH-{description.json, document_index.int64, sample_index.int64, shuffle_index.int64},
// keyed by the dataset's file name (not its directory: data copied with its cache keeps it), its
// document / sequence / token counts, a fingerprint of the split's document lengths, the split's
// document range, seq_length, num_samples and seed. Built once, then mapped read-only.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "data/index_cache.h"
#include "data/indexed_dataset.h"

namespace mt::data {

const char* split_name(Split s);  // "train", "valid", "test"

// Megatron's split by documents: weights normalized, cumulative bookends, each document range
// [round(lo * num_documents), round(hi * num_documents)) with round half to even (Python's round).
// A split of weight 0 is disabled (enabled = false).
struct DocRange {
  int64_t begin = 0, end = 0;
  bool enabled = false;
};
std::array<DocRange, 3> split_document_ranges(const std::vector<double>& split, int64_t num_documents);

// The cache directory of a prefix: cache_dir, or PREFIX_DIR/megatrain_cache when cache_dir is "".
std::string cache_dir_for(const std::string& cache_dir, const std::string& prefix);

struct GPTDatasetOptions {
  int seq_length = 0;
  int64_t num_samples = 0;  // at least this many samples (whole epochs are built)
  uint64_t seed = 1234;
  Split split = Split::Train;
  std::string cache_dir;    // "" = no cache (build in memory); see cache_dir_for
  int64_t vocab_size = 0;   // > 0: get() checks every token id is below it
};

class GPTDataset : public SampleDataset {
 public:
  GPTDataset(std::shared_ptr<const IndexedDataset> data, DocRange documents, const GPTDatasetOptions& opt);

  int64_t size() const override { return shuffle_index_.size(); }
  int seq_length() const override { return opt_.seq_length; }
  void get(int64_t idx, int32_t* out) const override;
  std::string describe() const override;

  // The index arrays and how they came to be (for tests and tools).
  const Array<int64_t>& document_index() const { return document_index_; }
  const Array<int64_t>& sample_index() const { return sample_index_; }  // pairs, flattened
  const Array<int64_t>& shuffle_index() const { return shuffle_index_; }
  int64_t num_epochs() const { return num_epochs_; }
  int64_t tokens_per_epoch() const { return tokens_per_epoch_; }
  bool loaded_from_cache() const { return loaded_from_cache_; }
  bool saved_to_cache() const { return saved_to_cache_; }
  std::string cache_description_path() const { return cache_description_path_; }
  const IndexedDataset& indexed() const { return *data_; }
  // Tokens of document d (the concatenation of its sequences).
  int64_t document_length(int64_t d) const { return doc_lengths_[d - range_.begin]; }
  void read_document(int64_t d, int64_t offset, int64_t count, int32_t* out) const;

 private:
  void build(IndexCache& cache);
  std::string check_index() const;  // "" when the loaded arrays are sound

  std::shared_ptr<const IndexedDataset> data_;
  DocRange range_;
  GPTDatasetOptions opt_;
  std::vector<int64_t> doc_lengths_;
  int64_t tokens_per_epoch_ = 0, num_epochs_ = 0;
  Array<int64_t> document_index_, sample_index_, shuffle_index_;
  bool loaded_from_cache_ = false, saved_to_cache_ = false;
  std::string cache_description_path_;
};

// Fisher-Yates with an unbiased bounded draw from std::mt19937_64 (both fully specified by the
// standard, unlike std::shuffle and std::uniform_int_distribution): the same order everywhere.
class Shuffler {
 public:
  explicit Shuffler(uint64_t seed) : engine_(seed) {}
  uint64_t below(uint64_t n) {  // uniform in [0, n), n > 0: reject the 2^64 mod n lowest values
    const uint64_t threshold = (0 - n) % n;
    for (;;) {
      const uint64_t x = engine_();
      if (x >= threshold) return x % n;
    }
  }
  template <typename T>
  void shuffle(T* first, int64_t n) {
    for (int64_t i = n - 1; i > 0; --i) std::swap(first[i], first[below(static_cast<uint64_t>(i) + 1)]);
  }

 private:
  std::mt19937_64 engine_;
};

}  // namespace mt::data
