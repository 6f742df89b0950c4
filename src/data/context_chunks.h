// Context parallelism's split of each sequence (parallel.context = P > 1): a sequence of T tokens is cut into 2P
// chunks of c = T / (2P); context rank r keeps chunks r and 2P - 1 - r, in that order (T / P tokens), so that every
// rank gets the same share of the causal mask's work. Tokens and labels are cut the same way; the kept tokens'
// positions are core/rope_params.h context_chunk_positions.
#pragma once

#include <cstdint>
#include <vector>

#include "data/dataset.h"

namespace mt::data {

// The micro-batch as context rank `rank` of `size` sees it: each row cut to its two chunks, seq_length T / size.
// size 1 returns it unchanged.
MicroBatch context_chunks(const MicroBatch& mb, int size, int rank);
void context_chunks(std::vector<MicroBatch>& mbs, int size, int rank);

}  // namespace mt::data
