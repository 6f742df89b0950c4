// The master-halves ops (tensor/master_halves_ops.h): checks, then the CPU loops or the CUDA kernels
// (cuda/master_halves.cu, cuda/adamw.cu). On the CPU the update joins into fp32, runs adamw_step and splits back:
// the reference the CUDA kernel equals bit for bit.
#include "tensor/master_halves_ops.h"

#include <initializer_list>

#include "core/check.h"
#include "core/master_halves.h"
#if defined(MEGATRAIN_HAVE_CUDA)
#include "cuda/cuda_ops.h"
#endif

namespace mt::ops {

namespace {

#define HALVES_ASSERT(cond, ...) MT_INTERNAL_ASSERT(cond, "op ", op, ": ", __VA_ARGS__)

void check_halves(const char* op, const Tensor& hi, const Tensor& lo, const Tensor& master) {
  HALVES_ASSERT(hi.defined() && master.defined(), "hi and master must be defined");
  HALVES_ASSERT(hi.dtype() == DType::BF16 && master.dtype() == DType::F32, "hi ", hi.str(), " should be bf16, master ",
                master.str(), " fp32");
  HALVES_ASSERT(hi.numel() == master.numel() && hi.device() == master.device(), "hi ", hi.str(), " and master ",
                master.str(), " should have the same numel and device");
  if (lo.defined())
    HALVES_ASSERT(lo.dtype() == DType::U16 && lo.numel() == hi.numel() && lo.device() == hi.device(), "lo ",
                  lo.str(), " should be uint16 like hi ", hi.str());
}

uint16_t* bits(Tensor& t) { return static_cast<uint16_t*>(t.raw()); }
const uint16_t* bits(const Tensor& t) { return static_cast<const uint16_t*>(t.raw()); }

}  // namespace

void split_master(Tensor& hi, Tensor* lo, const Tensor& master) {
  const char* op = "split_master";
  check_halves(op, hi, lo ? *lo : Tensor(), master);
  const int64_t n = master.numel();
#if defined(MEGATRAIN_HAVE_CUDA)
  if (master.device() == Device::CUDA)
    return cuda::split_master_cuda(bits(hi), lo ? bits(*lo) : nullptr, master.data<float>(), n);
#endif
  HALVES_ASSERT(master.device() == Device::CPU, "unsupported device");
  const float* x = master.data<float>();
  uint16_t *h = bits(hi), *l = lo ? bits(*lo) : nullptr;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = float_bits(x[i]);
    h[i] = master_halves::high_half(u);
    if (l) l[i] = master_halves::low_half(u);
  }
}

void join_master(Tensor& master, const Tensor& hi, const Tensor& lo) {
  const char* op = "join_master";
  HALVES_ASSERT(lo.defined(), "lo must be defined");
  check_halves(op, hi, lo, master);
  const int64_t n = master.numel();
#if defined(MEGATRAIN_HAVE_CUDA)
  if (master.device() == Device::CUDA) return cuda::join_master_cuda(master.data<float>(), bits(hi), bits(lo), n);
#endif
  HALVES_ASSERT(master.device() == Device::CPU, "unsupported device");
  float* x = master.data<float>();
  const uint16_t *h = bits(hi), *l = bits(lo);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) x[i] = master_halves::join(h[i], l[i]);
}

void adamw_step_halves(Tensor& hi, Tensor& lo, Tensor& m, Tensor& v, const Tensor& grad, const AdamWArgs& a,
                       const DecayRuns* decay) {
  const char* op = "adamw_step_halves";
  HALVES_ASSERT(lo.defined(), "lo must be defined");
  HALVES_ASSERT(hi.dtype() == DType::BF16 && lo.dtype() == DType::U16 && lo.numel() == hi.numel() &&
                    lo.device() == hi.device(),
                "hi ", hi.str(), " should be bf16 and lo ", lo.str(), " uint16 of its numel and device");
#if defined(MEGATRAIN_HAVE_CUDA)
  if (hi.device() == Device::CUDA) {
    const int64_t n = hi.numel();
    for (const Tensor* t : std::initializer_list<const Tensor*>{&m, &v})
      HALVES_ASSERT(t->dtype() == DType::F32 && t->numel() == n && t->device() == Device::CUDA, t->str(),
                    " should be fp32 of ", n, " elements on cuda");
    HALVES_ASSERT((grad.dtype() == DType::F32 || grad.dtype() == DType::BF16) && grad.numel() == n &&
                      grad.device() == Device::CUDA,
                  "grad ", grad.str(), " should be fp32 or bf16 of ", n, " elements on cuda");
    const int64_t runs = check_decay_runs(op, decay, n);
    const cuda::OpTimer timer(op, n);  // MT_OP_PROFILE
    cuda::adamw_step_halves_cuda(bits(hi), bits(lo), m.data<float>(), v.data<float>(), grad.raw(),
                                 grad.dtype() == DType::BF16, n, a.lr,
                                 a.beta1, a.beta2, a.eps, a.weight_decay, a.step, a.grad_scale,
                                 decay ? decay->starts.data() : nullptr, decay ? decay->decay.data() : nullptr, runs);
    return;
  }
#endif
  Tensor p = Tensor::empty(hi.shape(), DType::F32, hi.device());
  join_master(p, hi, lo);
  adamw_step(p, m, v, grad, a, nullptr, decay);
  split_master(hi, &lo, p);
}

}  // namespace mt::ops
