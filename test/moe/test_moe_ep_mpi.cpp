// Expert parallelism: the MoE layer with its experts spread over the world as one expert-parallel group (EP =
// world size: 1 plain, 2 and 4 under mpirun, see test/CMakeLists.txt) gives each rank the outputs and input
// gradients of a single-rank layer holding every expert (EP 1) on the same tokens, and each expert's weight
// gradient equals the sum over ranks of the EP-1 gradients. Routings: free, and one where the expert bias keeps
// every token away from expert 0 and from all of rank 1's experts (an empty expert and a rank receiving nothing).
#include <memory>

#include "catch.h"
#include "moe/moe_fixture.h"
#include "ops/gradcheck.h"
#include "runtime/mpi_communicator.h"

using namespace mt;
using namespace mt::test;

TEST_CASE("moe layer under expert parallelism equals one rank", "[moe][mpi]") {
  std::unique_ptr<Communicator> world = make_world_communicator();
  const int P = world->size(), rank = world->rank();
  MoEOptions opt;
  opt.num_experts = 8;
  opt.topk = 2;
  opt.ffn_hidden_size = 3;
  opt.shared_ffn_hidden_size = 2;
  opt.aux_loss_coeff = 0.1;
  opt.z_loss_coeff = 0.01;
  opt.expert_bias = true;
  opt.seq_length = 1;
  const int64_t C = 4, N = 12 + 3 * rank;  // a different number of tokens on each rank
  ParallelState ps;
  ps.world_size = P;
  ps.world_rank = rank;
  ps.ep_size = P;
  ps.ep_rank = rank;
  ps.ep = world.get();
  for (bool blocked : {false, true}) {
    INFO((blocked ? "blocked routing" : "free routing") << " on " << P << " rank(s), rank " << rank);
    MoEFixture ep(opt, C, &ps), one(opt, C);
    const int64_t El = opt.num_experts / P;
    for (MoEFixture* fx : {&ep, &one}) {
      Tensor& b = fx->layer->router().expert_bias();
      for (int64_t e = 0; e < opt.num_experts; ++e)
        b.data<double>()[e] = blocked && (e == 0 || (P > 1 && e / El == 1)) ? -100.0 : 0.0;
    }
    const Tensor x = randn({N, C}, 100 + static_cast<uint64_t>(rank)), dy = randn({N, C}, 200 + static_cast<uint64_t>(rank));
    MoELayer::Saved se, so;
    const Tensor ye = ep.layer->forward(se, x), yo = one.layer->forward(so, x);
    CHECK(max_abs_diff(ye, yo) < 1e-12);
    CHECK(mt::MoELayer::loss_value(se.router.aux_loss) ==
          Approx(mt::MoELayer::loss_value(so.router.aux_loss)).epsilon(1e-14));
    int64_t received = 0;
    for (int64_t c : se.plan.local_counts) received += c;
    if (blocked && P > 1 && rank == 1) CHECK(received == 0);
    if (blocked) CHECK(se.counts[0] == 0);
    ep.store->zero_grads();
    one.store->zero_grads();
    const Tensor dxe = ep.layer->backward(dy, se, x), dxo = one.layer->backward(dy, so, x);
    CHECK(max_abs_diff(dxe, dxo) < 1e-12);
    // expert gradients: the EP-1 layers' gradients summed over the ranks
    Tensor sum = one.store->flat_grads().clone();
    world->all_reduce(sum, ReduceOp::Sum);
    double expert_norm = 0;
    for (Param* p : ep.store->params()) {
      INFO(p->spec.name);
      Param* q = one.store->find(p->spec.name);
      REQUIRE(q != nullptr);
      const bool expert = p->spec.name.find(".experts.") != std::string::npos;
      const Tensor ref = expert ? sum.slice(static_cast<int64_t>(q->flat_offset), q->value.numel()) : q->grad;
      CHECK(max_abs_diff(p->grad, ref) < 1e-12);
      if (expert) expert_norm += norm(p->grad);
    }
    CHECK(world->all_reduce_scalar(expert_norm, ReduceOp::Sum) > 0);
    // the EP layer holds only its own experts
    CHECK(ep.store->find("layers.0.mlp.experts." + std::to_string(rank * El) + ".linear_fc1.weight") != nullptr);
    if (P > 1) CHECK(ep.store->find("layers.0.mlp.experts." + std::to_string(((rank + 1) % P) * El) + ".linear_fc1.weight") == nullptr);
  }
}

