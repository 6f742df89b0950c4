// CUDA causal grouped-query attention against the CPU reference (fp64 on the same rounded inputs):
// MHA, GQA and MQA, T not a multiple of the tiles (16 to 128 rows), D = 64 and 128, fp32 (CUDA-core path),
// bf16 (tensor cores) and fp16 (cuDNN at T % 128 == 0, else the fp32 kernels on fp32 copies); forward out
// and lse, backward dq, dk, dv; the backward is deterministic. Each bf16/fp16 case runs under every
// attention backend policy (training.attention_backend) that can run it: auto, own (our kernels only) and, at
// T % 128 == 0, cudnn (cuDNN only: an error if it did not run); cudnn on anything else is an error naming the key.
// A hidden benchmark ("[.bench]") times the bf16 kernels at a training size, cuDNN's and ours.
#include "catch.h"

#if defined(MEGATRAIN_HAVE_CUDA)
#include <string>
#include <vector>

#include "core/attention_chunks.h"
#include "test_cuda_util.h"

using namespace mt;
using namespace mt::gpu_test;

namespace {
using Backend = ops::AttentionBackend;

const char* backend_name(Backend b) { return b == Backend::Auto ? "auto" : b == Backend::Cudnn ? "cudnn" : "own"; }

// The process-wide attention policies for one scope (restored to the trainer's defaults at its end).
struct AttentionPolicy {
  explicit AttentionPolicy(Backend b, int64_t workspace_mib = 1024) {
    ops::set_attention_backend(b);
    ops::set_attention_bwd_workspace_mib(workspace_mib);
  }
  ~AttentionPolicy() {
    ops::set_attention_backend(Backend::Auto);
    ops::set_attention_bwd_workspace_mib(1024);
  }
};

// The policies a case runs under: fp32 has only our kernels (auto); bf16 and fp16 auto and own, and cudnn where
// cuDNN runs the shape.
std::vector<Backend> backends_for(DType dt, int64_t T) {
  if (dt == DType::F32) return {Backend::Auto};
  if (T % 128 == 0) return {Backend::Auto, Backend::Own, Backend::Cudnn};
  return {Backend::Auto, Backend::Own};
}

struct AttnDims {
  int64_t B, T, H, G, D;
};

// Random inputs of one shape, rounded to dt, on the host (fp64) and the device; the forward on both (the GPU's
// out and lse feed its backward, as in training; the reference's its own).
struct AttnCase {
  Shape qs, ks;
  Tensor q64, k64, v64, do64, q, k, v, dout, out, lse, out_r, lse_r;
  AttnCase(const AttnDims& d, DType dt, uint64_t& seed) : qs{d.B, d.T, d.H, d.D}, ks{d.B, d.T, d.G, d.D} {
    q64 = rounded(randn64(qs, ++seed), dt);
    k64 = rounded(randn64(ks, ++seed), dt);
    v64 = rounded(randn64(ks, ++seed), dt);
    do64 = rounded(randn64(qs, ++seed), dt);
    q = to_device(q64, dt);
    k = to_device(k64, dt);
    v = to_device(v64, dt);
    dout = to_device(do64, dt);
    out = poisoned(qs, dt);
    lse = poisoned({d.B, d.H, d.T}, DType::F32);
    ops::attention_forward(out, lse, q, k, v);
    out_r = Tensor::empty(qs, DType::F64);
    lse_r = Tensor::empty({d.B, d.H, d.T}, DType::F64);
    ops::attention_forward(out_r, lse_r, q64, k64, v64);
  }
  // The GPU's backward into fresh (poisoned) tensors.
  void backward(Tensor& dq, Tensor& dk, Tensor& dv, DType dt) const {
    dq = poisoned(qs, dt);
    dk = poisoned(ks, dt);
    dv = poisoned(ks, dt);
    ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
  }
  // dq, dk, dv against the CPU reference's backward.
  void check_backward(const char* what, const Tensor& dq, const Tensor& dk, const Tensor& dv, DType dt) const {
    Tensor dq_r = Tensor::empty(qs, DType::F64), dk_r = Tensor::empty(ks, DType::F64),
           dv_r = Tensor::empty(ks, DType::F64);
    ops::attention_backward(dq_r, dk_r, dv_r, do64, q64, k64, v64, out_r, lse_r);
    check_close(std::string(what) + " dq", dq, dq_r, dt);
    check_close(std::string(what) + " dk", dk, dk_r, dt);
    check_close(std::string(what) + " dv", dv, dv_r, dt);
  }
};
}  // namespace

