// The public ops: shape/dtype/device checks, then dispatch on device (CPU reference, or the CUDA
// backend's `case Device::CUDA` when built with it) and on dtype (fp32 / fp64 on CPU; fp32 / bf16 /
// fp16 on CUDA). A wrong shape or a dtype mismatch between the arguments is a bug in our code
// (MT_INTERNAL_ASSERT naming the op and the tensors); an unsupported device/dtype pair is a
// user-visible error (MT_CHECK) naming the op.
// CUDA mixed precision (Megatron style): statistics are fp32, and parameter gradients (dweight,
// dbias, dtable) are fp32 main grads whatever the activation dtype, or bf16 ones for 16-bit activations
// (grad_reduce_in_fp32 false); on CPU they have the op's dtype.
#include "tensor/ops.h"

#include <array>
#include <atomic>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "tensor/cpu/cpu_ops.h"
#include "tensor/fp8/fp8_ops.h"
#include "tensor/scalar_read.h"
#if defined(MEGATRAIN_HAVE_CUDA)
#include "cuda/cuda_ops.h"
#endif

namespace mt::ops {

namespace {

#define OP_ASSERT(cond, ...) MT_INTERNAL_ASSERT(cond, "op ", op, ": ", __VA_ARGS__)

[[noreturn]] void unsupported(const char* op, const Tensor& t) {
  MT_CHECK(false, "op ", op, " is not supported on device ", device_name(t.device()), " for ", dtype_name(t.dtype()));
  __builtin_unreachable();
}

DType stat_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

// Product of all dimensions but the last (the "N" of a row-wise op on (..., C)).
int64_t rows(const Tensor& t) {
  int64_t n = 1;
  for (int i = 0; i + 1 < t.dim(); ++i) n *= t.shape()[static_cast<size_t>(i)];
  return n;
}

void need(const char* op, const Tensor& t, const char* name) { OP_ASSERT(t.defined(), name, " is undefined"); }

// t's data, or null for no tensor.
template <typename T>
T* data_or_null(const Tensor* t) { return t ? t->data<T>() : nullptr; }

// t is defined, on the device of ref, with dtype `dt`.
void on_device(const char* op, const Tensor& ref, const Tensor& t, const char* name, DType dt) {
  need(op, t, name);
  OP_ASSERT(t.device() == ref.device(), name, " ", t.str(), " is on ", device_name(t.device()), ", expected ",
            device_name(ref.device()));
  OP_ASSERT(t.dtype() == dt, name, " ", t.str(), " should be ", dtype_name(dt));
}
void numel_is(const char* op, const Tensor& t, const char* name, int64_t n) {
  OP_ASSERT(t.numel() == n, name, " ", t.str(), " should have ", n, " elements");
}
// t is defined, with the dtype and device of ref (and the given shape / rows / numel).
void like(const char* op, const Tensor& ref, const Tensor& t, const char* name) {
  on_device(op, ref, t, name, ref.dtype());
}
void like(const char* op, const Tensor& ref, const Tensor& t, const char* name, const Shape& s) {
  like(op, ref, t, name);
  OP_ASSERT(t.shape() == s, name, " ", t.str(), " should have shape ", shape_str(s));
}
void like_rows(const char* op, const Tensor& ref, const Tensor& t, const char* name, int64_t N, int64_t C) {
  like(op, ref, t, name);
  OP_ASSERT(t.dim() >= 1 && t.size(-1) == C && rows(t) == N, name, " ", t.str(), " should be (", N, ", ", C, ")");
}
void like_numel(const char* op, const Tensor& ref, const Tensor& t, const char* name, int64_t n) {
  like(op, ref, t, name);
  numel_is(op, t, name, n);
}
// The last dimension of a row-wise op's input (..., C).
int64_t last_dim(const char* op, const Tensor& t, const char* name) {
  need(op, t, name);
  OP_ASSERT(t.dim() >= 1, name, " ", t.str(), " should be (N, C)");
  return t.size(-1);
}
// A row-statistics tensor: N elements of the statistics dtype of ref, on ref's device.
void stat(const char* op, const Tensor& ref, const Tensor& t, const char* name, int64_t N) {
  on_device(op, ref, t, name, stat_dtype(ref.dtype()));
  numel_is(op, t, name, N);
}

// Calls f(float{}) or f(double{}) for the dtype of t (CPU reference dtypes).
template <typename F>
void cpu_float(const char* op, const Tensor& t, F&& f) {
  switch (t.dtype()) {
    case DType::F32: f(float{}); return;
    case DType::F64: f(double{}); return;
    default: unsupported(op, t);
  }
}

// Parameter gradients (dweight, dbias, dtable) of an op whose inputs are like ref: ref's dtype on CPU;
// on CUDA fp32 main grads, or bf16 ones when ref is 16-bit (another dtype there is a user-visible error).
void param_grad(const char* op, const Tensor& ref, const Tensor& t, const char* name, const Shape& s) {
  need(op, t, name);
  const bool bf16_ok = ref.dtype() == DType::BF16 || ref.dtype() == DType::F16;
  if (ref.device() == Device::CUDA && t.device() == Device::CUDA)
    MT_CHECK(t.dtype() == DType::F32 || (bf16_ok && t.dtype() == DType::BF16), "op ", op,
             " is not supported on device cuda for ", name, " ", t.str(), " with ", dtype_name(ref.dtype()),
             " activations: parameter gradients on cuda are fp32 (main grads), or bf16 for bf16 / fp16 activations");
  const DType want = ref.device() != Device::CUDA ? ref.dtype() : t.dtype() == DType::BF16 ? DType::BF16 : DType::F32;
  on_device(op, ref, t, name, want);
  OP_ASSERT(t.shape() == s, name, " ", t.str(), " should have shape ", shape_str(s));
}

#define MT_UNPAREN(...) __VA_ARGS__

// True when t is on the GPU and MT_OP_PROFILE asks for per-op times.
[[maybe_unused]] bool profiling(const Tensor& t) {
#if defined(MEGATRAIN_HAVE_CUDA)
  return t.device() == Device::CUDA && cuda::op_profile_enabled();
#else
  (void)t;
  return false;
#endif
}

#if defined(MEGATRAIN_HAVE_CUDA)
// Calls f(float{}), f(bf16{}) or f(f16{}) for the dtype of t (CUDA dtypes).
template <typename F>
void cuda_float(const char* op, const Tensor& t, F&& f) {
  switch (t.dtype()) {
    case DType::F32: f(float{}); return;
    case DType::BF16: f(bf16{}); return;
    case DType::F16: f(f16{}); return;
    default: unsupported(op, t);
  }
}
// Calls f(float{}) or f(bf16{}) for the dtype of an op's parameter gradients on CUDA (each checked by param_grad;
// null ones skipped, the others of one dtype). T: the activation type (fp32 activations have fp32 gradients).
template <typename T, typename F>
void cuda_grad(const char* op, std::initializer_list<const Tensor*> grads, F&& f) {
  const Tensor* first = nullptr;
  for (const Tensor* g : grads) {
    if (g && first) OP_ASSERT(g->dtype() == first->dtype(), "parameter gradients ", first->str(), " and ", g->str(),
                              " should have one dtype");
    if (g && !first) first = g;
  }
  if constexpr (!std::is_same_v<T, float>)
    if (first && first->dtype() == DType::BF16) return f(bf16{});
  f(float{});
}
#define MT_CUDA_CASE(op, t, cuda_call)             \
  case Device::CUDA:                               \
    cuda_float(op, t, [&](auto zero_) {            \
      const cuda::OpTimer timer_(op, (t).numel()); \
      using T [[maybe_unused]] = decltype(zero_);  \
      MT_UNPAREN cuda_call;                        \
    });                                            \
    return;
#else
#define MT_CUDA_CASE(op, t, cuda_call)
#endif

// Dispatch on the device of t, then its dtype: the CPU call (the variadic tail) with T in
// {float, double}; the CUDA call (parenthesized) with T in {float, bf16, f16}.
#define MT_DISPATCH(op, t, cuda_call, ...)    \
  switch ((t).device()) {                     \
    case Device::CPU:                         \
      cpu_float(op, t, [&](auto zero_) {      \
        using T = decltype(zero_);            \
        __VA_ARGS__;                          \
      });                                     \
      return;                                 \
    MT_CUDA_CASE(op, t, cuda_call)            \
    default:                                  \
      unsupported(op, t);                     \
  }

}  // namespace

// ---------------------------------------------------------------- elementwise

void fill_(Tensor& x, double value) {
  const char* op = "fill_";
  need(op, x, "x");
  MT_DISPATCH(op, x, (cuda::fill_cuda<T>(x.data<T>(), x.numel(), value)),
              cpu::fill_cpu<T>(x.data<T>(), x.numel(), value));
}

void add_(Tensor& a, const Tensor& b) {
  const char* op = "add_";
  need(op, a, "a");
  like_numel(op, a, b, "b", a.numel());
  MT_DISPATCH(op, a, (cuda::add_inplace_cuda<T>(a.data<T>(), b.data<T>(), a.numel())),
              cpu::add_inplace_cpu<T>(a.data<T>(), b.data<T>(), a.numel()));
}

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  const char* op = "add";
  need(op, a, "a");
  like_numel(op, a, b, "b", a.numel());
  like_numel(op, a, out, "out", a.numel());
  MT_DISPATCH(op, a, (cuda::add_cuda<T>(out.data<T>(), a.data<T>(), b.data<T>(), a.numel())),
              cpu::add_cpu<T>(out.data<T>(), a.data<T>(), b.data<T>(), a.numel()));
}

