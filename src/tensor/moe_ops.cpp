// The MoE ops (tensor/moe_ops.h): shape/dtype checks, then dispatch on device and dtype. The CPU references
// live in tensor/cpu/moe_*.cpp; a device without an implementation is a user-visible error naming the op.
#include "tensor/moe_ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "tensor/cpu/moe_cpu.h"
#if defined(MEGATRAIN_HAVE_CUDA)
#include "cuda/cuda_ops.h"
#include "cuda/moe_cuda.h"
#include "cuda/sm90/grouped_gemm.h"
#endif

namespace mt::ops {

namespace {

#define MOE_ASSERT(cond, ...) MT_INTERNAL_ASSERT(cond, "op ", op, ": ", __VA_ARGS__)

[[noreturn]] void unsupported(const char* op, const Tensor& t) {
  MT_CHECK(false, "op ", op, " is not supported on device ", device_name(t.device()), " for ", dtype_name(t.dtype()));
  __builtin_unreachable();
}

// Calls f(float{}) or f(double{}) for a CPU tensor of that dtype; anything else is unsupported.
template <typename F>
void cpu_float(const char* op, const Tensor& t, F&& f) {
  if (t.device() != Device::CPU) unsupported(op, t);
  switch (t.dtype()) {
    case DType::F32: f(float{}); return;
    case DType::F64: f(double{}); return;
    default: unsupported(op, t);
  }
}

void check(const char* op, const Tensor& t, const char* name, const Tensor& ref, DType dt, const Shape& s) {
  MOE_ASSERT(t.defined(), name, " is undefined");
  MOE_ASSERT(t.device() == ref.device(), name, " ", t.str(), " is on ", device_name(t.device()));
  MOE_ASSERT(t.dtype() == dt, name, " ", t.str(), " should be ", dtype_name(dt));
  MOE_ASSERT(t.shape() == s, name, " ", t.str(), " should have shape ", shape_str(s));
}
[[maybe_unused]] bool on_cuda(const Tensor& t) { return t.device() == Device::CUDA; }
// The activation dtypes with CUDA kernels (any_float's lambdas also see double, which runs on the CPU only).
template <typename T>
[[maybe_unused]] constexpr bool kCudaDtype = !std::is_same_v<T, double>;
// A CUDA op of router tensors: fp32 only.
[[maybe_unused]] void cuda_f32(const char* op, const Tensor& t) {
  if (t.dtype() != DType::F32) unsupported(op, t);
}
// Host copy of a tensor (for the few ops that run on the host on every device) and back.
Tensor host_copy(const Tensor& t) {
  Tensor h = Tensor::empty(t.shape(), t.dtype());
  h.copy_from(t);
  return h;
}

// Calls f(T{}) for an activation dtype: CPU float/double through cpu_float, CUDA float/bf16/f16.
template <typename F>
void any_float(const char* op, const Tensor& t, F&& f) {
#if defined(MEGATRAIN_HAVE_CUDA)
  if (on_cuda(t)) {
    const cuda::OpTimer timer(op, t.numel());  // MT_OP_PROFILE
    switch (t.dtype()) {
      case DType::F32: f(float{}); return;
      case DType::BF16: f(bf16{}); return;
      case DType::F16: f(f16{}); return;
      default: unsupported(op, t);
    }
  }
#endif
  cpu_float(op, t, f);
}

// The router dtype of activations of dtype t: fp64 for fp64, else fp32.
DType router_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }
void check_2d(const char* op, const Tensor& t, const char* name) {
  MOE_ASSERT(t.defined() && t.dim() == 2, name, " ", t.defined() ? t.str() : "undefined", " should be 2-d");
}

}  // namespace

// ---------------------------------------------------------------- router

void moe_router_forward(Tensor& indices, Tensor& weights, Tensor& scores, const Tensor& logits, const Tensor* bias,
                        const RouterSpec& spec) {
  const char* op = "moe_router_forward";
  check_2d(op, logits, "logits");
  const int64_t N = logits.size(0), E = logits.size(1), k = spec.topk;
  MOE_ASSERT(k >= 1 && k <= E, "topk ", k, " for ", E, " experts");
  check(op, indices, "indices", logits, DType::I32, {N, k});
  check(op, weights, "weights", logits, logits.dtype(), {N, k});
  check(op, scores, "scores", logits, logits.dtype(), {N, E});
  if (bias) check(op, *bias, "bias", logits, logits.dtype(), {E});
#if defined(MEGATRAIN_HAVE_CUDA)
  if (on_cuda(logits)) {
    cuda_f32(op, logits);
    const cuda::OpTimer timer(op, logits.numel());  // MT_OP_PROFILE
    cuda::moe_router_forward_cuda(indices.data<int32_t>(), weights.data<float>(), scores.data<float>(),
                                  logits.data<float>(), bias ? bias->data<float>() : nullptr, N, E, spec);
    return;
  }
#endif
  cpu_float(op, logits, [&](auto z) {
    using T = decltype(z);
    cpu::moe_router_forward_cpu<T>(indices.data<int32_t>(), weights.data<T>(), scores.data<T>(), logits.data<T>(),
                                   bias ? bias->data<T>() : nullptr, N, E, spec);
  });
}

void moe_router_backward(Tensor& dlogits, const Tensor& dweights, const Tensor& scores, const Tensor& indices,
                         const RouterSpec& spec) {
  const char* op = "moe_router_backward";
  check_2d(op, scores, "scores");
  const int64_t N = scores.size(0), E = scores.size(1), k = spec.topk;
  check(op, indices, "indices", scores, DType::I32, {N, k});
  check(op, dweights, "dweights", scores, scores.dtype(), {N, k});
  check(op, dlogits, "dlogits", scores, scores.dtype(), {N, E});
#if defined(MEGATRAIN_HAVE_CUDA)
  if (on_cuda(scores)) {
    cuda_f32(op, scores);
    const cuda::OpTimer timer(op, scores.numel());
    cuda::moe_router_backward_cuda(dlogits.data<float>(), dweights.data<float>(), scores.data<float>(),
                                   indices.data<int32_t>(), N, E, spec);
    return;
  }
#endif
  cpu_float(op, scores, [&](auto z) {
    using T = decltype(z);
    cpu::moe_router_backward_cpu<T>(dlogits.data<T>(), dweights.data<T>(), scores.data<T>(),
                                    indices.data<int32_t>(), N, E, spec);
  });
}

