// CUDA ops against the CPU reference: elementwise, sum_squares, linear, embedding, norms, activations,
// rope, qkv split, cross-entropy, dropout, fill_normal, AdamW, in fp32, bf16 and fp16, on fresh random inputs, with odd
// sizes and shifted views that take the scalar (non-vector) paths. test_cuda_util.h explains the
// tolerances. Attention is in test_cuda_attention.cpp.
#include "catch.h"

#if defined(MEGATRAIN_HAVE_CUDA)
#include <functional>
#include <iterator>

#include "core/counter_rng.h"
#include "optim/adamw.h"
#include "params/param_store.h"
#include "tensor/master_halves_ops.h"
#include "test_cuda_util.h"
#include "tensor/scalar_read.h"

using namespace mt;
using namespace mt::gpu_test;

namespace {
const DType kDTypes[] = {DType::F32, DType::BF16, DType::F16};

struct LinearDims { int64_t N, IC, OC; };
// fn(dt, d) for every dtype of kDTypes and every shape; failures name the dtype and the shape.
template <typename F>
void for_each_linear_case(std::initializer_list<LinearDims> shapes, F&& fn) {
  for (DType dt : kDTypes)
    for (const LinearDims& d : shapes) {
      INFO(dtype_name(dt) << " N " << d.N << " IC " << d.IC << " OC " << d.OC);
      fn(dt, d);
    }
}
}  // namespace

TEST_CASE("cuda elementwise ops match the CPU", "[cuda][ops]") {
  init();
  uint64_t seed = 100;
  for (DType dt : kDTypes)
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(4096), int64_t(1000003)})
      for (int64_t shift : {int64_t(0), int64_t(1)}) {
        const Tensor a64 = rounded(randn64({n}, ++seed), dt), b64 = rounded(randn64({n}, ++seed), dt);
        const Tensor a = to_device_shifted(a64, dt, shift), b = to_device_shifted(b64, dt, shift);
        Tensor ref = Tensor::empty({n}, DType::F64);
        // add (out = a + b), into a poisoned output
        Tensor out = poisoned({n}, dt);
        ops::add(out, a, b);
        ops::add(ref, a64, b64);
        check_close("add", out, rounded(ref, dt), dt);
        // add_ (a += b), in place
        Tensor c = to_device_shifted(a64, dt, shift);
        ops::add_(c, b);
        check_close("add_", c, rounded(ref, dt), dt);
        // scale_
        Tensor sc = to_device_shifted(a64, dt, shift);
        ops::scale_(sc, -1.7);
        Tensor ref_s = a64.clone();
        ops::scale_(ref_s, -1.7);
        check_close("scale_", sc, ref_s, dt);
        // fill_
        Tensor f = poisoned({n}, dt);
        ops::fill_(f, 0.3125);  // exact in bf16 and fp16
        Tensor ref_f = Tensor::empty({n}, DType::F64);
        ops::fill_(ref_f, 0.3125);
        CHECK(rel_err(to_host64(f), ref_f) == 0.0);
      }
}

TEST_CASE("cuda cast and copy are exact", "[cuda][ops]") {
  init();
  for (int64_t n : {int64_t(5), int64_t(100001)})
    for (int64_t shift : {int64_t(0), int64_t(3)}) {
      const Tensor x32 = cast_host(randn64({n}, 7 + n, 3.0), DType::F32);
      Tensor d32 = to_device_shifted(x32, DType::F32, shift);
      for (DType h : {DType::BF16, DType::F16}) {
        INFO(dtype_name(h));
        Tensor d16 = poisoned({n}, h);
        ops::cast(d16, d32);  // fp32 -> bf16 / fp16: round to nearest even, like the CPU
        CHECK(bitwise_equal(d16, to_device(cast_host(x32, h), h)));
        Tensor back = poisoned({n}, DType::F32);
        ops::cast(back, d16);  // -> fp32: exact
        CHECK(bitwise_equal(back, to_device(cast_host(cast_host(x32, h), DType::F32), DType::F32)));
      }
      Tensor copy = poisoned({n}, DType::F32);
      ops::cast(copy, d32);
      CHECK(bitwise_equal(copy, d32));
    }
  // fp16's edges: the largest finite value, ties at the overflow threshold, subnormals, signed zero, inf.
  const float edges[] = {65504.f, 65519.f, 65520.f, -65536.f, 1e5f, 6.1035156e-5f, 6.0e-5f, 5.9604645e-8f,
                         2.9802322e-8f, 2.9802326e-8f, 8.940697e-8f, 1e-9f, -0.f, INFINITY, -INFINITY, 1.f / 3};
  const int64_t ne = static_cast<int64_t>(std::size(edges));
  Tensor e32 = Tensor::empty({ne}, DType::F32);
  std::memcpy(e32.raw(), edges, sizeof edges);
  Tensor e16 = poisoned({ne}, DType::F16);
  ops::cast(e16, to_device(e32, DType::F32));
  CHECK(bitwise_equal(e16, to_device(cast_host(e32, DType::F16), DType::F16)));
  Tensor i = to_device(randint32({10}, 3, -5, 5), DType::I32);
  Tensor i2 = Tensor::empty({10}, DType::I32, Device::CUDA);
  ops::cast(i2, i);
  CHECK(bitwise_equal(i2, i));
}

TEST_CASE("cuda sum_squares matches the CPU and is deterministic", "[cuda][ops]") {
  init();
  for (DType dt : kDTypes)
    for (int64_t n : {int64_t(1), int64_t(1000), int64_t(3000001)}) {
      const Tensor x64 = rounded(randn64({n}, 11 + n), dt);
      const Tensor x = to_device_shifted(x64, dt, 1);
      const double got = ops::sum_squares(x), again = ops::sum_squares(x), ref = ops::sum_squares(x64);
      ErrorTable::get().record("sum_squares", dt, std::fabs(got - ref) / ref);
      CHECK(std::fabs(got - ref) <= 1e-12 * ref);
      CHECK(std::memcmp(&got, &again, sizeof got) == 0);
    }
}

TEST_CASE("cuda sum_squares_into and read_scalars: one read of many device values", "[cuda][ops]") {
  init();
  // Sums of squares written on the device (no wait), read with F32 scalars in one call: equal to the host-value
  // sum_squares bit for bit, in order; more scalars than one gather launch takes (128).
  const Tensor x64 = rounded(randn64({300001}, 41), DType::BF16);
  const Tensor x = to_device(x64, DType::BF16);
  Tensor sums = Tensor::empty({2}, DType::F64, Device::CUDA);
  Tensor s0 = sums.slice(0, 1), s1 = sums.slice(1, 1);
  ops::sum_squares_into(s0, x);
  ops::sum_squares_into(s1, x.slice(0, 1000));
  const double a = ops::sum_squares(x), b = ops::sum_squares(x.slice(0, 1000));
  const int n = 300;
  Tensor f_host = Tensor::empty({n}, DType::F32);
  for (int i = 0; i < n; ++i) f_host.data<float>()[i] = 0.25f * static_cast<float>(i) - 7.0f;
  const Tensor f = to_device(f_host, DType::F32);
  std::vector<Tensor> scalars = {s1};
  for (int i = 0; i < n; ++i) scalars.push_back(f.slice(i, 1));
  scalars.push_back(s0);
  const std::vector<double> v = read_scalars(scalars);
  REQUIRE(v.size() == scalars.size());
  CHECK(std::memcmp(&v.front(), &b, sizeof(double)) == 0);
  CHECK(std::memcmp(&v.back(), &a, sizeof(double)) == 0);
  for (int i = 0; i < n; ++i) CHECK(v[size_t(i) + 1] == 0.25 * i - 7.0);
}

