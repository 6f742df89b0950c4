// What `megatrain plan` says an MoE layer keeps for its backward (model/kept_tensors.h, MLPKind::MoE) against the
// tensors a real forward keeps (MoELayer::Saved) on one rank, where the experts get exactly rows x topk rows
// (dropless; with expert parallelism the description is the balanced case): the same names, the same sizes.
#include <map>
#include <set>
#include <string>

#include "catch.h"
#include "model/kept_tensors.h"
#include "moe/moe_fixture.h"
#include "ops/gradcheck.h"

using namespace mt;
using namespace mt::test;

TEST_CASE("moe kept tensors: the plan's description equals what a forward keeps", "[moe][plan]") {
  for (const bool shared : {false, true}) {
    for (const bool capacity : {false, true}) {
      const bool keep_input = shared != capacity;  // training.recompute_norm_act false in two of the four
      INFO("shared expert " << shared << ", capacity " << capacity << ", permuted input kept " << keep_input);
      MoEOptions o;
      o.num_experts = 4;
      o.topk = 2;
      o.ffn_hidden_size = 3;
      o.seq_length = 3;
      o.aux_loss_coeff = 0.1;
      o.z_loss_coeff = 0.01;
      o.shared_ffn_hidden_size = shared ? 2 : 0;
      o.capacity_factor = capacity ? 4.0 : 0.0;  // large enough that nothing is dropped
      const int64_t C = 5, N = 6;
      MoEFixture fx(o, C);
      fx.ctx.recompute.norm_act = !keep_input;
      MoELayer::Saved s;
      fx.layer->forward(s, randn({N, C}, 3));
      const std::map<std::string, const Tensor*> real = {
          {"mlp.router.logits", &s.router.logits}, {"mlp.router.scores", &s.router.scores},
          {"mlp.router.choice", &s.router.choice}, {"mlp.router.weights", &s.router.weights},
          {"mlp.slot_of_row", &s.slot_of_row},     {"mlp.row_of_slot", &s.row_of_slot},
          {"mlp.send_slot", &s.send_slot},         {"mlp.row_of_send", &s.row_of_send},
          {"mlp.tokens", &s.tokens},               {"mlp.local_weights", &s.local_weights},
          {"mlp.experts.h", &s.experts.h},
          {"mlp.experts.a", &s.experts.a},         {"mlp.yp", &s.yp},                {"mlp.xp", &s.xp},
          {"mlp.shared_h", &s.shared_h},           {"mlp.shared_a", &s.shared_a}};
      LayerDims d;
      d.B = 2;
      d.T = 3;
      d.rows = N;
      d.hidden = C;
      d.experts = o.num_experts;
      d.topk = o.topk;
      d.moe_ffn = o.ffn_hidden_size;
      d.shared_ffn = o.shared_ffn_hidden_size;
      d.capacity = capacity;
      std::set<std::string> names;
      for (const KeptTensor& t : mlp_kept(MLPKind::MoE, Activation::SwiGLU, d, keep_input)) {
        INFO(t.name);
        names.insert(t.name);
        if (t.name == "mlp.router.indices") {  // a copy of the choice before the drop
          CHECK(s.router.indices.raw() != s.router.choice.raw());
          CHECK(s.router.indices.numel() == t.numel);
          continue;
        }
        REQUIRE(real.count(t.name) == 1);
        REQUIRE(real.at(t.name)->defined());
        CHECK(real.at(t.name)->numel() == t.numel);
      }
      for (const auto& [name, t] : real)
        if (t->defined()) CHECK(names.count(name) == 1);
      if (!capacity) CHECK(s.router.indices.raw() == s.router.choice.raw());
    }
  }
}
