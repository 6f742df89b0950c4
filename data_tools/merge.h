// `megatrain-data merge`: several indexed datasets (same dtype) into one, in the order given,
// like Megatron's tools/merge_datasets.py (IndexedDatasetWriter::add_index for each). An input
// that is a directory stands for every PREFIX.idx in it, in sorted order (merge_datasets.py --input).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt::data {

struct MergeStats {
  int64_t inputs = 0, sequences = 0, documents = 0, tokens = 0;
  std::string dtype;
};

MergeStats merge_datasets(const std::vector<std::string>& inputs, const std::string& output_prefix);

}  // namespace mt::data