// sum_each (the experts' gradient sums of squares from their GEMMs' partials): each input's sum as the CPU's to fp64
// rounding, empty inputs 0, more inputs than one launch takes (64), the same bits on a rerun.
TEST_CASE("cuda sum_each matches the CPU and is deterministic", "[cuda][ops]") {
  init();
  std::vector<Tensor> host, dev;
  for (int i = 0; i < 70; ++i) {
    const int64_t n = i % 7 == 0 ? 0 : i % 5 == 0 ? 100003 : 1 + 37 * i;
    host.push_back(randn64({n}, 300 + i));
    dev.push_back(to_device(host.back(), DType::F64));
  }
  Tensor ref = Tensor::empty({70}, DType::F64), got = Tensor::empty({70}, DType::F64, Device::CUDA),
         again = Tensor::empty({70}, DType::F64, Device::CUDA);
  ops::sum_each(ref, host);
  ops::sum_each(got, dev);
  ops::sum_each(again, dev);
  const Tensor g = to_host(got), a = to_host(again);
  for (int i = 0; i < 70; ++i) {
    const double r = ref.data<double>()[i], v = g.data<double>()[i];
    INFO("input " << i << " of " << host[size_t(i)].numel() << " values");
    CHECK(std::fabs(v - r) <= 1e-12 * std::max(1.0, std::fabs(r)));
    if (host[size_t(i)].numel() == 0) CHECK(v == 0.0);
  }
  CHECK(std::memcmp(g.data<double>(), a.data<double>(), 70 * sizeof(double)) == 0);
}

// PendingRead: the copy is taken where the constructor stands in the stream (later writes to the source do not show),
// the host gets it after wait(); slots are reused (several reads in flight at once, of growing sizes); a read
// never waited for is finished by the destructor.
TEST_CASE("cuda PendingRead: a device read the host waits for later", "[cuda][ops]") {
  init();
  for (int64_t n : {int64_t(5), int64_t(3000), int64_t(70000)}) {
    Tensor h = Tensor::empty({n}, DType::I32);
    for (int64_t i = 0; i < n; ++i) h.data<int32_t>()[i] = int32_t(i * 7 - 3);
    Tensor d = Tensor::empty({n}, DType::I32, Device::CUDA);
    d.copy_from(h);
    PendingRead first(d);
    d.zero_();  // queued after the copy
    PendingRead second(d), unread(d);
    const Tensor& a = first.wait();
    const Tensor& b = second.wait();
    CHECK(std::memcmp(a.raw(), h.raw(), h.nbytes()) == 0);
    for (int64_t i = 0; i < n; ++i) CHECK(b.data<int32_t>()[i] == 0);
  }
}

// upload: the host's values at the call (the host buffer may change right after), in order with the stream's work;
// more uploads than staging slots (8), of growing sizes.
TEST_CASE("cuda upload: host-to-device copies that do not wait for the device", "[cuda][ops]") {
  init();
  std::vector<Tensor> dev;
  Tensor h;
  for (int i = 0; i < 20; ++i) {
    const int64_t n = 100 + 5000 * i;
    h = Tensor::empty({n}, DType::I32);
    for (int64_t j = 0; j < n; ++j) h.data<int32_t>()[j] = int32_t(i * 1000003 + j);
    dev.push_back(Tensor::empty({n}, DType::I32, Device::CUDA));
    upload(dev.back(), h);
    std::fill_n(h.data<int32_t>(), n, -1);  // after the call: not what the device gets
  }
  for (int i = 0; i < 20; ++i) {
    const Tensor back = to_host(dev[size_t(i)]);
    bool ok = true;
    for (int64_t j = 0; j < back.numel(); ++j) ok = ok && back.data<int32_t>()[j] == int32_t(i * 1000003 + j);
    CHECK(ok);
  }
}

TEST_CASE("cuda linear forward/backward match the CPU; fp32 grads accumulate", "[cuda][linear]") {
  init();
  struct Dims { int64_t N, IC, OC; };
  uint64_t seed = 200;
  for (DType dt : kDTypes)
    for (Dims d : {Dims{64, 128, 256}, Dims{37, 45, 19}, Dims{256, 1024, 768}})
      for (bool with_bias : {true, false}) {
        const Tensor x64 = rounded(randn64({d.N, d.IC}, ++seed), dt);
        const Tensor w64 = rounded(randn64({d.OC, d.IC}, ++seed, 0.05), dt);
        const Tensor b64 = rounded(randn64({d.OC}, ++seed), dt);
        const Tensor g64 = rounded(randn64({d.N, d.OC}, ++seed), dt);
        const Tensor x = to_device(x64, dt), w = to_device(w64, dt), b = to_device(b64, dt), g = to_device(g64, dt);
        // forward
        Tensor y = poisoned({d.N, d.OC}, dt), y_ref = Tensor::empty({d.N, d.OC}, DType::F64);
        ops::linear_forward(y, x, w, with_bias ? &b : nullptr);
        ops::linear_forward(y_ref, x64, w64, with_bias ? &b64 : nullptr);
        check_close("linear_forward", y, y_ref, dt);
        // forward + residual (the GEMM's C operand on the GPU; the residual is left untouched)
        const Tensor r64 = rounded(randn64({d.N, d.OC}, ++seed), dt);
        const Tensor r = to_device(r64, dt);
        Tensor yr = poisoned({d.N, d.OC}, dt), yr_ref = Tensor::empty({d.N, d.OC}, DType::F64);
        ops::linear_forward(yr, x, w, with_bias ? &b : nullptr, &r);
        ops::linear_forward(yr_ref, x64, w64, with_bias ? &b64 : nullptr, &r64);
        check_close("linear_forward + residual", yr, yr_ref, dt);
        check_close("linear_forward residual unchanged", r, r64, dt);
        // backward: dinp overwritten; dweight, dbias (fp32) accumulate onto their initial values
        const Tensor dw0 = randn64({d.OC, d.IC}, ++seed), db0 = randn64({d.OC}, ++seed);
        Tensor dx = poisoned({d.N, d.IC}, dt), dw = to_device(dw0, DType::F32), db = to_device(db0, DType::F32);
        Tensor dx_ref = Tensor::empty({d.N, d.IC}, DType::F64), dw_ref = rounded(dw0, DType::F32),
               db_ref = rounded(db0, DType::F32);
        ops::linear_backward(&dx, &dw, with_bias ? &db : nullptr, g, x, w);
        ops::linear_backward(&dx_ref, &dw_ref, with_bias ? &db_ref : nullptr, g64, x64, w64);
        check_close("linear_backward dinp", dx, dx_ref, dt);
        check_close("linear_backward dweight(fp32 +=)", dw, dw_ref, dt, kTolF32);
        if (with_bias) {
          check_close("linear_backward dbias(fp32 +=)", db, db_ref, dt, kTolF32);
          // the bias gradient alone, without inp and weight: the same column sums, bit for bit
          Tensor db_only = to_device(db0, DType::F32);
          ops::linear_backward(nullptr, nullptr, &db_only, g, Tensor(), Tensor());
          CHECK(bitwise_equal(db_only, db));
        }
        // GradMode::Accumulate on dinp
        const Tensor dx0 = rounded(randn64({d.N, d.IC}, ++seed), dt);
        Tensor dx_acc = to_device(dx0, dt), dx_acc_ref = dx0.clone();
        ops::linear_backward(&dx_acc, nullptr, nullptr, g, x, w, ops::GradMode::Accumulate);
        ops::linear_backward(&dx_acc_ref, nullptr, nullptr, g64, x64, w64, ops::GradMode::Accumulate);
        check_close("linear_backward dinp +=", dx_acc, dx_acc_ref, dt);
      }
}

// The MoE router's logits: 16-bit operands into fp32 outputs (exact products, fp32 sums), fp32 as linear_forward.
TEST_CASE("cuda linear_forward_wide gives fp32 outputs from 16-bit operands as the CPU in fp64", "[cuda][linear][moe]") {
  init();
  uint64_t seed = 2100;
  for_each_linear_case({{257, 1024, 64}, {300, 1024, 8}, {37, 45, 19}}, [&](DType dt, const LinearDims& d) {
    const Tensor x64 = rounded(randn64({d.N, d.IC}, ++seed), dt);
    const Tensor w64 = rounded(randn64({d.OC, d.IC}, ++seed, 0.05), dt);
    Tensor y = poisoned({d.N, d.OC}, DType::F32), y_ref = Tensor::empty({d.N, d.OC}, DType::F64);
    ops::linear_forward_wide(y, to_device(x64, dt), to_device(w64, dt));
    ops::linear_forward(y_ref, x64, w64, nullptr);
    check_close("linear_forward_wide", y, y_ref, DType::F32);
  });
}