void scale_(Tensor& x, double s) {
  const char* op = "scale_";
  need(op, x, "x");
  MT_DISPATCH(op, x, (cuda::scale_cuda<T>(x.data<T>(), x.numel(), s)), cpu::scale_cpu<T>(x.data<T>(), x.numel(), s));
}

void cast(Tensor& out, const Tensor& in) {
  const char* op = "cast";
  need(op, in, "in");
  need(op, out, "out");
  numel_is(op, out, "out", in.numel());
  OP_ASSERT(out.device() == in.device(), "out ", out.str(), " and in ", in.str(), " are on different devices");
  switch (in.device()) {
    case Device::CPU: {
      using D = DType;
      const D a = in.dtype(), b = out.dtype();
      const int64_t n = in.numel();
      if (a == b) out.copy_from(in);
      else if (a == D::F32 && b == D::F64) cpu::cast_cpu(out.data<double>(), in.data<float>(), n);
      else if (a == D::F64 && b == D::F32) cpu::cast_cpu(out.data<float>(), in.data<double>(), n);
      else if (a == D::F32 && b == D::BF16) cpu::cast_cpu(out.data<bf16>(), in.data<float>(), n);
      else if (a == D::F64 && b == D::BF16) cpu::cast_cpu(out.data<bf16>(), in.data<double>(), n);
      else if (a == D::BF16 && b == D::F32) cpu::cast_cpu(out.data<float>(), in.data<bf16>(), n);
      else if (a == D::BF16 && b == D::F64) cpu::cast_cpu(out.data<double>(), in.data<bf16>(), n);
      else if (a == D::F32 && b == D::F16) cpu::cast_cpu(out.data<f16>(), in.data<float>(), n);
      else if (a == D::F64 && b == D::F16) cpu::cast_cpu(out.data<f16>(), in.data<double>(), n);
      else if (a == D::F16 && b == D::F32) cpu::cast_cpu(out.data<float>(), in.data<f16>(), n);
      else if (a == D::F16 && b == D::F64) cpu::cast_cpu(out.data<double>(), in.data<f16>(), n);
      else if (a == D::I32 && b == D::I64) cpu::cast_cpu(out.data<int64_t>(), in.data<int32_t>(), n);
      else if (a == D::I64 && b == D::I32) cpu::cast_cpu(out.data<int32_t>(), in.data<int64_t>(), n);
      else MT_CHECK(false, "op cast is not supported on device cpu for ", dtype_name(a), " -> ", dtype_name(b));
      return;
    }
#if defined(MEGATRAIN_HAVE_CUDA)
    case Device::CUDA: {
      using D = DType;
      const D a = in.dtype(), b = out.dtype();
      const int64_t n = in.numel();
      const cuda::OpTimer timer(op, n);
      if (a == b) cuda::copy_cuda(out.raw(), in.raw(), in.nbytes());
      else if (a == D::F32 && b == D::BF16) cuda::cast_cuda(out.data<bf16>(), in.data<float>(), n);
      else if (a == D::BF16 && b == D::F32) cuda::cast_cuda(out.data<float>(), in.data<bf16>(), n);
      else if (a == D::F32 && b == D::F16) cuda::cast_cuda(out.data<f16>(), in.data<float>(), n);
      else if (a == D::F16 && b == D::F32) cuda::cast_cuda(out.data<float>(), in.data<f16>(), n);
      else MT_CHECK(false, "op cast is not supported on device cuda for ", dtype_name(a), " -> ", dtype_name(b));
      return;
    }
#endif
    default:
      unsupported(op, in);
  }
}

void sum_squares_into(Tensor& out, const Tensor& x) {
  const char* op = "sum_squares";
  need(op, x, "x");
  need(op, out, "out");
  OP_ASSERT(out.dtype() == DType::F64 && out.numel() == 1 && out.device() == x.device(), "out ", out.str(),
            " should be one F64 element on x's device");
  switch (x.device()) {
    case Device::CPU:
      cpu_float(op, x, [&](auto z) {
        using T = decltype(z);
        out.data<double>()[0] = cpu::sum_squares_cpu<T>(x.data<T>(), x.numel());
      });
      return;
#if defined(MEGATRAIN_HAVE_CUDA)
    case Device::CUDA:
      cuda_float(op, x, [&](auto z) {
        using T = decltype(z);
        const cuda::OpTimer timer(op, x.numel());
        cuda::sum_squares_into_cuda<T>(out.data<double>(), x.data<T>(), x.numel());
      });
      return;
#endif
    default:
      unsupported(op, x);
  }
}

void gather_scalars(Tensor& out, const std::vector<Tensor>& in) {
  const char* op = "gather_scalars";
  need(op, out, "out");
  OP_ASSERT(out.dim() == 1 && out.numel() == static_cast<int64_t>(in.size()), "out ", out.str(), " for ", in.size(),
            " scalars");
  OP_ASSERT(out.dtype() == DType::F32 || out.dtype() == DType::F64, "out ", out.str(), " should be F32 or F64");
  for (const Tensor& t : in) {
    like(op, out, t, "a scalar");
    OP_ASSERT(t.numel() == 1, "scalar ", t.str(), " has more than one element");
  }
  if (in.empty()) return;
  switch (out.device()) {
    case Device::CPU:
      for (size_t i = 0; i < in.size(); ++i) out.slice(static_cast<int64_t>(i), 1).copy_from(in[i]);
      return;
#if defined(MEGATRAIN_HAVE_CUDA)
    case Device::CUDA: {
      const int64_t n = static_cast<int64_t>(in.size());
      if (out.dtype() == DType::F64) {
        std::vector<const double*> p;
        for (const Tensor& t : in) p.push_back(t.data<double>());
        cuda::gather_scalars_cuda<double>(out.data<double>(), p.data(), n);
      } else {
        std::vector<const float*> p;
        for (const Tensor& t : in) p.push_back(t.data<float>());
        cuda::gather_scalars_cuda<float>(out.data<float>(), p.data(), n);
      }
      return;
    }
#endif
    default:
      unsupported(op, out);
  }
}

void sum_each(Tensor& out, const std::vector<Tensor>& in) {
  const char* op = "sum_each";
  need(op, out, "out");
  OP_ASSERT(out.dim() == 1 && out.numel() == static_cast<int64_t>(in.size()) && out.dtype() == DType::F64, "out ",
            out.str(), " should be F64 (", in.size(), ")");
  for (const Tensor& t : in) {
    need(op, t, "an input");
    OP_ASSERT(t.dtype() == DType::F64 && t.device() == out.device(), "input ", t.str(), " should be F64 on ",
              device_name(out.device()));
  }
  if (in.empty()) return;
  switch (out.device()) {
    case Device::CPU:
      for (size_t i = 0; i < in.size(); ++i)
        out.data<double>()[i] = cpu::sum_cpu(in[i].data<double>(), in[i].numel());
      return;
#if defined(MEGATRAIN_HAVE_CUDA)
    case Device::CUDA: {
      std::vector<const double*> p;
      std::vector<int64_t> n;
      for (const Tensor& t : in) p.push_back(t.numel() > 0 ? t.data<double>() : nullptr), n.push_back(t.numel());
      cuda::sum_each_cuda(out.data<double>(), p.data(), n.data(), static_cast<int64_t>(in.size()));
      return;
    }
#endif
    default:
      unsupported(op, out);
  }
}

