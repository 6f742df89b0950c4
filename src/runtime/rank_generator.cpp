// Rank groups of the parallel mesh (see rank_generator.h): Megatron-Core's masked orthogonal rank
// groups over the order "tp-cp-ep-dp-pp", one generator for dense layers, one for expert layers.
#include "runtime/rank_generator.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "core/check.h"

namespace mt {

namespace {

// The order every generator uses, fastest first.
enum Dim { kTP = 0, kCP = 1, kEP = 2, kDP = 3, kPP = 4, kNumDims = 5 };

std::vector<int64_t> prefix_product(const std::vector<int>& a) {
  std::vector<int64_t> r{1};
  for (int v : a) r.push_back(r.back() * v);
  return r;
}

// index = sum idx[i] * stride[i] with stride = prefix_product(shape): returns idx.
std::vector<int> decompose(int64_t index, const std::vector<int>& shape) {
  std::vector<int> idx(shape.size());
  int64_t stride = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    idx[i] = static_cast<int>((index / stride) % shape[i]);
    stride *= shape[i];
  }
  return idx;
}

// Groups of a generator with per-dimension sizes `sizes` (kNumDims entries) varying `dims`.
RankGroups generate(const std::vector<int>& sizes, std::initializer_list<Dim> dims) {
  std::vector<bool> mask(kNumDims, false);
  for (Dim d : dims) mask[d] = true;
  int64_t world = 1;
  for (int s : sizes) world *= s;
  return masked_orthogonal_rank_groups(static_cast<int>(world), sizes, mask);
}

std::vector<int> dense_sizes(const MeshSizes& s) { return {s.tp, s.cp, 1, s.dp, s.pp}; }
std::vector<int> expert_sizes(const MeshSizes& s) { return {s.tp, 1, s.ep, s.expert_dp(), s.pp}; }

}  // namespace

RankGroups masked_orthogonal_rank_groups(int world_size, const std::vector<int>& sizes, const std::vector<bool>& mask) {
  MT_INTERNAL_ASSERT(sizes.size() == mask.size(), "sizes and mask differ in length");
  std::vector<int> masked_shape, unmasked_shape;
  std::vector<int64_t> masked_stride, unmasked_stride;
  const std::vector<int64_t> global_stride = prefix_product(sizes);
  MT_INTERNAL_ASSERT(global_stride.back() == world_size, "sizes multiply to ", global_stride.back(), ", not world ",
                     world_size);
  for (size_t i = 0; i < sizes.size(); ++i) {
    (mask[i] ? masked_shape : unmasked_shape).push_back(sizes[i]);
    (mask[i] ? masked_stride : unmasked_stride).push_back(global_stride[i]);
  }
  const int64_t group_size = prefix_product(masked_shape).back();
  const int64_t num_groups = world_size / group_size;
  RankGroups groups(static_cast<size_t>(num_groups));
  for (int64_t g = 0; g < num_groups; ++g) {
    const std::vector<int> gidx = decompose(g, unmasked_shape);
    int64_t base = 0;
    for (size_t i = 0; i < gidx.size(); ++i) base += gidx[i] * unmasked_stride[i];
    std::vector<int>& ranks = groups[static_cast<size_t>(g)];
    ranks.reserve(static_cast<size_t>(group_size));
    for (int64_t r = 0; r < group_size; ++r) {
      const std::vector<int> ridx = decompose(r, masked_shape);
      int64_t rank = base;
      for (size_t i = 0; i < ridx.size(); ++i) rank += ridx[i] * masked_stride[i];
      ranks.push_back(static_cast<int>(rank));
    }
  }
  return groups;
}

const char* group_kind_name(GroupKind k) {
  switch (k) {
    case GroupKind::TP: return "tp";
    case GroupKind::CP: return "cp";
    case GroupKind::DP: return "dp";
    case GroupKind::PP: return "pp";
    case GroupKind::DP_CP: return "dp-cp";
    case GroupKind::TP_CP: return "tp-cp";
    case GroupKind::MP: return "mp";
    case GroupKind::Embedding: return "embedding";
    case GroupKind::EP: return "ep";
    case GroupKind::ExpertDP: return "expert-dp";
  }
  return "?";
}