TEST_CASE("cuda attention forward/backward match the CPU", "[cuda][attention]") {
  init();
  const AttnDims dims[] = {
      {2, 77, 4, 4, 64},    // MHA, T < 2 tiles, odd
      {1, 200, 8, 2, 128},  // GQA R = 4
      {2, 64, 4, 1, 64},    // MQA, exactly one tile
      {1, 130, 2, 2, 128},  // MHA, one row past two tiles
      {1, 333, 6, 3, 64},   // GQA R = 2, several tiles
      {1, 1, 2, 1, 128},    // a single token
      // T % 128 == 0: bf16 and fp16 run on cuDNN's fused attention (attention_cudnn.cu) where it is available
      {2, 256, 8, 2, 64},   // GQA R = 4, D = 64 (llama-1b's head layout)
      {1, 128, 4, 4, 128},  // MHA, D = 128
      {2, 256, 6, 2, 128},  // GQA R = 3, D = 128 (llama-3b's)
      {2, 128, 4, 4, 64},   // MHA, D = 64 (gpt2's)
  };
  uint64_t seed = 900;
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (const AttnDims& d : dims)
      for (Backend backend : backends_for(dt, d.T)) {
        INFO("B " << d.B << " T " << d.T << " H " << d.H << " G " << d.G << " D " << d.D << " " << dtype_name(dt)
                  << " attention_backend " << backend_name(backend));
        const AttentionPolicy policy(backend);
        const AttnCase c(d, dt, seed);
        check_close("attention_forward out", c.out, c.out_r, dt);
        check_close("attention_forward lse", c.lse, c.lse_r, dt, dt != DType::F32 ? 1e-3 : kTolF32);
        Tensor dq[2], dk[2], dv[2];
        for (int run = 0; run < 2; ++run) c.backward(dq[run], dk[run], dv[run], dt);
        c.check_backward("attention_backward", dq[0], dk[0], dv[0], dt);
        CHECK(bitwise_equal(dq[0], dq[1]));
        CHECK(bitwise_equal(dk[0], dk[1]));
        CHECK(bitwise_equal(dv[0], dv[1]));
      }
}

TEST_CASE("cuda attention on the fused projection matches the CPU", "[cuda][attention_fused]") {
  init();
  // MHA in bf16 / fp16 with T % 128 == 0 runs on cuDNN reading/writing the heads in place; the rest splits.
  const AttnDims dims[] = {{2, 128, 4, 4, 64}, {1, 256, 2, 2, 128}, {2, 77, 4, 4, 64}, {2, 128, 8, 2, 64}};
  uint64_t seed = 1900;
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (const AttnDims& d : dims)
      for (Backend backend : backends_for(dt, d.T)) {
        INFO("B " << d.B << " T " << d.T << " H " << d.H << " G " << d.G << " D " << d.D << " " << dtype_name(dt)
                  << " attention_backend " << backend_name(backend));
        const AttentionPolicy policy(backend);
        const int64_t W = d.G * (d.H / d.G + 2) * d.D;
        const Shape qs{d.B, d.T, d.H, d.D}, ws{d.B, d.T, W};
        const Tensor qkv64 = rounded(randn64(ws, ++seed), dt), do64 = rounded(randn64(qs, ++seed), dt);
        const Tensor qkv = to_device(qkv64, dt), dout = to_device(do64, dt);
        Tensor out = poisoned(qs, dt), lse = poisoned({d.B, d.H, d.T}, DType::F32);
        ops::attention_forward_qkv(out, lse, qkv, d.G);
        Tensor out_r = Tensor::empty(qs, DType::F64), lse_r = Tensor::empty({d.B, d.H, d.T}, DType::F64);
        ops::attention_forward_qkv(out_r, lse_r, qkv64, d.G);
        check_close("attention_forward_qkv out", out, out_r, dt);
        check_close("attention_forward_qkv lse", lse, lse_r, dt, dt != DType::F32 ? 1e-3 : kTolF32);
        Tensor dqkv[2];
        for (int run = 0; run < 2; ++run) {
          dqkv[run] = poisoned(ws, dt);
          ops::attention_backward_qkv(dqkv[run], dout, qkv, out, lse, d.G);
        }
        Tensor dqkv_r = Tensor::empty(ws, DType::F64);
        ops::attention_backward_qkv(dqkv_r, do64, qkv64, out_r, lse_r, d.G);
        check_close("attention_backward_qkv dqkv", dqkv[0], dqkv_r, dt);
        CHECK(bitwise_equal(dqkv[0], dqkv[1]));
      }
}

