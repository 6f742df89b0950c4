// Index-array cache: see index_cache.h.
#include "data/index_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "core/log.h"

namespace mt::data {

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash_string(std::string_view s, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ull ^ mix64(seed);
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return mix64(h);
}

uint64_t checksum_bytes(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0x243f6a8885a308d3ull ^ bytes;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x9fb21c651e98df25ull;  // odd multiplier: every word changes the state, in order
    h ^= h >> 31;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, bytes - i);
  return mix64(h ^ tail);
}

static std::string hex64(uint64_t x) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(x));
  return hex;
}

std::shared_ptr<const unsigned char> map_file(const std::string& path, int64_t* bytes) {
  *bytes = 0;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return nullptr;
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    static const unsigned char empty = 0;
    return std::shared_ptr<const unsigned char>(&empty, [](const unsigned char*) {});
  }
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (addr == MAP_FAILED) return nullptr;
  *bytes = static_cast<int64_t>(size);
  return std::shared_ptr<const unsigned char>(static_cast<const unsigned char*>(addr),
                                              [size](const unsigned char* p) { ::munmap(const_cast<unsigned char*>(p), size); });
}

void write_file_atomic(const std::string& path, const void* data, size_t bytes) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = str_cat(path, ".tmp.", ::getpid(), ".", counter++);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  MT_CHECK(f, "cannot create '", tmp, "' (", std::strerror(errno), ")");
  bool ok = bytes == 0 || std::fwrite(data, 1, bytes, f) == bytes;
  const int err = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    MT_CHECK(false, "cannot write '", tmp, "' (", std::strerror(err), ")");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    MT_CHECK(false, "cannot rename '", tmp, "' to '", path, "' (", std::strerror(e), ")");
  }
}

IndexCache::IndexCache(std::string dir, const std::string& stem, nlohmann::json key) : key_(std::move(key)) {
  if (dir.empty()) return;
  base_ = (std::filesystem::path(dir) / (stem + "-" + hex64(hash_string(key_.dump())))).string();
}

bool IndexCache::find() {
  if (!enabled()) return false;
  std::ifstream f(path("description.json"));
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  const auto j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("key") || j["key"] != key_ || !j.contains("arrays") ||
      !j["arrays"].is_object() || !j.contains("checksums") || !j["checksums"].is_object()) {
    log::warn("index cache '{}' is unreadable or belongs to other data: rebuilding it", path("description.json"));
    return false;
  }
  description_ = j;
  return true;
}

int64_t IndexCache::recorded_count(const std::string& name) const {
  if (!description_.contains("arrays") || !description_["arrays"].contains(name)) return -1;
  const auto& v = description_["arrays"][name];
  return v.is_number_integer() ? v.get<int64_t>() : -1;
}

std::string IndexCache::recorded_checksum(const std::string& name) const {
  if (!description_.contains("checksums") || !description_["checksums"].contains(name)) return "";
  const auto& v = description_["checksums"][name];
  return v.is_string() ? v.get<std::string>() : "";
}

void IndexCache::reject(const std::string& file, const std::string& why) const {
  log::warn("index cache file '{}' is corrupt ({}): rebuilding it", file, why);
}

bool IndexCache::verify(const std::string& file, const unsigned char* data, int64_t bytes, int64_t count,
                        size_t elem, const std::string& checksum) const {
  if (!data) {
    reject(file, "cannot be read");
    return false;
  }
  if (count < 0 || checksum.empty()) {
    reject(file, "no size or checksum recorded in " + path("description.json"));
    return false;
  }
  if (bytes != count * static_cast<int64_t>(elem)) {
    reject(file, str_cat(bytes, " bytes where ", count * static_cast<int64_t>(elem), " were written"));
    return false;
  }
  if (hex64(checksum_bytes(data, static_cast<size_t>(bytes))) != checksum) {
    reject(file, "its contents do not match the checksum recorded in " + path("description.json"));
    return false;
  }
  return true;
}

void IndexCache::add_raw(const std::string& file, const std::string& name, const void* data, size_t bytes,
                         int64_t count) {
  if (!enabled() || save_failed_) return;
  try {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(base_).parent_path(), ec);
    MT_CHECK(!ec, "cannot create the directory '", std::filesystem::path(base_).parent_path().string(), "' (",
             ec.message(), ")");
    write_file_atomic(path(file), data, bytes);
    description_["arrays"][name] = count;
    description_["checksums"][name] = hex64(checksum_bytes(data, bytes));
  } catch (const Error& e) {
    log::warn("cannot save the index cache ({}); keeping it in memory (set data.cache_dir to a writable directory)",
              e.what());
    save_failed_ = true;
  }
}

void IndexCache::commit() {
  if (!enabled() || save_failed_) return;
  description_["key"] = key_;
  const std::string text = description_.dump(2) + "\n";
  try {
    write_file_atomic(path("description.json"), text.data(), text.size());
    saved_ok_ = true;
  } catch (const Error& e) {
    log::warn("cannot save the index cache ({}); keeping it in memory (set data.cache_dir to a writable directory)",
              e.what());
  }
}

}  // namespace mt::data
