// The MoE layer on one rank (fp64): equal to a direct computation (every token through its k experts, weighted
// and summed, + the shared expert) to 1e-12, and its backward (with the balancing losses' gradients) equal to
// finite differences of  L = <dy, y> + aux/seq-aux loss + z-loss  w.r.t. the input and every parameter.
#include <cstring>

#include "catch.h"
#include "moe/moe_fixture.h"
#include "ops/gradcheck.h"

using namespace mt;
using namespace mt::test;

namespace {
struct Variant {
  const char* name;
  MoEOptions opt;
  bool bias = false;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  MoEOptions base;
  base.num_experts = 4;
  base.topk = 2;
  base.ffn_hidden_size = 3;
  base.seq_length = 3;
  base.aux_loss_coeff = 0.1;
  {
    Variant x{"softmax, aux_loss, swiglu", base};
    v.push_back(x);
  }
  {
    Variant x{"sigmoid, seq_aux_loss, z-loss, expert bias, scaling, shared expert", base, true};
    x.opt.sigmoid = true;
    x.opt.load_balancing = "seq_aux_loss";
    x.opt.z_loss_coeff = 0.05;
    x.opt.expert_bias = true;
    x.opt.topk_scaling = 2.5;
    x.opt.shared_ffn_hidden_size = 2;
    v.push_back(x);
  }
  {
    Variant x{"softmax pre-softmax, no balancing loss, capacity, gelu, shared expert", base};
    x.opt.pre_softmax = true;
    x.opt.load_balancing = "none";
    x.opt.capacity_factor = 0.75;
    x.opt.swiglu = false;
    x.opt.shared_ffn_hidden_size = 2;
    v.push_back(x);
  }
  {
    Variant x{"top-1 sigmoid, aux_loss, z-loss", base};
    x.opt.topk = 1;
    x.opt.sigmoid = true;
    x.opt.z_loss_coeff = 0.02;
    v.push_back(x);
  }
  return v;
}

void set_bias(MoEFixture& fx) {
  Tensor& b = fx.layer->router().expert_bias();
  for (int64_t e = 0; e < b.numel(); ++e) b.data<double>()[e] = 0.3 * static_cast<double>(e % 3) - 0.2;
}
}  // namespace

TEST_CASE("moe layer equals the direct computation", "[moe][layer]") {
  const int64_t N = 9, C = 4;
  for (const Variant& v : variants()) {
    INFO(v.name);
    MoEFixture fx(v.opt, C);
    if (v.bias) set_bias(fx);
    const Tensor x = randn({N, C}, 3);
    MoELayer::Saved s;
    const Tensor y = fx.layer->forward(s, x);
    const Tensor ref = direct_moe(fx, x, v.bias ? fx.layer->router().expert_bias().data<double>() : nullptr);
    CHECK(max_abs_diff(y, ref) < 1e-12);
    CHECK(norm(ref) > 0.1);
    int64_t routed = 0;
    for (int64_t c : fx.layer->tokens_per_expert(s)) routed += c;
    if (v.opt.capacity_factor > 0)
      CHECK(routed < N * v.opt.topk);  // something was dropped
    else
      CHECK(routed == N * v.opt.topk);
    // with a residual
    MoELayer::Saved s2;
    const Tensor r = randn({N, C}, 4);
    const Tensor yr = fx.layer->forward(s2, x, &r);
    Tensor sum = Tensor::empty({N, C}, DType::F64);
    ops::add(sum, y, r);
    CHECK(max_abs_diff(yr, sum) < 1e-15);
  }
}

TEST_CASE("moe layer backward matches finite differences, balancing losses included", "[moe][layer]") {
  const int64_t N = 9, C = 4;
  for (const Variant& v : variants()) {
    INFO(v.name);
    MoEFixture fx(v.opt, C);
    if (v.bias) set_bias(fx);
    Tensor x = randn({N, C}, 5);
    const Tensor dy = randn({N, C}, 6);
    auto L = [&] {
      MoELayer::Saved s;
      const Tensor y = fx.layer->forward(s, x);
      return dot(y, dy) + mt::MoELayer::loss_value(s.router.aux_loss) + mt::MoELayer::loss_value(s.router.z_loss);
    };
    MoELayer::Saved s;
    fx.layer->forward(s, x);
    if (v.opt.aux_loss_coeff > 0 && v.opt.load_balancing != "none")
      CHECK(mt::MoELayer::loss_value(s.router.aux_loss) > 0);
    if (v.opt.z_loss_coeff > 0) CHECK(mt::MoELayer::loss_value(s.router.z_loss) > 0);
    fx.store->zero_grads();
    const Tensor dx = fx.layer->backward(dy, s, x);
    check_grad("dx", dx, x, L, 1e-7);
    const Tensor grads = fx.store->flat_grads().clone();
    {  // the experts' permuted input kept (training.recompute_norm_act false) instead of permuted again: the same bits
      fx.ctx.recompute.norm_act = false;
      MoELayer::Saved sk;
      fx.layer->forward(sk, x);
      CHECK(sk.xp.defined());
      fx.store->zero_grads();
      const Tensor dx_kept = fx.layer->backward(dy, sk, x);
      CHECK(std::memcmp(dx_kept.raw(), dx.raw(), dx.nbytes()) == 0);
      CHECK(std::memcmp(fx.store->flat_grads().raw(), grads.raw(), grads.nbytes()) == 0);
      fx.ctx.recompute.norm_act = true;  // (the gradients are as before, bit for bit, for the checks below)
    }
    check_grad("parameters", grads, fx.store->flat_values(), L, 1e-7);
    // each parameter on its own (a wrong one would hide in the norm of the whole)
    for (Param* p : fx.store->params()) {
      INFO(p->spec.name);
      const Tensor num = numeric_grad(p->value, L);
      CHECK(rel_err(p->grad, num) < 1e-6);
    }
  }
}
