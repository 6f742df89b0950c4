// `megatrain-data preprocess`: JSONL -> Megatron indexed datasets, one per JSON key
// (PREFIX_KEY_document.bin/.idx), as Megatron's tools/preprocess_data.py writes them:
//   - a line is a document; its value is a string (one sequence) or a list of strings (one
//     sequence each, empty ones dropped); --append-eod adds the EOD id to the last sequence of a
//     non-empty document; an empty document is still recorded (document_indices repeats).
//   - dtype uint16 when the vocabulary is under 65500 ids, else int32.
// Pipeline, memory-bounded whatever the input size:
//   reader thread --(chunks of ~chunk_bytes of lines)--> N worker threads (parse JSON, tokenize)
//   --> the calling thread writes chunks strictly in input order.
// At most chunks_in_flight chunks exist at once (read, not yet written), so memory is about
// chunks_in_flight x (chunk_bytes + its tokens) plus the tokenizer; the output never depends on
// the worker count. Outputs go to temporary names and are renamed only at the end.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "data_tools/tokenizer.h"

namespace mt::data {

struct PreprocessOptions {
  std::vector<std::string> inputs;        // JSONL files, plain or gzip; "-" is stdin
  std::vector<std::string> json_keys = {"text"};
  TokenizerOptions tokenizer;
  bool append_eod = false;
  int workers = 1;
  std::string output_prefix;
  bool skip_bad = false;                  // skip malformed lines (counted) instead of stopping
  size_t chunk_bytes = size_t{1} << 20;   // JSONL bytes per chunk of work
  int chunks_in_flight = 0;               // 0: 2 x workers + 2
  double log_interval = 1.0;              // seconds between progress lines on stderr; <= 0: none
};

struct PreprocessStats {
  int64_t lines = 0, documents = 0, sequences = 0, tokens = 0;
  int64_t bad_lines = 0, blank_lines = 0;
  int64_t input_bytes = 0;  // uncompressed JSONL bytes
  double load_seconds = 0;  // loading the tokenizer
  double seconds = 0;       // the pipeline, after loading (MB/s = input_bytes / seconds)
  std::string dtype;
  std::vector<std::string> output_prefixes;  // one per JSON key
};

// Output prefix of a key's dataset: PREFIX_KEY_document.
std::string dataset_prefix(const std::string& output_prefix, const std::string& key);

// Runs the pipeline; throws mt::Error ("FILE:LINE: ...") on bad input unless skip_bad. When
// cancel becomes true (e.g. on SIGINT) it stops with an error. Either way no final-named output
// is left behind.
PreprocessStats preprocess(const PreprocessOptions& options, const std::atomic<bool>* cancel = nullptr);

}  // namespace mt::data