double sum_squares(const Tensor& x) {
  need("sum_squares", x, "x");
  Tensor out = Tensor::empty({1}, DType::F64, x.device());
  sum_squares_into(out, x);
  return read_scalars({out})[0];  // waits for the device
}

// ---------------------------------------------------------------- linear

namespace {
// weight (OC, IC) and inp (..., IC); returns {N, IC, OC}.
std::array<int64_t, 3> linear_dims(const char* op, const Tensor& inp, const Tensor& weight) {
  const int64_t IC = last_dim(op, inp, "inp");
  like(op, inp, weight, "weight");
  OP_ASSERT(weight.dim() == 2 && weight.size(1) == IC, "weight ", weight.str(), " should be (OC, IC) for inp ",
            inp.str());
  return {rows(inp), IC, weight.size(0)};
}
}  // namespace

void linear_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias, const Tensor* residual) {
  const char* op = "linear_forward";
  const auto [N, IC, OC] = linear_dims(op, inp, weight);
  like_rows(op, inp, out, "out", N, OC);
  if (bias) like(op, inp, *bias, "bias", {OC});
  if (residual) like_rows(op, inp, *residual, "residual", N, OC);
  std::string pname;  // the profile's key names the output features too
  if (profiling(inp)) op = (pname = str_cat(op, " OC=", OC, residual ? " +residual" : "")).c_str();
  MT_DISPATCH(op, inp,
              (cuda::linear_forward_cuda<T>(out.data<T>(), inp.data<T>(), weight.data<T>(),
                                            bias ? bias->data<T>() : nullptr, N, IC, OC,
                                            residual ? residual->data<T>() : nullptr)),
              cpu::linear_forward_cpu<T>(out.data<T>(), inp.data<T>(), weight.data<T>(),
                                         bias ? bias->data<T>() : nullptr, N, IC, OC);
              if (residual) add(out, out, *residual));  // the CPU's reference: y + residual, a second pass
}

void linear_forward_wide(Tensor& out, const Tensor& inp, const Tensor& weight) {
  const char* op = "linear_forward_wide";
  need(op, out, "out");
  if (inp.defined() && inp.dtype() == out.dtype()) return linear_forward(out, inp, weight, nullptr);  // fp32 / fp64
  const auto [N, IC, OC] = linear_dims(op, inp, weight);
  OP_ASSERT(out.dtype() == DType::F32 && (inp.dtype() == DType::BF16 || inp.dtype() == DType::F16), "out ",
            out.str(), " should be fp32 for 16-bit inp ", inp.str());
  on_device(op, inp, out, "out", DType::F32);
  OP_ASSERT(out.dim() >= 1 && out.size(-1) == OC && rows(out) == N, "out ", out.str(), " should be (", N, ", ", OC, ")");
#if defined(MEGATRAIN_HAVE_CUDA)
  if (inp.device() == Device::CUDA) {
    std::string pname;
    if (profiling(inp)) op = (pname = str_cat(op, " OC=", OC)).c_str();
    const cuda::OpTimer timer(op, inp.numel());
    if (inp.dtype() == DType::BF16)
      cuda::linear_forward_f32out_cuda<bf16>(out.data<float>(), inp.data<bf16>(), weight.data<bf16>(), N, IC, OC);
    else
      cuda::linear_forward_f32out_cuda<f16>(out.data<float>(), inp.data<f16>(), weight.data<f16>(), N, IC, OC);
    return;
  }
#endif
  unsupported(op, inp);  // the CPU holds 16-bit tensors only on their way to or from a file
}

void linear_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                     const Tensor& weight, GradMode dinp_mode, GradMode dweight_mode) {
  const char* op = "linear_backward";
  if (!dinp && !dweight && !inp.defined()) {  // the bias gradient alone: the column sums of dout
    const int64_t OC = last_dim(op, dout, "dout"), N = rows(dout);
    if (!dbias) return;
    param_grad(op, dout, *dbias, "dbias", {OC});
    MT_DISPATCH(op, dout, (cuda_grad<T>(op, {dbias}, [&](auto g_) {
                  using G = decltype(g_);
                  cuda::linear_backward_cuda<T, G>(nullptr, nullptr, dbias->data<G>(), dout.data<T>(), nullptr,
                                                   nullptr, N, 0, OC, false, true);
                })),
                cpu::linear_backward_cpu<T>(nullptr, nullptr, dbias->data<T>(), dout.data<T>(), nullptr, nullptr, N, 0,
                                            OC, false, true));
  }
  const auto [N, IC, OC] = linear_dims(op, inp, weight);
  like_rows(op, inp, dout, "dout", N, OC);
  if (dinp) like_rows(op, inp, *dinp, "dinp", N, IC);
  if (dweight) param_grad(op, inp, *dweight, "dweight", weight.shape());
  if (dbias) param_grad(op, inp, *dbias, "dbias", {OC});
  const bool acc = dinp_mode == GradMode::Accumulate, acc_w = dweight_mode == GradMode::Accumulate;
  std::string pname;
  if (profiling(inp)) op = (pname = str_cat(op, " OC=", OC, dinp ? "" : " no-dinp")).c_str();
  MT_DISPATCH(op, inp, (cuda_grad<T>(op, {dweight, dbias}, [&](auto g_) {
                using G = decltype(g_);
                cuda::linear_backward_cuda<T, G>(data_or_null<T>(dinp), data_or_null<G>(dweight),
                                                 data_or_null<G>(dbias), dout.data<T>(), inp.data<T>(),
                                                 weight.data<T>(), N, IC, OC, acc, acc_w);
              })),
              cpu::linear_backward_cpu<T>(dinp ? dinp->data<T>() : nullptr, dweight ? dweight->data<T>() : nullptr,
                                          dbias ? dbias->data<T>() : nullptr, dout.data<T>(), inp.data<T>(),
                                          weight.data<T>(), N, IC, OC, acc, acc_w));
}

void linear_backward_wide(Tensor* dinp, Tensor* dweight, const Tensor& dout, const Tensor& inp, const Tensor& weight,
                          GradMode dweight_mode, GradMode dinp_mode) {
  const char* op = "linear_backward_wide";
  need(op, dout, "dout");
  if (inp.defined() && inp.dtype() == dout.dtype())  // fp32 / fp64
    return linear_backward(dinp, dweight, nullptr, dout, inp, weight, dinp_mode, dweight_mode);
  const auto [N, IC, OC] = linear_dims(op, inp, weight);
  OP_ASSERT(dout.dtype() == DType::F32 && (inp.dtype() == DType::BF16 || inp.dtype() == DType::F16), "dout ",
            dout.str(), " should be fp32 for 16-bit inp ", inp.str());
  on_device(op, inp, dout, "dout", DType::F32);
  OP_ASSERT(dout.dim() >= 1 && dout.size(-1) == OC && rows(dout) == N, "dout ", dout.str(), " should be (", N, ", ",
            OC, ")");
  if (dinp) like_rows(op, inp, *dinp, "dinp", N, IC);
  if (dweight) param_grad(op, inp, *dweight, "dweight", weight.shape());
#if defined(MEGATRAIN_HAVE_CUDA)
  if (inp.device() == Device::CUDA && inp.dtype() == DType::BF16) {
    std::string pname;
    if (profiling(inp)) op = (pname = str_cat(op, " OC=", OC)).c_str();
    const cuda::OpTimer timer(op, inp.numel());
    cuda_grad<bf16>(op, {dweight}, [&](auto g_) {
      using G = decltype(g_);
      cuda::linear_backward_wide_cuda<G>(data_or_null<bf16>(dinp), data_or_null<G>(dweight), dout.data<float>(),
                                         inp.data<bf16>(), weight.data<bf16>(), N, IC, OC,
                                         dweight_mode == GradMode::Accumulate, dinp_mode == GradMode::Accumulate);
    });
    return;
  }
  if (inp.device() == Device::CUDA) {  // fp16: parts would leave fp16's range; through fp32 copies
    Tensor xr = Tensor::empty(inp.shape(), DType::F32, inp.device());
    Tensor wr = Tensor::empty(weight.shape(), DType::F32, inp.device());
    cast(xr, inp);
    cast(wr, weight);
    Tensor dxr = dinp ? Tensor::empty(inp.shape(), DType::F32, inp.device()) : Tensor();
    if (dinp && dinp_mode == GradMode::Accumulate) cast(dxr, *dinp);
    // a bf16 dweight: through an fp32 copy (exact), rounded once at the end
    const bool dw16 = dweight && dweight->dtype() == DType::BF16;
    Tensor dwr = dw16 ? Tensor::empty(weight.shape(), DType::F32, inp.device()) : Tensor();
    if (dw16 && dweight_mode == GradMode::Accumulate) cast(dwr, *dweight);
    linear_backward(dinp ? &dxr : nullptr, dw16 ? &dwr : dweight, nullptr, dout, xr, wr, dinp_mode, dweight_mode);
    if (dinp) cast(*dinp, dxr);
    if (dw16) cast(*dweight, dwr);
    return;
  }
#endif
  unsupported(op, inp);  // the CPU holds 16-bit tensors only on their way to or from a file
}

