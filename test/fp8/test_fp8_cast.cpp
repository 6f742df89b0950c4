// The FP8 casts (core/fp8_format.h) against references written here from the formats' definitions (OCP
// FP8: e4m3 "fn" without infinities, e5m2 IEEE-like): every one of the 256 codes of each format decodes to the value
// the definition gives, and the encoder agrees with a brute-force nearest-value search (ties to the even code,
// saturation to the largest finite value) on every code's value, every midpoint between neighbours and its two
// float neighbours, and random floats across the whole range.
#include <cmath>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "catch.h"
#include "core/fp8_format.h"

using namespace mt::fp8;

namespace {

struct Format {
  const char* name;
  int E, M;
  bool has_inf;  // e5m2: S.11111.00 = inf, other all-ones exponents NaN; e4m3: only S.1111.111 is NaN
  Fp8Dtype dtype;
};
const Format kFormats[] = {{"e4m3", 4, 3, false, Fp8Dtype::E4M3}, {"e5m2", 5, 2, true, Fp8Dtype::E5M2}};

// The definition: (-1)^s 2^(e - bias) (1 + m / 2^M), or 2^(1 - bias) (m / 2^M) for e = 0; in double via ldexp.
double reference_value(const Format& f, int code) {
  const int bias = (1 << (f.E - 1)) - 1;
  const int s = code >> 7, e = (code >> f.M) & ((1 << f.E) - 1), m = code & ((1 << f.M) - 1);
  const int emax = (1 << f.E) - 1;
  if (e == emax && f.has_inf) return m == 0 ? (s ? -INFINITY : INFINITY) : NAN;
  if (e == emax && !f.has_inf && m == (1 << f.M) - 1) return NAN;
  const double mag = e == 0 ? std::ldexp(m, 1 - bias - f.M) : std::ldexp((1 << f.M) + m, e - bias - f.M);
  return s ? -mag : mag;
}

// Brute force: the finite code nearest to x (ties: the code with an even mantissa), saturating at the largest
// finite magnitude; NaN -> any NaN code (checked by class).
int reference_encode(const Format& f, float x) {
  if (std::isnan(x)) return -1;
  double fmax = 0;  // saturation is part of the definition: beyond the largest finite value, that value
  for (int c = 0; c < 128; ++c)
    if (std::isfinite(reference_value(f, c))) fmax = std::max(fmax, reference_value(f, c));
  const double v = std::fabs(static_cast<double>(x)) > fmax ? std::copysign(fmax, static_cast<double>(x)) : x;
  int best = -1;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 256; ++c) {
    const double r = reference_value(f, c);
    if (!std::isfinite(r)) continue;
    if ((c & 0x80) != (std::signbit(x) ? 0x80 : 0)) continue;  // keep the sign (also of zero)
    const double d = std::fabs(r - v);
    if (d < best_d || (d == best_d && (c & 1) == 0 && (best & 1) == 1)) best = c, best_d = d;
  }
  return best;
}

uint8_t encode(const Format& f, float x) { return float_to_fp8(x, f.dtype); }

}  // namespace

TEST_CASE("every FP8 code decodes to the value of the format's definition", "[fp8][cast]") {
  for (const Format& f : kFormats) {
    for (int c = 0; c < 256; ++c) {
      const double ref = reference_value(f, c);
      const float got = fp8_to_float(static_cast<uint8_t>(c), f.dtype);
      INFO(f.name << " code " << c << ": " << got << " vs " << ref);
      if (std::isnan(ref)) {
        CHECK(std::isnan(got));
      } else {
        CHECK(static_cast<double>(got) == ref);
        CHECK(std::signbit(got) == std::signbit(ref));
      }
    }
  }
  // Anchors from the formats' specification.
  CHECK(e4m3_to_float(0x7e) == 448.0f);
  CHECK(e4m3_to_float(0x01) == std::ldexp(1.0f, -9));
  CHECK(e4m3_to_float(0x38) == 1.0f);
  CHECK(e5m2_to_float(0x7b) == 57344.0f);
  CHECK(e5m2_to_float(0x01) == std::ldexp(1.0f, -16));
  CHECK(e5m2_to_float(0x3c) == 1.0f);
  CHECK(std::isinf(e5m2_to_float(0x7c)));
}

TEST_CASE("FP8 casts round to nearest even and saturate, as a brute-force search says", "[fp8][cast]") {
  for (const Format& f : kFormats) {
    std::vector<float> probes;
    std::vector<double> finite;
    for (int c = 0; c < 128; ++c)
      if (std::isfinite(reference_value(f, c))) finite.push_back(reference_value(f, c));
    for (size_t i = 0; i < finite.size(); ++i) {
      probes.push_back(static_cast<float>(finite[i]));
      if (i + 1 < finite.size()) {
        const float mid = static_cast<float>((finite[i] + finite[i + 1]) / 2);  // exact in float
        probes.push_back(mid);
        probes.push_back(std::nextafter(mid, 0.0f));
        probes.push_back(std::nextafter(mid, INFINITY));
      }
    }
    const float fmax = static_cast<float>(finite.back());
    for (float v : {fmax * 1.03f, fmax * 1.0625f, fmax * 1.2f, fmax * 4, 1e30f, std::numeric_limits<float>::max(),
                    INFINITY, std::ldexp(1.0f, -30), std::numeric_limits<float>::denorm_min(), 0.0f})
      probes.push_back(v);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> exp_d(-24.0f, 18.0f), mant(1.0f, 2.0f);
    for (int i = 0; i < 20000; ++i) probes.push_back(std::ldexp(mant(rng), static_cast<int>(exp_d(rng))));
    size_t n = probes.size();
    for (size_t i = 0; i < n; ++i) probes.push_back(-probes[i]);
    for (float x : probes) {
      const int want = reference_encode(f, x);
      const int got = encode(f, x);
      INFO(f.name << " x = " << x << " (" << std::hexfloat << x << std::defaultfloat << "): code " << got
                  << ", want " << want);
      // +-inf saturates to +-max (CUDA's __NV_SATFINITE)
      CHECK(got == want);
    }
    const uint8_t nan_code = encode(f, NAN);
    CHECK(std::isnan(fp8_to_float(nan_code, f.dtype)));
  }
}

TEST_CASE("scales from amax: fp8_max / amax / 2^margin, 1 for amax 0, powers of two for blocks", "[fp8][cast]") {
  CHECK(scale_from_amax(2.0f, kE4M3Max, 0, false) == 224.0f);
  CHECK(scale_from_amax(2.0f, kE4M3Max, 1, false) == 112.0f);
  CHECK(scale_from_amax(0.0f, kE4M3Max, 0, false) == 1.0f);
  CHECK(scale_from_amax(NAN, kE4M3Max, 0, false) == 1.0f);
  CHECK(scale_from_amax(INFINITY, kE4M3Max, 0, false) == 1.0f);
  CHECK(scale_from_amax(3.0f, kE4M3Max, 0, true) == 128.0f);  // 149.3 rounded down to 2^7
  CHECK(scale_from_amax(1e-45f, kE5M2Max, 0, false) == std::numeric_limits<float>::max());
  // The amax itself maps onto the largest code: no saturation loss at the top.
  for (float amax : {0.37f, 5.0f, 1234.5f, 3e-5f}) {
    const float s = scale_from_amax(amax, kE4M3Max, 0, false);
    CHECK(float_to_e4m3(amax * s) == 0x7e);
  }
}
