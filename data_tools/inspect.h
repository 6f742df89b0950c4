// `megatrain-data inspect PREFIX`: what an indexed dataset holds: counts (sequences, documents,
// empty documents, tokens), dtype, token id range, sequence and document length statistics with
// log2-bucket histograms, and with a tokenizer N decoded sample documents.
#pragma once

#include <ostream>
#include <string>

#include "data_tools/tokenizer.h"

namespace mt::data {

struct InspectOptions {
  std::string prefix;
  TokenizerOptions tokenizer;  // type empty: no decoding
  int samples = 3;             // decoded documents, spread evenly over the dataset
  size_t max_chars = 300;      // of each decoded sample
};

void inspect_dataset(const InspectOptions& options, std::ostream& out);

}  // namespace mt::data