void linear_gelu_forward(Tensor& out, Tensor& pre, const Tensor& inp, const Tensor& weight, const Tensor* bias) {
  const char* op = "linear_gelu_forward";
  const auto [N, IC, OC] = linear_dims(op, inp, weight);
  like_rows(op, inp, out, "out", N, OC);
  like_rows(op, inp, pre, "pre", N, OC);
  if (bias) like(op, inp, *bias, "bias", {OC});
  if (inp.device() == Device::CPU) {  // the reference: linear, then GELU
    linear_forward(pre, inp, weight, bias);
    gelu_forward(out, pre);
    return;
  }
  std::string pname;
  if (profiling(inp)) op = (pname = str_cat(op, " OC=", OC)).c_str();
  MT_DISPATCH(op, inp,
              (cuda::linear_gelu_forward_cuda<T>(out.data<T>(), pre.data<T>(), inp.data<T>(), weight.data<T>(),
                                                 bias ? bias->data<T>() : nullptr, N, IC, OC)),
              (void)sizeof(T); unsupported(op, inp));
}

void linear_backward_gelu(Tensor& dpre, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                          const Tensor& weight, const Tensor& pre, GradMode dweight_mode) {
  const char* op = "linear_backward_gelu";
  const auto [N, IC, OC] = linear_dims(op, inp, weight);
  like_rows(op, inp, dout, "dout", N, OC);
  like_rows(op, inp, dpre, "dpre", N, IC);
  like_rows(op, inp, pre, "pre", N, IC);
  if (dweight) param_grad(op, inp, *dweight, "dweight", weight.shape());
  if (dbias) param_grad(op, inp, *dbias, "dbias", {OC});
  if (inp.device() == Device::CPU) {  // the reference: linear backward, then the GELU's
    Tensor dinp = Tensor::empty(inp.shape(), inp.dtype());
    linear_backward(&dinp, dweight, dbias, dout, inp, weight, GradMode::Overwrite, dweight_mode);
    gelu_backward(dpre, dinp, pre);
    return;
  }
  std::string pname;
  if (profiling(inp)) op = (pname = str_cat(op, " OC=", OC)).c_str();
  MT_DISPATCH(op, inp, (cuda_grad<T>(op, {dweight, dbias}, [&](auto g_) {
                using G = decltype(g_);
                cuda::linear_backward_gelu_cuda<T, G>(dpre.data<T>(), data_or_null<G>(dweight),
                                                      data_or_null<G>(dbias), dout.data<T>(), inp.data<T>(),
                                                      weight.data<T>(), pre.data<T>(), N, IC, OC,
                                                      dweight_mode == GradMode::Accumulate);
              })),
              (void)sizeof(T); unsupported(op, inp));
}

void linear_backward_swiglu(Tensor& dh, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& weight,
                            const Tensor& h, GradMode dweight_mode) {
  const char* op = "linear_backward_swiglu";
  const int64_t F2 = last_dim(op, h, "h"), N = rows(h), F = F2 / 2;
  OP_ASSERT(F2 % 2 == 0, "h ", h.str(), " should be (N, 2F)");
  like(op, h, weight, "weight");
  OP_ASSERT(weight.dim() == 2 && weight.size(1) == F, "weight ", weight.str(), " should be (OC, F) for h ", h.str());
  const int64_t OC = weight.size(0);
  like_rows(op, h, dout, "dout", N, OC);
  like_rows(op, h, dh, "dh", N, F2);
  if (dweight) param_grad(op, h, *dweight, "dweight", weight.shape());
  if (dbias) param_grad(op, h, *dbias, "dbias", {OC});
  if (h.device() == Device::CPU) {  // the reference: swiglu forward, linear backward, swiglu backward
    const Tensor h2 = h.view({N, F2});
    Tensor a = Tensor::empty({N, F}, h.dtype()), da = Tensor::empty({N, F}, h.dtype()), dh2 = dh.view({N, F2});
    swiglu_forward(a, h2);
    linear_backward(&da, dweight, dbias, dout.view({N, OC}), a, weight, GradMode::Overwrite, dweight_mode);
    swiglu_backward(dh2, da, h2);  // may overwrite h: read (row by row) before written
    return;
  }
  std::string pname;
  if (profiling(h)) op = (pname = str_cat(op, " OC=", OC)).c_str();
  MT_DISPATCH(op, h, (cuda_grad<T>(op, {dweight, dbias}, [&](auto g_) {
                using G = decltype(g_);
                cuda::linear_backward_swiglu_cuda<T, G>(dh.data<T>(), data_or_null<G>(dweight),
                                                        data_or_null<G>(dbias), dout.data<T>(), weight.data<T>(),
                                                        h.data<T>(), N, F, OC, dweight_mode == GradMode::Accumulate);
              })),
              (void)sizeof(T); unsupported(op, h));
}

// ---------------------------------------------------------------- embedding

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& table, int64_t vocab_start) {
  const char* op = "embedding_forward";
  need(op, table, "table");
  on_device(op, table, tokens, "tokens", DType::I32);
  OP_ASSERT(table.dim() == 2, "table ", table.str(), " should be (Vl, C)");
  OP_ASSERT(vocab_start >= 0, "vocab_start ", vocab_start, " is negative");
  const int64_t Vl = table.size(0), C = table.size(1), N = tokens.numel();
  like_rows(op, table, out, "out", N, C);
  MT_DISPATCH(op, table,
              (cuda::embedding_forward_cuda<T>(out.data<T>(), tokens.data<int32_t>(), table.data<T>(), N, Vl, C,
                                               vocab_start)),
              cpu::embedding_forward_cpu<T>(out.data<T>(), tokens.data<int32_t>(), table.data<T>(), N, Vl, C,
                                            vocab_start));
}

void embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& tokens, int64_t vocab_start) {
  const char* op = "embedding_backward";
  need(op, dtable, "dtable");
  on_device(op, dtable, tokens, "tokens", DType::I32);
  OP_ASSERT(dtable.dim() == 2, "dtable ", dtable.str(), " should be (Vl, C)");
  OP_ASSERT(vocab_start >= 0, "vocab_start ", vocab_start, " is negative");
  const int64_t Vl = dtable.size(0), C = dtable.size(1), N = tokens.numel();
#if defined(MEGATRAIN_HAVE_CUDA)
  if (dtable.device() == Device::CUDA) {  // dtable: a main grad (fp32, or bf16 for 16-bit dout); dout: activations
    need(op, dout, "dout");
    param_grad(op, dout, dtable, "dtable", dtable.shape());
    OP_ASSERT(dout.dim() >= 1 && dout.size(-1) == C && rows(dout) == N, "dout ", dout.str(), " should be (", N, ", ",
              C, ")");
    cuda_float(op, dout, [&](auto z) {
      using T = decltype(z);
      const cuda::OpTimer timer(op, N, Vl, C);
      cuda_grad<T>(op, {&dtable}, [&](auto g_) {
        using G = decltype(g_);
        cuda::embedding_backward_cuda<T, G>(dtable.data<G>(), dout.data<T>(), tokens.data<int32_t>(), N, Vl, C,
                                            vocab_start);
      });
    });
    return;
  }
#endif
  like_rows(op, dtable, dout, "dout", N, C);
  MT_DISPATCH(op, dtable, (unsupported(op, dtable)),
              cpu::embedding_backward_cpu<T>(dtable.data<T>(), dout.data<T>(), tokens.data<int32_t>(), N, Vl, C,
                                             vocab_start));
}

