// Context-parallel attention's ops on CUDA against the CPU reference (fp64 on the same rounded inputs): non-causal
// attention with keys of another length (cuDNN for bf16/fp16 when T and Tk are multiples of 128, forced under
// training.attention_backend cudnn; else our fp32 kernels, on fp32 copies for bf16/fp16; a block cuDNN cannot run
// under cudnn is refused by name), forward and backward, deterministic; attention_merge and seq_copy; and the ring's
// load-balanced block schedule (parallel/context_parallel.cpp) run on the device for P = 2 and 4 in one process:
// the merged blocks and their backward (dq here, dk/dv summed at the block's owner) equal causal attention over the
// whole sequence on the CPU (bf16 tolerance; bf16 through cuDNN only).
#include "catch.h"

#if defined(MEGATRAIN_HAVE_CUDA)
#include <string>
#include <vector>

#include "cp/cp_reference.h"
#include "test_cuda_util.h"

using namespace mt;
using namespace mt::gpu_test;

namespace {
using Backend = ops::AttentionBackend;

struct Policy {
  explicit Policy(Backend b) { ops::set_attention_backend(b); }
  ~Policy() { ops::set_attention_backend(Backend::Auto); }
};

struct Dims {
  int64_t B, T, Tk, H, G, D;
};
}  // namespace

TEST_CASE("cuda non-causal attention with keys of another length matches the CPU", "[cuda][context]") {
  init();
  const Dims dims[] = {
      {2, 128, 256, 8, 2, 64},   // GQA, more keys than queries
      {1, 256, 128, 4, 4, 128},  // MHA, fewer keys than queries
      {2, 77, 50, 4, 2, 64},     // not multiples of the tiles
      {1, 40, 96, 2, 1, 128},    // MQA
  };
  uint64_t seed = 5000;
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (const Dims& d : dims) {
      std::vector<Backend> backends{Backend::Auto};
      if (dt != DType::F32) backends.push_back(Backend::Own);
      if (dt != DType::F32 && d.T % 128 == 0 && d.Tk % 128 == 0 && d.D == 64) backends.push_back(Backend::Cudnn);
      for (Backend b : backends) {
        INFO("B " << d.B << " T " << d.T << " Tk " << d.Tk << " H " << d.H << " G " << d.G << " D " << d.D << " "
                  << dtype_name(dt) << " backend " << static_cast<int>(b));
        const Policy policy(b);
        const Shape qs{d.B, d.T, d.H, d.D}, ks{d.B, d.Tk, d.G, d.D};
        const Tensor q64 = rounded(randn64(qs, ++seed), dt), k64 = rounded(randn64(ks, ++seed), dt),
                     v64 = rounded(randn64(ks, ++seed), dt), do64 = rounded(randn64(qs, ++seed), dt);
        const Tensor q = to_device(q64, dt), k = to_device(k64, dt), v = to_device(v64, dt), dout = to_device(do64, dt);
        Tensor out = poisoned(qs, dt), lse = poisoned({d.B, d.H, d.T}, DType::F32);
        ops::attention_forward(out, lse, q, k, v, false);
        Tensor out_r = Tensor::empty(qs, DType::F64), lse_r = Tensor::empty({d.B, d.H, d.T}, DType::F64);
        ops::attention_forward(out_r, lse_r, q64, k64, v64, false);
        check_close("non-causal attention out", out, out_r, dt);
        check_close("non-causal attention lse", lse, lse_r, dt, dt != DType::F32 ? 1e-3 : kTolF32);
        Tensor dq[2], dk[2], dv[2];
        for (int run = 0; run < 2; ++run) {
          dq[run] = poisoned(qs, dt);
          dk[run] = poisoned(ks, dt);
          dv[run] = poisoned(ks, dt);
          ops::attention_backward(dq[run], dk[run], dv[run], dout, q, k, v, out, lse, false);
        }
        Tensor dq_r = Tensor::empty(qs, DType::F64), dk_r = Tensor::empty(ks, DType::F64),
               dv_r = Tensor::empty(ks, DType::F64);
        ops::attention_backward(dq_r, dk_r, dv_r, do64, q64, k64, v64, out_r, lse_r, false);
        check_close("non-causal attention dq", dq[0], dq_r, dt);
        check_close("non-causal attention dk", dk[0], dk_r, dt);
        check_close("non-causal attention dv", dv[0], dv_r, dt);
        CHECK(bitwise_equal(dq[0], dq[1]));
        CHECK(bitwise_equal(dk[0], dk[1]));
        CHECK(bitwise_equal(dv[0], dv[1]));
      }
    }
}

