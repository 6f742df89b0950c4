// Counter-based random numbers: no state, every value is a pure function of (seed, stream, index), so
// any thread count, any parallel layout and any device that implements the same few lines regenerates
// exactly the same numbers (dropout masks in backward, seeded weight init on every rank).
//
// Generator: SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number generators", 2014;
// the generator used to seed xoshiro). Its n-th output from state s is mix64(s + n * kGolden), which is
// random access by construction. Here:
//   key(seed, stream)         = mix64(mix64(seed) + stream)            (one sequence per (seed, stream))
//   bits(seed, stream, index) = mix64(key + (index + 1) * kGolden)      (64 random bits)
//   uniform01                 = (bits >> 11) * 2^-53                    in [0, 1), 53 random bits
//   normal01                  = Box-Muller on two uniforms of the same counter:
//                               u1 = 1 - uniform(bits) in (0, 1], u2 = uniform(mix64(bits + kGolden)),
//                               z = sqrt(-2 ln u1) * cos(2 pi u2)
// The *_keyed forms take skey = key(seed, stream) computed once (the CUDA kernels compute it on the host).
// Plain header, host and device (the CUDA backend includes it for its dropout and fill_normal kernels).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MT_RNG_FN __host__ __device__ __forceinline__
#else
#define MT_RNG_FN inline
#endif

namespace mt::rng {

inline constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio, odd
inline constexpr uint64_t kDropoutStream = 0x64726f706f7574ull;  // "dropout": the stream dropout masks use
// "router": the router's random logits under model.moe_router_force_load_balancing (model/moe/router.h)
inline constexpr uint64_t kRouterLogitsStream = 0x726f75746572ull;

// SplitMix64 finalizer: a bijection on 64-bit words with full avalanche.
MT_RNG_FN uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

MT_RNG_FN uint64_t key(uint64_t seed, uint64_t stream) { return mix64(mix64(seed) + stream); }

MT_RNG_FN uint64_t bits64_keyed(uint64_t skey, uint64_t index) { return mix64(skey + (index + 1) * kGolden); }

MT_RNG_FN uint64_t bits64(uint64_t seed, uint64_t stream, uint64_t index) {
  return bits64_keyed(key(seed, stream), index);
}

// Top 53 bits as a double in [0, 1).
MT_RNG_FN double bits_to_unit(uint64_t b) { return static_cast<double>(b >> 11) * (1.0 / 9007199254740992.0); }

// Uniform in [0, 1).
MT_RNG_FN double uniform01(uint64_t seed, uint64_t stream, uint64_t index) {
  return bits_to_unit(bits64(seed, stream, index));
}

// Standard normal (mean 0, variance 1), Box-Muller from two uniforms of the same counter.
MT_RNG_FN double normal01_keyed(uint64_t skey, uint64_t index) {
  const uint64_t b1 = bits64_keyed(skey, index);
  const uint64_t b2 = mix64(b1 + kGolden);
  const double u1 = 1.0 - bits_to_unit(b1);  // (0, 1]: log is finite
  const double u2 = bits_to_unit(b2);
  return ::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586476925 * u2);
}

MT_RNG_FN double normal01(uint64_t seed, uint64_t stream, uint64_t index) {
  return normal01_keyed(key(seed, stream), index);
}

}  // namespace mt::rng