// training.deterministic: false. cuDNN's backward accumulates dQ with fp32 atomics: as accurate as the
// deterministic graph against the CPU, and, where several key blocks add into each dQ row (T >= 256), not the
// same bits as it (evidence that the other graph ran; at T = 128 one block writes each row).
TEST_CASE("cuda attention backward, non-deterministic cuDNN graph, matches the CPU", "[cuda][attention]") {
  init();
  struct Restore {
    ~Restore() { ops::set_deterministic(true); }
  } restore;
  const AttentionPolicy policy(Backend::Cudnn);  // these shapes run on cuDNN (else an error)
  const AttnDims dims[] = {{2, 256, 8, 2, 64}, {2, 256, 6, 2, 128}, {2, 128, 4, 4, 64}};
  uint64_t seed = 2900;
  for (DType dt : {DType::BF16, DType::F16})
    for (const AttnDims& d : dims) {
      INFO("B " << d.B << " T " << d.T << " H " << d.H << " G " << d.G << " D " << d.D << " " << dtype_name(dt));
      const AttnCase c(d, dt, seed);
      Tensor dq[2], dk[2], dv[2];  // [0] deterministic, [1] not
      for (int run = 0; run < 2; ++run) {
        ops::set_deterministic(run == 0);
        c.backward(dq[run], dk[run], dv[run], dt);
      }
      c.check_backward("attention_backward (non-deterministic)", dq[1], dk[1], dv[1], dt);
      if (d.T >= 256) CHECK_FALSE(bitwise_equal(dq[0], dq[1]));
    }
}

TEST_CASE("cuda attention rejects unsupported head dims by name", "[cuda][attention]") {
  init();
  const Tensor q = Tensor::zeros({1, 4, 2, 96}, DType::BF16, Device::CUDA);
  Tensor out = Tensor::zeros({1, 4, 2, 96}, DType::BF16, Device::CUDA);
  Tensor lse = Tensor::zeros({1, 2, 4}, DType::F32, Device::CUDA);
  try {
    ops::attention_forward(out, lse, q, q, q);
    FAIL("D = 96 accepted");
  } catch (const mt::Error& e) {
    CHECK(std::string(e.what()).find("head dims 64 and 128") != std::string::npos);
  }
}

// training.attention_backend: cudnn never falls back to our kernels silently: fp32 and T % 128 != 0 are errors naming
// the key and the fix.
TEST_CASE("cuda attention under attention_backend cudnn refuses what cuDNN cannot run, by name", "[cuda][attention]") {
  init();
  const AttentionPolicy policy(Backend::Cudnn);
  const AttnDims dims[] = {{1, 77, 2, 2, 64}, {1, 128, 2, 1, 128}};
  for (DType dt : {DType::F32, DType::BF16})
    for (const AttnDims& d : dims) {
      if (dt == DType::BF16 && d.T % 128 == 0) continue;  // runs on cuDNN
      INFO("B " << d.B << " T " << d.T << " " << dtype_name(dt));
      const Shape qs{d.B, d.T, d.H, d.D}, ks{d.B, d.T, d.G, d.D};
      const Tensor q = to_device(randn64(qs, 1), dt), k = to_device(randn64(ks, 2), dt);
      const Tensor v = to_device(randn64(ks, 3), dt);
      Tensor out = poisoned(qs, dt), lse = poisoned({d.B, d.H, d.T}, DType::F32);
      try {
        ops::attention_forward(out, lse, q, k, v);
        FAIL("attention_backend cudnn ran our kernels");
      } catch (const mt::Error& e) {
        INFO(e.what());
        CHECK(std::string(e.what()).find("training.attention_backend is cudnn") != std::string::npos);
        CHECK(std::string(e.what()).find("set training.attention_backend: auto or own") != std::string::npos);
      }
    }
}