// The MoE router's backward: an fp32 output gradient through 16-bit operands. Against the CPU in fp64 (dinp rounded
// once to the 16-bit dtype, dweight at fp32 precision, = and +=); and, with identity operands, exactly: dweight =
// dout^T and dinp = dout rounded once, bit for bit, for dout of full fp32 precision over 40 orders of magnitude
// (the bf16 path splits dout into three bf16 parts: a lost part or a second rounding fails these).
TEST_CASE("cuda linear_backward_wide: fp32 gradients through 16-bit operands as the CPU in fp64", "[cuda][linear][moe]") {
  init();
  uint64_t seed = 2150;
  for_each_linear_case({{300, 1024, 64}, {257, 1024, 8}, {37, 45, 19}}, [&](DType dt, const LinearDims& d) {
    const Tensor x64 = rounded(randn64({d.N, d.IC}, ++seed), dt), w64 = rounded(randn64({d.OC, d.IC}, ++seed, 0.05), dt);
    const Tensor g64 = rounded(randn64({d.N, d.OC}, ++seed, 1e-3), DType::F32), dw0 = randn64({d.OC, d.IC}, ++seed, 1e-2);
    const Tensor x = to_device(x64, dt), w = to_device(w64, dt), g = to_device(g64, DType::F32);
    Tensor dx = poisoned({d.N, d.IC}, dt), dw = to_device(dw0, DType::F32);
    Tensor dx_ref = Tensor::empty({d.N, d.IC}, DType::F64), dw_ref = rounded(dw0, DType::F32);
    ops::linear_backward_wide(&dx, &dw, g, x, w);  // dweight +=
    ops::linear_backward(&dx_ref, &dw_ref, nullptr, g64, x64, w64);
    check_close("linear_backward_wide dinp", dx, dx_ref, dt);
    check_close("linear_backward_wide dweight (fp32 +=)", dw, dw_ref, DType::F32);
    Tensor dw1 = poisoned({d.OC, d.IC}, DType::F32), dw1_ref = Tensor::empty({d.OC, d.IC}, DType::F64);
    ops::linear_backward_wide(nullptr, &dw1, g, x, w, ops::GradMode::Overwrite);
    ops::linear_backward(nullptr, &dw1_ref, nullptr, g64, x64, w64, ops::GradMode::Overwrite, ops::GradMode::Overwrite);
    check_close("linear_backward_wide dweight (fp32 =)", dw1, dw1_ref, DType::F32);
    // dinp += (the router's input gradient added to the layer's): the sum rounded once
    const Tensor dx0 = rounded(randn64({d.N, d.IC}, ++seed), dt);
    Tensor dx2 = to_device(dx0, dt), dx2_ref = dx0.clone();
    ops::linear_backward_wide(&dx2, nullptr, g, x, w, ops::GradMode::Accumulate, ops::GradMode::Accumulate);
    ops::linear_backward(&dx2_ref, nullptr, nullptr, g64, x64, w64, ops::GradMode::Accumulate);
    check_close("linear_backward_wide dinp (+=)", dx2, dx2_ref, dt);
  });
  for (DType dt : kDTypes) {
    // identity inp and weight (N = IC = OC): dweight = dout^T, dinp = dout, each exact up to dinp's one rounding
    const int64_t n = 64;
    Tensor eye64 = Tensor::zeros({n, n}, DType::F64), g64 = randn64({n, n}, ++seed);
    for (int64_t i = 0; i < n; ++i) eye64.data<double>()[i * n + i] = 1.0;
    for (int64_t i = 0; i < n * n; ++i) g64.data<double>()[i] *= std::pow(10.0, double(i % 41) - 20.0);
    g64 = rounded(g64, DType::F32);
    const Tensor eye = to_device(eye64, dt), g = to_device(g64, DType::F32);
    Tensor dx = poisoned({n, n}, dt), dw = poisoned({n, n}, DType::F32);
    ops::linear_backward_wide(&dx, &dw, g, eye, eye, ops::GradMode::Overwrite);
    Tensor gt64 = Tensor::empty({n, n}, DType::F64);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) gt64.data<double>()[j * n + i] = g64.data<double>()[i * n + j];
    INFO(dtype_name(dt) << " identity operands");
    CHECK(bitwise_equal(to_host(dw), cast_host(gt64, DType::F32)));
    if (dt != DType::F16)  // fp16's range ends at 65504: dinp = dout overflows there
      CHECK(bitwise_equal(to_host(dx), cast_host(g64, dt)));
  }
}

TEST_CASE("cuda linear + GELU (fused epilogues) match the CPU", "[cuda][linear_gelu]") {
  init();
  struct Dims { int64_t N, IC, OC; };
  uint64_t seed = 2200;
  for (DType dt : kDTypes)
    for (Dims d : {Dims{64, 128, 256}, Dims{37, 45, 19}, Dims{256, 768, 1024}})
      for (bool with_bias : {true, false}) {
        INFO("N " << d.N << " IC " << d.IC << " OC " << d.OC << " bias " << with_bias);
        const Tensor x64 = rounded(randn64({d.N, d.IC}, ++seed), dt);
        const Tensor w64 = rounded(randn64({d.OC, d.IC}, ++seed, 0.05), dt);
        const Tensor b64 = rounded(randn64({d.OC}, ++seed), dt);
        const Tensor x = to_device(x64, dt), w = to_device(w64, dt), b = to_device(b64, dt);
        // forward: pre = x w^T + b, out = gelu(pre)
        Tensor out = poisoned({d.N, d.OC}, dt), pre = poisoned({d.N, d.OC}, dt);
        Tensor out_ref = Tensor::empty({d.N, d.OC}, DType::F64), pre_ref = Tensor::empty({d.N, d.OC}, DType::F64);
        ops::linear_gelu_forward(out, pre, x, w, with_bias ? &b : nullptr);
        ops::linear_gelu_forward(out_ref, pre_ref, x64, w64, with_bias ? &b64 : nullptr);
        check_close("linear_gelu_forward out", out, out_ref, dt);
        check_close("linear_gelu_forward pre", pre, pre_ref, dt);
        // backward of a following linear (in = out, weight w2 (C, OC)) through the GELU, from the GPU's pre
        const int64_t C = 96;
        const Tensor w2_64 = rounded(randn64({C, d.OC}, ++seed, 0.05), dt), g64 = rounded(randn64({d.N, C}, ++seed), dt);
        const Tensor w2 = to_device(w2_64, dt), g = to_device(g64, dt);
        const Tensor a64 = to_host64(out), p64 = to_host64(pre);
        const Tensor dw0 = randn64({C, d.OC}, ++seed), db0 = randn64({C}, ++seed);
        Tensor dpre = poisoned({d.N, d.OC}, dt), dw = to_device(dw0, DType::F32), db = to_device(db0, DType::F32);
        Tensor dpre_ref = Tensor::empty({d.N, d.OC}, DType::F64), dw_ref = rounded(dw0, DType::F32),
               db_ref = rounded(db0, DType::F32);
        ops::linear_backward_gelu(dpre, &dw, with_bias ? &db : nullptr, g, out, w2, pre);
        ops::linear_backward_gelu(dpre_ref, &dw_ref, with_bias ? &db_ref : nullptr, g64, a64, w2_64, p64);
        check_close("linear_backward_gelu dpre", dpre, dpre_ref, dt);
        check_close("linear_backward_gelu dweight(fp32 +=)", dw, dw_ref, dt, kTolF32);
        if (with_bias) check_close("linear_backward_gelu dbias(fp32 +=)", db, db_ref, dt, kTolF32);
      }
}

TEST_CASE("cuda parameter gradients are fp32 main grads, or bf16 ones for 16-bit activations",
          "[cuda][linear][grad_bf16]") {
  init();
  const Tensor x = to_device(randn64({4, 8}, 1), DType::BF16), w = to_device(randn64({3, 8}, 2), DType::BF16);
  const Tensor g = to_device(randn64({4, 3}, 3), DType::BF16);
  Tensor dw16 = Tensor::zeros({3, 8}, DType::BF16, Device::CUDA), dwh = Tensor::zeros({3, 8}, DType::F16, Device::CUDA);
  Tensor db32 = Tensor::zeros({3}, DType::F32, Device::CUDA);
  CHECK_NOTHROW(ops::linear_backward(nullptr, &dw16, nullptr, g, x, w));
  CHECK_THROWS_AS(ops::linear_backward(nullptr, &dwh, nullptr, g, x, w), mt::Error);
  CHECK_THROWS_AS(ops::linear_backward(nullptr, &dw16, &db32, g, x, w), mt::InternalError);  // one dtype a call
  const Tensor x32 = to_device(randn64({4, 8}, 1), DType::F32), w32 = to_device(randn64({3, 8}, 2), DType::F32);
  CHECK_THROWS_AS(ops::linear_backward(nullptr, &dw16, nullptr, to_device(randn64({4, 3}, 3), DType::F32), x32, w32),
                  mt::Error);  // fp32 activations: fp32 gradients only
  Tensor p = Tensor::zeros({8}, DType::BF16, Device::CUDA);
  CHECK_THROWS_AS(ops::adamw_step(p, p, p, p, ops::AdamWArgs{}), mt::Error);
  Tensor x64 = Tensor::zeros({8}, DType::F64, Device::CUDA);
  CHECK_THROWS_AS(ops::gelu_forward(x64, x64), mt::Error);
}