TEST_CASE("cuda non-causal attention cuDNN cannot run under attention_backend cudnn is refused by name",
          "[cuda][context]") {
  init();
  const Policy policy(Backend::Cudnn);
  const Tensor q = Tensor::zeros({1, 128, 2, 64}, DType::BF16, Device::CUDA);
  const Tensor k = Tensor::zeros({1, 200, 2, 64}, DType::BF16, Device::CUDA);  // Tk % 128 != 0
  Tensor out = Tensor::zeros(q.shape(), DType::BF16, Device::CUDA), lse = Tensor::zeros({1, 2, 128}, DType::F32, Device::CUDA);
  try {
    ops::attention_forward(out, lse, q, k, k, false);
    FAIL("accepted");
  } catch (const mt::Error& e) {
    CHECK(std::string(e.what()).find("training.attention_backend is cudnn") != std::string::npos);
    CHECK(std::string(e.what()).find("Tk % 128 == 0") != std::string::npos);
  }
}

TEST_CASE("cuda attention_merge and seq_copy match the CPU", "[cuda][context]") {
  init();
  uint64_t seed = 6000;
  for (DType dt : {DType::F32, DType::BF16}) {
    INFO(dtype_name(dt));
    const int64_t B = 2, T = 40, Tb = 24, H = 4, D = 64, t0 = 10;
    const Tensor o64 = rounded(randn64({B, T, H, D}, ++seed), dt), p64 = rounded(randn64({B, Tb, H, D}, ++seed), dt);
    const Tensor l64 = randn64({B, H, T}, ++seed, 2.0), pl64 = randn64({B, H, Tb}, ++seed, 2.0);
    Tensor o = to_device(o64, dt), l = to_device(l64, DType::F32);
    ops::attention_merge(o, l, to_device(p64, dt), to_device(pl64, DType::F32), t0);
    Tensor o_r = o64.clone(), l_r = rounded(l64, DType::F32);
    ops::attention_merge(o_r, l_r, p64, rounded(pl64, DType::F32), t0);
    check_close("attention_merge out", o, o_r, dt);
    check_close("attention_merge lse", l, l_r, DType::F32);

    Tensor dst = to_device(o64, dt), dst_r = o64.clone();
    ops::seq_copy(dst, 3, to_device(p64, dt), 5, 12, ops::GradMode::Accumulate);
    ops::seq_copy(dst_r, 3, p64, 5, 12, ops::GradMode::Accumulate);
    ops::seq_copy(dst, 20, to_device(p64, dt), 0, 7);
    ops::seq_copy(dst_r, 20, p64, 0, 7);
    check_close("seq_copy", dst, dst_r, dt);
  }
}