TEST_CASE("cuda attention bf16 timing", "[.bench][cuda][attention]") {
  init();
  const AttnDims dims[] = {
      {4, 2048, 16, 16, 128}, {4, 2048, 32, 8, 128}, {8, 1024, 12, 12, 64}, {1, 8192, 16, 16, 128}};
  for (Backend backend : {Backend::Cudnn, Backend::Own})
    for (const AttnDims& d : dims) {
      const AttentionPolicy policy(backend);
      const Shape qs{d.B, d.T, d.H, d.D}, ks{d.B, d.T, d.G, d.D};
      const DType dt = DType::BF16;
      const Tensor q = to_device(randn64(qs, 1), dt), k = to_device(randn64(ks, 2), dt);
      const Tensor v = to_device(randn64(ks, 3), dt), dout = to_device(randn64(qs, 4), dt);
      Tensor out = Tensor::empty(qs, dt, Device::CUDA);
      Tensor lse = Tensor::empty({d.B, d.H, d.T}, DType::F32, Device::CUDA);
      Tensor dq = Tensor::empty(qs, dt, Device::CUDA), dk = Tensor::empty(ks, dt, Device::CUDA),
             dv = Tensor::empty(ks, dt, Device::CUDA);
      const double fwd = median_ms([&] { ops::attention_forward(out, lse, q, k, v); }, 20);
      const double bwd = median_ms([&] { ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse); }, 20);
      // Causal FLOPs: forward 2 GEMMs of B H T^2 D / 2 multiply-adds each; backward 2.5x that.
      const double flops = 4.0 * d.B * d.H * double(d.T) * d.T * d.D / 2;
      std::printf("BENCH attention bf16 %s B=%lld T=%lld H=%lld G=%lld D=%lld: fwd %.3f ms (%.0f TFLOP/s), bwd "
                  "%.3f ms (%.0f TFLOP/s)\n",
                  backend_name(backend), (long long)d.B, (long long)d.T, (long long)d.H, (long long)d.G,
                  (long long)d.D, fwd, flops / fwd * 1e-9, bwd, 2.5 * flops / bwd * 1e-9);
    }
}

TEST_CASE("cuda attention backward in batch chunks (bounded cuDNN workspace) matches the CPU", "[cuda][attention]") {
  init();
  // cuDNN's deterministic backward needs B H T^2 2 bytes of workspace (1 MiB per sample here): caps of 1 and
  // 2 MiB (training.attention_bwd_workspace_mib) run it on 1 and 2 samples at a time.
  const AttnDims dims[] = {{4, 256, 8, 2, 64}, {2, 256, 8, 8, 128}};
  uint64_t seed = 2900;
  for (DType dt : {DType::BF16, DType::F16})
    for (const AttnDims& d : dims)
      for (int64_t cap : {1, 2}) {
        INFO("B " << d.B << " T " << d.T << " H " << d.H << " G " << d.G << " D " << d.D << " cap " << cap);
        const Shape qs{d.B, d.T, d.H, d.D}, ks{d.B, d.T, d.G, d.D};
        const Tensor q64 = rounded(randn64(qs, ++seed), dt), k64 = rounded(randn64(ks, ++seed), dt);
        const Tensor v64 = rounded(randn64(ks, ++seed), dt), do64 = rounded(randn64(qs, ++seed), dt);
        const Tensor q = to_device(q64, dt), k = to_device(k64, dt), v = to_device(v64, dt), dout = to_device(do64, dt);
        Tensor out = poisoned(qs, dt), lse = poisoned({d.B, d.H, d.T}, DType::F32);
        ops::attention_forward(out, lse, q, k, v);
        Tensor dq = poisoned(qs, dt), dk = poisoned(ks, dt), dv = poisoned(ks, dt);
        {
          const AttentionPolicy policy(Backend::Cudnn, cap);  // cuDNN or an error: the chunked graph ran
          ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
        }
        const Tensor out_r64 = to_host64(out), lse_r64 = to_host64(lse);
        Tensor dq_r = Tensor::empty(qs, DType::F64), dk_r = Tensor::empty(ks, DType::F64),
               dv_r = Tensor::empty(ks, DType::F64);
        ops::attention_backward(dq_r, dk_r, dv_r, do64, q64, k64, v64, out_r64, lse_r64);
        check_close("chunked attention_backward dq", dq, dq_r, dt);
        check_close("chunked attention_backward dk", dk, dk_r, dt);
        check_close("chunked attention_backward dv", dv, dv_r, dt);
      }
}