// ---------------------------------------------------------------- losses

namespace {
void aux_loss(const char* op, Tensor* loss, Tensor* dlogits, const Tensor& scores, const Tensor& indices,
              int64_t groups, double coeff, bool sigmoid, double dloss, const AuxLossGroup* group) {
  check_2d(op, scores, "scores");
  check_2d(op, indices, "indices");
  const int64_t N = scores.size(0), E = scores.size(1), k = indices.size(1);
  check(op, indices, "indices", scores, DType::I32, {N, k});
  MOE_ASSERT(groups >= 1 && N % groups == 0, N, " rows do not split into ", groups, " groups");
  if (loss) check(op, *loss, "loss", scores, scores.dtype(), {1});
  if (dlogits) check(op, *dlogits, "dlogits", scores, scores.dtype(), {N, E});
  // The group's coefficients a_e = dL/dp_ne = coeff * E * f_e / rows (f_e = count / (rows * k)), on the host.
  std::vector<double> a;
  if (group) {
    MOE_ASSERT(groups == 1 && static_cast<int64_t>(group->counts.size()) == E && group->rows >= N,
               "a group's aux loss needs groups 1, E counts and at least this rank's rows");
    const double rows = static_cast<double>(group->rows);
    for (int64_t e = 0; e < E; ++e)
      a.push_back(coeff * static_cast<double>(E) * static_cast<double>(group->counts[static_cast<size_t>(e)]) /
                  (rows * static_cast<double>(k) * rows));
  }
  const double* a_host = group ? a.data() : nullptr;
#if defined(MEGATRAIN_HAVE_CUDA)
  if (on_cuda(scores)) {
    cuda_f32(op, scores);
    const cuda::OpTimer timer(op, scores.numel());
    cuda::moe_aux_loss_cuda(loss ? loss->data<float>() : nullptr, dlogits ? dlogits->data<float>() : nullptr,
                            scores.data<float>(), indices.data<int32_t>(), N, E, k, groups, coeff, sigmoid, dloss,
                            a_host);
    return;
  }
#endif
  cpu_float(op, scores, [&](auto z) {
    using T = decltype(z);
    cpu::moe_aux_loss_cpu<T>(loss ? loss->data<T>() : nullptr, dlogits ? dlogits->data<T>() : nullptr,
                             scores.data<T>(), indices.data<int32_t>(), N, E, k, groups, coeff, sigmoid, dloss, a_host);
  });
}
void z_loss(const char* op, Tensor* loss, Tensor* dlogits, const Tensor& logits, double coeff, double dloss) {
  check_2d(op, logits, "logits");
  const int64_t N = logits.size(0), E = logits.size(1);
  if (loss) check(op, *loss, "loss", logits, logits.dtype(), {1});
  if (dlogits) check(op, *dlogits, "dlogits", logits, logits.dtype(), {N, E});
#if defined(MEGATRAIN_HAVE_CUDA)
  if (on_cuda(logits)) {
    cuda_f32(op, logits);
    const cuda::OpTimer timer(op, logits.numel());
    cuda::moe_z_loss_cuda(loss ? loss->data<float>() : nullptr, dlogits ? dlogits->data<float>() : nullptr,
                          logits.data<float>(), N, E, coeff, dloss);
    return;
  }
#endif
  cpu_float(op, logits, [&](auto z) {
    using T = decltype(z);
    cpu::moe_z_loss_cpu<T>(loss ? loss->data<T>() : nullptr, dlogits ? dlogits->data<T>() : nullptr,
                           logits.data<T>(), N, E, coeff, dloss);
  });
}
}  // namespace

void moe_aux_loss_forward(Tensor& loss, const Tensor& scores, const Tensor& indices, int64_t groups, double coeff,
                          bool sigmoid, const AuxLossGroup* group) {
  aux_loss("moe_aux_loss_forward", &loss, nullptr, scores, indices, groups, coeff, sigmoid, 0.0, group);
}
void moe_aux_loss_backward(Tensor& dlogits, const Tensor& scores, const Tensor& indices, int64_t groups, double coeff,
                           bool sigmoid, double dloss, const AuxLossGroup* group) {
  aux_loss("moe_aux_loss_backward", nullptr, &dlogits, scores, indices, groups, coeff, sigmoid, dloss, group);
}
void moe_z_loss_forward(Tensor& loss, const Tensor& logits, double coeff) {
  z_loss("moe_z_loss_forward", &loss, nullptr, logits, coeff, 0.0);
}
void moe_z_loss_backward(Tensor& dlogits, const Tensor& logits, double coeff, double dloss) {
  z_loss("moe_z_loss_backward", nullptr, &dlogits, logits, coeff, dloss);
}

void moe_expert_counts(Tensor& counts, const Tensor& indices, int64_t E) {
  const char* op = "moe_expert_counts";
  check(op, counts, "counts", indices, DType::I32, {E});
  MOE_ASSERT(indices.dtype() == DType::I32, "indices ", indices.str(), " should be int32");
#if defined(MEGATRAIN_HAVE_CUDA)
  if (on_cuda(indices)) {
    const cuda::OpTimer timer(op, indices.numel());
    cuda::moe_expert_counts_cuda(counts.data<int32_t>(), indices.data<int32_t>(), indices.numel(), E);
    return;
  }
#endif
  if (indices.device() != Device::CPU) unsupported(op, indices);
  cpu::moe_expert_counts_cpu(counts.data<int32_t>(), indices.data<int32_t>(), indices.numel(), E);
}

