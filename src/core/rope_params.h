// Rotary embedding frequencies, shared by the CPU reference (tensor/cpu/rope.cpp) and the CUDA kernels
// (cuda/rope_common.cuh): pair i < D/2 of a head of dim D turns at inv_freq_i = theta^(-2i/D) radians per
// position, optionally rescaled the Llama-3 way (HF transformers' _compute_llama3_parameters), in fp64:
//   wavelen = 2 pi / inv_freq; lo = L / low_freq_factor; hi = L / high_freq_factor (L: original max positions)
//   wavelen < hi:  inv_freq                      (high frequencies kept)
//   wavelen > lo:  inv_freq / factor             (low frequencies slowed down)
//   else:          (1 - s) inv_freq / factor + s inv_freq,  s = (L / wavelen - low_freq_factor) /
//                                                               (high_freq_factor - low_freq_factor)
// Plain arithmetic only (no std::), so that device code can include it.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MT_ROPE_HD __host__ __device__
#else
#define MT_ROPE_HD
#endif

namespace mt {

struct RopeParams {
  // From theta alone (plain RoPE): callers with only a base frequency pass it as before.
  MT_ROPE_HD RopeParams(double base = 10000.0) : theta(base) {}  // NOLINT(google-explicit-constructor)
  double theta;
  bool scaling = false;  // Llama-3 scaling with the four values below
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position_embeddings = 8192;
};

// The positions of the T tokens of a (B, T, ...) tensor: token t < split sits at offset + t, token t >= split at
// offset2 + (t - split). One offset (the default, and any int64 converts to it): the whole sequence from `offset`.
// Context parallelism gives each rank two chunks of the sequence (data/context_chunks.h): two offsets.
struct RopePositions {
  MT_ROPE_HD RopePositions(int64_t first = 0) : offset(first) {}  // NOLINT(google-explicit-constructor)
  MT_ROPE_HD RopePositions(int64_t first, int64_t split_at, int64_t second)
      : offset(first), split(split_at), offset2(second) {}
  int64_t offset = 0;
  int64_t split = int64_t{1} << 62;  // never reached with one offset
  int64_t offset2 = 0;
  MT_ROPE_HD int64_t operator()(int64_t t) const { return t < split ? offset + t : offset2 + (t - split); }
};

// Context parallelism (parallel.context = P > 1) cuts each sequence into 2P chunks; rank r holds chunks r and
// 2P - 1 - r, T_local = 2 c tokens (data/context_chunks.h): their true positions. P = 1: 0, 1, ..., T_local - 1.
MT_ROPE_HD inline RopePositions context_chunk_positions(int64_t T_local, int size, int rank) {
  if (size <= 1) return RopePositions(0);
  const int64_t c = T_local / 2;
  return RopePositions(rank * c, c, (2 * int64_t{size} - 1 - rank) * c);
}

// inv_freq rescaled as above (unchanged when !r.scaling).
MT_ROPE_HD inline double rope_scale_inv_freq(double inv_freq, const RopeParams& r) {
  if (!r.scaling) return inv_freq;
  const double kTwoPi = 6.283185307179586;
  const double wavelen = kTwoPi / inv_freq;
  const double L = r.original_max_position_embeddings;
  if (wavelen < L / r.high_freq_factor) return inv_freq;
  if (wavelen > L / r.low_freq_factor) return inv_freq / r.factor;
  const double s = (L / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  return (1.0 - s) * inv_freq / r.factor + s * inv_freq;
}

}  // namespace mt