TEST_CASE("cuda rope and qkv_split_rope at two chunks' positions match the CPU", "[cuda][context]") {
  init();
  uint64_t seed = 8000;
  for (DType dt : {DType::F32, DType::BF16}) {
    INFO(dtype_name(dt));
    const int64_t B = 2, T = 64, H = 4, G = 2, D = 64, W = G * (H / G + 2) * D;
    const RopePositions pos = context_chunk_positions(T, 4, 1);  // chunks 1 and 6 of 8 (32 each)
    const Tensor x64 = rounded(randn64({B, T, H, D}, ++seed), dt);
    Tensor x = to_device(x64, dt), x_r = x64.clone();
    ops::rope_forward(x, 10000.0, pos);
    ops::rope_forward(x_r, 10000.0, pos);
    check_close("rope_forward at chunk positions", x, x_r, dt);
    const Tensor qkv64 = rounded(randn64({B, T, W}, ++seed), dt);
    Tensor q = poisoned({B, T, H, D}, dt), k = poisoned({B, T, G, D}, dt), v = poisoned({B, T, G, D}, dt);
    Tensor qr = Tensor::empty({B, T, H, D}, DType::F64), kr = Tensor::empty({B, T, G, D}, DType::F64),
           vr = Tensor::empty({B, T, G, D}, DType::F64);
    ops::qkv_split_rope_forward(q, k, v, to_device(qkv64, dt), 10000.0, pos);
    ops::qkv_split_rope_forward(qr, kr, vr, qkv64, 10000.0, pos);
    check_close("qkv_split_rope_forward q at chunk positions", q, qr, dt);
    check_close("qkv_split_rope_forward k at chunk positions", k, kr, dt);
    Tensor dqkv = poisoned({B, T, W}, dt), dqkv_r = Tensor::empty({B, T, W}, DType::F64);
    ops::qkv_split_rope_backward(dqkv, to_device(qr, dt), to_device(kr, dt), to_device(vr, dt), 10000.0, pos);
    ops::qkv_split_rope_backward(dqkv_r, rounded(qr, dt), rounded(kr, dt), rounded(vr, dt), 10000.0, pos);
    check_close("qkv_split_rope_backward at chunk positions", dqkv, dqkv_r, dt);
  }
}