// The first write of a step's weight gradient (GradMode::Overwrite, the GEMM's beta 0: ParamStore::zero_grads marks
// the gradients unwritten instead of zeroing them) gives the bits of accumulating into zeros (beta 1), whatever the
// buffer held (NaN here): linear, linear + GELU and linear + SwiGLU backward, at the ci models' shapes and odd ones.
TEST_CASE("cuda first-write weight gradients are bit-identical to accumulating into zeros", "[cuda][linear]") {
  init();
  uint64_t seed = 2700;
  for_each_linear_case({{512, 256, 768}, {512, 512, 256}, {37, 45, 19}}, [&](DType dt, const LinearDims& d) {
    const Tensor x = to_device(randn64({d.N, d.IC}, ++seed), dt), g = to_device(randn64({d.N, d.OC}, ++seed), dt);
    const Tensor w = to_device(randn64({d.OC, d.IC}, ++seed, 0.05), dt);
    const Tensor pre = to_device(randn64({d.N, d.IC}, ++seed), dt);
    const Tensor h = to_device(randn64({d.N, 2 * d.IC}, ++seed), dt);
    // dw[0]: written first onto NaN; dw[1]: accumulated onto zeros.
    auto check = [&](const char* op, const std::function<void(Tensor&, ops::GradMode)>& backward) {
      Tensor dw[2] = {poisoned({d.OC, d.IC}, DType::F32), Tensor::zeros({d.OC, d.IC}, DType::F32, Device::CUDA)};
      backward(dw[0], ops::GradMode::Overwrite);
      backward(dw[1], ops::GradMode::Accumulate);
      INFO(op);
      CHECK(all_finite(to_host64(dw[0])));
      CHECK(bitwise_equal(dw[0], dw[1]));
    };
    check("linear_backward", [&](Tensor& dw, ops::GradMode m) {
      ops::linear_backward(nullptr, &dw, nullptr, g, x, w, ops::GradMode::Overwrite, m);
    });
    check("linear_backward_gelu", [&](Tensor& dw, ops::GradMode m) {
      Tensor dpre = poisoned({d.N, d.IC}, dt);
      ops::linear_backward_gelu(dpre, &dw, nullptr, g, x, w, pre, m);
    });
    check("linear_backward_swiglu", [&](Tensor& dw, ops::GradMode m) {
      Tensor dh = poisoned({d.N, 2 * d.IC}, dt);
      ops::linear_backward_swiglu(dh, &dw, nullptr, g, w, h, m);
    });
  });
}

TEST_CASE("cuda embedding forward/backward match the CPU; backward is deterministic", "[cuda][embedding]") {
  init();
  uint64_t seed = 300;
  for (DType dt : kDTypes)
    for (int64_t C : {int64_t(96), int64_t(13)}) {
      const int64_t N = 333, Vl = 50, vocab_start = 100;
      const Tensor tok = randint32({N}, ++seed, 80, 170);  // some tokens outside [100, 150)
      const Tensor table64 = rounded(randn64({Vl, C}, ++seed), dt);
      const Tensor t = to_device(tok, DType::I32), table = to_device(table64, dt);
      Tensor out = poisoned({N, C}, dt), out_ref = Tensor::empty({N, C}, DType::F64);
      ops::embedding_forward(out, t, table, vocab_start);
      ops::embedding_forward(out_ref, tok, table64, vocab_start);
      check_close("embedding_forward", out, out_ref, dt, 0.0);
      const Tensor g64 = rounded(randn64({N, C}, ++seed), dt), dt0 = rounded(randn64({Vl, C}, ++seed), DType::F32);
      const Tensor g = to_device(g64, dt);
      Tensor dtab = to_device(dt0, DType::F32), dtab2 = to_device(dt0, DType::F32), ref = dt0.clone();
      ops::embedding_backward(dtab, g, t, vocab_start);
      ops::embedding_backward(dtab2, g, t, vocab_start);
      ops::embedding_backward(ref, g64, tok, vocab_start);
      check_close("embedding_backward dtable(fp32 +=)", dtab, ref, dt, kTolF32);
      CHECK(bitwise_equal(dtab, dtab2));
    }
}

TEST_CASE("cuda layernorm and rmsnorm match the CPU; weight grads are deterministic", "[cuda][norm]") {
  init();
  struct Dims { int64_t N, C; };
  uint64_t seed = 400;
  for (DType dt : kDTypes)
    for (Dims d : {Dims{67, 96}, Dims{16, 4096}, Dims{33, 13}, Dims{5, 1000}, Dims{257, 768}, Dims{40, 3072},
                   Dims{3000, 2048}})
      for (bool layer : {true, false}) {
        const std::string name = layer ? "layernorm" : "rmsnorm";
        const Tensor x64 = rounded(randn64({d.N, d.C}, ++seed, 2.0), dt);
        const Tensor w64 = rounded(randn64({d.C}, ++seed), dt), b64 = rounded(randn64({d.C}, ++seed), dt);
        const Tensor g64 = rounded(randn64({d.N, d.C}, ++seed), dt);
        const Tensor x = to_device(x64, dt), w = to_device(w64, dt), b = to_device(b64, dt), g = to_device(g64, dt);
        Tensor y = poisoned({d.N, d.C}, dt), mean = poisoned({d.N}, DType::F32), rstd = poisoned({d.N}, DType::F32);
        Tensor y_ref = Tensor::empty({d.N, d.C}, DType::F64), mean_ref = Tensor::empty({d.N}, DType::F64),
               rstd_ref = Tensor::empty({d.N}, DType::F64);
        if (layer) {
          ops::layernorm_forward(y, mean, rstd, x, w, b, 1e-5);
          ops::layernorm_forward(y_ref, mean_ref, rstd_ref, x64, w64, b64, 1e-5);
          check_close(name + "_forward mean", mean, mean_ref, dt, kTolF32);
        } else {
          ops::rmsnorm_forward(y, rstd, x, w, 1e-5);
          ops::rmsnorm_forward(y_ref, rstd_ref, x64, w64, 1e-5);
        }
        check_close(name + "_forward out", y, y_ref, dt);
        check_close(name + "_forward rstd", rstd, rstd_ref, dt, kTolF32);
        // backward, twice from the same start: bitwise equal
        const Tensor dw0 = randn64({d.C}, ++seed), db0 = randn64({d.C}, ++seed);
        Tensor dw_ref = rounded(dw0, DType::F32), db_ref = rounded(db0, DType::F32);
        Tensor dx_ref = Tensor::empty({d.N, d.C}, DType::F64);
        Tensor dx[2], dw[2], db[2];
        for (int run = 0; run < 2; ++run) {
          dx[run] = poisoned({d.N, d.C}, dt);
          dw[run] = to_device(dw0, DType::F32);
          db[run] = to_device(db0, DType::F32);
          if (layer) ops::layernorm_backward(dx[run], dw[run], db[run], g, x, w, mean, rstd);
          else ops::rmsnorm_backward(dx[run], dw[run], g, x, w, rstd);
        }
        if (layer) ops::layernorm_backward(dx_ref, dw_ref, db_ref, g64, x64, w64, mean_ref, rstd_ref);
        else ops::rmsnorm_backward(dx_ref, dw_ref, g64, x64, w64, rstd_ref);
        check_close(name + "_backward dinp", dx[0], dx_ref, dt);
        check_close(name + "_backward dweight(fp32 +=)", dw[0], dw_ref, dt, kTolF32);
        if (layer) check_close(name + "_backward dbias(fp32 +=)", db[0], db_ref, dt, kTolF32);
        CHECK(bitwise_equal(dx[0], dx[1]));
        CHECK(bitwise_equal(dw[0], dw[1]));
        CHECK(bitwise_equal(db[0], db[1]));
        // GradMode::Accumulate on dinp (the residual stream)
        const Tensor r0 = rounded(randn64({d.N, d.C}, ++seed), dt);
        Tensor dxa = to_device(r0, dt), dxa_ref = r0.clone();
        Tensor dwa = to_device(dw0, DType::F32), dba = to_device(db0, DType::F32);
        Tensor dwa_ref = rounded(dw0, DType::F32), dba_ref = rounded(db0, DType::F32);
        if (layer) {
          ops::layernorm_backward(dxa, dwa, dba, g, x, w, mean, rstd, ops::GradMode::Accumulate);
          ops::layernorm_backward(dxa_ref, dwa_ref, dba_ref, g64, x64, w64, mean_ref, rstd_ref,
                                  ops::GradMode::Accumulate);
        } else {
          ops::rmsnorm_backward(dxa, dwa, g, x, w, rstd, ops::GradMode::Accumulate);
          ops::rmsnorm_backward(dxa_ref, dwa_ref, g64, x64, w64, rstd_ref, ops::GradMode::Accumulate);
        }
        check_close(name + "_backward dinp +=", dxa, dxa_ref, dt);
      }
}

