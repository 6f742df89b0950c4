#include "data/context_chunks.h"

#include <algorithm>

#include "core/check.h"
#include "core/rope_params.h"

namespace mt::data {

MicroBatch context_chunks(const MicroBatch& mb, int size, int rank) {
  if (size == 1) return mb;
  const int64_t T = mb.seq_length, c = T / (2 * int64_t{size});
  MT_INTERNAL_ASSERT(c * 2 * size == T && rank >= 0 && rank < size, "sequence ", T, " does not split into 2 x ", size,
                     " chunks (rank ", rank, ")");
  MicroBatch out;
  out.first_sample = mb.first_sample;
  out.rows = mb.rows;
  out.seq_length = static_cast<int>(2 * c);
  const RopePositions pos = context_chunk_positions(2 * c, size, rank);
  const int64_t starts[2] = {pos(0), pos(c)};
  for (const auto* v : {&mb.tokens, &mb.labels}) {
    std::vector<int32_t>& dst = v == &mb.tokens ? out.tokens : out.labels;
    dst.resize(static_cast<size_t>(mb.rows * 2 * c));
    for (int64_t b = 0; b < mb.rows; ++b)
      for (int k = 0; k < 2; ++k)
        std::copy_n(v->begin() + b * T + starts[k], c, dst.begin() + b * 2 * c + k * c);
  }
  return out;
}

void context_chunks(std::vector<MicroBatch>& mbs, int size, int rank) {
  if (size == 1) return;
  for (MicroBatch& mb : mbs) mb = context_chunks(mb, size, rank);
}

}  // namespace mt::data
