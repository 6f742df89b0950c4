// Megatron-Core's indexed dataset, byte for byte (megatron/core/datasets/indexed_dataset.py):
//
//   PREFIX.idx (little-endian):
//     magic        9 bytes  "MMIDIDX\0\0"
//     version      uint64   1
//     dtype code   uint8    1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
//     seq count    uint64   S
//     doc count    uint64   D  (entries of document_indices = documents + 1)
//     seq lengths  int32[S] tokens per sequence
//     seq pointers int64[S] byte offset of each sequence in PREFIX.bin
//     doc indices  int64[D] sequence index where each document starts; first 0, last S
//   PREFIX.bin: the token ids of every sequence, back to back, in the dtype above.
//
// Megatron's builder writes one sequence per add_item() and closes a document with end_document().
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace mt::data {

// Token dtype for a vocabulary, as Megatron chooses it: uint16 below 65500, else int32.
DType token_dtype_for_vocab(int64_t vocab_size);
uint8_t indexed_dtype_code(DType t);  // throws mt::Error for types the format lacks

// Read-only view of PREFIX.idx/.bin (both memory-mapped). Opening validates the whole index
// (magic, version, dtype, sizes, pointers within .bin, document indices monotonic) and throws
// mt::Error naming the file and what is wrong (truncated, mismatched .bin size, ...).
// Sequence pointers must be exactly the running sum of length * dtype size (what every Megatron
// writer produces), and the .bin size exactly the sum of all sequences.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  DType dtype() const { return dtype_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return static_cast<int64_t>(document_indices_.size()) - 1; }
  // The arrays sit at unaligned offsets of the mapped .idx (the header is 34 bytes): read by memcpy.
  int32_t sequence_length(int64_t i) const {
    int32_t v;
    std::memcpy(&v, lengths_ + 4 * i, 4);
    return v;
  }
  int64_t sequence_pointer(int64_t i) const {
    int64_t v;
    std::memcpy(&v, pointers_ + 8 * i, 8);
    return v;
  }
  const std::vector<int64_t>& document_indices() const { return document_indices_; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t bin_size() const { return num_tokens_ * static_cast<int64_t>(dtype_size(dtype_)); }
  // Copies tokens [offset, offset + count) of sequence i into out, widened to int32.
  void read(int64_t i, int64_t offset, int64_t count, int32_t* out) const;
  // {smallest, largest} token id among the first max_tokens tokens of the .bin (all of them when
  // max_tokens < 0); {0, -1} when there are none. Float data is truncated to integers.
  std::pair<int64_t, int64_t> token_range(int64_t max_tokens = -1) const;

 private:
  friend class IndexedDatasetWriter;  // add_index copies the mapped .bin
  const unsigned char* bin_data() const;
  std::string prefix_;
  DType dtype_ = DType::U16;
  int64_t num_sequences_ = 0;
  int64_t num_tokens_ = 0;
  const unsigned char* lengths_ = nullptr;   // int32[S], little-endian, inside the .idx mapping
  const unsigned char* pointers_ = nullptr;  // int64[S]
  std::vector<int64_t> document_indices_;
  struct Mapping;
  std::unique_ptr<Mapping> idx_map_, bin_map_;
};

// Writes PREFIX.bin/.idx. Data goes to PREFIX.bin.tmp / PREFIX.idx.tmp and is renamed in
// finalize(), so an interrupted run leaves nothing under the final names.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(const std::string& prefix, DType token_dtype);
  ~IndexedDatasetWriter();  // without finalize(): removes the temporary files
  void add_item(const int32_t* tokens, int64_t count);  // one sequence
  void end_document();
  // Appends every sequence and document of an existing dataset (same dtype), like Megatron's add_index.
  void add_index(const std::string& other_prefix);
  // Closes a pending document (sequences added since the last end_document()), writes the .idx
  // and renames both files to their final names. Nothing may be added afterwards.
  void finalize();
  int64_t num_sequences() const;  // so far
  int64_t num_documents() const;  // closed so far
  int64_t num_tokens() const;

 private:
  std::string prefix_;
  DType dtype_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt::data