// ---------------------------------------------------------------- norms

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                       const Tensor& bias, double eps) {
  const char* op = "layernorm_forward";
  const int64_t C = last_dim(op, inp, "inp"), N = rows(inp);
  like(op, inp, weight, "weight", {C});
  like(op, inp, bias, "bias", {C});
  like_rows(op, inp, out, "out", N, C);
  stat(op, inp, mean, "mean", N);
  stat(op, inp, rstd, "rstd", N);
  OP_ASSERT(eps >= 0, "eps ", eps, " is negative");
  MT_DISPATCH(op, inp,
              (cuda::layernorm_forward_cuda<T>(out.data<T>(), mean.data<float>(), rstd.data<float>(), inp.data<T>(),
                                               weight.data<T>(), bias.data<T>(), N, C, eps)),
              cpu::layernorm_forward_cpu<T>(out.data<T>(), mean.data<T>(), rstd.data<T>(), inp.data<T>(),
                                            weight.data<T>(), bias.data<T>(), N, C, eps));
}

void layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout, const Tensor& inp,
                        const Tensor& weight, const Tensor& mean, const Tensor& rstd, GradMode dinp_mode) {
  const char* op = "layernorm_backward";
  const int64_t C = last_dim(op, inp, "inp"), N = rows(inp);
  like(op, inp, weight, "weight", {C});
  param_grad(op, inp, dweight, "dweight", {C});
  param_grad(op, inp, dbias, "dbias", {C});
  like_rows(op, inp, dinp, "dinp", N, C);
  like_rows(op, inp, dout, "dout", N, C);
  stat(op, inp, mean, "mean", N);
  stat(op, inp, rstd, "rstd", N);
  const bool acc = dinp_mode == GradMode::Accumulate;
  MT_DISPATCH(op, inp, (cuda_grad<T>(op, {&dweight, &dbias}, [&](auto g_) {
                using G = decltype(g_);
                cuda::layernorm_backward_cuda<T, G>(dinp.data<T>(), dweight.data<G>(), dbias.data<G>(),
                                                    dout.data<T>(), inp.data<T>(), weight.data<T>(),
                                                    mean.data<float>(), rstd.data<float>(), N, C, acc);
              })),
              cpu::layernorm_backward_cpu<T>(dinp.data<T>(), dweight.data<T>(), dbias.data<T>(), dout.data<T>(),
                                             inp.data<T>(), weight.data<T>(), mean.data<T>(), rstd.data<T>(), N,
                                             C, acc));
}

void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& weight, double eps) {
  const char* op = "rmsnorm_forward";
  const int64_t C = last_dim(op, inp, "inp"), N = rows(inp);
  like(op, inp, weight, "weight", {C});
  like_rows(op, inp, out, "out", N, C);
  stat(op, inp, rstd, "rstd", N);
  OP_ASSERT(eps >= 0, "eps ", eps, " is negative");
  MT_DISPATCH(op, inp,
              (cuda::rmsnorm_forward_cuda<T>(out.data<T>(), rstd.data<float>(), inp.data<T>(), weight.data<T>(), N,
                                             C, eps)),
              cpu::rmsnorm_forward_cpu<T>(out.data<T>(), rstd.data<T>(), inp.data<T>(), weight.data<T>(), N, C,
                                          eps));
}

void rmsnorm_backward(Tensor& dinp, Tensor& dweight, const Tensor& dout, const Tensor& inp, const Tensor& weight,
                      const Tensor& rstd, GradMode dinp_mode) {
  const char* op = "rmsnorm_backward";
  const int64_t C = last_dim(op, inp, "inp"), N = rows(inp);
  like(op, inp, weight, "weight", {C});
  param_grad(op, inp, dweight, "dweight", {C});
  like_rows(op, inp, dinp, "dinp", N, C);
  like_rows(op, inp, dout, "dout", N, C);
  stat(op, inp, rstd, "rstd", N);
  const bool acc = dinp_mode == GradMode::Accumulate;
  MT_DISPATCH(op, inp, (cuda_grad<T>(op, {&dweight}, [&](auto g_) {
                using G = decltype(g_);
                cuda::rmsnorm_backward_cuda<T, G>(dinp.data<T>(), dweight.data<G>(), dout.data<T>(), inp.data<T>(),
                                                  weight.data<T>(), rstd.data<float>(), N, C, acc);
              })),
              cpu::rmsnorm_backward_cpu<T>(dinp.data<T>(), dweight.data<T>(), dout.data<T>(), inp.data<T>(),
                                           weight.data<T>(), rstd.data<T>(), N, C, acc));
}

// ---------------------------------------------------------------- activations

void gelu_forward(Tensor& out, const Tensor& inp) {
  const char* op = "gelu_forward";
  need(op, inp, "inp");
  like_numel(op, inp, out, "out", inp.numel());
  MT_DISPATCH(op, inp, (cuda::gelu_forward_cuda<T>(out.data<T>(), inp.data<T>(), inp.numel())),
              cpu::gelu_forward_cpu<T>(out.data<T>(), inp.data<T>(), inp.numel()));
}

void gelu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  const char* op = "gelu_backward";
  need(op, inp, "inp");
  like_numel(op, inp, dinp, "dinp", inp.numel());
  like_numel(op, inp, dout, "dout", inp.numel());
  MT_DISPATCH(op, inp, (cuda::gelu_backward_cuda<T>(dinp.data<T>(), dout.data<T>(), inp.data<T>(), inp.numel())),
              cpu::gelu_backward_cpu<T>(dinp.data<T>(), dout.data<T>(), inp.data<T>(), inp.numel()));
}

namespace {
void check_amax(const char* op, const Tensor* amax, const Tensor& like) {
  if (amax)
    OP_ASSERT(amax->dtype() == DType::F32 && amax->numel() == 1 && amax->device() == like.device(), "amax ",
              amax->str(), " should be fp32 (1) on ", device_name(like.device()));
}
}  // namespace

void swiglu_forward(Tensor& out, const Tensor& inp, Tensor* out_amax) {
  const char* op = "swiglu_forward";
  const int64_t F2 = last_dim(op, inp, "inp"), N = rows(inp);
  OP_ASSERT(F2 % 2 == 0, "inp ", inp.str(), " should be (N, 2F)");
  like_rows(op, inp, out, "out", N, F2 / 2);
  check_amax(op, out_amax, inp);
  MT_DISPATCH(op, inp,
              (cuda::swiglu_forward_cuda<T>(out.data<T>(), inp.data<T>(), N, F2 / 2,
                                            out_amax ? out_amax->data<float>() : nullptr)),
              cpu::swiglu_forward_cpu<T>(out.data<T>(), inp.data<T>(), N, F2 / 2);
              if (out_amax) fp8_amax(*out_amax, out));  // the reference: a pass of its own
}

void swiglu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp, Tensor* dinp_amax) {
  const char* op = "swiglu_backward";
  const int64_t F2 = last_dim(op, inp, "inp"), N = rows(inp);
  OP_ASSERT(F2 % 2 == 0, "inp ", inp.str(), " should be (N, 2F)");
  like_rows(op, inp, dinp, "dinp", N, F2);
  like_rows(op, inp, dout, "dout", N, F2 / 2);
  check_amax(op, dinp_amax, inp);
  MT_DISPATCH(op, inp,
              (cuda::swiglu_backward_cuda<T>(dinp.data<T>(), dout.data<T>(), inp.data<T>(), N, F2 / 2,
                                             dinp_amax ? dinp_amax->data<float>() : nullptr)),
              cpu::swiglu_backward_cpu<T>(dinp.data<T>(), dout.data<T>(), inp.data<T>(), N, F2 / 2);
              if (dinp_amax) fp8_amax(*dinp_amax, dinp));
}

// ---------------------------------------------------------------- attention

namespace {
void check_rope(const char* op, const Tensor& x, const RopeParams& rope) {
  need(op, x, "x");
  OP_ASSERT(x.dim() == 4 && x.size(3) % 2 == 0, "x ", x.str(), " should be (B, T, heads, D) with D even");
  OP_ASSERT(rope.theta > 0, "theta ", rope.theta, " should be positive");
  OP_ASSERT(!rope.scaling || (rope.factor > 0 && rope.high_freq_factor > rope.low_freq_factor && rope.low_freq_factor > 0),
            "rope scaling factor ", rope.factor, ", low/high frequency factors ", rope.low_freq_factor, "/",
            rope.high_freq_factor, " should be positive with high > low");
}

// q (B, T, H, D), k and v (B, Tk, G, D), H a multiple of G; returns the shape. Tk == T unless !causal.
cpu::AttnShape attn_shape(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, bool causal = true) {
  need(op, q, "q");
  like(op, q, k, "k");
  OP_ASSERT(q.dim() == 4, "q ", q.str(), " should be (B, T, H, D)");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3);
  OP_ASSERT(k.dim() == 4 && k.size(0) == B && (k.size(1) == T || !causal) && k.size(3) == D && k.size(2) >= 1 &&
                H % k.size(2) == 0,
            "k ", k.str(), causal ? " should be (B, T, G, D)" : " should be (B, Tk, G, D)", " with H % G == 0 for q ",
            q.str());
  like(op, q, v, "v", k.shape());
  return {B, T, H, k.size(2), D, k.size(1), causal};
}

