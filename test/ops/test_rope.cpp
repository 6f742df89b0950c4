// rope: complex-rotation reference, position offset, finite differences, round trip.
#include <cmath>
#include <complex>
#include <vector>

#include "gradcheck.h"

using namespace mt;
using namespace mt::test;

namespace {
// Rotate-half convention as complex multiplication: z = x[i] + i x[i + D/2], z' = z e^{i p theta^(-2i/D)}.
Tensor naive_rope(const Tensor& x, double theta, int64_t offset) {
  const int64_t B = x.size(0), T = x.size(1), Hh = x.size(2), D = x.size(3), half = D / 2;
  Tensor y = x.clone();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < Hh; ++h) {
        double* v = y.data<double>() + ((b * T + t) * Hh + h) * D;
        for (int64_t i = 0; i < half; ++i) {
          const double angle = static_cast<double>(offset + t) / std::pow(theta, 2.0 * i / D);
          const std::complex<double> z = std::complex<double>(v[i], v[i + half]) * std::polar(1.0, angle);
          v[i] = z.real();
          v[i + half] = z.imag();
        }
      }
  return y;
}
}  // namespace

TEST_CASE("rope forward matches a complex rotation, with position offsets", "[ops][rope]") {
  const double theta = 10000.0;
  Tensor x = randn({2, 5, 3, 8}, 1);
  Tensor y = x.clone();
  ops::rope_forward(y, theta, 0);
  CHECK(rel_err(y, naive_rope(x, theta, 0)) < 1e-14);
  // Position 0 is the identity.
  for (int64_t i = 0; i < 3 * 8; ++i) CHECK(y.data<double>()[i] == x.data<double>()[i]);
  y = x.clone();
  ops::rope_forward(y, 500.0, 7);
  CHECK(rel_err(y, naive_rope(x, 500.0, 7)) < 1e-14);
  CHECK(rel_err(y, naive_rope(x, theta, 7)) > 1e-3);
}

TEST_CASE("rope backward matches finite differences and inverts forward", "[ops][rope]") {
  Tensor x = randn({2, 4, 2, 6}, 11), wts = randn({2, 4, 2, 6}, 12);
  auto L = [&] {
    Tensor y = x.clone();
    ops::rope_forward(y, 100.0, 3);
    return dot(wts, y);
  };
  Tensor dx = wts.clone();
  ops::rope_backward(dx, 100.0, 3);
  check_grad("dx", dx, x, L);

  Tensor y = x.clone();
  ops::rope_forward(y, 100.0, 3);
  ops::rope_backward(y, 100.0, 3);
  CHECK(max_abs_diff(y, x) < 1e-14);
}

TEST_CASE("rope fp32 agrees with fp64 at long positions", "[ops][rope]") {
  Tensor x = randn({1, 4, 2, 16}, 21);
  Tensor y = x.clone(), yf = to(x, DType::F32);
  ops::rope_forward(y, 10000.0, 4000);
  ops::rope_forward(yf, 10000.0, 4000);
  CHECK(rel_err(yf, y) < 1e-6);
  Tensor odd = randn({1, 2, 1, 5}, 22);
  CHECK_THROWS_AS(ops::rope_forward(odd, 10000.0, 0), InternalError);
}

namespace {
// HF transformers' _compute_llama3_parameters, written out in fp64 the way it is written there (torch.where on the
// wavelength of each frequency), independently of tensor/rope_params.h.
std::vector<double> hf_llama3_inv_freq(double base, int64_t dim, double factor, double low_freq_factor,
                                       double high_freq_factor, double old_context_len) {
  const double pi = std::acos(-1.0);
  std::vector<double> inv_freq;
  for (int64_t i = 0; i < dim; i += 2) inv_freq.push_back(1.0 / std::pow(base, static_cast<double>(i) / dim));
  const double low_freq_wavelen = old_context_len / low_freq_factor;
  const double high_freq_wavelen = old_context_len / high_freq_factor;
  std::vector<double> out;
  for (double f : inv_freq) {
    const double wavelen = 2 * pi / f;
    double llama = wavelen > low_freq_wavelen ? f / factor : f;
    const double smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
    const double smoothed = (1 - smooth) * llama / factor + smooth * llama;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    out.push_back(medium ? smoothed : llama);
  }
  return out;
}
}  // namespace

TEST_CASE("rope with llama3 scaling rotates by HF's rescaled frequencies; backward matches finite differences",
          "[ops][rope]") {
  // D 16, theta 10000: wavelengths 6.3 ... 2.2e4; original context 256 with factors 1 / 4 (low / high
  // wavelength 256 / 64) puts frequencies in all three regimes.
  const int64_t D = 16, half = D / 2;
  RopeParams r(10000.0);
  r.scaling = true;
  r.factor = 8.0;
  r.low_freq_factor = 1.0;
  r.high_freq_factor = 4.0;
  r.original_max_position_embeddings = 256;
  const std::vector<double> f = hf_llama3_inv_freq(10000.0, D, 8.0, 1.0, 4.0, 256);
  int kept = 0, divided = 0, smoothed = 0;
  for (int64_t i = 0; i < half; ++i) {
    const double plain = 1.0 / std::pow(10000.0, 2.0 * i / D);
    kept += f[i] == plain;
    divided += std::abs(f[i] - plain / 8.0) < 1e-18;
    smoothed += f[i] != plain && std::abs(f[i] - plain / 8.0) >= 1e-18;
  }
  REQUIRE((kept > 0 && divided > 0 && smoothed > 0));
  Tensor x = randn({2, 5, 3, D}, 31);
  Tensor y = x.clone();
  const int64_t offset = 100;
  ops::rope_forward(y, r, offset);
  // Reference: the complex rotation by p * f_i.
  Tensor ref = x.clone();
  for (int64_t bt = 0; bt < 2 * 5; ++bt)
    for (int64_t h = 0; h < 3; ++h) {
      double* v = ref.data<double>() + (bt * 3 + h) * D;
      const double p = static_cast<double>(offset + bt % 5);
      for (int64_t i = 0; i < half; ++i) {
        const std::complex<double> z = std::complex<double>(v[i], v[i + half]) * std::polar(1.0, p * f[i]);
        v[i] = z.real();
        v[i + half] = z.imag();
      }
    }
  CHECK(rel_err(y, ref) < 1e-13);
  CHECK(rel_err(y, naive_rope(x, 10000.0, offset)) > 1e-3);  // the scaling changed something

  Tensor wts = randn({2, 5, 3, D}, 32);
  auto L = [&] {
    Tensor z = x.clone();
    ops::rope_forward(z, r, offset);
    return dot(wts, z);
  };
  Tensor dx = wts.clone();
  ops::rope_backward(dx, r, offset);
  check_grad("dx", dx, x, L);
}
