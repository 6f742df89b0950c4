// merge: concatenation of indexed datasets through IndexedDatasetWriter::add_index (see merge.h).
#include "data_tools/merge.h"

#include <algorithm>
#include <filesystem>

#include "core/check.h"
#include "data/indexed_dataset.h"

namespace mt::data {

MergeStats merge_datasets(const std::vector<std::string>& inputs, const std::string& output_prefix) {
  namespace fs = std::filesystem;
  MT_CHECK(!output_prefix.empty(), "merge: --output-prefix is required");
  std::vector<std::string> prefixes;
  for (const std::string& in : inputs) {
    if (fs::is_directory(in)) {
      std::vector<std::string> found;
      for (const auto& e : fs::directory_iterator(in))
        if (e.path().extension() == ".idx") found.push_back((e.path().parent_path() / e.path().stem()).string());
      MT_CHECK(!found.empty(), in, ": directory holds no .idx file (merge --inputs)");
      std::sort(found.begin(), found.end());
      prefixes.insert(prefixes.end(), found.begin(), found.end());
    } else {
      prefixes.push_back(in);
    }
  }
  MT_CHECK(!prefixes.empty(), "merge: no --inputs given");
  for (const std::string& p : prefixes)
    MT_CHECK(fs::weakly_canonical(p) != fs::weakly_canonical(output_prefix), "merge: --output-prefix ", output_prefix,
             " is also an input; choose another output prefix");
  MergeStats st;
  DType dtype;
  {
    IndexedDataset first(prefixes[0]);
    dtype = first.dtype();
  }
  st.dtype = dtype_name(dtype);
  IndexedDatasetWriter w(output_prefix, dtype);
  for (const std::string& p : prefixes) {
    w.add_index(p);
    ++st.inputs;
  }
  w.finalize();
  st.sequences = w.num_sequences();
  st.documents = w.num_documents();
  st.tokens = w.num_tokens();
  return st;
}

}  // namespace mt::data
