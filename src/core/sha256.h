// SHA-256 (FIPS 180-4), used for checkpoint checksums. Streaming: update() any number of times,
// then finish(). A portable implementation plus an x86 SHA-NI path picked at run time when the CPU
// has it (several times faster; both give identical digests, the tests compare them).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace mt {

class Sha256 {
 public:
  // allow_hw = false forces the portable code (tests compare the two paths).
  explicit Sha256(bool allow_hw = true);
  void update(const void* data, size_t len);
  std::array<uint8_t, 32> finish();  // the object must be reset() before reuse
  std::string finish_hex();          // lower-case hex, 64 characters
  void reset();

 private:
  void compress(const uint8_t* blocks, size_t nblocks);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;  // bytes
  bool hw_ = false;
};

// Whether this CPU runs the SHA-NI path.
bool sha256_hw_available();

// One-shot helpers.
std::string sha256_hex(const void* data, size_t len);
inline std::string sha256_hex(const std::string& s) { return sha256_hex(s.data(), s.size()); }

}  // namespace mt
