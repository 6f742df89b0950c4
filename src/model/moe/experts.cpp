#include "model/moe/experts.h"

#include <cstdint>

#include "core/check.h"
#include "tensor/moe_ops.h"

namespace mt {

Experts::Experts(const std::string& prefix, int64_t first_expert, int64_t local_experts, int64_t ffn_hidden_size,
                 bool swiglu, const ModelContext& ctx, ParamStore& store)
    : ctx_(&ctx), store_(&store), local_experts_(local_experts), ffn_(ffn_hidden_size), swiglu_(swiglu) {
  MT_CHECK(ffn_hidden_size >= 1, "model.moe_ffn_hidden_size must be set (>= 1) for an MoE layer");
  const int64_t C = ctx.model->hidden_size;
  auto add = [&](int64_t e, const char* name, Shape shape, ParamInit init) {
    ParamSpec s;
    s.name = prefix + "." + std::to_string(e) + "." + name;
    s.global_shape = std::move(shape);
    s.init = init;
    s.sequence_parallel_grad = ctx.ps->sequence_parallel;
    s.expert_parallel = true;
    return store.add(s);
  };
  for (int64_t e = first_expert; e < first_expert + local_experts; ++e)
    fc1_.push_back(add(e, "linear_fc1.weight", {ffn_ * (swiglu ? 2 : 1), C}, ParamInit::Normal));
  for (int64_t e = first_expert; e < first_expert + local_experts; ++e)
    fc2_.push_back(add(e, "linear_fc2.weight", {C, ffn_}, ParamInit::ScaledNormal));
}

Tensor Experts::stacked(const std::vector<Param*>& ps, bool grad) const {
  const Shape& s = ps.front()->local_shape;
  const int64_t n = s[0] * s[1];
  for (size_t i = 0; i < ps.size(); ++i)
    MT_INTERNAL_ASSERT(ps[i]->flat_offset == ps.front()->flat_offset + i * static_cast<size_t>(n),
                       "expert weights ", ps[i]->spec.name, " are not consecutive in the parameter store");
  Tensor& flat = grad ? store_->flat_grads() : store_->flat_values();
  return flat.slice(static_cast<int64_t>(ps.front()->flat_offset), n * static_cast<int64_t>(ps.size()))
      .view({static_cast<int64_t>(ps.size()), s[0], s[1]});
}

ops::GradMode Experts::grad_mode(const std::vector<Param*>& ps) const {
  const ops::GradMode m = grad_write_mode(*ps.front());
  for (size_t i = 1; i < ps.size(); ++i)
    MT_INTERNAL_ASSERT(grad_write_mode(*ps[i]) == m, "expert gradients written apart");
  return m;
}

Tensor Experts::gradient_span() const {
  const int64_t n1 = fc1_.front()->value.numel(), n2 = fc2_.front()->value.numel();
  const auto n = static_cast<int64_t>(fc1_.size()) * n1 + static_cast<int64_t>(fc2_.size()) * n2;
  MT_INTERNAL_ASSERT(fc2_.front()->flat_offset == fc1_.front()->flat_offset + fc1_.size() * static_cast<size_t>(n1),
                     "an MoE layer's fc1 and fc2 expert weights are not consecutive in the parameter store");
  return store_->flat_grads().slice(static_cast<int64_t>(fc1_.front()->flat_offset), n);
}

Tensor Experts::forward(Saved& s, const Tensor& x, const std::vector<int64_t>& counts) const {
  const ModelContext& c = *ctx_;
  const int64_t M = x.size(0), C = x.size(1);
  s.counts = counts;
  s.h = c.empty({M, ffn_ * (swiglu_ ? 2 : 1)});
  Tensor a;
  if (swiglu_ && arena_) {
    char* const own = static_cast<char*>(gradient_span().raw());  // the arena ends where this layer's gradients start
    if (arena_first_) arena_->next = own;
    const auto at = (reinterpret_cast<uintptr_t>(arena_->next) + 255) / 256 * 256;  // (TMA: aligned)
    const size_t bytes = static_cast<size_t>(M * ffn_) * dtype_size(c.dtype);
    if (at + bytes <= reinterpret_cast<uintptr_t>(own)) {
      a = Tensor::from_blob(reinterpret_cast<void*>(at), {M, ffn_}, c.dtype, c.device);
      arena_->next = reinterpret_cast<char*>(at + bytes);
    }
  }
  const bool kept = a.defined() || !swiglu_;  // else the backward recomputes a from h
  if (!a.defined()) a = c.empty({M, ffn_});
  if (swiglu_) {
    ops::moe_grouped_linear_forward_swiglu(s.h, a, x, stacked(fc1_, false), counts);
  } else {
    ops::moe_grouped_linear_forward(s.h, x, stacked(fc1_, false), counts);
    ops::gelu_forward(a, s.h);
  }
  Tensor y = c.empty({M, C});
  ops::moe_grouped_linear_forward(y, a, stacked(fc2_, false), counts);
  if (kept) s.a = a;
  return y;
}

void Experts::record_squares(const std::vector<Param*>& ps, Tensor squares) const {
  const auto b = static_cast<int64_t>(ps.front()->flat_offset);
  store_->record_grad_squares(b, b + ps.front()->value.numel() * static_cast<int64_t>(ps.size()), std::move(squares));
}

Tensor Experts::backward_fc2(Tensor dy, Saved& s) const {
  const ModelContext& c = *ctx_;
  Tensor dw2 = stacked(fc2_, true), squares;
  Tensor dh;
  if (swiglu_) {  // through the SwiGLU, recomputing a = swiglu(h) in its pass unless kept; dh overwrites h
    dh = s.h;
    ops::moe_grouped_linear_backward_swiglu(dh, &dw2, dy, stacked(fc2_, false), s.h, s.counts, grad_mode(fc2_),
                                            &squares, s.a.defined() ? &s.a : nullptr);
  } else {
    Tensor da = c.empty(s.a.shape());
    ops::moe_grouped_linear_backward(&da, &dw2, dy, s.a, stacked(fc2_, false), s.counts, grad_mode(fc2_), &squares);
    dh = c.empty(s.h.shape());
    ops::gelu_backward(dh, da, s.h);
  }
  record_squares(fc2_, std::move(squares));
  return dh;
}

Tensor Experts::backward_fc1(const Tensor& dh, Saved& s, const Tensor& x) const {
  const ModelContext& c = *ctx_;
  Tensor dx = c.empty(x.shape());
  Tensor dw1 = stacked(fc1_, true), squares;
  ops::moe_grouped_linear_backward(&dx, &dw1, dh, x, stacked(fc1_, false), s.counts, grad_mode(fc1_), &squares);
  record_squares(fc1_, std::move(squares));
  s = Saved{};
  return dx;
}

}  // namespace mt