// Long sequences: where one sample's workspace (H T Tk 2 bytes) is above training.attention_bwd_workspace_mib, the
// deterministic backward runs KV groups of one sample (a group's dK/dV from one call), or single query heads (GQA:
// a group's dK/dV summed over its heads in fixed order) (core/attention_chunks.h). Tiny caps force each cut here;
// every result equals the unchunked backward (cap 1024) bit for bit, repeats bit for bit and matches the CPU in fp64,
// causal and non-causal (a context-parallel block, Tk = 2 T), GQA, MQA and MHA, and the fused projection's in-place
// heads.
TEST_CASE("cuda deterministic attention backward in head chunks equals the unchunked one", "[cuda][attention]") {
  init();
  struct Cut {
    int64_t cap_mib, samples, heads;
    bool single;
  };
  struct Case {
    int64_t B, T, Tk, H, G, D;
    bool causal;
    std::vector<Cut> cuts;
  };
  const Case cases[] = {
      // causal GQA R 4: 0.5 MiB per head, 2 MiB per group, 4 MiB per sample
      {2, 512, 512, 8, 2, 64, true, {{4, 1, 8, false}, {2, 1, 4, false}, {1, 1, 1, true}}},
      // a context-parallel block, GQA R 2: 1 MiB per head, 2 per group, 8 per sample
      {2, 512, 1024, 8, 4, 64, false, {{8, 1, 8, false}, {4, 1, 4, false}, {2, 1, 2, false}, {1, 1, 1, true}}},
      // MHA, D 128: a group is one head
      {1, 512, 512, 4, 4, 128, true, {{1, 1, 2, false}}},
      // MQA: one group of 4 heads, 1 MiB per head
      {1, 256, 2048, 4, 1, 64, false, {{2, 1, 1, true}}},
  };
  uint64_t seed = 7100;
  for (DType dt : {DType::BF16, DType::F16})
    for (const Case& c : cases) {
      INFO("B " << c.B << " T " << c.T << " Tk " << c.Tk << " H " << c.H << " G " << c.G << " D " << c.D
                << (c.causal ? " causal " : " non-causal ") << dtype_name(dt));
      const Shape qs{c.B, c.T, c.H, c.D}, ks{c.B, c.Tk, c.G, c.D};
      const Tensor q64 = rounded(randn64(qs, ++seed), dt), k64 = rounded(randn64(ks, ++seed), dt);
      const Tensor v64 = rounded(randn64(ks, ++seed), dt), do64 = rounded(randn64(qs, ++seed), dt);
      const Tensor q = to_device(q64, dt), k = to_device(k64, dt), v = to_device(v64, dt), dout = to_device(do64, dt);
      Tensor out = poisoned(qs, dt), lse = poisoned({c.B, c.H, c.T}, DType::F32);
      {
        const AttentionPolicy policy(Backend::Cudnn);
        ops::attention_forward(out, lse, q, k, v, c.causal);
      }
      auto backward = [&](int64_t cap, Tensor& dq, Tensor& dk, Tensor& dv) {
        dq = poisoned(qs, dt);
        dk = poisoned(ks, dt);
        dv = poisoned(ks, dt);
        const AttentionPolicy policy(Backend::Cudnn, cap);  // cuDNN or an error: the chunked graphs ran
        ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, c.causal);
      };
      Tensor dq0, dk0, dv0;
      REQUIRE(attention_bwd_chunks(c.B, c.H, c.G, c.T, c.Tk, 1024 * 1048576).calls(c.B, c.H) == 1);
      backward(1024, dq0, dk0, dv0);
      Tensor dq_r = Tensor::empty(qs, DType::F64), dk_r = Tensor::empty(ks, DType::F64),
             dv_r = Tensor::empty(ks, DType::F64);
      ops::attention_backward(dq_r, dk_r, dv_r, do64, q64, k64, v64, to_host64(out), to_host64(lse), c.causal);
      check_close("unchunked attention_backward dq", dq0, dq_r, dt);
      check_close("unchunked attention_backward dk", dk0, dk_r, dt);
      check_close("unchunked attention_backward dv", dv0, dv_r, dt);
      for (const Cut& cut : c.cuts) {
        const AttnBwdChunks ch = attention_bwd_chunks(c.B, c.H, c.G, c.T, c.Tk, cut.cap_mib * 1048576);
        INFO("cap " << cut.cap_mib << " MiB: " << ch.samples << " sample(s) x " << ch.heads << " head(s) per call"
                    << (ch.single_heads ? " (single heads, summed per group)" : ""));
        REQUIRE(ch.samples == cut.samples);
        REQUIRE(ch.heads == cut.heads);
        REQUIRE(ch.single_heads == cut.single);
        CHECK(!ch.over_cap());
        Tensor dq[2], dk[2], dv[2];
        for (int run = 0; run < 2; ++run) backward(cut.cap_mib, dq[run], dk[run], dv[run]);
        check_close("head-chunked attention_backward dq", dq[0], dq_r, dt);
        check_close("head-chunked attention_backward dk", dk[0], dk_r, dt);
        check_close("head-chunked attention_backward dv", dv[0], dv_r, dt);
        CHECK(bitwise_equal(dq[0], dq0));
        CHECK(bitwise_equal(dq[0], dq[1]));
        CHECK(bitwise_equal(dk[0], dk[1]));
        CHECK(bitwise_equal(dv[0], dv[1]));
        // Single heads under GQA too: our kernel's fp32 sum of a group's heads in head order gives the bits of
        // cuDNN's own group reduction (cuDNN 9.14, H100; a cuDNN summing otherwise would fail here, not silently).
        CHECK(bitwise_equal(dk[0], dk0));
        CHECK(bitwise_equal(dv[0], dv0));
      }
    }
  // The fused projection of multi-head attention (heads read and written in place, head stride 3 D): KV groups.
  for (DType dt : {DType::BF16}) {
    const int64_t B = 2, T = 512, H = 4, D = 64, W = 3 * H * D;
    const Shape qs{B, T, H, D}, ws{B, T, W};
    const Tensor qkv64 = rounded(randn64(ws, ++seed), dt), do64 = rounded(randn64(qs, ++seed), dt);
    const Tensor qkv = to_device(qkv64, dt), dout = to_device(do64, dt);
    Tensor out = poisoned(qs, dt), lse = poisoned({B, H, T}, DType::F32);
    Tensor dqkv[2];
    {
      const AttentionPolicy policy(Backend::Cudnn);
      ops::attention_forward_qkv(out, lse, qkv, H);
    }
    for (int run = 0; run < 2; ++run) {
      const AttentionPolicy policy(Backend::Cudnn, run == 0 ? 1024 : 1);  // 1 MiB: 2 heads of one sample per call
      dqkv[run] = poisoned(ws, dt);
      ops::attention_backward_qkv(dqkv[run], dout, qkv, out, lse, H);
    }
    CHECK(attention_bwd_chunks(B, H, H, T, T, 1048576).heads == 2);
    Tensor dqkv_r = Tensor::empty(ws, DType::F64);
    ops::attention_backward_qkv(dqkv_r, do64, qkv64, to_host64(out), to_host64(lse), H);
    check_close("head-chunked attention_backward_qkv dqkv", dqkv[1], dqkv_r, dt);
    CHECK(bitwise_equal(dqkv[0], dqkv[1]));
  }
}
#endif
