// `megatrain generate`: samples text from a checkpoint. The model is rebuilt on one rank from the
// config stored in the checkpoint (any parallel layout reads back), the prompt is encoded with the
// tokenizer the config names (data.tokenizer_type, or the command-line flags), and tokens are drawn
// one at a time from softmax(logits / temperature) restricted to the top-k (greedy at temperature 0).
#pragma once

#include <cstdint>
#include <string>

namespace mt {

struct GenerateOptions {
  std::string checkpoint;   // a checkpoint directory, or a checkpoint.dir holding `latest`
  std::string prompt;
  int max_new_tokens = 100;
  double temperature = 0.8;
  int top_k = 40;           // 0 = no top-k cut
  uint64_t seed = 1234;
  // Override the tokenizer of the stored config (empty = keep).
  std::string tokenizer_type, vocab_file, merge_file, tokenizer_file;
};

// Prints the prompt and its continuation to stdout. Throws mt::Error on bad input.
void run_generate(const GenerateOptions& opt);

}  // namespace mt