void moe_expert_bias_update(Tensor& bias, const Tensor& load, double rate) {
  const char* op = "moe_expert_bias_update";
  MOE_ASSERT(bias.defined() && bias.dim() == 1, "bias should be (E)");
  const int64_t E = bias.numel();
  MOE_ASSERT(load.defined() && load.numel() == E && load.device() == bias.device(), "load should be (E)");
  if (bias.device() != Device::CPU) {  // E values: on the host, then back
    Tensor b = host_copy(bias);
    moe_expert_bias_update(b, host_copy(load), rate);
    bias.copy_from(b);
    return;
  }
  if (load.device() != Device::CPU) unsupported(op, load);
  std::vector<double> load64(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    switch (load.dtype()) {
      case DType::I32: load64[e] = load.data<int32_t>()[e]; break;
      case DType::I64: load64[e] = static_cast<double>(load.data<int64_t>()[e]); break;
      case DType::F32: load64[e] = load.data<float>()[e]; break;
      case DType::F64: load64[e] = load.data<double>()[e]; break;
      default: unsupported(op, load);
    }
  }
  cpu_float(op, bias, [&](auto z) {
    using T = decltype(z);
    cpu::moe_expert_bias_update_cpu<T>(bias.data<T>(), load64.data(), E, rate);
  });
}

// ---------------------------------------------------------------- capacity

int64_t moe_capacity(int64_t N, int64_t k, int64_t E, double factor) {
  return static_cast<int64_t>(std::ceil(static_cast<double>(N * k) / static_cast<double>(E) * factor));
}

void moe_apply_capacity(Tensor& indices, const Tensor& weights, int64_t E, int64_t capacity) {
  const char* op = "moe_apply_capacity";
  check_2d(op, weights, "weights");
  check(op, indices, "indices", weights, DType::I32, weights.shape());
  MOE_ASSERT(capacity >= 0, "capacity ", capacity);
  if (weights.device() != Device::CPU) {  // a per-expert sort: on the host (N * k values), then back
    Tensor idx = host_copy(indices), w = host_copy(weights);
    if (w.dtype() != DType::F32 && w.dtype() != DType::F64) unsupported(op, w);
    moe_apply_capacity(idx, w, E, capacity);
    indices.copy_from(idx);
    return;
  }
  cpu_float(op, weights, [&](auto z) {
    using T = decltype(z);
    cpu::moe_apply_capacity_cpu<T>(indices.data<int32_t>(), weights.data<T>(), indices.numel(), E, capacity);
  });
}

// ---------------------------------------------------------------- permute / unpermute

void moe_routing_map(Tensor& slot_of_row, Tensor& row_of_slot, Tensor& counts, const Tensor& indices, int64_t E) {
  const char* op = "moe_routing_map";
  check_2d(op, indices, "indices");
  MOE_ASSERT(indices.dtype() == DType::I32, "indices ", indices.str(), " should be int32");
  const int64_t S = indices.numel();
  check(op, slot_of_row, "slot_of_row", indices, DType::I32, {S});
  check(op, row_of_slot, "row_of_slot", indices, DType::I32, {S});
  check(op, counts, "counts", indices, DType::I32, {E});
#if defined(MEGATRAIN_HAVE_CUDA)
  if (on_cuda(indices)) {
    const cuda::OpTimer timer(op, S, E);
    cuda::moe_routing_map_cuda(slot_of_row.data<int32_t>(), row_of_slot.data<int32_t>(), counts.data<int32_t>(),
                               indices.data<int32_t>(), S, E);
    return;
  }
#endif
  if (indices.device() != Device::CPU) unsupported(op, indices);
  cpu::moe_routing_map_cpu(slot_of_row.data<int32_t>(), row_of_slot.data<int32_t>(), counts.data<int32_t>(),
                           indices.data<int32_t>(), S, E);
}

void moe_permute_forward(Tensor& out, const Tensor& x, const Tensor& slot_of_row, int64_t k) {
  const char* op = "moe_permute_forward";
  check_2d(op, x, "x");
  check_2d(op, out, "out");
  const int64_t C = x.size(1), M = out.size(0);
  check(op, out, "out", x, x.dtype(), {M, C});
  MOE_ASSERT(slot_of_row.defined() && slot_of_row.dim() == 1 && slot_of_row.numel() >= M,
             "slot_of_row should be 1-d with at least the ", M, " rows of out");
  check(op, slot_of_row, "slot_of_row", x, DType::I32, {slot_of_row.numel()});
  any_float(op, x, [&](auto z) {
    using T = decltype(z);
#if defined(MEGATRAIN_HAVE_CUDA)
    if constexpr (kCudaDtype<T>)  // (no fp64 kernels: not even referenced)
      if (on_cuda(x))
        return cuda::moe_permute_forward_cuda<T>(out.data<T>(), x.data<T>(), slot_of_row.data<int32_t>(), M, C, k);
#endif
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
      cpu::moe_permute_forward_cpu<T>(out.data<T>(), x.data<T>(), slot_of_row.data<int32_t>(), M, C, k);
  });
}

void moe_dest_ranks(Tensor& dest, const Tensor& indices, int64_t El) {
  const char* op = "moe_dest_ranks";
  check_2d(op, indices, "indices");
  MOE_ASSERT(indices.dtype() == DType::I32 && El >= 1, "indices ", indices.str(), " should be int32, El ", El);
  check_2d(op, dest, "dest");
  const int64_t N = indices.size(0), k = indices.size(1), P = dest.size(1);
  check(op, dest, "dest", indices, DType::I32, {N, P});
#if defined(MEGATRAIN_HAVE_CUDA)
  if (on_cuda(indices)) {
    const cuda::OpTimer timer(op, N, P);
    return cuda::moe_dest_ranks_cuda(dest.data<int32_t>(), indices.data<int32_t>(), N, k, P, El);
  }
#endif
  if (indices.device() != Device::CPU) unsupported(op, indices);
  cpu::moe_dest_ranks_cpu(dest.data<int32_t>(), indices.data<int32_t>(), N, k, P, El);
}

