// Internals shared by checkpoint save and load: N-dimensional boxes (tiling checks, strided copies
// for resharding), durable POSIX file writes, a read-only file mapping, checkpoint directory names.
// Not part of the public API (tests include it to exercise the pieces directly).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace mt::ckpt::detail {

// ---------------------------------------------------------------- boxes
// The box [off[d], off[d] + len[d]) in every dimension d (a 0-dimensional box is one element).
struct Box {
  Shape off, len;
};
int64_t box_volume(const Box& b);
std::string box_str(const Box& b);  // "offset [0, 4] shape [4, 4]"
// The intersection of a and b (same rank); false when it holds no element.
bool box_intersect(const Box& a, const Box& b, Box* out);
// "" when `boxes` tile `domain` exactly once (each inside it, no overlap, no gap), else what is wrong.
std::string tiling_problem(const Box& domain, const std::vector<Box>& boxes);
// Copies the elements of `region` (inside both boxes, global coordinates) from `src`, the row-major
// contents of src_box, into `dst`, the row-major contents of dst_box. elem = bytes per element.
void copy_box(const void* src, const Box& src_box, void* dst, const Box& dst_box, const Box& region, size_t elem);

// ---------------------------------------------------------------- files
std::string errno_text(int err);
// Writes `chunks` (pointer, length pairs) to `path` (created or truncated), fsyncs and closes it.
// Throws mt::Error naming the path. threads > 1 splits the bytes into up to that many contiguous ranges of at
// least 1 MiB, each written (pwrite) and flushed to the disk (sync_file_range) by its own thread, before the
// fsync: the disk then sees that many write streams (a virtio disk of the GPU machine flushed 0.9 GB/s from one
// stream and 1.9 GB/s from four). The file's bytes are the same either way.
struct Chunk {
  const void* data;
  size_t len;
};
void write_file_durable(const std::string& path, const std::vector<Chunk>& chunks, int threads = 1);
inline void write_file_durable(const std::string& path, const std::string& text) {
  write_file_durable(path, {Chunk{text.data(), text.size()}});
}
void fsync_dir(const std::string& path);          // throws mt::Error naming the path
std::string read_text_file(const std::string& path);  // throws mt::Error naming the path
void remove_tree_quiet(const std::string& path);  // best effort, never throws

// A read-only mapping of bytes [offset, offset + len) of a file. Throws mt::Error naming the file
// when it is missing or shorter than offset + len.
class MappedRange {
 public:
  MappedRange(const std::string& path, uint64_t offset, uint64_t len);
  ~MappedRange();
  MappedRange(const MappedRange&) = delete;
  MappedRange& operator=(const MappedRange&) = delete;
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return len_; }

 private:
  void* map_ = nullptr;
  size_t map_len_ = 0;
  const uint8_t* data_ = nullptr;
  uint64_t len_ = 0;
};

// ---------------------------------------------------------------- names
std::string iter_dir_name(int64_t iteration);  // "iter_0000100"
// "iter_0000100" -> 100; false for anything else.
bool parse_iter_dir_name(const std::string& name, int64_t* iteration);
// "iter_0000100.tmp-<nonce>" or "iter_0000100.old-<nonce>" (left by a save) -> 100.
bool parse_leftover_dir_name(const std::string& name, int64_t* iteration);

}  // namespace mt::ckpt::detail