TEST_CASE("cuda gelu and swiglu match the CPU", "[cuda][activation]") {
  init();
  uint64_t seed = 500;
  for (DType dt : kDTypes) {
    for (int64_t n : {int64_t(9), int64_t(100003)}) {
      const Tensor x64 = rounded(randn64({n}, ++seed, 3.0), dt), g64 = rounded(randn64({n}, ++seed), dt);
      Tensor y = poisoned({n}, dt), y_ref = Tensor::empty({n}, DType::F64);
      ops::gelu_forward(y, to_device(x64, dt));
      ops::gelu_forward(y_ref, x64);
      check_close("gelu_forward", y, y_ref, dt);
      Tensor dx = poisoned({n}, dt), dx_ref = Tensor::empty({n}, DType::F64);
      ops::gelu_backward(dx, to_device(g64, dt), to_device(x64, dt));
      ops::gelu_backward(dx_ref, g64, x64);
      check_close("gelu_backward", dx, dx_ref, dt);
    }
    // rows of one partial warp (37: one column at a time), several rows per block (256, 512; 1200: threads left
    // over), one row per block (4104)
    for (int64_t F : {int64_t(37), int64_t(256), int64_t(512), int64_t(1200), int64_t(4104)}) {
      const int64_t N = 29;
      const Tensor x64 = rounded(randn64({N, 2 * F}, ++seed, 3.0), dt), g64 = rounded(randn64({N, F}, ++seed), dt);
      Tensor y = poisoned({N, F}, dt), y_ref = Tensor::empty({N, F}, DType::F64);
      ops::swiglu_forward(y, to_device(x64, dt));
      ops::swiglu_forward(y_ref, x64);
      check_close("swiglu_forward", y, y_ref, dt);
      Tensor dx = poisoned({N, 2 * F}, dt), dx_ref = Tensor::empty({N, 2 * F}, DType::F64);
      ops::swiglu_backward(dx, to_device(g64, dt), to_device(x64, dt));
      ops::swiglu_backward(dx_ref, g64, x64);
      check_close("swiglu_backward", dx, dx_ref, dt);
    }
  }
}

TEST_CASE("cuda rope and qkv split match the CPU", "[cuda][attention]") {
  init();
  struct Dims { int64_t B, T, heads, D; };
  uint64_t seed = 600;
  for (DType dt : kDTypes)
    for (Dims d : {Dims{2, 37, 3, 64}, Dims{1, 300, 4, 128}, Dims{2, 5, 2, 6}})
      for (double theta : {10000.0, 500000.0}) {
        const Tensor x64 = rounded(randn64({d.B, d.T, d.heads, d.D}, ++seed), dt);
        Tensor x = to_device(x64, dt), ref = x64.clone();
        ops::rope_forward(x, theta, 17);
        ops::rope_forward(ref, theta, 17);
        check_close("rope_forward", x, ref, dt);
        Tensor g = to_device(x64, dt), gref = x64.clone();
        ops::rope_backward(g, theta, 2000);
        ops::rope_backward(gref, theta, 2000);
        check_close("rope_backward", g, gref, dt);
      }
  struct QDims { int64_t B, T, H, G, D; };
  for (DType dt : kDTypes)
    for (QDims d : {QDims{2, 5, 8, 2, 64}, QDims{1, 3, 4, 4, 12}, QDims{3, 7, 6, 1, 128}}) {
      const int64_t W = d.G * (d.H / d.G + 2) * d.D;
      const Tensor qkv64 = rounded(randn64({d.B, d.T, W}, ++seed), dt);
      Tensor q = poisoned({d.B, d.T, d.H, d.D}, dt), k = poisoned({d.B, d.T, d.G, d.D}, dt),
             v = poisoned({d.B, d.T, d.G, d.D}, dt);
      Tensor qr = Tensor::empty(q.shape(), DType::F64), kr = Tensor::empty(k.shape(), DType::F64),
             vr = Tensor::empty(v.shape(), DType::F64);
      ops::qkv_split_forward(q, k, v, to_device(qkv64, dt));
      ops::qkv_split_forward(qr, kr, vr, qkv64);
      check_close("qkv_split_forward q", q, qr, dt, 0.0);
      check_close("qkv_split_forward k", k, kr, dt, 0.0);
      check_close("qkv_split_forward v", v, vr, dt, 0.0);
      Tensor dqkv = poisoned({d.B, d.T, W}, dt);
      ops::qkv_split_backward(dqkv, q, k, v);
      check_close("qkv_split_backward", dqkv, qkv64, dt, 0.0);
    }
  // split + rope in one pass (llama): against the CPU's split-then-rope, and against the GPU's own split and rope
  for (DType dt : kDTypes)
    for (QDims d : {QDims{2, 37, 8, 2, 64}, QDims{1, 300, 6, 2, 128}, QDims{3, 7, 6, 1, 128}, QDims{2, 5, 4, 4, 6}}) {
      INFO("B " << d.B << " T " << d.T << " H " << d.H << " G " << d.G << " D " << d.D);
      const int64_t W = d.G * (d.H / d.G + 2) * d.D;
      const Shape qs{d.B, d.T, d.H, d.D}, ks{d.B, d.T, d.G, d.D};
      const Tensor qkv64 = rounded(randn64({d.B, d.T, W}, ++seed), dt);
      const Tensor qkv = to_device(qkv64, dt);
      Tensor q = poisoned(qs, dt), k = poisoned(ks, dt), v = poisoned(ks, dt);
      Tensor qr = Tensor::empty(qs, DType::F64), kr = Tensor::empty(ks, DType::F64), vr = Tensor::empty(ks, DType::F64);
      ops::qkv_split_rope_forward(q, k, v, qkv, 10000.0, 11);
      ops::qkv_split_rope_forward(qr, kr, vr, qkv64, 10000.0, 11);
      check_close("qkv_split_rope_forward q", q, qr, dt);
      check_close("qkv_split_rope_forward k", k, kr, dt);
      check_close("qkv_split_rope_forward v", v, vr, dt, 0.0);
      Tensor q2 = poisoned(qs, dt), k2 = poisoned(ks, dt), v2 = poisoned(ks, dt);
      ops::qkv_split_forward(q2, k2, v2, qkv);
      ops::rope_forward(q2, 10000.0, 11);
      ops::rope_forward(k2, 10000.0, 11);
      check_close("qkv_split_rope_forward q vs split + rope", q, to_host64(q2), dt, dt == DType::F32 ? kTolF32 : 5e-3);
      const Tensor dq64 = rounded(randn64(qs, ++seed), dt), dk64 = rounded(randn64(ks, ++seed), dt),
                   dv64 = rounded(randn64(ks, ++seed), dt);
      Tensor dqkv = poisoned({d.B, d.T, W}, dt), dqkv_r = Tensor::empty({d.B, d.T, W}, DType::F64);
      ops::qkv_split_rope_backward(dqkv, to_device(dq64, dt), to_device(dk64, dt), to_device(dv64, dt), 10000.0, 11);
      ops::qkv_split_rope_backward(dqkv_r, dq64, dk64, dv64, 10000.0, 11);
      check_close("qkv_split_rope_backward", dqkv, dqkv_r, dt);
    }
}