#if defined(MEGATRAIN_HAVE_CUDA)
cuda::AttnShape cuda_shape(const cpu::AttnShape& s) { return {s.B, s.T, s.H, s.G, s.D, s.keys(), s.causal}; }
#endif
}  // namespace

void rope_forward(Tensor& x, const RopeParams& rope, RopePositions positions) {
  const char* op = "rope_forward";
  check_rope(op, x, rope);
  MT_DISPATCH(op, x,
              (cuda::rope_forward_cuda<T>(x.data<T>(), x.size(0), x.size(1), x.size(2), x.size(3), rope,
                                          positions)),
              cpu::rope_forward_cpu<T>(x.data<T>(), x.size(0), x.size(1), x.size(2), x.size(3), rope,
                                       positions));
}

void rope_backward(Tensor& dx, const RopeParams& rope, RopePositions positions) {
  const char* op = "rope_backward";
  check_rope(op, dx, rope);
  MT_DISPATCH(op, dx,
              (cuda::rope_backward_cuda<T>(dx.data<T>(), dx.size(0), dx.size(1), dx.size(2), dx.size(3), rope,
                                           positions)),
              cpu::rope_backward_cpu<T>(dx.data<T>(), dx.size(0), dx.size(1), dx.size(2), dx.size(3), rope,
                                        positions));
}

void qkv_split_forward(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv) {
  const char* op = "qkv_split_forward";
  const cpu::AttnShape s = attn_shape(op, q, k, v);
  like_rows(op, q, qkv, "qkv", s.B * s.T, s.G * (s.H / s.G + 2) * s.D);
  MT_DISPATCH(op, q,
              (cuda::qkv_split_forward_cuda<T>(q.data<T>(), k.data<T>(), v.data<T>(), qkv.data<T>(), cuda_shape(s))),
              cpu::qkv_split_forward_cpu<T>(q.data<T>(), k.data<T>(), v.data<T>(), qkv.data<T>(), s));
}

void qkv_split_backward(Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const char* op = "qkv_split_backward";
  const cpu::AttnShape s = attn_shape(op, dq, dk, dv);
  like_rows(op, dq, dqkv, "dqkv", s.B * s.T, s.G * (s.H / s.G + 2) * s.D);
  MT_DISPATCH(op, dq,
              (cuda::qkv_split_backward_cuda<T>(dqkv.data<T>(), dq.data<T>(), dk.data<T>(), dv.data<T>(),
                                                cuda_shape(s))),
              cpu::qkv_split_backward_cpu<T>(dqkv.data<T>(), dq.data<T>(), dk.data<T>(), dv.data<T>(), s));
}

void qkv_split_rope_forward(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv, const RopeParams& rope,
                            RopePositions positions) {
  const char* op = "qkv_split_rope_forward";
  const cpu::AttnShape s = attn_shape(op, q, k, v);
  like_rows(op, q, qkv, "qkv", s.B * s.T, s.G * (s.H / s.G + 2) * s.D);
  check_rope(op, q, rope);
  if (q.device() == Device::CPU) {  // the reference: split, then rotate q and k
    qkv_split_forward(q, k, v, qkv);
    rope_forward(q, rope, positions);
    rope_forward(k, rope, positions);
    return;
  }
  MT_DISPATCH(op, q,
              (cuda::qkv_split_rope_forward_cuda<T>(q.data<T>(), k.data<T>(), v.data<T>(), qkv.data<T>(),
                                                    cuda_shape(s), rope, positions)),
              (void)sizeof(T); unsupported(op, q));
}

void qkv_split_rope_backward(Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv, const RopeParams& rope,
                             RopePositions positions) {
  const char* op = "qkv_split_rope_backward";
  const cpu::AttnShape s = attn_shape(op, dq, dk, dv);
  like_rows(op, dq, dqkv, "dqkv", s.B * s.T, s.G * (s.H / s.G + 2) * s.D);
  check_rope(op, dq, rope);
  if (dq.device() == Device::CPU) {  // the reference: rotate copies of dq and dk back, then the inverse split
    Tensor dq_r = dq.clone(), dk_r = dk.clone();
    rope_backward(dq_r, rope, positions);
    rope_backward(dk_r, rope, positions);
    qkv_split_backward(dqkv, dq_r, dk_r, dv);
    return;
  }
  MT_DISPATCH(op, dq,
              (cuda::qkv_split_rope_backward_cuda<T>(dqkv.data<T>(), dq.data<T>(), dk.data<T>(), dv.data<T>(),
                                                     cuda_shape(s), rope, positions)),
              (void)sizeof(T); unsupported(op, dq));
}

void attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  const char* op = "attention_forward";
  const cpu::AttnShape s = attn_shape(op, q, k, v, causal);
  like(op, q, out, "out", q.shape());
  stat(op, q, lse, "lse (B, H, T)", s.B * s.H * s.T);
  MT_DISPATCH(op, q,
              (cuda::attention_forward_cuda<T>(out.data<T>(), lse.data<float>(), q.data<T>(), k.data<T>(),
                                               v.data<T>(), cuda_shape(s))),
              cpu::attention_forward_cpu<T>(out.data<T>(), lse.data<T>(), q.data<T>(), k.data<T>(), v.data<T>(),
                                            s));
}

void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, bool causal) {
  const char* op = "attention_backward";
  const cpu::AttnShape s = attn_shape(op, q, k, v, causal);
  like(op, q, dq, "dq", q.shape());
  like(op, q, dk, "dk", k.shape());
  like(op, q, dv, "dv", k.shape());
  like(op, q, dout, "dout", q.shape());
  like(op, q, out, "out", q.shape());
  stat(op, q, lse, "lse (B, H, T)", s.B * s.H * s.T);
  MT_DISPATCH(op, q,
              (cuda::attention_backward_cuda<T>(dq.data<T>(), dk.data<T>(), dv.data<T>(), dout.data<T>(), q.data<T>(),
                                                k.data<T>(), v.data<T>(), out.data<T>(), lse.data<float>(),
                                                cuda_shape(s))),
              cpu::attention_backward_cpu<T>(dq.data<T>(), dk.data<T>(), dv.data<T>(), dout.data<T>(),
                                             q.data<T>(), k.data<T>(), v.data<T>(), out.data<T>(), lse.data<T>(),
                                             s));
}

namespace {
// out (B, T, H, D) and qkv (B, T, G*(H/G+2)*D) with G key/value heads; returns the shape.
cpu::AttnShape qkv_attn_shape(const char* op, const Tensor& out, const Tensor& qkv, int64_t G) {
  need(op, out, "out");
  like(op, out, qkv, "qkv");
  OP_ASSERT(out.dim() == 4, "out ", out.str(), " should be (B, T, H, D)");
  const int64_t B = out.size(0), T = out.size(1), H = out.size(2), D = out.size(3);
  OP_ASSERT(G >= 1 && H % G == 0, "G ", G, " should divide H ", H);
  OP_ASSERT(qkv.dim() == 3 && qkv.size(0) == B && qkv.size(1) == T && qkv.size(2) == G * (H / G + 2) * D, "qkv ",
            qkv.str(), " should be (B, T, G*(H/G+2)*D) for out ", out.str(), " and G ", G);
  return {B, T, H, G, D, T, true};
}
}  // namespace

void attention_forward_qkv(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t G) {
  const char* op = "attention_forward_qkv";
  const cpu::AttnShape s = qkv_attn_shape(op, out, qkv, G);
  stat(op, out, lse, "lse (B, H, T)", s.B * s.H * s.T);
  if (out.device() == Device::CPU) {  // the reference: split, then attention
    Tensor q = Tensor::empty({s.B, s.T, s.H, s.D}, out.dtype()), k = Tensor::empty({s.B, s.T, s.G, s.D}, out.dtype()),
           v = Tensor::empty({s.B, s.T, s.G, s.D}, out.dtype());
    qkv_split_forward(q, k, v, qkv);
    attention_forward(out, lse, q, k, v);
    return;
  }
  MT_DISPATCH(op, out,
              (cuda::attention_forward_qkv_cuda<T>(out.data<T>(), lse.data<float>(), qkv.data<T>(), cuda_shape(s))),
              (void)sizeof(T); unsupported(op, out));
}

