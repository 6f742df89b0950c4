// The master weights of bf16 parameters as two 16-bit halves (core/master_halves.h, tensor/master_halves_ops.h): the
// halves give the fp32 weights back bit for bit, the high half is the bf16 value rounded to nearest (ties away from
// zero), and the optimizer's update of the halves is the fp32 update.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "catch.h"
#include "core/dtype.h"
#include "optim/adamw.h"
#include "params/param_store.h"
#include "tensor/master_halves_ops.h"
#include "tensor/ops.h"

using namespace mt;

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Every kind of fp32 bit pattern: zeros, subnormals, the largest finite values, infinities, NaNs, ties in both
// parities and both signs, and random bits.
std::vector<uint32_t> sample_bits() {
  std::vector<uint32_t> b = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu, 0xff7fffffu,
                             0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fff8000u,
                             0xffffffffu, 0x3f808000u, 0x3f818000u, 0xbf808000u, 0xbf818000u, 0x3f807fffu,
                             0x3f80ffffu, 0x00008000u, 0x7f7f8000u};
  std::mt19937 gen(2026);
  for (int i = 0; i < 200000; ++i) b.push_back(gen());
  for (int i = 0; i < 1000; ++i) b.push_back((gen() & 0xffff0000u) | 0x8000u);  // ties
  return b;
}

Tensor floats_of(const std::vector<uint32_t>& bits) {
  Tensor t = Tensor::empty({static_cast<int64_t>(bits.size())}, DType::F32);
  std::memcpy(t.raw(), bits.data(), bits.size() * 4);
  return t;
}

bool is_nan(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

}  // namespace

TEST_CASE("master halves give the fp32 weights back bit for bit; the high half is bf16 rounded, ties away from zero",
          "[optim][master_halves]") {
  const std::vector<uint32_t> bits = sample_bits();
  const int64_t n = static_cast<int64_t>(bits.size());
  const Tensor master = floats_of(bits);
  Tensor hi = Tensor::empty({n}, DType::BF16), lo = Tensor::empty({n}, DType::U16);
  ops::split_master(hi, &lo, master);
  Tensor joined = Tensor::empty({n}, DType::F32);
  ops::join_master(joined, hi, lo);
  Tensor hi_only = Tensor::empty({n}, DType::BF16);
  ops::split_master(hi_only, nullptr, master);
  const auto* h = static_cast<const uint16_t*>(hi.raw());
  const auto* l = static_cast<const uint16_t*>(lo.raw());
  int64_t ties = 0, nans = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = bits[i];
    INFO("bits 0x" << std::hex << u);
    REQUIRE(static_cast<const uint16_t*>(hi_only.raw())[i] == h[i]);
    const uint32_t back = bits_of(joined.data<float>()[i]);
    if (is_nan(u)) {  // a NaN stays a NaN (bf16's quiet NaN in the high half)
      ++nans;
      REQUIRE(is_nan(back));
      REQUIRE((h[i] & 0x7fffu) == 0x7fc0u);
      continue;
    }
    REQUIRE(back == u);
    const uint16_t even = bf16(std::bit_cast<float>(u)).bits;  // the cast's rounding: to nearest, ties to even
    if ((u & 0xffffu) == 0x8000u) {
      ++ties;
      REQUIRE(h[i] == static_cast<uint16_t>((u >> 16) + 1));  // away from zero (in magnitude)
    } else {
      REQUIRE(h[i] == even);
    }
    REQUIRE(l[i] == static_cast<uint16_t>(u & 0xffffu));
  }
  CHECK(ties > 1000);
  CHECK(nans >= 6);
}

TEST_CASE("adamw on master halves is the fp32 update of the joined weights", "[optim][master_halves]") {
  const int64_t n = 10007;
  std::mt19937 gen(7);
  std::normal_distribution<float> w(0.0f, 0.02f), g(0.0f, 1.0f);
  Tensor p = Tensor::empty({n}, DType::F32), grad = Tensor::empty({n}, DType::F32);
  for (int64_t i = 0; i < n; ++i) p.data<float>()[i] = w(gen);
  Tensor hi = Tensor::empty({n}, DType::BF16), lo = Tensor::empty({n}, DType::U16);
  ops::split_master(hi, &lo, p);
  Tensor m = Tensor::zeros({n}, DType::F32), v = Tensor::zeros({n}, DType::F32);
  Tensor m_ref = m.clone(), v_ref = v.clone();
  ops::DecayRuns runs{{0, 100, 5000}, {1, 0, 1}};
  ops::AdamWArgs a;
  a.lr = 1e-3;
  a.weight_decay = 0.1;
  for (a.step = 1; a.step <= 3; ++a.step) {
    for (int64_t i = 0; i < n; ++i) grad.data<float>()[i] = g(gen);
    ops::adamw_step_halves(hi, lo, m, v, grad, a, &runs);
    ops::adamw_step(p, m_ref, v_ref, grad, a, nullptr, &runs);
  }
  Tensor joined = Tensor::empty({n}, DType::F32);
  ops::join_master(joined, hi, lo);
  CHECK(std::memcmp(joined.raw(), p.raw(), size_t(n) * 4) == 0);
  CHECK(std::memcmp(m.raw(), m_ref.raw(), size_t(n) * 4) == 0);
  CHECK(std::memcmp(v.raw(), v_ref.raw(), size_t(n) * 4) == 0);
  // the high halves are the values the model computes with: within half a bf16 step of the weights
  for (int64_t i = 0; i < n; ++i) {
    const float value = std::bit_cast<float>(uint32_t{static_cast<const uint16_t*>(hi.raw())[i]} << 16);
    REQUIRE(std::fabs(value - p.data<float>()[i]) <= std::ldexp(std::fabs(p.data<float>()[i]), -8));
  }
}