TEST_CASE("cuda load-balanced attention blocks merged equal causal attention on the CPU", "[cuda][context]") {
  init();
  uint64_t seed = 7000;
  // fp32 on our kernels; bf16 through cuDNN only (attention_backend cudnn: a block it does not run is an error).
  for (DType dt : {DType::F32, DType::BF16})
    for (int P : {2, 4}) {
      const Policy policy(dt == DType::BF16 ? Backend::Cudnn : Backend::Auto);
      const int64_t B = 1, H = 8, G = 2, D = 64, c = 128, T = 2 * P * c;  // chunks of 128: cuDNN runs bf16 blocks
      INFO(dtype_name(dt) << " P " << P);
      const Tensor q64 = rounded(randn64({B, T, H, D}, ++seed), dt), k64 = rounded(randn64({B, T, G, D}, ++seed), dt),
                   v64 = rounded(randn64({B, T, G, D}, ++seed), dt), do64 = rounded(randn64({B, T, H, D}, ++seed), dt);
      Tensor out_r = Tensor::empty(q64.shape(), DType::F64), lse_r = Tensor::empty({B, H, T}, DType::F64);
      ops::attention_forward(out_r, lse_r, q64, k64, v64);
      Tensor dq_r = Tensor::empty(q64.shape(), DType::F64), dk_r = Tensor::empty(k64.shape(), DType::F64),
             dv_r = Tensor::empty(k64.shape(), DType::F64);
      ops::attention_backward(dq_r, dk_r, dv_r, do64, q64, k64, v64, out_r, lse_r);
      const Tensor q = to_device(q64, dt), k = to_device(k64, dt), v = to_device(v64, dt), dout = to_device(do64, dt);
      std::vector<Tensor> ql, kl, vl, dol, dkl, dvl;
      for (int r = 0; r < P; ++r) {
        ql.push_back(test::cp_local(q, P, r));
        kl.push_back(test::cp_local(k, P, r));
        vl.push_back(test::cp_local(v, P, r));
        dol.push_back(test::cp_local(dout, P, r));
        dkl.push_back(Tensor::zeros(kl[r].shape(), dt, Device::CUDA));  // block r's gradient, summed over the ranks
        dvl.push_back(Tensor::zeros(vl[r].shape(), dt, Device::CUDA));
      }
      auto half = [&](const Tensor& x, int64_t t0) {
        Shape s = x.shape();
        s[1] = c;
        Tensor o = Tensor::empty(s, x.dtype(), x.device());
        ops::seq_copy(o, 0, x, t0, c);
        return o;
      };
      for (int r = 0; r < P; ++r) {
        // Forward: the ring's schedule (parallel/context_parallel.cpp ring_forward), merged in step order.
        Tensor out = poisoned(ql[r].shape(), dt), lse = poisoned({B, H, 2 * c}, DType::F32);
        ops::attention_forward(out, lse, ql[r], kl[r], vl[r], true);
        for (int i = 1; i < P; ++i) {
          const int s = (r - i + P) % P;
          const bool all_queries = s < r;
          const Tensor qb = all_queries ? ql[r] : half(ql[r], c);
          const Tensor kb = all_queries ? half(kl[s], 0) : kl[s], vb = all_queries ? half(vl[s], 0) : vl[s];
          Tensor part = poisoned(qb.shape(), dt), part_lse = poisoned({B, H, qb.size(1)}, DType::F32);
          ops::attention_forward(part, part_lse, qb, kb, vb, false);
          ops::attention_merge(out, lse, part, part_lse, all_queries ? 0 : c);
        }
        check_close("blocked attention out", out, test::cp_local(out_r, P, r), dt);
        check_close("blocked attention lse", lse, test::cp_local_lse(lse_r, P, r), dt,
                    dt != DType::F32 ? 1e-3 : kTolF32);
        // Backward: the same blocks with the merged out and lse (ring_backward), dq here, dk/dv to the block's owner.
        Tensor dq = poisoned(ql[r].shape(), dt);
        {
          Tensor dkb = poisoned(kl[r].shape(), dt), dvb = poisoned(vl[r].shape(), dt);
          ops::attention_backward(dq, dkb, dvb, dol[r], ql[r], kl[r], vl[r], out, lse, true);
          ops::add_(dkl[r], dkb);
          ops::add_(dvl[r], dvb);
        }
        for (int i = 1; i < P; ++i) {
          const int s = (r - i + P) % P;
          if (s < r) {  // every query, the block's first chunk
            const Tensor kb = half(kl[s], 0), vb = half(vl[s], 0);
            Tensor dqb = poisoned(ql[r].shape(), dt), dkh = poisoned(kb.shape(), dt), dvh = poisoned(vb.shape(), dt);
            ops::attention_backward(dqb, dkh, dvh, dol[r], ql[r], kb, vb, out, lse, false);
            ops::add_(dq, dqb);
            ops::seq_copy(dkl[s], 0, dkh, 0, c, ops::GradMode::Accumulate);
            ops::seq_copy(dvl[s], 0, dvh, 0, c, ops::GradMode::Accumulate);
          } else {  // the second local chunk, the whole block
            const Tensor qh = half(ql[r], c), doh = half(dol[r], c), oh = half(out, c);
            Tensor lh = Tensor::empty({B * H, c, 1}, DType::F32, Device::CUDA);
            ops::seq_copy(lh, 0, lse.view({B * H, 2 * c, 1}), c, c);
            Tensor dqh = poisoned(qh.shape(), dt), dkb = poisoned(kl[s].shape(), dt), dvb = poisoned(vl[s].shape(), dt);
            ops::attention_backward(dqh, dkb, dvb, doh, qh, kl[s], vl[s], oh, lh.view({B, H, c}), false);
            ops::seq_copy(dq, c, dqh, 0, c, ops::GradMode::Accumulate);
            ops::add_(dkl[s], dkb);
            ops::add_(dvl[s], dvb);
          }
        }
        check_close("blocked attention dq", dq, test::cp_local(dq_r, P, r), dt);
      }
      for (int r = 0; r < P; ++r) {
        check_close("blocked attention dk", dkl[r], test::cp_local(dk_r, P, r), dt);
        check_close("blocked attention dv", dvl[r], test::cp_local(dv_r, P, r), dt);
      }
    }
}

#endif
