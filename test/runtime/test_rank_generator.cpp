// The rank generator as pure functions (no MPI): every group kind partitions the world with the
// right group size, the rank order is tp-cp-ep-dp-pp, and two layouts match hand-written groups
// (the TP2 PP2 DP2 one is Megatron-Core's own docstring example).
#include <algorithm>
#include <set>

#include "core/check.h"
#include "runtime/rank_generator.h"
#include "test/catch.h"

using namespace mt;

namespace {

MeshSizes sizes(int tp, int cp, int dp, int pp, int ep = 1) {
  MeshSizes s;
  s.tp = tp;
  s.cp = cp;
  s.dp = dp;
  s.pp = pp;
  s.ep = ep;
  return s;
}

int expected_group_size(const MeshSizes& s, GroupKind k) {
  switch (k) {
    case GroupKind::TP: return s.tp;
    case GroupKind::CP: return s.cp;
    case GroupKind::DP: return s.dp;
    case GroupKind::PP: return s.pp;
    case GroupKind::DP_CP: return s.dp * s.cp;
    case GroupKind::TP_CP: return s.tp * s.cp;
    case GroupKind::MP: return s.tp * s.pp;
    case GroupKind::Embedding: return s.pp == 1 ? 1 : 2;
    case GroupKind::EP: return s.ep;
    case GroupKind::ExpertDP: return s.expert_dp();
  }
  return -1;
}

// Every kind: groups ascending, of the right size, disjoint; all but embedding cover the world.
void check_partitions(const MeshSizes& s) {
  for (GroupKind k : kAllGroupKinds) {
    INFO("kind " << group_kind_name(k) << " tp " << s.tp << " cp " << s.cp << " dp " << s.dp << " pp " << s.pp
                 << " ep " << s.ep);
    const RankGroups groups = rank_groups(s, k);
    std::set<int> seen;
    for (const auto& g : groups) {
      CHECK(static_cast<int>(g.size()) == expected_group_size(s, k));
      CHECK(std::is_sorted(g.begin(), g.end()));
      for (int r : g) {
        CHECK(r >= 0);
        CHECK(r < s.world());
        CHECK(seen.insert(r).second);  // disjoint
      }
    }
    if (k == GroupKind::Embedding) {
      CHECK(static_cast<int>(groups.size()) == s.world() / s.pp);
    } else {
      CHECK(static_cast<int>(seen.size()) == s.world());
      CHECK(static_cast<int>(groups.size()) * expected_group_size(s, k) == s.world());
    }
  }
}

}  // namespace

TEST_CASE("rank generator: each kind partitions the world", "[mesh]") {
  const MeshSizes layouts[] = {
      sizes(1, 1, 1, 1),    sizes(2, 1, 2, 2),    sizes(2, 2, 2, 1),    sizes(1, 1, 2, 4),
      sizes(4, 1, 1, 2),    sizes(1, 1, 4, 1, 2), sizes(2, 1, 2, 1, 2), sizes(2, 2, 3, 2, 3),
      sizes(1, 2, 2, 3, 4), sizes(8, 1, 1, 1),    sizes(1, 1, 1, 8),    sizes(2, 4, 1, 1, 2),
  };
  for (const MeshSizes& s : layouts) check_partitions(s);
}

TEST_CASE("rank generator: global rank = tp + TP*(cp + CP*(dp + DP*pp))", "[mesh]") {
  const MeshSizes s = sizes(2, 3, 2, 2, 3);
  for (int r = 0; r < s.world(); ++r) {
    const RankCoords c = rank_coords(s, r);
    CHECK(global_rank_of(s, c.tp, c.cp, c.dp, c.pp) == r);
    CHECK(r == c.tp + s.tp * (c.cp + s.cp * (c.dp + s.dp * c.pp)));
    // expert coordinates regroup (cp, dp) as ep fastest
    CHECK(c.cp + s.cp * c.dp == c.ep + s.ep * c.edp);
    // the rank's position in each group is its coordinate
    CHECK(group_place(rank_groups(s, GroupKind::TP), r).rank == c.tp);
    CHECK(group_place(rank_groups(s, GroupKind::CP), r).rank == c.cp);
    CHECK(group_place(rank_groups(s, GroupKind::DP), r).rank == c.dp);
    CHECK(group_place(rank_groups(s, GroupKind::PP), r).rank == c.pp);
    CHECK(group_place(rank_groups(s, GroupKind::EP), r).rank == c.ep);
    CHECK(group_place(rank_groups(s, GroupKind::ExpertDP), r).rank == c.edp);
    CHECK(group_place(rank_groups(s, GroupKind::DP_CP), r).rank == c.cp + s.cp * c.dp);
    CHECK(group_place(rank_groups(s, GroupKind::MP), r).rank == c.tp + s.tp * c.pp);
  }
}