// The optimizer on a bf16 store (the GPU's training path, here on the CPU): take_master splits the store's fp32
// master weights and frees them; each step is the fp32 update of an independent copy, bit for bit; the values are the
// high halves; joined with master_low_halves (what a checkpoint saves) they give the fp32 weights back exactly.
TEST_CASE("AdamW on a bf16 store holds the master weights as halves and saves them exactly", "[optim][master_halves]") {
  ParamStore store{0, 1};
  for (const char* name : {"layers.0.w", "layers.1.w"}) {
    ParamSpec s;
    s.name = name;
    s.global_shape = {37, 29};
    store.add(s);
  }
  store.allocate(DType::BF16, Device::CPU);
  store.initialize(11, 0.02, 2);
  const int64_t n = store.padded_numel();
  Tensor p_ref = store.flat_master().clone(), m_ref = Tensor::zeros({n}, DType::F32), v_ref = m_ref.clone();
  OptimizerConfig cfg;
  cfg.weight_decay = 0.1;
  ParallelState ps;
  AdamW opt(store, cfg, ps, false);
  opt.take_master();
  REQUIRE(opt.holds_master());
  CHECK_THROWS(store.flat_master());  // freed: the optimizer holds them
  ops::AdamWArgs a;
  a.beta1 = cfg.adam_beta1, a.beta2 = cfg.adam_beta2, a.eps = cfg.adam_eps, a.weight_decay = cfg.weight_decay;
  std::mt19937 gen(5);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (a.step = 1; a.step <= 3; ++a.step) {
    for (int64_t i = 0; i < n; ++i) store.flat_grads().data<float>()[i] = g(gen);
    opt.step(1e-3, 0.5);
    a.lr = 1e-3;
    a.grad_scale = 0.5;
    ops::adamw_step(p_ref, m_ref, v_ref, store.flat_grads(), a);
  }
  REQUIRE(opt.master_low_halves().numel() == n);
  Tensor saved = Tensor::empty({n}, DType::F32);
  ops::join_master(saved, store.flat_values(), opt.master_low_halves());
  CHECK(std::memcmp(saved.raw(), p_ref.raw(), size_t(n) * 4) == 0);
  Tensor hi_ref = Tensor::empty({n}, DType::BF16);
  ops::split_master(hi_ref, nullptr, p_ref);
  CHECK(std::memcmp(store.flat_values().raw(), hi_ref.raw(), size_t(n) * 2) == 0);
  Tensor m, v;
  opt.full_moments(m, v);
  CHECK(std::memcmp(m.raw(), m_ref.raw(), size_t(n) * 4) == 0);
  CHECK(std::memcmp(v.raw(), v_ref.raw(), size_t(n) * 4) == 0);
}

// take_master on a bf16 store makes every value the high half of its master weight: under the distributed optimizer
// (here either rank of 2, its shard one half of each bucket) the other rank's ranges too, which it does not update
// but computes with until the next parameter gather. The values are zeroed first, so a range left out shows.
TEST_CASE("take_master on a bf16 store writes every high half, inside and outside the rank's shard",
          "[optim][master_halves]") {
  for (const int rank : {-1, 0, 1}) {  // -1: not distributed
    const bool distributed = rank >= 0;
    INFO("data-parallel rank " << rank);
    ParamStore store{0, 1};
    for (const char* name : {"layers.0.w", "layers.1.w", "layers.2.w"}) {
      ParamSpec s;
      s.name = name;
      s.global_shape = {41, 23};
      store.add(s);
    }
    store.allocate(DType::BF16, Device::CPU, 2);  // padded for 2 data-parallel shards
    store.initialize(13, 0.02, 3);
    const int64_t n = store.padded_numel();
    Tensor hi_ref = Tensor::empty({n}, DType::BF16);
    ops::split_master(hi_ref, nullptr, store.flat_master());
    std::memset(store.flat_values().raw(), 0, size_t(n) * 2);
    ParallelState ps;
    ps.dp_size = distributed ? 2 : 1;
    ps.dp_rank = std::max(rank, 0);
    OptimizerConfig cfg;
    AdamW opt(store, cfg, ps, distributed);
    int64_t shard = 0;
    for (const ShardRange& r : opt.shard()) shard += r.size();
    if (distributed) REQUIRE(shard < n);  // the shard leaves ranges outside it
    opt.take_master();
    CHECK(std::memcmp(store.flat_values().raw(), hi_ref.raw(), size_t(n) * 2) == 0);
  }
}
