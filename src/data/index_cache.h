// On-disk cache of the index arrays that datasets build once (GPT sample index, blending indices).
//
//   DIR/STEM-HASH-description.json   {"key": {...}, "arrays": {"NAME": count, ...}}, written last
//   DIR/STEM-HASH-NAME.TYPE          raw little-endian elements, TYPE = int16 | int64
//
// HASH is 16 hex digits of a hash of the key (the JSON of everything the arrays depend on). Every
// file is written to a unique temporary name and renamed, so concurrent builders (several ranks)
// and interrupted runs never leave a partial file under a final name; a reader trusts a cache
// only when the description's key equals its own and each array file has the recorded size and
// checksum ("checksums": {"NAME": hex}, a hash of the file's bytes): an edited, truncated or
// swapped file is rebuilt with a warning naming it, never used. Callers also check the loaded
// arrays' structure (ranges, permutations) before trusting them.
// Arrays load as read-only mappings (shared by every process on the node).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::data {

uint64_t mix64(uint64_t x);                                  // splitmix64 finalizer
uint64_t hash_string(std::string_view s, uint64_t seed = 0);  // 64-bit FNV-1a, then mixed
// Order-sensitive 64-bit checksum of a byte buffer (8-byte words multiplied in, then mixed).
uint64_t checksum_bytes(const void* data, size_t bytes);

// A read-only array: built in memory, or a mapping of a cache file.
template <typename T>
class Array {
 public:
  Array() = default;
  explicit Array(std::vector<T> v) {
    auto owned = std::make_shared<std::vector<T>>(std::move(v));
    data_ = owned->data();
    size_ = static_cast<int64_t>(owned->size());
    owner_ = std::move(owned);
  }
  Array(std::shared_ptr<const void> owner, const T* data, int64_t size)
      : owner_(std::move(owner)), data_(data), size_(size) {}
  const T& operator[](int64_t i) const { return data_[i]; }
  const T* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  std::shared_ptr<const void> owner_;
  const T* data_ = nullptr;
  int64_t size_ = 0;
};

// Maps a whole file read-only; null when it cannot be opened. *bytes = its size.
std::shared_ptr<const unsigned char> map_file(const std::string& path, int64_t* bytes);
// Writes bytes to path through a unique temporary file and a rename; throws mt::Error on failure.
void write_file_atomic(const std::string& path, const void* data, size_t bytes);

class IndexCache {
 public:
  // dir: the cache directory ("" = none: nothing is loaded or saved). stem: a readable file prefix.
  IndexCache(std::string dir, const std::string& stem, nlohmann::json key);
  bool enabled() const { return !base_.empty(); }
  std::string path(const std::string& name) const { return base_ + "-" + name; }

  // True when a complete cache with this key exists; then load() maps its arrays (false, with a
  // warning naming the file, when a file is missing, its size is not the recorded count or its
  // bytes do not match the recorded checksum).
  bool find();
  template <typename T>
  bool load(const std::string& name, Array<T>* out) const {
    int64_t bytes = 0;
    const std::string file = path(file_name<T>(name));
    const int64_t count = recorded_count(name);
    auto m = map_file(file, &bytes);
    if (!verify(file, m.get(), bytes, count, sizeof(T), recorded_checksum(name))) return false;
    *out = Array<T>(m, reinterpret_cast<const T*>(m.get()), count);
    return true;
  }
  // Logs "index cache file FILE is corrupt (WHY): rebuilding it" (for the callers' structural checks).
  void reject(const std::string& file, const std::string& why) const;

  // Saving: add each array, then commit() writes the description. Failures (a read-only data
  // directory, a full disk) are logged as warnings and the arrays simply stay in memory.
  template <typename T>
  void add(const std::string& name, const std::vector<T>& v) {
    add_raw(file_name<T>(name), name, v.data(), v.size() * sizeof(T), static_cast<int64_t>(v.size()));
  }
  void commit();
  bool saved() const { return saved_ok_; }
  const nlohmann::json& description() const { return description_; }

 private:
  template <typename T>
  static std::string file_name(const std::string& name) {
    static_assert(sizeof(T) == 2 || sizeof(T) == 8);
    return name + (sizeof(T) == 2 ? ".int16" : ".int64");
  }
  int64_t recorded_count(const std::string& name) const;
  std::string recorded_checksum(const std::string& name) const;
  bool verify(const std::string& file, const unsigned char* data, int64_t bytes, int64_t count, size_t elem,
              const std::string& checksum) const;
  void add_raw(const std::string& file, const std::string& name, const void* data, size_t bytes, int64_t count);

  std::string base_;
  nlohmann::json key_, description_;
  bool save_failed_ = false, saved_ok_ = false;
};

}  // namespace mt::data