void moe_local_choices(Tensor& local, const Tensor& indices, const Tensor& send_slot, int64_t P, int64_t El) {
  const char* op = "moe_local_choices";
  check_2d(op, indices, "indices");
  check_2d(op, local, "local");
  const int64_t k = indices.size(1), S = local.size(0);
  check(op, local, "local", indices, DType::I32, {S, k});
  MOE_ASSERT(indices.dtype() == DType::I32 && P >= 1 && El >= 1, "indices ", indices.str(), ", P ", P, ", El ", El);
  MOE_ASSERT(send_slot.dim() == 1 && send_slot.numel() >= S, "send_slot ", send_slot.str(), " for ", S, " rows");
  check(op, send_slot, "send_slot", indices, DType::I32, {send_slot.numel()});
#if defined(MEGATRAIN_HAVE_CUDA)
  if (on_cuda(indices)) {
    const cuda::OpTimer timer(op, S, k);
    return cuda::moe_local_choices_cuda(local.data<int32_t>(), indices.data<int32_t>(), send_slot.data<int32_t>(), S,
                                        k, P, El);
  }
#endif
  if (indices.device() != Device::CPU) unsupported(op, indices);
  cpu::moe_local_choices_cpu(local.data<int32_t>(), indices.data<int32_t>(), send_slot.data<int32_t>(), S, k, P, El);
}

void moe_pad_routing_map(Tensor& slot_of_row_pad, Tensor& row_of_slot, const Tensor& slot_of_row,
                         const std::vector<int64_t>& counts, const std::vector<int64_t>& regions) {
  const char* op = "moe_pad_routing_map";
  const auto E = static_cast<int64_t>(counts.size());
  MOE_ASSERT(static_cast<int64_t>(regions.size()) == E, regions.size(), " regions for ", E, " experts");
  int64_t M = 0, P = 0;
  for (int64_t e = 0; e < E; ++e) {
    MOE_ASSERT(counts[e] >= 0 && regions[e] >= counts[e], "expert ", e, ": region ", regions[e], " < its ",
               counts[e], " rows");
    M += counts[e], P += regions[e];
  }
  const int64_t S = row_of_slot.numel();
  MOE_ASSERT(row_of_slot.dim() == 1 && M <= S, "row_of_slot ", row_of_slot.str(), " for ", M, " routed rows");
  check(op, slot_of_row, "slot_of_row", row_of_slot, DType::I32, {S});
  check(op, row_of_slot, "row_of_slot", row_of_slot, DType::I32, {S});
  MOE_ASSERT(slot_of_row_pad.defined() && slot_of_row_pad.dim() == 1 && slot_of_row_pad.numel() >= P,
             "slot_of_row_pad should be 1-d with at least the ", P, " padded rows");
  check(op, slot_of_row_pad, "slot_of_row_pad", row_of_slot, DType::I32, {slot_of_row_pad.numel()});
  const int64_t tail = slot_of_row_pad.numel() - P;  // rows past the regions: padding (-1)
#if defined(MEGATRAIN_HAVE_CUDA)
  if (on_cuda(row_of_slot)) {
    MOE_ASSERT(E <= cuda::PadPlan::kMaxExperts, E, " experts: the padded layout takes at most ",
               cuda::PadPlan::kMaxExperts);
    MOE_ASSERT(P < (int64_t{1} << 31), P, " padded rows overflow int32");
    cuda::PadPlan plan{};
    plan.E = static_cast<int32_t>(E);
    for (int64_t e = 0; e < E; ++e) {
      plan.start[e + 1] = plan.start[e] + static_cast<int32_t>(counts[e]);
      plan.pstart[e + 1] = plan.pstart[e] + static_cast<int32_t>(regions[e]);
    }
    const cuda::OpTimer timer(op, S, P);
    cuda::moe_pad_routing_map_cuda(slot_of_row_pad.data<int32_t>(), row_of_slot.data<int32_t>(),
                                   slot_of_row.data<int32_t>(), S, plan, tail);
    return;
  }
#endif
  if (row_of_slot.device() != Device::CPU) unsupported(op, row_of_slot);
  cpu::moe_pad_routing_map_cpu(slot_of_row_pad.data<int32_t>(), row_of_slot.data<int32_t>(),
                               slot_of_row.data<int32_t>(), counts.data(), regions.data(), S, E);
  std::fill_n(slot_of_row_pad.data<int32_t>() + P, tail, -1);
}

int64_t moe_alloc_rows(int64_t rows) {
  if (rows <= 32) return rows;
  int64_t shift = 0;
  while ((rows >> shift) >= 64) ++shift;  // rows >> shift in [32, 64): steps of 1/32 of the octave
  const int64_t step = int64_t{1} << shift;
  return (rows + step - 1) / step * step;
}

Tensor moe_rows_empty(const Shape& s, DType dtype, Device device) {
  MT_INTERNAL_ASSERT(!s.empty(), "moe_rows_empty: a shape with rows");
  Shape alloc = s;
  alloc[0] = moe_alloc_rows(s[0]);
  return Tensor::empty(alloc, dtype, device).slice(0, s[0]);
}

