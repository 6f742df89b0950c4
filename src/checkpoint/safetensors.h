// The safetensors format (Hugging Face): an 8-byte little-endian header length N, N bytes of JSON
// header ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {str: str}}, padded with spaces), then the data section: the tensors' bytes,
// row-major little-endian, offsets relative to the data section's start. The format requires the
// offsets to tile the data section exactly (no gap, no overlap) and the header to start with '{'.
// A model is one model.safetensors or shards named by model.safetensors.index.json
// ({"metadata": {...}, "weight_map": {tensor: file}}).
// megatrain reads F32, F16 and BF16 tensors; anything else is an error naming the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tensor/tensor.h"

namespace mt::st {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;   // F32, F16 or BF16
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range in the data section
};

// "F32" / "F16" / "BF16" <-> DType; false for any other name.
bool dtype_from_st(const std::string& s, DType* out);
const char* dtype_to_st(DType t);  // throws for dtypes safetensors files of ours never hold

// One safetensors file, mapped read-only and validated on open. Throws mt::Error naming the file
// and the problem (too short, header length out of range, bad JSON, bad entry, unsupported dtype,
// size mismatch, offsets out of range, overlapping or leaving a gap).
class File {
 public:
  explicit File(const std::string& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in data-offset order
  const TensorInfo* find(const std::string& name) const;
  const uint8_t* data(const TensorInfo& t) const { return data_ + t.begin; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_len_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

// A model's weights in DIR: model.safetensors, or the shards model.safetensors.index.json names
// (every shard validated; a tensor the index names must be in that shard and every tensor of a
// shard must be in the index).
class Archive {
 public:
  explicit Archive(const std::string& dir);
  struct Entry {
    const File* file;
    const TensorInfo* info;
  };
  // nullptr when absent.
  const Entry* find(const std::string& name) const;
  const std::map<std::string, Entry>& entries() const { return entries_; }
  // The file a tensor lives in (for error messages).
  std::string describe() const { return describe_; }

 private:
  std::vector<std::unique_ptr<File>> files_;
  std::map<std::string, Entry> entries_;
  std::string describe_;
};

struct WriteTensor {
  std::string name;
  DType dtype;
  Shape shape;
  const void* data;  // shape_numel(shape) * dtype_size(dtype) bytes
};

// Writes one safetensors file (the header padded with spaces to a multiple of 8 bytes, tensors in
// the given order). Throws mt::Error naming the path.
void write_file(const std::string& path, const std::vector<WriteTensor>& tensors,
                const std::map<std::string, std::string>& metadata = {});

// Writes the tensors into DIR as model.safetensors, or, when their total size exceeds
// max_shard_bytes, as model-0000i-of-0000n.safetensors shards (in order, each at most
// max_shard_bytes unless one tensor alone is larger) plus model.safetensors.index.json.
// Returns the file names written.
std::vector<std::string> write_model(const std::string& dir, const std::vector<WriteTensor>& tensors,
                                     uint64_t max_shard_bytes);

// "5GB", "500MB", "10KB", "123" (bytes; decimal units as transformers uses) -> bytes.
uint64_t parse_size(const std::string& s);

}  // namespace mt::st