// The dispatcher's padded layout (TokenDispatcher::pad, taken on a GPU for our grouped kernels): each local expert's
// arrived rows start its region, source ranks ascending, the rest of the region and the rows past the regions are
// zeros; combine and the output gradients' exchange read and write the same layout. Row (rank, global expert, i)
// carries 1000 rank + 10 expert + i + column / 100, so every row's place is checked exactly.
TEST_CASE("token dispatcher: padded regions on arrival, and back", "[moe][mpi]") {
  std::unique_ptr<Communicator> world = make_world_communicator();
  const int P = world->size(), rank = world->rank();
  ParallelState ps;
  ps.world_size = P;
  ps.world_rank = rank;
  ps.ep_size = P;
  ps.ep_rank = rank;
  ps.ep = world.get();
  const int64_t E = 8, C = 3;
  TokenDispatcher d(E, ps);
  const int64_t El = d.local_experts();
  // rows of rank q for global expert e: (q + 2 e) % 5, and none for expert 1 (an empty expert on rank 0)
  auto rows_of = [](int q, int64_t e) { return e == 1 ? int64_t{0} : (q + 2 * e) % 5; };
  auto value = [](int q, int64_t e, int64_t i, int64_t c) { return 1000.0 * q + 10.0 * e + i + c / 100.0; };
  std::vector<int64_t> counts(E);
  int64_t M = 0;
  for (int64_t e = 0; e < E; ++e) M += counts[e] = rows_of(rank, e);
  Tensor xp = Tensor::empty({M, C}, DType::F64);
  for (int64_t e = 0, row = 0; e < E; ++e)
    for (int64_t i = 0; i < counts[e]; ++i, ++row)
      for (int64_t c = 0; c < C; ++c) xp.data<double>()[row * C + c] = value(rank, e, i, c);
  TokenDispatcher::Plan plan;
  TokenDispatcher::Exchange x = d.dispatch_start(plan, xp, counts);
  std::vector<int64_t> regions(El);
  int64_t total = 0;
  for (int64_t e = 0; e < El; ++e) total += regions[e] = plan.local_counts[e] + e % 3;  // no padding for some
  if (P > 1) d.pad(plan, regions, total + 2);
  const Tensor xl = d.finish(plan, x);
  if (P == 1) {  // no exchange: the rows as they were, packed
    CHECK(max_abs_diff(xl, xp) == 0);
    return;
  }
  REQUIRE(xl.size(0) == total + 2);
  int64_t row = 0, wrong = 0;
  for (int64_t e = 0; e < El; ++e) {
    const int64_t ge = d.first_expert() + e;
    for (int q = 0; q < P; ++q)
      for (int64_t i = 0; i < rows_of(q, ge); ++i, ++row)
        for (int64_t c = 0; c < C; ++c) wrong += xl.data<double>()[row * C + c] != value(q, ge, i, c);
    for (int64_t i = plan.local_counts[e]; i < regions[e]; ++i, ++row)
      for (int64_t c = 0; c < C; ++c) wrong += xl.data<double>()[row * C + c] != 0.0;
  }
  for (; row < xl.size(0); ++row)
    for (int64_t c = 0; c < C; ++c) wrong += xl.data<double>()[row * C + c] != 0.0;
  CHECK(wrong == 0);
  // combine is the inverse: every row back to its rank, in xp's order
  CHECK(max_abs_diff(d.combine(plan, xl), xp) == 0);
  // the output gradients go the dispatch's way, padded the same
  TokenDispatcher::Exchange g = d.combine_backward_start(plan, xp);
  CHECK(max_abs_diff(d.finish(plan, g), xl) == 0);
}