void moe_zero_unrouted_rows(Tensor& x, const Tensor& slot_of_row) {
  const char* op = "moe_zero_unrouted_rows";
  check_2d(op, x, "x");
  const int64_t M = x.size(0), C = x.size(1);
  check(op, slot_of_row, "slot_of_row", x, DType::I32, {M});
  any_float(op, x, [&](auto z) {
    using T = decltype(z);
#if defined(MEGATRAIN_HAVE_CUDA)
    if constexpr (kCudaDtype<T>)  // (no fp64 kernels: not even referenced)
      if (on_cuda(x)) return cuda::moe_zero_unrouted_rows_cuda<T>(x.data<T>(), slot_of_row.data<int32_t>(), M, C);
#endif
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
      cpu::moe_zero_unrouted_rows_cpu<T>(x.data<T>(), slot_of_row.data<int32_t>(), M, C);
  });
}

void moe_permute_backward(Tensor& dx, const Tensor& dout, const Tensor& row_of_slot, int64_t k, const Tensor* dlogits,
                          const Tensor* router_weight, const Tensor* residual) {
  const char* op = "moe_permute_backward";
  check_2d(op, dx, "dx");
  check_2d(op, dout, "dout");
  const int64_t N = dx.size(0), C = dx.size(1);
  check(op, dout, "dout", dx, dx.dtype(), {dout.size(0), C});
  check(op, row_of_slot, "row_of_slot", dx, DType::I32, {N * k});
  MOE_ASSERT(!dlogits == !router_weight, "dlogits and router_weight come together");
  const int64_t E = dlogits ? dlogits->size(-1) : 0;
  if (dlogits) {  // the router dtype: fp32 on CUDA, the activations' on the CPU
    check(op, *dlogits, "dlogits", dx, on_cuda(dx) ? DType::F32 : dx.dtype(), {N, E});
    check(op, *router_weight, "router_weight", dx, dx.dtype(), {E, C});
    MOE_ASSERT(E <= kRouterTermMaxE, "the router term of ", E, " experts (at most ", kRouterTermMaxE, ")");
  }
  if (residual) check(op, *residual, "residual", dx, dx.dtype(), {N, C});
  any_float(op, dx, [&](auto z) {
    using T = decltype(z);
#if defined(MEGATRAIN_HAVE_CUDA)
    if constexpr (kCudaDtype<T>)  // (no fp64 kernels: not even referenced)
      if (on_cuda(dx))
        return cuda::moe_permute_backward_cuda<T>(dx.data<T>(), dout.data<T>(), row_of_slot.data<int32_t>(), N, C, k,
                                                  dlogits ? dlogits->data<float>() : nullptr,
                                                  router_weight ? router_weight->data<T>() : nullptr, E,
                                                  residual ? residual->data<T>() : nullptr);
#endif
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
      cpu::moe_permute_backward_cpu<T>(dx.data<T>(), dout.data<T>(), row_of_slot.data<int32_t>(), N, C, k,
                                       dlogits ? dlogits->data<T>() : nullptr,
                                       router_weight ? router_weight->data<T>() : nullptr, E,
                                       residual ? residual->data<T>() : nullptr);
  });
}

void moe_unpermute_forward(Tensor& y, const Tensor& yp, const Tensor& weights, const Tensor& row_of_slot,
                           const Tensor* residual) {
  const char* op = "moe_unpermute_forward";
  check_2d(op, y, "y");
  check_2d(op, yp, "yp");
  check_2d(op, weights, "weights");
  const int64_t N = y.size(0), C = y.size(1), k = weights.size(1);
  check(op, yp, "yp", y, y.dtype(), {yp.size(0), C});
  check(op, weights, "weights", y, router_dtype(y.dtype()), {N, k});
  check(op, row_of_slot, "row_of_slot", y, DType::I32, {N * k});
  if (residual) check(op, *residual, "residual", y, y.dtype(), {N, C});
  any_float(op, y, [&](auto z) {
    using T = decltype(z);
#if defined(MEGATRAIN_HAVE_CUDA)
    if constexpr (kCudaDtype<T>)  // (no fp64 kernels: not even referenced)
      if (on_cuda(y))
        return cuda::moe_unpermute_forward_cuda<T>(y.data<T>(), yp.data<T>(), weights.data<float>(),
                                                   row_of_slot.data<int32_t>(), N, C, k,
                                                   residual ? residual->data<T>() : nullptr);
#endif
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
      cpu::moe_unpermute_forward_cpu<T>(y.data<T>(), yp.data<T>(), weights.data<T>(), row_of_slot.data<int32_t>(), N,
                                        C, k, residual ? residual->data<T>() : nullptr);
  });
}

void moe_unpermute_backward(Tensor& dyp, Tensor& dweights, const Tensor& dy, const Tensor& yp, const Tensor& weights,
                            const Tensor& row_of_slot) {
  const char* op = "moe_unpermute_backward";
  check_2d(op, dy, "dy");
  check_2d(op, yp, "yp");
  check_2d(op, weights, "weights");
  const int64_t N = dy.size(0), C = dy.size(1), k = weights.size(1);
  check(op, yp, "yp", dy, dy.dtype(), {yp.size(0), C});
  check(op, dyp, "dyp", dy, dy.dtype(), yp.shape());
  check(op, weights, "weights", dy, router_dtype(dy.dtype()), {N, k});
  check(op, dweights, "dweights", dy, router_dtype(dy.dtype()), {N, k});
  check(op, row_of_slot, "row_of_slot", dy, DType::I32, {N * k});
  any_float(op, dy, [&](auto z) {
    using T = decltype(z);
#if defined(MEGATRAIN_HAVE_CUDA)
    if constexpr (kCudaDtype<T>)  // (no fp64 kernels: not even referenced)
      if (on_cuda(dy))
        return cuda::moe_unpermute_backward_cuda<T>(dyp.data<T>(), dweights.data<float>(), dy.data<T>(), yp.data<T>(),
                                                    weights.data<float>(), row_of_slot.data<int32_t>(), N, C, k);
#endif
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
      cpu::moe_unpermute_backward_cpu<T>(dyp.data<T>(), dweights.data<T>(), dy.data<T>(), yp.data<T>(),
                                         weights.data<T>(), row_of_slot.data<int32_t>(), N, C, k);
  });
}

