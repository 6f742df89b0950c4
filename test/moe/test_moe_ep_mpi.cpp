// Expert parallelism: the MoE layer with its experts spread over the world as one expert-parallel group (EP =
// world size: 1 plain, 2 and 4 under mpirun, see test/CMakeLists.txt) gives each rank the outputs and input
// gradients of a single-rank layer holding every expert (EP 1) on the same tokens, and each expert's weight
// gradient equals the sum over ranks of the EP-1 gradients. Routings: free, and one where the expert bias keeps
// every token away from expert 0 and from all of rank 1's experts (an empty expert and a rank receiving nothing),
// and free routing with a single token on rank 0.
#include <memory>

#include "catch.h"
#include "moe/moe_fixture.h"
#include "ops/gradcheck.h"
#include "runtime/mpi_communicator.h"

using namespace mt;
using namespace mt::test;

namespace {
// The world as one expert-parallel group.
ParallelState expert_group(Communicator& world) {
  ParallelState ps;
  ps.world_size = ps.ep_size = world.size();
  ps.world_rank = ps.ep_rank = world.rank();
  ps.ep = &world;
  return ps;
}
}  // namespace

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
  const int64_t C = 4;
  const ParallelState ps = expert_group(*world);
  // free routing, blocked routing, free routing with a single token on rank 0, and free routing with the experts'
  // permuted input kept (training.recompute_norm_act false: the received tokens are then dropped after the forward)
  for (int variant = 0; variant < 4; ++variant) {
    const bool blocked = variant == 1, keep_input = variant == 3;
    const int64_t N = variant == 2 && rank == 0 ? 1 : 12 + 3 * rank;  // a different number of tokens on each rank
    INFO((blocked ? "blocked routing" : "free routing") << (keep_input ? ", input kept" : "") << ", " << N
                                                        << " tokens on " << P << " rank(s), rank " << rank);
    MoEFixture ep(opt, C, &ps), one(opt, C);
    ep.ctx.recompute.norm_act = !keep_input;
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
    CHECK(se.xp.defined() == keep_input);
    if (P > 1) CHECK(se.tokens.defined() == !keep_input);
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

// The dispatcher alone: the counts exchange (rows per rank, slots per local expert summed over the sources), and
// row exchanges of any dtype towards the experts (grouped by source rank, ascending) and back (the inverse). Row i
// of rank q for rank d carries 1000 q + 10 d + i (+ column / 100), so every row's place is checked exactly; some
// (q, d) pairs send nothing.
TEST_CASE("token dispatcher: counts, rows towards the experts and back", "[moe][mpi]") {
  std::unique_ptr<Communicator> world = make_world_communicator();
  const int P = world->size(), rank = world->rank();
  const ParallelState ps = expert_group(*world);
  const int64_t E = 8, C = 3;
  TokenDispatcher d(E, ps);
  const int64_t El = d.local_experts();
  auto rows_to = [](int q, int64_t r) { return int64_t{(q + 2 * r) % 4}; };  // rows rank q sends to rank r
  auto slots_to = [](int q, int64_t e) { return int64_t{(3 * q + e) % 5}; };  // slots rank q routes to expert e
  auto value = [](int q, int64_t r, int64_t i, int64_t c) { return 1000.0 * q + 10.0 * r + i + c / 100.0; };
  std::vector<int64_t> send(P), counts(E);
  int64_t S = 0;
  for (int64_t r = 0; r < P; ++r) S += send[r] = rows_to(rank, r);
  for (int64_t e = 0; e < E; ++e) counts[e] = slots_to(rank, e);
  TokenDispatcher::Plan plan;
  d.exchange_counts(plan, counts, send);
  for (int q = 0; q < P; ++q) CHECK(plan.recv_rows[q] == rows_to(q, rank));
  for (int64_t e = 0; e < El; ++e) {
    int64_t sum = 0;
    for (int q = 0; q < P; ++q) sum += slots_to(q, d.first_expert() + e);
    CHECK(plan.local_counts[e] == sum);
  }
  Tensor rows = Tensor::empty({S, C}, DType::F64), ids = Tensor::empty({S, 2}, DType::I32);
  for (int64_t r = 0, row = 0; r < P; ++r)
    for (int64_t i = 0; i < send[r]; ++i, ++row) {
      for (int64_t c = 0; c < C; ++c) rows.data<double>()[row * C + c] = value(rank, r, i, c);
      ids.data<int32_t>()[row * 2] = rank, ids.data<int32_t>()[row * 2 + 1] = static_cast<int32_t>(i);
    }
  using Dir = TokenDispatcher::Direction;
  TokenDispatcher::Exchange x = d.start(plan, rows, Dir::ToExperts);
  const Tensor got = d.finish(x), got_ids = d.exchange(plan, ids, Dir::ToExperts);
  int64_t row = 0, wrong = 0;
  for (int q = 0; q < P; ++q)
    for (int64_t i = 0; i < rows_to(q, rank); ++i, ++row) {
      for (int64_t c = 0; c < C; ++c) wrong += got.data<double>()[row * C + c] != value(q, rank, i, c);
      wrong += got_ids.data<int32_t>()[row * 2] != q || got_ids.data<int32_t>()[row * 2 + 1] != i;
    }
  CHECK(row == got.size(0));
  CHECK(wrong == 0);
  // back: every row to its rank, in the order it was sent
  CHECK(max_abs_diff(d.exchange(plan, got, Dir::Back), rows) == 0);
}