void check_mesh_sizes(const MeshSizes& s) {
  MT_CHECK(s.tp >= 1 && s.cp >= 1 && s.dp >= 1 && s.pp >= 1 && s.ep >= 1, "parallel sizes must be >= 1: tensor ", s.tp,
           ", context ", s.cp, ", data ", s.dp, ", pipeline ", s.pp, ", expert ", s.ep);
  MT_CHECK((s.cp * s.dp) % s.ep == 0, "parallel.expert (", s.ep, ") must divide data-parallel (", s.dp,
           ") x parallel.context (", s.cp, ") = ", s.cp * s.dp,
           ": expert layers regroup those ranks into expert x expert-data-parallel");
}

RankGroups rank_groups(const MeshSizes& s, GroupKind kind) {
  check_mesh_sizes(s);
  const std::vector<int> dense = dense_sizes(s);
  switch (kind) {
    case GroupKind::TP: return generate(dense, {kTP});
    case GroupKind::CP: return generate(dense, {kCP});
    case GroupKind::DP: return generate(dense, {kDP});
    case GroupKind::PP: return generate(dense, {kPP});
    case GroupKind::DP_CP: return generate(dense, {kDP, kCP});
    case GroupKind::TP_CP: return generate(dense, {kTP, kCP});
    case GroupKind::MP: return generate(dense, {kTP, kPP});
    case GroupKind::Embedding: {
      RankGroups out;
      for (const std::vector<int>& p : generate(dense, {kPP}))
        out.push_back(p.size() == 1 ? std::vector<int>{p.front()} : std::vector<int>{p.front(), p.back()});
      return out;
    }
    case GroupKind::EP: return generate(expert_sizes(s), {kEP});
    case GroupKind::ExpertDP: return generate(expert_sizes(s), {kDP});
  }
  MT_INTERNAL_ASSERT(false, "unknown group kind");
  return {};
}

RankCoords rank_coords(const MeshSizes& s, int global_rank) {
  MT_INTERNAL_ASSERT(global_rank >= 0 && global_rank < s.world(), "rank ", global_rank, " outside world ", s.world());
  const std::vector<int> d = decompose(global_rank, dense_sizes(s));
  const std::vector<int> e = decompose(global_rank, expert_sizes(s));
  RankCoords c;
  c.tp = d[kTP];
  c.cp = d[kCP];
  c.dp = d[kDP];
  c.pp = d[kPP];
  c.ep = e[kEP];
  c.edp = e[kDP];
  return c;
}

int global_rank_of(const MeshSizes& s, int tp, int cp, int dp, int pp) {
  return tp + s.tp * (cp + s.cp * (dp + s.dp * pp));
}

std::string format_rank_table(const MeshSizes& s) {
  std::string out = str_cat("  rank    tp   cp   dp   pp   ep  edp  stage\n");
  char line[128];
  for (int r = 0; r < s.world(); ++r) {
    const RankCoords c = rank_coords(s, r);
    const char* role = s.pp == 1 ? "only" : c.pp == 0 ? "first" : c.pp == s.pp - 1 ? "last" : "middle";
    std::snprintf(line, sizeof line, "  %4d  %4d %4d %4d %4d %4d %4d  %s\n", r, c.tp, c.cp, c.dp, c.pp, c.ep, c.edp, role);
    out += line;
  }
  return out;
}

GroupPlace group_place(const RankGroups& groups, int global_rank) {
  for (size_t g = 0; g < groups.size(); ++g) {
    auto it = std::find(groups[g].begin(), groups[g].end(), global_rank);
    if (it != groups[g].end()) return {static_cast<int>(g), static_cast<int>(it - groups[g].begin())};
  }
  return {};
}

}  // namespace mt