// ---------------------------------------------------------------- grouped expert GEMMs

namespace {
void grouped_shapes(const char* op, const Tensor& x, const Tensor& weight, const std::vector<int64_t>& counts) {
  check_2d(op, x, "x");
  MOE_ASSERT(weight.defined() && weight.dim() == 3, "weight should be (El, OC, IC)");
  MOE_ASSERT(static_cast<int64_t>(counts.size()) == weight.size(0), counts.size(), " counts for weight ",
             weight.str());
  MOE_ASSERT(x.size(1) == weight.size(2), "x ", x.str(), " does not match weight ", weight.str());
  const int64_t M = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  MOE_ASSERT(M <= x.size(0), "counts sum to ", M, ", x is ", x.str());
  MOE_ASSERT(weight.device() == x.device() && weight.dtype() == x.dtype(), "weight ", weight.str(), " vs x ",
             x.str());
}
// Expert e's (OC, IC) matrix of a stacked (El, OC, IC) tensor.
Tensor expert_matrix(const Tensor& w, int64_t e) { return w.slice(e, 1).view({w.size(1), w.size(2)}); }
}  // namespace

bool moe_gemm_per_group(int64_t M, int64_t groups, int64_t IC, int64_t OC) {
  return groups > 0 && 2.0 * static_cast<double>(M) / static_cast<double>(groups) * static_cast<double>(IC) *
                               static_cast<double>(OC) >= kGroupGemmMaxFlops;
}

#if defined(MEGATRAIN_HAVE_CUDA)
static_assert(cuda::kMaxShapeBuckets == kPadBuckets, "the GPU's batched buckets are the padded layout's runs");
#endif

namespace {
// Our Hopper kernels (cuda/sm90/grouped_gemm.h) run the forward and dx of these experts on this GPU.
bool sm90_grouped(DType dtype, int64_t E, int64_t IC, int64_t OC) {
#if defined(MEGATRAIN_HAVE_CUDA)
  return dtype == DType::BF16 && cuda::sm90::grouped_forward_takes(E, IC, OC) &&
         cuda::sm90::grouped_dx_takes(E, IC, OC);
#else
  (void)dtype, (void)E, (void)IC, (void)OC;
  return false;
#endif
}
}  // namespace

std::vector<int64_t> moe_padded_regions(Device device, DType dtype, const std::vector<int64_t>& counts, int64_t IC,
                                        int64_t OC) {
  const auto E = static_cast<int64_t>(counts.size());
#if defined(MEGATRAIN_HAVE_CUDA)
  if (E > cuda::PadPlan::kMaxExperts) return {};
#endif
  if (device != Device::CUDA || E == 0) return {};
  int64_t M = 0;
  for (int64_t c : counts) M += c;
  if (M == 0) return {};
  if (sm90_grouped(dtype, E, IC, OC)) {
    std::vector<int64_t> regions(counts.size());
    for (size_t e = 0; e < counts.size(); ++e)
      regions[e] = (counts[e] + kSm90PadRows - 1) / kSm90PadRows * kSm90PadRows;
    return regions;
  }
  // seconds of one product (IC -> OC) for `rows` rows at `tflops`
  const double per_row = 2.0 * static_cast<double>(IC) * static_cast<double>(OC) * 1e-12;
  auto t = [&](double rows, double tflops) { return rows * per_row / tflops; };
  const double exact = t(static_cast<double>(M), moe_gemm_per_group(M, E, IC, OC) ? kPerGroupTflops : kGroupedTflops);
  // experts with rows, largest first, grouped by padded size (round_up(count, kPadRows)): a cut between two
  // experts of one size would add a call and save no padding, so the runs cut between groups only
  std::vector<int64_t> order;
  for (int64_t e = 0; e < E; ++e)
    if (counts[e] > 0) order.push_back(e);
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return counts[x] > counts[y]; });
  std::vector<int64_t> size, first{0};  // group g: padded size size[g], experts order[first[g], first[g + 1])
  for (size_t x = 0; x < order.size(); ++x) {
    const int64_t p = (counts[order[x]] + kPadRows - 1) / kPadRows * kPadRows;
    if (size.empty() || size.back() != p) {
      if (!size.empty()) first.push_back(static_cast<int64_t>(x));
      size.push_back(p);
    }
  }
  first.push_back(static_cast<int64_t>(order.size()));
  const auto n = static_cast<int64_t>(size.size());
  // best[j][i]: the least time of the first i groups in j runs; cut[j][i]: where the last run starts. A run
  // [a, i) costs one call plus (experts in it) x size[a] rows; a outer, i inner (the same ties as i outer: the
  // least a wins)
  const double inf = 1e300, call = kBatchedCallUs * 1e-6;
  std::vector<std::vector<double>> best(kPadBuckets + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int64_t>> cut(kPadBuckets + 1, std::vector<int64_t>(n + 1, 0));
  best[0][0] = 0;
  for (int64_t j = 1; j <= kPadBuckets; ++j)
    for (int64_t a = j - 1; a < n; ++a) {
      if (!(best[j - 1][a] < inf)) continue;
      const double base = best[j - 1][a] + call, per_expert = t(static_cast<double>(size[a]), kBatchedTflops);
      double* bj = best[j].data();
      int64_t* cj = cut[j].data();
      for (int64_t i = a + 1; i <= n; ++i) {
        const double c = base + static_cast<double>(first[i] - first[a]) * per_expert;
        if (c < bj[i]) bj[i] = c, cj[i] = a;
      }
    }
  int64_t runs = 1;
  for (int64_t j = 2; j <= kPadBuckets; ++j)
    if (best[j][n] < best[runs][n]) runs = j;
  if (!(best[runs][n] < exact)) return {};
  std::vector<int64_t> regions(static_cast<size_t>(E), 0);
  for (int64_t j = runs, i = n; j >= 1; --j) {
    const int64_t a = cut[j][i];
    for (int64_t x = first[a]; x < first[i]; ++x) regions[order[x]] = size[a];
    i = a;
  }
  return regions;
}