void attention_backward_qkv(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                            const Tensor& lse, int64_t G) {
  const char* op = "attention_backward_qkv";
  const cpu::AttnShape s = qkv_attn_shape(op, out, qkv, G);
  like(op, out, dout, "dout", out.shape());
  like(op, out, dqkv, "dqkv", qkv.shape());
  stat(op, out, lse, "lse (B, H, T)", s.B * s.H * s.T);
  if (out.device() == Device::CPU) {  // the reference: split, attention backward, split backward
    const DType dt = out.dtype();
    const Shape qs{s.B, s.T, s.H, s.D}, ks{s.B, s.T, s.G, s.D};
    Tensor q = Tensor::empty(qs, dt), k = Tensor::empty(ks, dt), v = Tensor::empty(ks, dt);
    Tensor dq = Tensor::empty(qs, dt), dk = Tensor::empty(ks, dt), dv = Tensor::empty(ks, dt);
    qkv_split_forward(q, k, v, qkv);
    attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
    qkv_split_backward(dqkv, dq, dk, dv);
    return;
  }
  MT_DISPATCH(op, out,
              (cuda::attention_backward_qkv_cuda<T>(dqkv.data<T>(), dout.data<T>(), qkv.data<T>(), out.data<T>(),
                                                    lse.data<float>(), cuda_shape(s))),
              (void)sizeof(T); unsupported(op, out));
}

void attention_merge(Tensor& out, Tensor& lse, const Tensor& part_out, const Tensor& part_lse, int64_t t0) {
  const char* op = "attention_merge";
  need(op, out, "out");
  OP_ASSERT(out.dim() == 4, "out ", out.str(), " should be (B, T, H, D)");
  const int64_t B = out.size(0), Tq = out.size(1), H = out.size(2), D = out.size(3);
  like(op, out, part_out, "part_out");
  OP_ASSERT(part_out.dim() == 4 && part_out.size(0) == B && part_out.size(2) == H && part_out.size(3) == D &&
                t0 >= 0 && t0 + part_out.size(1) <= Tq,
            "part_out ", part_out.str(), " at row ", t0, " should be (B, Tb, H, D) inside out ", out.str());
  const int64_t Tb = part_out.size(1);
  stat(op, out, lse, "lse (B, H, T)", B * H * Tq);
  stat(op, out, part_lse, "part_lse (B, H, Tb)", B * H * Tb);
  MT_DISPATCH(op, out,
              (cuda::attention_merge_cuda<T>(out.data<T>(), lse.data<float>(), part_out.data<T>(),
                                             part_lse.data<float>(), B, Tq, Tb, H, D, t0)),
              cpu::attention_merge_cpu<T>(out.data<T>(), lse.data<T>(), part_out.data<T>(), part_lse.data<T>(), B, Tq,
                                          Tb, H, D, t0));
}

void seq_copy(Tensor& dst, int64_t dst_t, const Tensor& src, int64_t src_t, int64_t len, GradMode mode) {
  const char* op = "seq_copy";
  need(op, dst, "dst");
  like(op, dst, src, "src");
  OP_ASSERT(dst.dim() >= 2 && src.dim() == dst.dim() && src.size(0) == dst.size(0), "dst ", dst.str(), " and src ",
            src.str(), " should be (B, T, ...) with the same B");
  int64_t row = 1;
  for (int d = 2; d < dst.dim(); ++d) {
    OP_ASSERT(dst.size(d) == src.size(d), "dst ", dst.str(), " and src ", src.str(), " differ after the sequence dim");
    row *= dst.size(d);
  }
  OP_ASSERT(len >= 0 && dst_t >= 0 && src_t >= 0 && dst_t + len <= dst.size(1) && src_t + len <= src.size(1),
            "range of ", len, " from ", src_t, " of src ", src.str(), " to ", dst_t, " of dst ", dst.str());
  const int64_t B = dst.size(0), Td = dst.size(1), Ts = src.size(1);
  const bool acc = mode == GradMode::Accumulate;
  MT_DISPATCH(op, dst,
              (cuda::seq_copy_cuda<T>(dst.data<T>(), Td, dst_t, src.data<T>(), Ts, src_t, B, len, row, acc)),
              cpu::seq_copy_cpu<T>(dst.data<T>(), Td, dst_t, src.data<T>(), Ts, src_t, B, len, row, acc));
}

// ---------------------------------------------------------------- cross-entropy

namespace {
// logits (..., Vl) with targets int32 (N); returns {N, Vl}.
std::array<int64_t, 2> ce_dims(const char* op, const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                               int64_t n_valid) {
  const int64_t Vl = last_dim(op, logits, "logits"), N = rows(logits);
  on_device(op, logits, targets, "targets", DType::I32);
  numel_is(op, targets, "targets", N);
  OP_ASSERT(n_valid >= 0 && n_valid <= Vl, "n_valid ", n_valid, " outside [0, ", Vl, "] for logits ", logits.str());
  OP_ASSERT(vocab_start >= 0, "vocab_start ", vocab_start, " is negative");
  return {N, Vl};
}
}  // namespace

void cross_entropy_stats(Tensor& max, Tensor& sumexp, Tensor& target_logit, const Tensor& logits,
                         const Tensor& targets, int64_t vocab_start, int64_t n_valid) {
  const char* op = "cross_entropy_stats";
  const auto [N, Vl] = ce_dims(op, logits, targets, vocab_start, n_valid);
  stat(op, logits, max, "max", N);
  stat(op, logits, sumexp, "sumexp", N);
  stat(op, logits, target_logit, "target_logit", N);
  MT_DISPATCH(op, logits,
              (cuda::cross_entropy_stats_cuda<T>(max.data<float>(), sumexp.data<float>(), target_logit.data<float>(),
                                                 logits.data<T>(), targets.data<int32_t>(), N, Vl, vocab_start,
                                                 n_valid)),
              cpu::cross_entropy_stats_cpu<T>(max.data<T>(), sumexp.data<T>(), target_logit.data<T>(),
                                              logits.data<T>(), targets.data<int32_t>(), N, Vl, vocab_start,
                                              n_valid));
}

void cross_entropy_rescale(Tensor& sumexp, const Tensor& max, const Tensor& gmax) {
  const char* op = "cross_entropy_rescale";
  need(op, max, "max");
  OP_ASSERT(max.dtype() == DType::F32 || max.dtype() == DType::F64, "max ", max.str(), " should be fp32 or fp64");
  const int64_t N = max.numel();
  on_device(op, max, sumexp, "sumexp", max.dtype());
  on_device(op, max, gmax, "gmax", max.dtype());
  numel_is(op, sumexp, "sumexp", N);
  numel_is(op, gmax, "gmax", N);
  MT_DISPATCH(op, max, (cuda::cross_entropy_rescale_cuda(sumexp.data<float>(), max.data<float>(), gmax.data<float>(), N)),
              cpu::cross_entropy_rescale_cpu<T>(sumexp.data<T>(), max.data<T>(), gmax.data<T>(), N));
}

void cross_entropy_finish(Tensor& lse, Tensor& loss, const Tensor& gmax, const Tensor& sumexp,
                          const Tensor& target_logit) {
  const char* op = "cross_entropy_finish";
  need(op, gmax, "gmax");
  OP_ASSERT(gmax.dtype() == DType::F32 || gmax.dtype() == DType::F64, "gmax ", gmax.str(), " should be fp32 or fp64");
  const int64_t N = gmax.numel();
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&lse, "lse"}, {&sumexp, "sumexp"},
                                {&target_logit, "target_logit"}}) {
    on_device(op, gmax, *t, name, gmax.dtype());
    numel_is(op, *t, name, N);
  }
  on_device(op, gmax, loss, "loss", DType::F64);
  numel_is(op, loss, "loss", N);
  MT_DISPATCH(op, gmax,
              (cuda::cross_entropy_finish_cuda(lse.data<float>(), loss.data<double>(), gmax.data<float>(),
                                               sumexp.data<float>(), target_logit.data<float>(), N)),
              cpu::cross_entropy_finish_cpu<T>(lse.data<T>(), loss.data<double>(), gmax.data<T>(), sumexp.data<T>(),
                                               target_logit.data<T>(), N));
}

