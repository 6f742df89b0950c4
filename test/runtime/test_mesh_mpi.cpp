// The mesh under MPI: each group communicator this rank gets holds exactly the ranks that the
// rank generator lists (checked by all-reducing the global rank ids: sum, min, max, count), with
// this rank at its position. ctest runs this file three ways (test/CMakeLists.txt): plain (one
// rank), `mpirun -np 8` with MT_MESH_TEST_LAYOUT=tp2-pp2 (TP2 PP2 DP2) and `mpirun -np 4` with
// MT_MESH_TEST_LAYOUT=cp2-ep2 (CP2 DP2, experts regrouped EP2 x EDP2). The data-parallel size is
// what the world leaves. Collectives run in the same order on every rank; checks never abort early.
#include <cstdlib>
#include <string>

#include "core/check.h"
#include "runtime/mesh.h"
#include "runtime/mpi_communicator.h"
#include "test/catch.h"

using namespace mt;

namespace {

// "tp2-pp2-cp1-ep2" -> sizes (missing = 1); data = world / (tp * pp * cp).
ParallelConfig layout_from_env(int world, DerivedConfig* d) {
  ParallelConfig par;
  const char* env = std::getenv("MT_MESH_TEST_LAYOUT");
  std::string spec = env ? env : "";
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find('-', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string tok = spec.substr(pos, end - pos);
    const int v = std::atoi(tok.c_str() + 2);
    if (tok.rfind("tp", 0) == 0) par.tensor = v;
    else if (tok.rfind("pp", 0) == 0) par.pipeline = v;
    else if (tok.rfind("cp", 0) == 0) par.context = v;
    else if (tok.rfind("ep", 0) == 0) par.expert = v;
    else FAIL("bad MT_MESH_TEST_LAYOUT token '" << tok << "'");
    pos = end + 1;
  }
  d->world_size = world;
  d->data_parallel_size = world / (par.tensor * par.pipeline * par.context);
  return par;
}

// The group's members seen through the communicator, by all-reducing this rank's id.
struct Seen {
  int64_t sum, min, max, count;
};
Seen reduce_ids(Communicator& c, int id) {
  Seen s;
  s.sum = c.all_reduce_int(id, ReduceOp::Sum);
  s.min = c.all_reduce_int(id, ReduceOp::Min);
  s.max = c.all_reduce_int(id, ReduceOp::Max);
  s.count = c.all_reduce_int(1, ReduceOp::Sum);
  return s;
}

Communicator* comm_of(const ParallelState& s, GroupKind k, int* rank, int* size) {
  switch (k) {
    case GroupKind::TP: *rank = s.tp_rank; *size = s.tp_size; return s.tp;
    case GroupKind::CP: *rank = s.cp_rank; *size = s.cp_size; return s.cp;
    case GroupKind::DP: *rank = s.dp_rank; *size = s.dp_size; return s.dp;
    case GroupKind::PP: *rank = s.pp_rank; *size = s.pp_size; return s.pp;
    case GroupKind::DP_CP: *rank = s.dp_cp_rank; *size = s.dp_cp_size; return s.dp_cp;
    case GroupKind::TP_CP: *rank = s.tp_cp_rank; *size = s.tp_cp_size; return s.tp_cp;
    case GroupKind::MP: *rank = s.mp_rank; *size = s.mp_size; return s.mp;
    case GroupKind::Embedding: *rank = s.embedding_rank; *size = s.embedding_size; return s.embedding;
    case GroupKind::EP: *rank = s.ep_rank; *size = s.ep_size; return s.ep;
    case GroupKind::ExpertDP: *rank = s.expert_dp_rank; *size = s.expert_dp_size; return s.expert_dp;
  }
  return nullptr;
}

template <typename F>
std::string thrown_message(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no mt::Error thrown>";
}

}  // namespace

TEST_CASE("mesh: every group communicator holds the generator's ranks", "[mpi][mesh]") {
  mpi_init(nullptr, nullptr);
  std::unique_ptr<Communicator> world = make_world_communicator();
  DerivedConfig d;
  const ParallelConfig par = layout_from_env(world->size(), &d);
  Mesh mesh(par, d, *world);
  const ParallelState& s = mesh.state();
  const int me = world->rank();
  CHECK(s.world_rank == me);
  CHECK(s.world_size == world->size());
  CHECK(s.tp_size == par.tensor);
  CHECK(s.pp_size == par.pipeline);
  CHECK(s.cp_size == par.context);
  CHECK(s.dp_size == d.data_parallel_size);
  CHECK(s.ep_size == par.expert);
  CHECK(s.expert_dp_size == par.context * d.data_parallel_size / par.expert);

  for (GroupKind k : kAllGroupKinds) {
    INFO("rank " << me << " group " << group_kind_name(k));
    const RankGroups groups = rank_groups(mesh.sizes(), k);
    const GroupPlace place = group_place(groups, me);
    int rank = -2, size = -2;
    Communicator* c = comm_of(s, k, &rank, &size);
    if (place.group < 0) {  // only embedding groups skip ranks: the middle pipeline stages
      CHECK(k == GroupKind::Embedding);
      CHECK(c == nullptr);
      CHECK(rank == -1);
      CHECK(size == 0);
      CHECK_FALSE(s.in_embedding_group());
      continue;
    }
    const std::vector<int>& g = groups[place.group];
    REQUIRE(c != nullptr);
    CHECK(c->name() == group_kind_name(k));
    CHECK(c->rank() == place.rank);
    CHECK(rank == place.rank);
    CHECK(size == static_cast<int>(g.size()));
    CHECK(c->size() == static_cast<int>(g.size()));
    const Seen seen = reduce_ids(*c, me);
    int64_t sum = 0;
    for (int r : g) sum += r;
    CHECK(seen.sum == sum);
    CHECK(seen.min == g.front());
    CHECK(seen.max == g.back());
    CHECK(seen.count == static_cast<int64_t>(g.size()));
  }
  CHECK(s.is_first_stage() == (s.pp_rank == 0));
  CHECK(s.in_embedding_group() == (s.is_first_stage() || s.is_last_stage()));
  world->barrier();
}

TEST_CASE("mesh: a world that does not fit names the layouts that do", "[mpi][mesh]") {
  mpi_init(nullptr, nullptr);
  std::unique_ptr<Communicator> world = make_world_communicator();
  ParallelConfig par;
  par.tensor = 3;  // never divides the test worlds (1, 4, 8)
  DerivedConfig d;
  d.data_parallel_size = 1;
  // Thrown on every rank before any collective, so no rank waits on another.
  const std::string n = std::to_string(world->size());
  const std::string msg = thrown_message([&] { Mesh m(par, d, *world); });
  CHECK(msg.find("needs 3 ranks, but " + n + " were started") != std::string::npos);
  CHECK(msg.find("layouts that fit " + n + " ranks: tensor 1 x pipeline 1 x context 1 x data " + n) != std::string::npos);
  par.tensor = 1;
  par.expert = 3;
  d.data_parallel_size = world->size();
  CHECK(thrown_message([&] { Mesh m(par, d, *world); }).find("parallel.expert (3)") != std::string::npos);
  world->barrier();
}