namespace {
// The op's name for MT_OP_PROFILE (CUDA builds): which path the counts take (sm90: our own Hopper kernels,
// cuda/sm90/grouped_gemm.h; else cuBLAS's calls).
[[maybe_unused]] std::string gemm_name(const char* op, DType dtype, const std::vector<int64_t>& counts, int64_t M,
                                       int64_t IC, int64_t OC) {
  std::vector<int64_t> sizes;
  for (int64_t c : counts)
    if (c > 0 && std::find(sizes.begin(), sizes.end(), c) == sizes.end()) sizes.push_back(c);
  const char* path = sm90_grouped(dtype, static_cast<int64_t>(counts.size()), IC, OC) ? "sm90"
                     : static_cast<int64_t>(sizes.size()) <= kPadBuckets ? "batched"
                     : moe_gemm_per_group(M, static_cast<int64_t>(counts.size()), IC, OC) ? "per-group"
                                                                                           : "grouped";
  return std::string(op) + " [" + path + "] IC=" + std::to_string(IC) + " OC=" + std::to_string(OC);
}
}  // namespace

void moe_grouped_linear_forward(Tensor& out, const Tensor& x, const Tensor& weight,
                                const std::vector<int64_t>& counts) {
  const char* op = "moe_grouped_linear_forward";
  grouped_shapes(op, x, weight, counts);
  check(op, out, "out", x, x.dtype(), {x.size(0), weight.size(1)});
#if defined(MEGATRAIN_HAVE_CUDA)
  if (on_cuda(x)) {
    const bool per_group = moe_gemm_per_group(x.size(0), weight.size(0), weight.size(2), weight.size(1));
    std::string name;
    if (cuda::op_profile_enabled())
      op = (name = gemm_name(op, x.dtype(), counts, x.size(0), weight.size(2), weight.size(1))).c_str();
    any_float(op, x, [&](auto z) {
      using T = decltype(z);
      if constexpr (!std::is_same_v<T, double>)
        cuda::moe_grouped_linear_forward_cuda<T>(out.data<T>(), x.data<T>(), weight.data<T>(), counts.data(),
                                                 weight.size(0), weight.size(2), weight.size(1), per_group);
    });
    return;
  }
#endif
  if (x.device() != Device::CPU) unsupported(op, x);
  int64_t r0 = 0;  // CPU: one GEMM per group
  for (size_t e = 0; e < counts.size(); ++e) {
    const int64_t m = counts[e];
    if (m > 0) {
      Tensor o = out.slice(r0, m);
      linear_forward(o, x.slice(r0, m), expert_matrix(weight, static_cast<int64_t>(e)), nullptr);
    }
    r0 += m;
  }
}

void moe_grouped_linear_forward_swiglu(Tensor& h, Tensor& a, const Tensor& x, const Tensor& weight,
                                       const std::vector<int64_t>& counts) {
  const char* op = "moe_grouped_linear_forward_swiglu";
  grouped_shapes(op, x, weight, counts);
  const int64_t M = x.size(0), F = weight.size(1) / 2;
  MOE_ASSERT(weight.size(1) == 2 * F, "weight ", weight.str(), " should be (El, 2F, IC)");
  check(op, h, "h", x, x.dtype(), {M, 2 * F});
  check(op, a, "a", x, x.dtype(), {M, F});
#if defined(MEGATRAIN_HAVE_CUDA)
  const auto El = static_cast<int64_t>(counts.size());
  if (on_cuda(x) && x.dtype() == DType::BF16 && cuda::sm90::grouped_forward_swiglu_takes(El, x.size(1), F)) {
    const cuda::OpTimer timer("moe_grouped_linear_forward [sm90] + swiglu", h.numel());  // MT_OP_PROFILE
    if (cuda::sm90::grouped_forward_swiglu(h.data<bf16>(), a.data<bf16>(), x.data<bf16>(), weight.data<bf16>(),
                                           counts.data(), El, x.size(1), F))
      return;
  }
#endif
  moe_grouped_linear_forward(h, x, weight, counts);
  swiglu_forward(a, h);
}

