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
#include <memory>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace mt::data {

// Token dtype for a vocabulary, as Megatron chooses it: uint16 below 65500, else int32.
DType token_dtype_for_vocab(int64_t vocab_size);
uint8_t indexed_dtype_code(DType t);  // throws mt::Error for types the format lacks

// Read-only view of PREFIX.idx/.bin (both memory-mapped). Opening validates the whole index
// (magic, version, dtype, sizes, pointers within .bin, document indices monotonic) and throws
// mt::Error naming the file and what is wrong (truncated, mismatched .bin size, ...).
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
  int32_t sequence_length(int64_t i) const { return lengths_[i]; }
  int64_t sequence_pointer(int64_t i) const { return pointers_[i]; }
  const std::vector<int64_t>& document_indices() const { return document_indices_; }
  int64_t num_tokens() const;
  // Copies tokens [offset, offset + count) of sequence i into out, widened to int32.
  void read(int64_t i, int64_t offset, int64_t count, int32_t* out) const;

 private:
  std::string prefix_;
  DType dtype_ = DType::U16;
  int64_t num_sequences_ = 0;
  const int32_t* lengths_ = nullptr;
  const int64_t* pointers_ = nullptr;
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
  void finalize();

 private:
  std::string prefix_;
  DType dtype_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt::data