TEST_CASE("rank generator: world 8, tensor 2 x pipeline 2 x data 2 (Megatron's example)", "[mesh]") {
  const MeshSizes s = sizes(2, 1, 2, 2);
  CHECK(rank_groups(s, GroupKind::TP) == RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(rank_groups(s, GroupKind::DP) == RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(rank_groups(s, GroupKind::PP) == RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK(rank_groups(s, GroupKind::CP) == RankGroups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}});
  CHECK(rank_groups(s, GroupKind::DP_CP) == RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(rank_groups(s, GroupKind::TP_CP) == RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(rank_groups(s, GroupKind::MP) == RankGroups{{0, 1, 4, 5}, {2, 3, 6, 7}});
  CHECK(rank_groups(s, GroupKind::Embedding) == RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK(rank_groups(s, GroupKind::EP) == RankGroups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}});
  CHECK(rank_groups(s, GroupKind::ExpertDP) == RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
}

TEST_CASE("rank generator: world 8, tensor 2 x context 2 x data 2", "[mesh]") {
  const MeshSizes s = sizes(2, 2, 2, 1);
  CHECK(rank_groups(s, GroupKind::TP) == RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(rank_groups(s, GroupKind::CP) == RankGroups{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(rank_groups(s, GroupKind::DP) == RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK(rank_groups(s, GroupKind::PP) == RankGroups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}});
  CHECK(rank_groups(s, GroupKind::DP_CP) == RankGroups{{0, 2, 4, 6}, {1, 3, 5, 7}});
  CHECK(rank_groups(s, GroupKind::TP_CP) == RankGroups{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(rank_groups(s, GroupKind::MP) == RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(rank_groups(s, GroupKind::Embedding) == RankGroups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}});
  CHECK(rank_groups(s, GroupKind::ExpertDP) == rank_groups(s, GroupKind::DP_CP));
}

TEST_CASE("rank generator: pipeline 4 x data 2 embedding groups hold first and last stage", "[mesh]") {
  const MeshSizes s = sizes(1, 1, 2, 4);
  CHECK(rank_groups(s, GroupKind::PP) == RankGroups{{0, 2, 4, 6}, {1, 3, 5, 7}});
  CHECK(rank_groups(s, GroupKind::Embedding) == RankGroups{{0, 6}, {1, 7}});
  CHECK(group_place(rank_groups(s, GroupKind::Embedding), 2).group == -1);  // middle stage
  CHECK(rank_groups(s, GroupKind::DP) == RankGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
}

TEST_CASE("rank generator: tensor 4 x pipeline 2 on 8", "[mesh]") {
  const MeshSizes s = sizes(4, 1, 1, 2);
  CHECK(rank_groups(s, GroupKind::TP) == RankGroups{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(rank_groups(s, GroupKind::PP) == RankGroups{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK(rank_groups(s, GroupKind::MP) == RankGroups{{0, 1, 2, 3, 4, 5, 6, 7}});
  CHECK(rank_groups(s, GroupKind::DP).size() == 8);
}

TEST_CASE("rank generator: expert groups regroup data x context", "[mesh]") {
  // world 4 = data 4, expert 2: experts split over [0,1] and [2,3], replicated over [0,2], [1,3].
  const MeshSizes a = sizes(1, 1, 4, 1, 2);
  CHECK(rank_groups(a, GroupKind::EP) == RankGroups{{0, 1}, {2, 3}});
  CHECK(rank_groups(a, GroupKind::ExpertDP) == RankGroups{{0, 2}, {1, 3}});
  // world 4 = tensor 2 x data 2, expert 2: expert-data groups are single ranks.
  const MeshSizes b = sizes(2, 1, 2, 1, 2);
  CHECK(rank_groups(b, GroupKind::EP) == RankGroups{{0, 2}, {1, 3}});
  CHECK(rank_groups(b, GroupKind::ExpertDP) == RankGroups{{0}, {1}, {2}, {3}});
  // expert 1: single-rank expert groups, expert-data = data x context.
  const MeshSizes c = sizes(2, 2, 2, 2);
  CHECK(rank_groups(c, GroupKind::ExpertDP) == rank_groups(c, GroupKind::DP_CP));
  for (const auto& g : rank_groups(c, GroupKind::EP)) CHECK(g.size() == 1);
  // expert must divide data x context
  std::string msg;
  try {
    rank_groups(sizes(1, 1, 3, 1, 2), GroupKind::EP);
  } catch (const Error& e) {
    msg = e.what();
  }
  CHECK(msg.find("parallel.expert (2) must divide data-parallel (3)") != std::string::npos);
}

TEST_CASE("rank generator: masked orthogonal groups, Megatron's docstring example", "[mesh]") {
  // parallel_size [tp, dp, pp] = [2, 3, 4], mask dp: group k = tp + 2*dp + 6*pp.
  const RankGroups g = masked_orthogonal_rank_groups(24, {2, 3, 4}, {false, true, false});
  REQUIRE(g.size() == 8);
  CHECK(g[0] == std::vector<int>{0, 2, 4});
  CHECK(g[1] == std::vector<int>{1, 3, 5});
  CHECK(g[7] == std::vector<int>{19, 21, 23});
}

TEST_CASE("rank generator: layout table", "[mesh]") {
  const std::string t = format_rank_table(sizes(2, 1, 2, 2));
  CHECK(t.find("rank") != std::string::npos);
  CHECK(std::count(t.begin(), t.end(), '\n') == 9);  // header + 8 ranks
  CHECK(t.find("     7     1    0    1    1    0    1  last") != std::string::npos);
}
