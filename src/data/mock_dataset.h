// Mock data (data.mock: true): deterministic, learnable token streams with no files.
//
// Text is a walk on a sparse Markov chain over the vocabulary V (model.vocab_size, not padded):
// token t is followed by one of 4 successors succ(t, 0..3) (chosen by a hash of (seed, t), never
// the end-of-document token) with probabilities 0.55, 0.25, 0.12, 0.08. Documents of 20 .. 3*L
// tokens (L = seq_length) are each followed by the end-of-document token EOD = V - 1; the token
// after EOD is succ(EOD, k) like any other. The best possible loss is the entropy of the
// successor choice, about 1.13 nats (plus a little for document ends and each sample's first
// token), against ln(V) for a model that knows nothing.
//
// Sample idx is computed on its own from a counter-based generator keyed by (seed, split, idx):
// it starts at a random point of a random-length document and follows the chain for L + 1 tokens,
// so any sample can be read in any order, on any rank, with no state and nothing materialized.
// The train, valid and test splits are different streams.
#pragma once

#include <cstdint>
#include <string>

#include "data/dataset.h"

namespace mt::data {

class MockDataset : public SampleDataset {
 public:
  MockDataset(int64_t vocab_size, int seq_length, uint64_t seed, Split split, int64_t num_samples);

  int64_t size() const override { return size_; }
  int seq_length() const override { return seq_length_; }
  void get(int64_t idx, int32_t* out) const override;
  std::string describe() const override;

  int32_t eod() const { return static_cast<int32_t>(vocab_size_ - 1); }
  int32_t successor(int32_t token, int k) const;  // k in [0, 4)
  static constexpr double kProbabilities[4] = {0.55, 0.25, 0.12, 0.08};
  int min_document_length() const { return 20; }
  int max_document_length() const;

 private:
  int64_t vocab_size_;
  int seq_length_;
  uint64_t seed_;
  Split split_;
  int64_t size_;
};

}  // namespace mt::data
