// The parallel mesh (see mesh.h): one MPI_Comm_split per group kind, ranks and sizes into
// ParallelState, the layout table in the log.
#include "runtime/mesh.h"

#include <string>

#include "core/log.h"
#include "runtime/mpi_communicator.h"

namespace mt {

namespace {

// "tensor 2 x pipeline 2 x context 1 x data 2, ..." : up to `limit` layouts of `world` ranks,
// those keeping the configured context size first.
std::string layouts_that_fit(int world, int context, int limit = 6) {
  std::string out;
  int count = 0;
  for (int pass = 0; pass < 2 && count < limit; ++pass)
    for (int cp = 1; cp <= world && count < limit; ++cp) {
      if (world % cp != 0 || (pass == 0) != (cp == context)) continue;
      for (int tp = 1; tp <= world / cp && count < limit; tp *= 2) {
        if ((world / cp) % tp != 0) continue;
        for (int pp = 1; pp <= world / (cp * tp) && count < limit; ++pp) {
          if ((world / (cp * tp)) % pp != 0) continue;
          out += str_cat(count++ ? ", " : "", "tensor ", tp, " x pipeline ", pp, " x context ", cp, " x data ",
                         world / (cp * tp * pp));
        }
      }
    }
  return out;
}

}  // namespace

Mesh::Mesh(const ParallelConfig& par, const DerivedConfig& d, Communicator& world, const Wrap& wrap) {
  sizes_.tp = par.tensor;
  sizes_.pp = par.pipeline;
  sizes_.cp = par.context;
  sizes_.dp = d.data_parallel_size;
  sizes_.ep = par.expert;
  check_mesh_sizes(sizes_);
  MT_CHECK(world.size() == sizes_.world(), "the layout parallel.tensor ", par.tensor, " x parallel.pipeline ",
           par.pipeline, " x parallel.context ", par.context, " x data ", d.data_parallel_size, " needs ",
           sizes_.world(), " ranks, but ", world.size(), " were started; layouts that fit ", world.size(),
           " ranks: ", layouts_that_fit(world.size(), par.context), " (data-parallel size follows from the others)");
  MT_INTERNAL_ASSERT(world.size() == mpi_world_size(), "the mesh splits MPI_COMM_WORLD (", mpi_world_size(),
                     " ranks) but was given a world of ", world.size());

  ParallelState& s = state_;
  s.world_rank = world.rank();
  s.world_size = world.size();
  s.world = &world;
  s.sequence_parallel = par.sequence_parallel;

  // Same kinds in the same order on every rank: each split is collective over the world.
  for (GroupKind kind : kAllGroupKinds) {
    const RankGroups groups = rank_groups(sizes_, kind);
    const GroupPlace place = group_place(groups, s.world_rank);
    MT_INTERNAL_ASSERT(place.group >= 0 || kind == GroupKind::Embedding, "rank ", s.world_rank, " is in no ",
                       group_kind_name(kind), " group");
    std::unique_ptr<Communicator> comm = make_mpi_split(place.group, place.rank, group_kind_name(kind));
    Communicator* c = comm.get();
    if (c) {
      MT_INTERNAL_ASSERT(c->rank() == place.rank && c->size() == static_cast<int>(groups[place.group].size()),
                         "group ", group_kind_name(kind), ": MPI gave rank ", c->rank(), " of ", c->size(), ", expected ",
                         place.rank, " of ", groups[place.group].size());
      if (wrap) {
        comm = wrap(std::move(comm));
        c = comm.get();
      }
      groups_.push_back(std::move(comm));
    }
    const int rank = c ? c->rank() : -1, size = c ? c->size() : 0;
    switch (kind) {
      case GroupKind::TP: s.tp = c; s.tp_rank = rank; s.tp_size = size; break;
      case GroupKind::CP: s.cp = c; s.cp_rank = rank; s.cp_size = size; break;
      case GroupKind::DP: s.dp = c; s.dp_rank = rank; s.dp_size = size; break;
      case GroupKind::PP: s.pp = c; s.pp_rank = rank; s.pp_size = size; break;
      case GroupKind::DP_CP: s.dp_cp = c; s.dp_cp_rank = rank; s.dp_cp_size = size; break;
      case GroupKind::TP_CP: s.tp_cp = c; s.tp_cp_rank = rank; s.tp_cp_size = size; break;
      case GroupKind::MP: s.mp = c; s.mp_rank = rank; s.mp_size = size; break;
      case GroupKind::Embedding: s.embedding = c; s.embedding_rank = rank; s.embedding_size = size; break;
      case GroupKind::EP: s.ep = c; s.ep_rank = rank; s.ep_size = size; break;
      case GroupKind::ExpertDP: s.expert_dp = c; s.expert_dp_rank = rank; s.expert_dp_size = size; break;
    }
  }
  const RankCoords me = rank_coords(sizes_, s.world_rank);
  MT_INTERNAL_ASSERT(me.tp == s.tp_rank && me.cp == s.cp_rank && me.dp == s.dp_rank && me.pp == s.pp_rank &&
                         me.ep == s.ep_rank && me.edp == s.expert_dp_rank,
                     "rank ", s.world_rank, ": group ranks disagree with the rank order");

  if (s.world_rank == 0)
    log::info("parallel mesh: {} ranks = tensor {} x context {} x data {} x pipeline {} (expert {} x expert-data {}), "
              "order tp-cp-ep-dp-pp:\n{}",
              s.world_size, sizes_.tp, sizes_.cp, sizes_.dp, sizes_.pp, sizes_.ep, sizes_.expert_dp(),
              format_rank_table(sizes_));
}

std::string Mesh::coords() const {
  const ParallelState& s = state_;
  return str_cat("rank ", s.world_rank, " (tp ", s.tp_rank, ", pp ", s.pp_rank, ", dp ", s.dp_rank, ", cp ", s.cp_rank,
                 ")");
}

}  // namespace mt
