// The fp32 master weights of bf16 parameters held as two 16-bit halves instead of a separate fp32 copy: the high half
// is the bf16 value the model computes with (ParamStore's values), the low half a uint16 buffer of the optimizer's.
//   hi   = (bits + 0x8000) >> 16               fp32 -> bf16 rounded to nearest, ties away from zero
//   lo   = bits & 0xffff
//   bits = ((hi - (lo >= 0x8000)) << 16) | lo   exact: the rounding carried into the high half iff lo >= 0x8000
// The optimizer reads and writes 4 bytes a weight for both instead of 6 (fp32 master + bf16 copy), and the master
// costs 2 bytes a parameter of memory instead of 4. The one difference to a cast with ties to even: a master whose low
// half is exactly 0x8000 (about 1 in 65,536) rounds away from zero, where ties to even might round toward it (a bf16
// value one last-bit step apart). A NaN becomes bf16's quiet NaN (hi 0x7fc0 with its sign, lo 0: still a NaN).
// Plain header: the same inline functions on the host (CPU reference) and the device (cuda/adamw.cu,
// cuda/master_halves.cu).
#pragma once

#include <cstdint>

#include "core/float_bits.h"

namespace mt::master_halves {

MT_BITS_HD bool is_nan_bits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

// The high half (the bf16 value's bits) of master bits u.
MT_BITS_HD uint16_t high_half(uint32_t u) {
  if (is_nan_bits(u)) return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7fc0u);
  return static_cast<uint16_t>((u + 0x8000u) >> 16);
}

// The low half of master bits u (0 for a NaN, whose high half is then the quiet NaN).
MT_BITS_HD uint16_t low_half(uint32_t u) { return is_nan_bits(u) ? uint16_t{0} : static_cast<uint16_t>(u & 0xffffu); }

// The master weight of halves (hi, lo).
MT_BITS_HD float join(uint16_t hi, uint16_t lo) {
  const uint32_t top = static_cast<uint32_t>(hi) - (lo >= 0x8000u ? 1u : 0u);
  return bits_float((top << 16) | lo);
}

}  // namespace mt::master_halves
