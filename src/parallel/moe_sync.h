// Host-side sums for the mixture-of-experts layers over every rank that routes tokens through the same layers:
// the data x context ranks of this pipeline stage (expert parallelism regroups them) and, under sequence
// parallelism, its tensor-parallel ranks (each routes its own rows). The expert-bias update (tokens per expert of
// the whole step) and the routing metrics use it; model code never communicates.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/parallel_state.h"

namespace mt {

// In place; collective over this rank's data, context and (with sequence parallelism) tensor groups.
void sum_over_routing_ranks(std::vector<int64_t>& values, const ParallelState& ps);

}  // namespace mt
