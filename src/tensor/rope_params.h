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