void moe_grouped_linear_backward(Tensor* dx, Tensor* dweight, const Tensor& dout, const Tensor& x,
                                 const Tensor& weight, const std::vector<int64_t>& counts, GradMode dweight_mode,
                                 Tensor* dweight_squares) {
  if (dweight_squares) *dweight_squares = Tensor();
  const char* op = "moe_grouped_linear_backward";
  grouped_shapes(op, x, weight, counts);
  check(op, dout, "dout", x, x.dtype(), {x.size(0), weight.size(1)});
  if (dx) check(op, *dx, "dx", x, x.dtype(), x.shape());
  // parameter gradients: the op's dtype on CPU; on CUDA fp32 main grads, or bf16 ones for bf16 x
  // (parallel.grad_reduce_in_fp32 false)
  const bool bf16_grad = dweight && on_cuda(x) && x.dtype() == DType::BF16 && dweight->dtype() == DType::BF16;
  if (dweight)
    check(op, *dweight, "dweight", x, bf16_grad ? DType::BF16 : on_cuda(x) ? DType::F32 : x.dtype(), weight.shape());
#if defined(MEGATRAIN_HAVE_CUDA)
  if (on_cuda(x)) {
    const bool per_group = moe_gemm_per_group(x.size(0), weight.size(0), weight.size(2), weight.size(1));
    std::string name;
    if (cuda::op_profile_enabled())
      op = (name = gemm_name(op, x.dtype(), counts, x.size(0), weight.size(2), weight.size(1)) + (dx ? " dx" : "") +
                   (dweight ? " dweight" : "")).c_str();
    // room for the sm90 kernel's partials, when asked for
    Tensor sq;
    int64_t n_sq = -1;
    if (dweight && dweight_squares)
      sq = Tensor::empty({std::max<int64_t>(1, cuda::sm90::grouped_dweight_square_partials(
                                                   counts.data(), weight.size(0), weight.size(2), weight.size(1)))},
                         DType::F64, x.device());
    any_float(op, x, [&](auto z) {
      using T = decltype(z);
      if constexpr (!std::is_same_v<T, double>)
        cuda::moe_grouped_linear_backward_cuda<T>(dx ? dx->data<T>() : nullptr, dweight ? dweight->raw() : nullptr,
                                                  bf16_grad, dout.data<T>(),
                                                  x.data<T>(), weight.data<T>(), counts.data(), weight.size(0),
                                                  weight.size(2), weight.size(1),
                                                  dweight_mode == GradMode::Accumulate, per_group,
                                                  sq.defined() ? sq.data<double>() : nullptr,
                                                  sq.defined() ? &n_sq : nullptr);
    });
    if (n_sq >= 0) *dweight_squares = sq.slice(0, n_sq);
    return;
  }
#endif
  if (x.device() != Device::CPU) unsupported(op, x);
  int64_t r0 = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    const int64_t m = counts[e];
    const auto ei = static_cast<int64_t>(e);
    Tensor dxe = dx && m > 0 ? dx->slice(r0, m) : Tensor();
    Tensor dwe = dweight ? expert_matrix(*dweight, ei) : Tensor();
    if (m == 0) {  // no rows: dweight unchanged, or 0 when overwritten
      if (dweight && dweight_mode == GradMode::Overwrite) dwe.zero_();
    } else {
      linear_backward(dx ? &dxe : nullptr, dweight ? &dwe : nullptr, nullptr, dout.slice(r0, m), x.slice(r0, m),
                      expert_matrix(weight, ei), GradMode::Overwrite, dweight_mode);
    }
    r0 += m;
  }
  if (dweight && dweight_squares) {  // the reference: one value, a pass over what was written
    *dweight_squares = Tensor::empty({1}, DType::F64, x.device());
    sum_squares_into(*dweight_squares, *dweight);
  }
}

void moe_grouped_linear_backward_swiglu(Tensor& dh, Tensor* dweight, const Tensor& dout, const Tensor& weight,
                                        const Tensor& h, const std::vector<int64_t>& counts, GradMode dweight_mode,
                                        Tensor* dweight_squares, const Tensor* kept_a) {
  if (dweight_squares) *dweight_squares = Tensor();
  const char* op = "moe_grouped_linear_backward_swiglu";
  check_2d(op, h, "h");
  const int64_t M = h.size(0), F = h.size(1) / 2;
  MOE_ASSERT(h.size(1) == 2 * F, "h ", h.str(), " should be (M, 2F)");
  MOE_ASSERT(weight.defined() && weight.dim() == 3 && weight.size(2) == F, "weight should be (El, OC, F) for h ",
             h.str());
  check(op, dh, "dh", h, h.dtype(), h.shape());
  const Device dev = h.device();
  if (kept_a) check(op, *kept_a, "kept_a", h, h.dtype(), {M, F});
  Tensor a = kept_a ? *kept_a : Tensor::empty({M, F}, h.dtype(), dev);
  bool fused = false;
#if defined(MEGATRAIN_HAVE_CUDA)
  // Hopper, bf16, in place: the SwiGLU backward runs in the dx GEMM's epilogue (no da, no separate pass)
  const auto El = static_cast<int64_t>(counts.size());
  if (on_cuda(h) && h.dtype() == DType::BF16 && dh.data<bf16>() == h.data<bf16>() &&
      cuda::sm90::grouped_dx_swiglu_takes(El, F, weight.size(1))) {
    grouped_shapes(op, a, weight, counts);
    check(op, dout, "dout", h, h.dtype(), {M, weight.size(1)});
    const cuda::OpTimer timer("moe_grouped_linear_backward [sm90] dx + swiglu", dout.numel());  // MT_OP_PROFILE
    fused = cuda::sm90::grouped_dx_swiglu(dh.data<bf16>(), kept_a ? nullptr : a.data<bf16>(), dout.data<bf16>(),
                                          weight.data<bf16>(), counts.data(), El, F, weight.size(1));
  }
#endif
  if (!fused) {
    Tensor da = Tensor::empty({M, F}, h.dtype(), dev);  // back to the cache before the weight-gradient GEMMs
    moe_grouped_linear_backward(&da, nullptr, dout, a, weight, counts);  // a: shape only (dx alone reads no x)
    bool recomputed = false;
#if defined(MEGATRAIN_HAVE_CUDA)
    if (!kept_a && on_cuda(h)) {  // a recomputed in the SwiGLU backward's pass
      any_float(op, h, [&](auto z) {
        using T = decltype(z);
        if constexpr (!std::is_same_v<T, double>)
          cuda::swiglu_backward_recompute_cuda<T>(dh.data<T>(), a.data<T>(), da.data<T>(), h.data<T>(), M, F);
      });
      recomputed = true;
    }
#endif
    if (!recomputed) {  // swiglu forward (unless a is kept), then swiglu backward (may overwrite h: read row by row
                        // before written)
      if (!kept_a) swiglu_forward(a, h);
      swiglu_backward(dh, da, h);
    }
  }
  if (dweight) moe_grouped_linear_backward(nullptr, dweight, dout, a, weight, counts, dweight_mode, dweight_squares);
}

}  // namespace mt::ops
