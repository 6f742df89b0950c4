// SHA-256 (FIPS 180-4): the portable block function plus an x86 SHA-NI one chosen at run time.
#include "core/sha256.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define MT_SHA256_X86 1
#endif

namespace mt {

namespace {

alignas(16) constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr uint32_t kInit[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void compress_portable(uint32_t* h, const uint8_t* p, size_t nblocks) {
  for (; nblocks > 0; --nblocks, p += 64) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      w[i] = (uint32_t(p[4 * i]) << 24) | (uint32_t(p[4 * i + 1]) << 16) | (uint32_t(p[4 * i + 2]) << 8) |
             uint32_t(p[4 * i + 3]);
    }
    for (int i = 16; i < 64; ++i) {
      uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kK[i] + w[i];
      uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
  }
}

#ifdef MT_SHA256_X86
// The SHA-NI block function (Intel's SHA extensions): state kept as ABEF/CDGH, four rounds per
// group, the message schedule in four rotating registers.
__attribute__((target("sha,ssse3,sse4.1"))) void compress_shani(uint32_t* h, const uint8_t* p, size_t nblocks) {
  const __m128i mask = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i tmp = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)), 0xB1);  // CDAB
  __m128i st1 = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 4)), 0x1B);  // EFGH
  __m128i st0 = _mm_alignr_epi8(tmp, st1, 8);    // ABEF
  st1 = _mm_blend_epi16(st1, tmp, 0xF0);         // CDGH
  for (; nblocks > 0; --nblocks, p += 64) {
    const __m128i save0 = st0, save1 = st1;
    __m128i w[4];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      if (i < 4) w[i] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i)), mask);
      __m128i msg = _mm_add_epi32(w[i & 3], _mm_load_si128(reinterpret_cast<const __m128i*>(kK + 4 * i)));
      st1 = _mm_sha256rnds2_epu32(st1, st0, msg);
      if (i >= 3 && i <= 14) {
        __m128i& nx = w[(i + 1) & 3];
        nx = _mm_add_epi32(nx, _mm_alignr_epi8(w[i & 3], w[(i + 3) & 3], 4));
        nx = _mm_sha256msg2_epu32(nx, w[i & 3]);
      }
      st0 = _mm_sha256rnds2_epu32(st0, st1, _mm_shuffle_epi32(msg, 0x0E));
      if (i >= 1 && i <= 12) w[(i + 3) & 3] = _mm_sha256msg1_epu32(w[(i + 3) & 3], w[i & 3]);
    }
    st0 = _mm_add_epi32(st0, save0);
    st1 = _mm_add_epi32(st1, save1);
  }
  tmp = _mm_shuffle_epi32(st0, 0x1B);
  st1 = _mm_shuffle_epi32(st1, 0xB1);
  st0 = _mm_blend_epi16(tmp, st1, 0xF0);   // h[0..3]
  st1 = _mm_alignr_epi8(st1, tmp, 8);      // h[4..7]
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h), st0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h + 4), st1);
}

bool detect_shani() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  bool ssse3 = (c >> 9) & 1, sse41 = (c >> 19) & 1;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return ssse3 && sse41 && ((b >> 29) & 1);
}
#endif

}  // namespace

bool sha256_hw_available() {
#ifdef MT_SHA256_X86
  static const bool have = detect_shani();
  return have;
#else
  return false;
#endif
}

Sha256::Sha256(bool allow_hw) : hw_(allow_hw && sha256_hw_available()) { reset(); }

void Sha256::reset() {
  std::memcpy(h_, kInit, sizeof(h_));
  buf_len_ = 0;
  total_ = 0;
}

void Sha256::compress(const uint8_t* blocks, size_t nblocks) {
#ifdef MT_SHA256_X86
  if (hw_) {
    compress_shani(h_, blocks, nblocks);
    return;
  }
#endif
  compress_portable(h_, blocks, nblocks);
}

void Sha256::update(const void* data, size_t len) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  total_ += len;
  if (buf_len_ > 0) {
    size_t take = std::min(len, 64 - buf_len_);
    std::memcpy(buf_ + buf_len_, p, take);
    buf_len_ += take;
    p += take;
    len -= take;
    if (buf_len_ < 64) return;
    compress(buf_, 1);
    buf_len_ = 0;
  }
  if (len >= 64) {
    compress(p, len / 64);
    p += len / 64 * 64;
    len %= 64;
  }
  std::memcpy(buf_, p, len);
  buf_len_ = len;
}

std::array<uint8_t, 32> Sha256::finish() {
  const uint64_t bits = total_ * 8;
  uint8_t pad[72] = {0x80};
  size_t pad_len = (buf_len_ < 56 ? 56 : 120) - buf_len_;
  for (int i = 0; i < 8; ++i) pad[pad_len + i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
  update(pad, pad_len + 8);
  std::array<uint8_t, 32> out{};
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<uint8_t>(h_[i] >> (24 - 8 * j));
  }
  return out;
}

std::string Sha256::finish_hex() {
  static const char* digits = "0123456789abcdef";
  std::array<uint8_t, 32> d = finish();
  std::string s(64, '0');
  for (int i = 0; i < 32; ++i) {
    s[2 * i] = digits[d[i] >> 4];
    s[2 * i + 1] = digits[d[i] & 15];
  }
  return s;
}

std::string sha256_hex(const void* data, size_t len) {
  Sha256 h;
  h.update(data, len);
  return h.finish_hex();
}

}  // namespace mt