TEST_CASE("cuda linear + SwiGLU backward (recomputed SwiGLU output) matches the CPU", "[cuda][linear_swiglu]") {
  init();
  struct Dims { int64_t N, F, OC; };
  uint64_t seed = 2600;
  for (DType dt : kDTypes)
    for (Dims d : {Dims{64, 128, 96}, Dims{37, 45, 19}, Dims{256, 1024, 512}})
      for (bool in_place : {false, true}) {
        INFO("N " << d.N << " F " << d.F << " OC " << d.OC << " in place " << in_place);
        const Tensor h64 = rounded(randn64({d.N, 2 * d.F}, ++seed, 2.0), dt);
        const Tensor w64 = rounded(randn64({d.OC, d.F}, ++seed, 0.05), dt), g64 = rounded(randn64({d.N, d.OC}, ++seed), dt);
        const Tensor dw0 = randn64({d.OC, d.F}, ++seed), db0 = randn64({d.OC}, ++seed);
        Tensor h = to_device(h64, dt);
        Tensor dh = in_place ? h : poisoned({d.N, 2 * d.F}, dt);
        Tensor dw = to_device(dw0, DType::F32), db = to_device(db0, DType::F32);
        Tensor dh_ref = Tensor::empty({d.N, 2 * d.F}, DType::F64), dw_ref = rounded(dw0, DType::F32),
               db_ref = rounded(db0, DType::F32);
        ops::linear_backward_swiglu(dh, &dw, &db, to_device(g64, dt), to_device(w64, dt), h);
        ops::linear_backward_swiglu(dh_ref, &dw_ref, &db_ref, g64, w64, h64);
        check_close("linear_backward_swiglu dh", dh, dh_ref, dt);
        check_close("linear_backward_swiglu dweight(fp32 +=)", dw, dw_ref, dt);
        check_close("linear_backward_swiglu dbias(fp32 +=)", db, db_ref, dt, kTolF32);
      }
}

TEST_CASE("cuda cross-entropy matches the CPU", "[cuda][cross_entropy]") {
  init();
  struct Dims { int64_t N, Vl, n_valid, vocab_start; };
  uint64_t seed = 700;
  for (DType dt : kDTypes)
    for (Dims d : {Dims{37, 1000, 990, 500}, Dims{20, 333, 333, 0}, Dims{8, 4096, 4000, 4096}})
      for (bool in_place : {false, true}) {
        const Tensor z64 = rounded(randn64({d.N, d.Vl}, ++seed, 4.0), dt);
        const Tensor tok = randint32({d.N}, ++seed, static_cast<int32_t>(d.vocab_start - 50),
                                     static_cast<int32_t>(d.vocab_start + d.n_valid + 50));
        const Tensor z = to_device(z64, dt), t = to_device(tok, DType::I32);
        Tensor mx = poisoned({d.N}, DType::F32), se = poisoned({d.N}, DType::F32), tl = poisoned({d.N}, DType::F32);
        Tensor mx_r = Tensor::empty({d.N}, DType::F64), se_r = Tensor::empty({d.N}, DType::F64),
               tl_r = Tensor::empty({d.N}, DType::F64);
        ops::cross_entropy_stats(mx, se, tl, z, t, d.vocab_start, d.n_valid);
        ops::cross_entropy_stats(mx_r, se_r, tl_r, z64, tok, d.vocab_start, d.n_valid);
        check_close("cross_entropy_stats max", mx, mx_r, dt, kTolF32);
        check_close("cross_entropy_stats sumexp", se, se_r, dt, kTolF32);
        check_close("cross_entropy_stats target_logit", tl, tl_r, dt, kTolF32);
        // lse from the reference stats; dloss = 1/N
        Tensor lse64 = Tensor::empty({d.N}, DType::F64), dl64 = Tensor::empty({d.N}, DType::F64);
        for (int64_t n = 0; n < d.N; ++n) {
          lse64.data<double>()[n] = mx_r.data<double>()[n] + std::log(se_r.data<double>()[n]);
          dl64.data<double>()[n] = 1.0 / static_cast<double>(d.N) * (1 + n % 3);
        }
        const Tensor lse32 = rounded(lse64, DType::F32), dl32 = rounded(dl64, DType::F32);
        Tensor dz = in_place ? to_device(z64, dt) : poisoned({d.N, d.Vl}, dt);
        ops::cross_entropy_backward(dz, in_place ? dz : z, t, to_device(lse32, DType::F32),
                                    to_device(dl32, DType::F32), d.vocab_start, d.n_valid);
        Tensor dz_ref = Tensor::empty({d.N, d.Vl}, DType::F64);
        ops::cross_entropy_backward(dz_ref, z64, tok, lse32, dl32, d.vocab_start, d.n_valid);
        check_close("cross_entropy_backward", dz, dz_ref, dt);
      }
}

TEST_CASE("cuda dropout masks are bit-identical to the CPU", "[cuda][dropout]") {
  init();
  for (DType dt : kDTypes)
    for (int64_t n : {int64_t(17), int64_t(1000003)})
      for (double p : {0.1, 0.5}) {
        const uint64_t seed = 1234 + n, offset = 987654321;
        const Tensor x32 = cast_host(rounded(randn64({n}, n + 5), dt), DType::F32);
        Tensor y = poisoned({n}, dt), dx = poisoned({n}, dt);
        ops::dropout_forward(y, to_device(x32, dt), p, seed, offset);
        ops::dropout_backward(dx, to_device(x32, dt), p, seed, offset);
        Tensor y_ref = Tensor::empty({n}, DType::F32);
        ops::dropout_forward(y_ref, x32, p, seed, offset);
        const Tensor yh = to_host64(y), dxh = to_host64(dx), yr = cast_host(y_ref, DType::F64);
        int64_t mask_diff = 0;
        for (int64_t i = 0; i < n; ++i) {
          mask_diff += (yh.data<double>()[i] == 0.0) != (yr.data<double>()[i] == 0.0);
          mask_diff += (dxh.data<double>()[i] == 0.0) != (yr.data<double>()[i] == 0.0);
        }
        CHECK(mask_diff == 0);
        if (dt == DType::F32) {
          CHECK(bitwise_equal(y, to_device(y_ref, DType::F32)));  // the scale multiply is fp64 on both
        }
        check_close("dropout_forward", y, yr, dt);
        check_close("dropout_backward", dx, yr, dt);
      }
}

TEST_CASE("cuda fill_normal is bit-identical to the CPU in fp32", "[cuda][fill_normal]") {
  init();
  const uint64_t seed = 4242, stream = rng::kRouterLogitsStream;
  for (int64_t n : {int64_t(17), int64_t(100003)})
    for (int64_t shift : {int64_t(0), int64_t(1)}) {  // 1: the scalar (non-vector) stores
      const uint64_t offset = 123456789ull * static_cast<uint64_t>(shift + 1);
      Tensor ref32 = Tensor::empty({n}, DType::F32), ref64 = Tensor::empty({n}, DType::F64);
      ops::fill_normal(ref32, seed, stream, offset);
      ops::fill_normal(ref64, seed, stream, offset);
      Tensor nan_host = Tensor::empty({n}, DType::F64);
      ops::fill_(nan_host, std::nan(""));
      for (DType dt : kDTypes) {
        INFO(dtype_name(dt) << " n " << n << " shift " << shift);
        Tensor out = to_device_shifted(nan_host, dt, shift);  // poisoned
        ops::fill_normal(out, seed, stream, offset);
        if (dt == DType::F32) {
          const Tensor h = to_host(out);
          int64_t differ = 0;
          for (int64_t i = 0; i < n; ++i) differ += h.data<float>()[i] != ref32.data<float>()[i];
          CHECK(differ == 0);
        }
        check_close("fill_normal", out, rounded(ref64, dt), dt);
      }
    }
}

