// Mock Markov-chain data: see mock_dataset.h.
#include "data/mock_dataset.h"

#include <algorithm>

#include "core/check.h"
#include "data/index_cache.h"

namespace mt::data {

namespace {

// splitmix64 as a counter-based stream: value k of a stream is mix64(key + k * golden).
struct Stream {
  uint64_t state;
  uint64_t next() {
    state += 0x9e3779b97f4a7c15ull;
    return mix64(state);
  }
  uint64_t below(uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64); }
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

}  // namespace

MockDataset::MockDataset(int64_t vocab_size, int seq_length, uint64_t seed, Split split, int64_t num_samples)
    : vocab_size_(vocab_size), seq_length_(seq_length), seed_(seed), split_(split),
      size_(std::max<int64_t>(num_samples, 1)) {
  MT_CHECK(vocab_size_ >= 2, "model.vocab_size = ", vocab_size_, " is too small for mock data (need at least 2)");
  MT_CHECK(seq_length_ >= 1, "model.seq_length = ", seq_length_, " must be positive");
}

int MockDataset::max_document_length() const { return std::max(3 * seq_length_, min_document_length()); }

int32_t MockDataset::successor(int32_t token, int k) const {
  const uint64_t h = mix64(mix64(seed_ ^ 0x6d6f636b5f6d6b76ull) ^ (static_cast<uint64_t>(token) << 2 | static_cast<uint64_t>(k)));
  return static_cast<int32_t>(h % static_cast<uint64_t>(vocab_size_ - 1));  // never EOD
}

void MockDataset::get(int64_t idx, int32_t* out) const {
  const uint64_t i = static_cast<uint64_t>(((idx % size_) + size_) % size_);
  Stream rng{mix64(mix64(seed_ + 0x5851f42d4c957f2dull * (static_cast<uint64_t>(split_) + 1)) ^ mix64(i))};
  const int lo = min_document_length(), span = max_document_length() - lo + 1;
  auto doc_length = [&] { return lo + static_cast<int64_t>(rng.below(static_cast<uint64_t>(span))); };
  // Start at position p of a document of length len: p == len is its EOD.
  int64_t len = doc_length();
  int64_t pos = static_cast<int64_t>(rng.below(static_cast<uint64_t>(len + 1)));
  int32_t prev = pos == len ? eod() : static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab_size_ - 1)));
  out[0] = prev;
  for (int k = 1; k <= seq_length_; ++k) {
    int32_t t;
    if (pos == len - 1) {  // the document's last token was just emitted
      t = eod();
      pos = len;
    } else {
      if (pos == len) {  // after EOD: a new document
        len = doc_length();
        pos = 0;
      } else {
        ++pos;
      }
      const double u = rng.unit();
      const int choice = u < 0.55 ? 0 : u < 0.80 ? 1 : u < 0.92 ? 2 : 3;
      t = successor(prev, choice);
    }
    out[k] = t;
    prev = t;
  }
}

std::string MockDataset::describe() const {
  const char* names[] = {"train", "valid", "test"};
  return str_cat("MockDataset ", names[static_cast<int>(split_)], ": ", size_, " samples of ", seq_length_ + 1,
                 " tokens, Markov chain over vocab ", vocab_size_, " (EOD ", eod(), ", seed ", seed_, ")");
}

}  // namespace mt::data