void sum_accumulate(Tensor& acc, const Tensor& x) {
  const char* op = "sum_accumulate";
  need(op, x, "x");
  on_device(op, x, x, "x", DType::F64);
  on_device(op, x, acc, "acc", DType::F64);
  numel_is(op, acc, "acc", 1);
  switch (x.device()) {
    case Device::CPU:
      acc.data<double>()[0] += cpu::sum_cpu(x.data<double>(), x.numel());
      return;
#if defined(MEGATRAIN_HAVE_CUDA)
    case Device::CUDA: {
      const cuda::OpTimer timer(op, x.numel());
      cuda::sum_accumulate_cuda(acc.data<double>(), x.data<double>(), x.numel());
      return;
    }
#endif
    default:
      unsupported(op, x);
  }
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& dloss, int64_t vocab_start, int64_t n_valid) {
  const char* op = "cross_entropy_backward";
  const auto [N, Vl] = ce_dims(op, logits, targets, vocab_start, n_valid);
  like_rows(op, logits, dlogits, "dlogits", N, Vl);
  stat(op, logits, lse, "lse", N);
  need(op, dloss, "dloss");
  OP_ASSERT(dloss.dtype() == DType::F32 || dloss.dtype() == DType::F64, "dloss ", dloss.str(),
            " should be fp32 or fp64");
  on_device(op, logits, dloss, "dloss", dloss.dtype());
  numel_is(op, dloss, "dloss", N);
  if (logits.device() == Device::CUDA)
    MT_CHECK(dloss.dtype() == DType::F32, "op ", op, " is not supported on device cuda for dloss ", dloss.str(),
             " (fp32 only)");
  MT_DISPATCH(op, logits,
              (cuda::cross_entropy_backward_cuda<T>(dlogits.data<T>(), logits.data<T>(), targets.data<int32_t>(),
                                                    lse.data<float>(), dloss.data<float>(), N, Vl, vocab_start,
                                                    n_valid)), {
    if (dloss.dtype() == DType::F32)
      cpu::cross_entropy_backward_cpu<T, float>(dlogits.data<T>(), logits.data<T>(), targets.data<int32_t>(),
                                                lse.data<T>(), dloss.data<float>(), N, Vl, vocab_start, n_valid);
    else
      cpu::cross_entropy_backward_cpu<T, double>(dlogits.data<T>(), logits.data<T>(), targets.data<int32_t>(),
                                                 lse.data<T>(), dloss.data<double>(), N, Vl, vocab_start, n_valid);
  });
}

// ---------------------------------------------------------------- dropout

void dropout_forward(Tensor& out, const Tensor& inp, double p, uint64_t seed, uint64_t offset) {
  const char* op = "dropout_forward";
  need(op, inp, "inp");
  like_numel(op, inp, out, "out", inp.numel());
  OP_ASSERT(p >= 0 && p <= 1, "p ", p, " outside [0, 1]");
  MT_DISPATCH(op, inp, (cuda::dropout_forward_cuda<T>(out.data<T>(), inp.data<T>(), inp.numel(), p, seed, offset)),
              cpu::dropout_forward_cpu<T>(out.data<T>(), inp.data<T>(), inp.numel(), p, seed, offset));
}

void dropout_backward(Tensor& dinp, const Tensor& dout, double p, uint64_t seed, uint64_t offset) {
  const char* op = "dropout_backward";
  need(op, dout, "dout");
  like_numel(op, dout, dinp, "dinp", dout.numel());
  OP_ASSERT(p >= 0 && p <= 1, "p ", p, " outside [0, 1]");
  MT_DISPATCH(op, dout,
              (cuda::dropout_backward_cuda<T>(dinp.data<T>(), dout.data<T>(), dout.numel(), p, seed, offset)),
              cpu::dropout_backward_cpu<T>(dinp.data<T>(), dout.data<T>(), dout.numel(), p, seed, offset));
}

// ---------------------------------------------------------------- random fill

void fill_normal(Tensor& out, uint64_t seed, uint64_t stream, uint64_t offset) {
  const char* op = "fill_normal";
  need(op, out, "out");
  MT_DISPATCH(op, out, (cuda::fill_normal_cuda<T>(out.data<T>(), out.numel(), seed, stream, offset)),
              cpu::fill_normal_cpu<T>(out.data<T>(), out.numel(), seed, stream, offset));
}

// ---------------------------------------------------------------- optimizer

int64_t check_decay_runs(const char* op, const DecayRuns* decay, int64_t n) {
  if (!decay) return 0;
  const int64_t runs = static_cast<int64_t>(decay->starts.size());
  OP_ASSERT(runs >= 1 && decay->decay.size() == decay->starts.size() && decay->starts[0] == 0, "decay runs: ", runs,
            " starts and ", decay->decay.size(), " flags, the first at ", runs ? decay->starts[0] : -1,
            " (should be 0)");
  for (int64_t r = 1; r < runs; ++r)
    OP_ASSERT(decay->starts[r] > decay->starts[r - 1] && decay->starts[r] < n, "decay run ", r, " starts at ",
              decay->starts[r], " (after ", decay->starts[r - 1], ", before ", n, ")");
  return runs;
}

void adamw_step(Tensor& param, Tensor& m, Tensor& v, const Tensor& grad, const AdamWArgs& a, Tensor* param_copy,
                const DecayRuns* decay) {
  const char* op = "adamw_step";
  need(op, param, "param");
  like_numel(op, param, m, "m", param.numel());
  like_numel(op, param, v, "v", param.numel());
  // grad: param's dtype, or bf16 main grads for fp32 master weights on cuda (parallel.grad_reduce_in_fp32 false)
  const bool bf16_grad = grad.defined() && grad.dtype() == DType::BF16 && param.dtype() == DType::F32 &&
                         param.device() == Device::CUDA;
  on_device(op, param, grad, "grad", bf16_grad ? DType::BF16 : param.dtype());
  numel_is(op, grad, "grad", param.numel());
  OP_ASSERT(a.step >= 1, "step ", a.step, " should be >= 1");
  const int64_t runs = check_decay_runs(op, decay, param.numel());
  if (param_copy)
    OP_ASSERT(param_copy->numel() == param.numel() && param_copy->device() == param.device() &&
                  (param_copy->dtype() == DType::BF16 || param_copy->dtype() == DType::F16),
              "param_copy should be a bf16 / fp16 tensor of ", param.numel(), " elements on param's device");
#if defined(MEGATRAIN_HAVE_CUDA)
  if (param.device() == Device::CUDA && param.dtype() == DType::F32) {
    const cuda::OpTimer timer(param_copy ? "adamw_step (+ weight copy)" : op, param.numel());  // MT_OP_PROFILE
    cuda::adamw_step_cuda(param.data<float>(), m.data<float>(), v.data<float>(), grad.raw(), bf16_grad, param.numel(),
                          a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.step, a.grad_scale,
                          param_copy ? param_copy->raw() : nullptr,
                          param_copy && param_copy->dtype() == DType::F16, decay ? decay->starts.data() : nullptr,
                          decay ? decay->decay.data() : nullptr, runs);
    return;
  }
#endif
  if (runs > 1) {  // one update per run (the reference)
    for (int64_t r = 0; r < runs; ++r) {
      const int64_t b = decay->starts[r], e = r + 1 < runs ? decay->starts[r + 1] : param.numel();
      AdamWArgs ar = a;
      ar.weight_decay = decay->decay[r] ? a.weight_decay : 0.0;
      Tensor pr = param.slice(b, e - b), mr = m.slice(b, e - b), vr = v.slice(b, e - b);
      Tensor cr = param_copy ? param_copy->slice(b, e - b) : Tensor();
      adamw_step(pr, mr, vr, grad.slice(b, e - b), ar, param_copy ? &cr : nullptr);
    }
    return;
  }
  AdamWArgs ar = a;
  if (runs == 1 && !decay->decay[0]) ar.weight_decay = 0.0;
  if (param_copy) {
    adamw_step(param, m, v, grad, ar);
    cast(*param_copy, param);
    return;
  }
  MT_DISPATCH(op, param, (unsupported(op, param)),  // CUDA: fp32 above
              cpu::adamw_step_cpu<T>(param.data<T>(), m.data<T>(), v.data<T>(), grad.data<T>(), param.numel(),
                                     ar.lr, ar.beta1, ar.beta2, ar.eps, ar.weight_decay, ar.step, ar.grad_scale));
}

}  // namespace mt::ops