TEST_CASE("cuda adamw matches the CPU over several steps", "[cuda][adamw]") {
  init();
  for (int64_t n : {int64_t(3), int64_t(100003)})
    for (int64_t shift : {int64_t(0), int64_t(1)}) {
      const Tensor p0 = rounded(randn64({n}, 1 + n, 0.02), DType::F32);
      const Tensor zero = Tensor::zeros({n}, DType::F64);
      Tensor p = to_device_shifted(p0, DType::F32, shift), m = to_device_shifted(zero, DType::F32, shift);
      Tensor v = to_device_shifted(zero, DType::F32, shift);
      Tensor pr = p0.clone(), mr = Tensor::zeros({n}, DType::F64), vr = Tensor::zeros({n}, DType::F64);
      ops::AdamWArgs a;
      a.lr = 1e-3;
      a.weight_decay = 0.1;
      a.grad_scale = 0.5;
      for (int64_t step = 1; step <= 3; ++step) {
        a.step = step;
        const Tensor g64 = rounded(randn64({n}, 1000 * step + n), DType::F32);
        ops::adamw_step(p, m, v, to_device_shifted(g64, DType::F32, shift), a);
        ops::adamw_step(pr, mr, vr, g64, a);
      }
      check_close("adamw_step param", p, pr, DType::F32);
      check_close("adamw_step m", m, mr, DType::F32);
      check_close("adamw_step v", v, vr, DType::F32);
    }
}
// The trainer's AdamW on a GPU runs its update on a side stream, chunk by chunk, beside the next forward
// (optim/adamw.h): after params_needed(range) the compute stream reads that range's updated bf16 weights, and after
// wait_update all of them, bit for bit what one in-stream update gives. 2 x 40M parameters (several chunks, each
// ~0.1 ms of update): without the wait a read issued at once would see the old weights.
TEST_CASE("cuda adamw beside the compute stream: reads after params_needed see the update", "[cuda][adamw]") {
  init();
  ParamStore store{0, 1};
  for (const char* name : {"first.weight", "second.weight"}) {
    ParamSpec s;
    s.name = name;
    s.global_shape = {40 << 20};
    store.add(s);
  }
  store.allocate(DType::BF16, Device::CUDA);
  store.initialize(7, 0.02, 1);
  const Tensor g64 = rounded(randn64({store.padded_numel()}, 77, 0.01), DType::F32);
  store.flat_grads().copy_from(to_device(g64, DType::F32));
  // the reference: one in-stream update of copies
  OptimizerConfig cfg;
  ops::AdamWArgs a;
  a.lr = 1e-3, a.beta1 = cfg.adam_beta1, a.beta2 = cfg.adam_beta2, a.eps = cfg.adam_eps;
  a.weight_decay = cfg.weight_decay, a.step = 1;
  // (the optimizer holds bf16 master weights as halves: the values are the high halves)
  const Tensor& master = store.flat_master();
  Tensor hi_ref = Tensor::empty(master.shape(), DType::BF16, Device::CUDA),
         lo_ref = Tensor::empty(master.shape(), DType::U16, Device::CUDA),
         m_ref = Tensor::zeros(master.shape(), DType::F32, Device::CUDA), v_ref = m_ref.clone();
  ops::split_master(hi_ref, &lo_ref, master);
  ops::adamw_step_halves(hi_ref, lo_ref, m_ref, v_ref, store.flat_grads(), a);
  const int64_t N = int64_t{80} << 20;  // the two parameters (not the padding after them)
  Tensor want_dev = Tensor::empty({N}, DType::F32, Device::CUDA);
  ops::cast(want_dev, hi_ref.slice(0, N));
  const Tensor want = to_host(want_dev);
  ParallelState ps;
  AdamW opt(store, cfg, ps, false);
  opt.step(1e-3, 1.0);
  const Param* second = store.find("second.weight");
  const auto b = static_cast<int64_t>(second->flat_offset), n = second->value.numel();
  opt.params_needed(b, b + n);
  Tensor got = Tensor::empty({n}, DType::F32, Device::CUDA);
  ops::cast(got, store.flat_values().slice(b, n));  // a kernel on the compute stream, issued at once
  CHECK(std::memcmp(to_host(got).data<float>(), want.data<float>() + b, size_t(n) * sizeof(float)) == 0);
  opt.wait_update();
  Tensor all = Tensor::empty({N}, DType::F32, Device::CUDA);
  ops::cast(all, store.flat_values().slice(0, N));
  CHECK(std::memcmp(to_host(all).data<float>(), want.data<float>(), size_t(N) * sizeof(float)) == 0);
}

// AdamW on a bf16 store allocates m and v only once take_master has split the store's fp32 master weights into halves
// and freed them: the device never holds the fp32 copy beside m and v (18 bytes a parameter at start-up against 16 in
// training, where `megatrain plan` counts 16). The peak over the store's allocation, take_master and a step: values 2
// + grads 4 + low halves 2 + m and v 8 bytes a parameter, within the split's 32 MiB staging piece.
TEST_CASE("cuda adamw on a bf16 store: start-up holds at most the training's 16 bytes a parameter",
          "[cuda][adamw][master_halves]") {
  init();
  const size_t before = mt::cuda::allocator_stats().allocated;
  mt::cuda::reset_peak_allocated();
  ParamStore store{0, 1};
  ParamSpec s;
  s.name = "w.weight";
  s.global_shape = {64 << 20};
  store.add(s);
  store.allocate(DType::BF16, Device::CUDA);
  store.initialize(7, 0.02, 1);
  const size_t N = static_cast<size_t>(store.padded_numel());
  OptimizerConfig cfg;
  ParallelState ps;
  AdamW opt(store, cfg, ps, false);
  opt.take_master();
  ops::fill_(store.flat_grads(), 1e-3);
  opt.step(1e-3, 1.0);
  opt.wait_update();
  const size_t peak = mt::cuda::allocator_stats().peak_allocated - before;
  INFO("peak " << peak << " bytes for " << N << " parameters");
  CHECK(peak >= 16 * N);
  CHECK(peak <= 16 * N + (size_t{32} << 20));
}

// Weight decay by element range in one update: the same bits as one update per run (runs of 1 to 1031 elements,
// boundaries inside 4-float vectors, more runs than one launch's table holds), with and without the bf16 copy.
TEST_CASE("cuda adamw with decay runs equals one update per run", "[cuda][adamw]") {
  init();
  ops::DecayRuns runs;
  int64_t n = 0;
  for (int64_t r = 0; r < 450; ++r) {
    runs.starts.push_back(n);
    runs.decay.push_back(r % 3 != 1);
    n += 1 + (r * 37) % 1031;
  }
  for (bool with_copy : {false, true}) {
    INFO("copy " << with_copy);
    const Tensor p0 = to_device(rounded(randn64({n}, 17, 0.02), DType::F32), DType::F32);
    const Tensor zero = Tensor::zeros({n}, DType::F32, Device::CUDA);
    Tensor p = p0.clone(), m = zero.clone(), v = zero.clone(), pr = p0.clone(), mr = zero.clone(), vr = zero.clone();
    Tensor copy = Tensor::empty({n}, DType::BF16, Device::CUDA), copy_r = Tensor::empty({n}, DType::BF16, Device::CUDA);
    ops::AdamWArgs a;
    a.lr = 1e-3;
    a.weight_decay = 0.1;
    for (int64_t step = 1; step <= 2; ++step) {
      a.step = step;
      const Tensor g = to_device(rounded(randn64({n}, 3000 * step), DType::F32), DType::F32);
      ops::adamw_step(p, m, v, g, a, with_copy ? &copy : nullptr, &runs);
      for (size_t r = 0; r < runs.starts.size(); ++r) {
        const int64_t b = runs.starts[r], e = r + 1 < runs.starts.size() ? runs.starts[r + 1] : n;
        ops::AdamWArgs ar = a;
        ar.weight_decay = runs.decay[r] ? a.weight_decay : 0.0;
        Tensor pr_r = pr.slice(b, e - b), mr_r = mr.slice(b, e - b), vr_r = vr.slice(b, e - b);
        Tensor cr = copy_r.slice(b, e - b);
        ops::adamw_step(pr_r, mr_r, vr_r, g.slice(b, e - b), ar, with_copy ? &cr : nullptr);
      }
    }
    CHECK(bitwise_equal(p, pr));
    CHECK(bitwise_equal(m, mr));
    CHECK(bitwise_equal(v, vr));
    if (with_copy) CHECK(bitwise_equal(copy, copy_r));
    CHECK(!bitwise_equal(p, p0));
  }
}

