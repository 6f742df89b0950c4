// The rank layout of the parallel mesh as pure functions (no MPI), after Megatron-Core's
// RankGenerator / generate_masked_orthogonal_rank_groups (megatron/core/parallel_state.py).
//
// Dense layers order the ranks "tp-cp-ep-dp-pp" with ep = 1: tensor fastest, then context, data,
// pipeline:
//   global_rank = tp + TP * (cp + CP * (dp + DP * pp)).
// Expert layers regroup the same ranks (Megatron's expert RankGenerator: expert tensor size = TP,
// cp = 1, same order): the CP x DP ranks of one (tp, pp) become EP x EDP, EP fastest:
//   global_rank = tp + TP * (ep + EP * (edp + EDP * pp)),   EDP = CP * DP / EP.
// With EP = 1 every expert-parallel group is one rank and expert-dp equals dp-cp.
//
// A group kind ("dp", "tp-cp", ...) is the set of mesh dimensions that vary inside one group; each
// kind's groups partition the world (the embedding groups excepted: only first and last stages).
// Ranks inside a group are ascending, which is also Megatron's order (rank in group = position).
#pragma once

#include <string>
#include <vector>

namespace mt {

using RankGroups = std::vector<std::vector<int>>;

// Megatron's generate_masked_orthogonal_rank_groups: `sizes` lists each dimension's size, fastest
// first; the groups vary the dimensions whose mask entry is true and fix the others. Groups are
// numbered by the fixed dimensions (first fixed dimension fastest).
RankGroups masked_orthogonal_rank_groups(int world_size, const std::vector<int>& sizes, const std::vector<bool>& mask);

// The sizes of the mesh. world = tp * cp * dp * pp; ep must divide cp * dp.
struct MeshSizes {
  int tp = 1, cp = 1, dp = 1, pp = 1, ep = 1;
  int world() const { return tp * cp * dp * pp; }
  int expert_dp() const { return cp * dp / ep; }
};

// Every group kind the mesh builds (Megatron's names in comments).
enum class GroupKind {
  TP,         // tensor model parallel                       "tp"
  CP,         // context parallel                            "cp"
  DP,         // data parallel                               "dp"
  PP,         // pipeline model parallel                     "pp"
  DP_CP,      // data parallel with context parallel          "dp-cp" (gradient reduction, dist. optimizer)
  TP_CP,      // tensor and context parallel                  "tp-cp"
  MP,         // model parallel: tensor x pipeline            "tp-pp"
  Embedding,  // first and last stage of each pipeline group  (the tied / shared word embeddings)
  EP,         // expert model parallel                        expert generator "ep"
  ExpertDP,   // expert data parallel                         expert generator "dp"
};
inline constexpr int kNumGroupKinds = 10;
inline constexpr GroupKind kAllGroupKinds[] = {GroupKind::TP,    GroupKind::CP,    GroupKind::DP,        GroupKind::PP,
                                               GroupKind::DP_CP, GroupKind::TP_CP, GroupKind::MP,        GroupKind::Embedding,
                                               GroupKind::EP,    GroupKind::ExpertDP};
static_assert(sizeof(kAllGroupKinds) / sizeof(kAllGroupKinds[0]) == kNumGroupKinds);

// "tp", "cp", "dp", "pp", "dp-cp", "tp-cp", "mp", "embedding", "ep", "expert-dp".
const char* group_kind_name(GroupKind k);

// Throws mt::Error when a size is < 1 or ep does not divide cp * dp.
void check_mesh_sizes(const MeshSizes& s);

// All groups of one kind, ascending inside each group, in Megatron's group order.
RankGroups rank_groups(const MeshSizes& s, GroupKind kind);

// Where a global rank sits in the mesh.
struct RankCoords {
  int tp = 0, cp = 0, dp = 0, pp = 0;  // dense layers
  int ep = 0, edp = 0;                 // expert layers
};
RankCoords rank_coords(const MeshSizes& s, int global_rank);
int global_rank_of(const MeshSizes& s, int tp, int cp, int dp, int pp);

// The layout as a text table, one row per global rank: its tp, cp, dp, pp, ep, edp coordinates
// and its pipeline stage's role (first / last stage). Used by the mesh's start-up log and `plan`.
std::string format_rank_table(const MeshSizes& s);

// The group of `kind` holding `global_rank`: its index in rank_groups() and this rank's position in
// it; {-1, -1} when no group holds it (embedding groups skip the middle pipeline stages).
struct GroupPlace {
  int group = -1, rank = -1;
};
GroupPlace group_place(const RankGroups& groups, int global_rank);

}  // namespace mt