// The optimizer's fused compute copy: the same update, and the copy equal to ops::cast of the updated weights bit for
// bit (bf16 and fp16; vector and scalar paths, the copy shifted by one element).
TEST_CASE("cuda adamw with the weights' bf16 / fp16 copy written in the same pass", "[cuda][adamw]") {
  init();
  for (DType ct : {DType::BF16, DType::F16})
    for (int64_t n : {int64_t(3), int64_t(100003)})
      for (int64_t shift : {int64_t(0), int64_t(1)}) {
        const Tensor p0 = rounded(randn64({n}, 7 + n, 0.02), DType::F32);
        const Tensor zero = Tensor::zeros({n}, DType::F64);
        Tensor p = to_device(p0, DType::F32), m = to_device(zero, DType::F32), v = to_device(zero, DType::F32);
        Tensor pr = to_device(p0, DType::F32), mr = to_device(zero, DType::F32), vr = to_device(zero, DType::F32);
        Tensor copy = to_device_shifted(zero, ct, shift), ref = Tensor::empty({n}, ct, Device::CUDA);
        ops::AdamWArgs a;
        a.lr = 1e-3;
        a.weight_decay = 0.1;
        for (int64_t step = 1; step <= 2; ++step) {
          a.step = step;
          const Tensor g = to_device(rounded(randn64({n}, 2000 * step + n), DType::F32), DType::F32);
          ops::adamw_step(p, m, v, g, a, &copy);
          ops::adamw_step(pr, mr, vr, g, a);
        }
        ops::cast(ref, pr);
        CHECK(bitwise_equal(p, pr));
        CHECK(bitwise_equal(m, mr));
        CHECK(bitwise_equal(v, vr));
        CHECK(bitwise_equal(copy, ref));
      }
}

// The master weights as halves (core/master_halves.h) on the GPU: split and join equal the CPU's bit for bit (every
// kind of fp32 bit pattern; vector-unfriendly offsets), and the update of the halves is the fp32 update.
TEST_CASE("cuda master halves: split and join equal the CPU bit for bit", "[cuda][adamw][master_halves]") {
  init();
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x00000001u, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u,
                                0xff800000u, 0x7fc00000u, 0x7f800001u, 0x7fff8000u, 0xffffffffu, 0x3f808000u,
                                0x3f818000u, 0xbf808000u, 0x3f807fffu};
  std::mt19937 gen(31);
  for (int i = 0; i < 100003; ++i) bits.push_back(i % 7 ? gen() : (gen() & 0xffff0000u) | 0x8000u);
  const auto n = static_cast<int64_t>(bits.size());
  Tensor master = Tensor::empty({n}, DType::F32);
  std::memcpy(master.raw(), bits.data(), bits.size() * 4);
  Tensor hi = Tensor::empty({n}, DType::BF16), lo = Tensor::empty({n}, DType::U16), joined = master.clone();
  ops::split_master(hi, &lo, master);
  ops::join_master(joined, hi, lo);
  for (int64_t shift : {int64_t(0), int64_t(1)}) {
    INFO("shift " << shift);
    const Tensor master_d = to_device_shifted(master, DType::F32, shift);
    Tensor hi_d = to_device_shifted(Tensor::zeros({n}, DType::BF16), DType::BF16, shift);
    Tensor lo_d = to_device_shifted(Tensor::zeros({n}, DType::U16), DType::U16, shift);
    ops::split_master(hi_d, &lo_d, master_d);
    CHECK(bitwise_equal(hi_d, hi));
    CHECK(bitwise_equal(lo_d, lo));
    Tensor joined_d = to_device_shifted(Tensor::zeros({n}, DType::F32), DType::F32, shift);
    ops::join_master(joined_d, hi_d, lo_d);
    CHECK(bitwise_equal(joined_d, joined));
  }
}

TEST_CASE("cuda adamw on master halves is the fp32 update bit for bit", "[cuda][adamw][master_halves]") {
  init();
  for (int64_t n : {int64_t(3), int64_t(100003)})
    for (int64_t shift : {int64_t(0), int64_t(1)}) {
      INFO("n " << n << " shift " << shift);
      const Tensor p0 = rounded(randn64({n}, 5 + n, 0.02), DType::F32);
      const Tensor zero = Tensor::zeros({n}, DType::F64);
      Tensor p = to_device(p0, DType::F32), m = to_device(zero, DType::F32), v = to_device(zero, DType::F32);
      Tensor mh = to_device_shifted(zero, DType::F32, shift), vh = to_device_shifted(zero, DType::F32, shift);
      Tensor hi = to_device_shifted(zero, DType::BF16, shift), lo = Tensor::empty({n}, DType::U16, Device::CUDA);
      ops::split_master(hi, &lo, p);
      const ops::DecayRuns r = decay_runs_of(n);
      ops::AdamWArgs a;
      a.lr = 1e-3;
      a.weight_decay = 0.1;
      for (a.step = 1; a.step <= 3; ++a.step) {
        const Tensor g = to_device(rounded(randn64({n}, 4000 * a.step + n), DType::F32), DType::F32);
        ops::adamw_step_halves(hi, lo, mh, vh, g, a, &r);
        ops::adamw_step(p, m, v, g, a, nullptr, &r);
      }
      Tensor joined = Tensor::empty({n}, DType::F32, Device::CUDA);
      ops::join_master(joined, hi, lo);
      CHECK(bitwise_equal(joined, p));
      CHECK(bitwise_equal(mh, m));
      CHECK(bitwise_equal(vh, v));
      Tensor hi_ref = Tensor::empty({n}, DType::BF16, Device::CUDA);
      ops::split_master(hi_ref, nullptr, p);
      CHECK(bitwise_equal(hi, hi_ref));
      CHECK(!bitwise_equal(p, to_device(p0, DType::F32)));
    }
}

TEST_CASE("cuda cross-entropy combine (rescale, finish) and sum_accumulate match the CPU", "[cuda][cross_entropy]") {
  init();
  const int64_t N = 3000;
  // fp32 statistics of two slices (the second with some rows that have no valid column: max -inf, sumexp 0).
  Tensor mx = cast_host(randn64({N}, 801, 3.0), DType::F32), gmax = mx.clone(),
         se = cast_host(randn64({N}, 802), DType::F32), tl = cast_host(randn64({N}, 803), DType::F32);
  for (int64_t n = 0; n < N; ++n) {
    se.data<float>()[n] = 1.0f + std::fabs(se.data<float>()[n]);
    gmax.data<float>()[n] = mx.data<float>()[n] + static_cast<float>(n % 5) * 0.25f;
    if (n % 97 == 0) mx.data<float>()[n] = -INFINITY;
  }
  Tensor se_ref = se.clone();
  ops::cross_entropy_rescale(se_ref, mx, gmax);
  Tensor se_d = to_device(se, DType::F32);
  ops::cross_entropy_rescale(se_d, to_device(mx, DType::F32), to_device(gmax, DType::F32));
  check_close("cross_entropy_rescale", se_d, cast_host(se_ref, DType::F64), DType::F32, kTolF32);
  // The sum over slices: a second slice holding the row's max (sumexp 1 at gmax), so that every row has a valid column.
  Tensor S = se_ref.clone();
  for (int64_t n = 0; n < N; ++n) S.data<float>()[n] += 1.0f;
  Tensor lse_ref = Tensor::empty({N}, DType::F32), loss_ref = Tensor::empty({N}, DType::F64);
  ops::cross_entropy_finish(lse_ref, loss_ref, gmax, S, tl);
  Tensor lse_d = poisoned({N}, DType::F32), loss_d = Tensor::empty({N}, DType::F64, Device::CUDA);
  loss_d.copy_from(randn64({N}, 804));
  ops::cross_entropy_finish(lse_d, loss_d, to_device(gmax, DType::F32), to_device(S, DType::F32),
                            to_device(tl, DType::F32));
  check_close("cross_entropy_finish lse", lse_d, cast_host(lse_ref, DType::F64), DType::F32, kTolF32);
  CHECK(rel_err(to_host64(loss_d), loss_ref) < 1e-6);
  // sum_accumulate: the CPU's in-order sum within rounding, and the same bits every run.
  Tensor acc_ref = Tensor::zeros({1}, DType::F64);
  ops::sum_accumulate(acc_ref, loss_ref);
  Tensor loss_exact = Tensor::empty({N}, DType::F64, Device::CUDA);
  loss_exact.copy_from(loss_ref);
  Tensor a1 = Tensor::zeros({1}, DType::F64, Device::CUDA), a2 = Tensor::zeros({1}, DType::F64, Device::CUDA);
  ops::sum_accumulate(a1, loss_exact);
  ops::sum_accumulate(a1, loss_exact);
  ops::sum_accumulate(a2, loss_exact);
  ops::sum_accumulate(a2, loss_exact);
  CHECK(to_host(a1).data<double>()[0] == Approx(2 * acc_ref.data<double>()[0]).epsilon(1e-12));
  CHECK(bitwise_equal(a1, a2));
}

#endif
