// Tokenizer interface of data_tools and the factory behind the --tokenizer flags.
//   gpt2-bpe: GPT-2's encoder.json + vocab.bpe (gpt2_tokenizer.h)
//   hf-json:  a Hugging Face tokenizer.json with a byte-level BPE model (hf_tokenizer.h)
// A Tokenizer object is used by one thread at a time (it owns a cache); clone() gives another one
// sharing the loaded model, for the next thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mt::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::unique_ptr<Tokenizer> clone() const = 0;
  // Appends the ids of text to ids.
  virtual void encode(std::string_view text, std::vector<int32_t>* ids) = 0;
  std::vector<int32_t> encode(std::string_view text) {
    std::vector<int32_t> ids;
    encode(text, &ids);
    return ids;
  }
  // The text of ids (throws mt::Error for an id outside the vocabulary).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Number of ids (largest id + 1): chooses the dataset dtype, as Megatron's tokenizer.vocab_size.
  virtual int64_t vocab_size() const = 0;
  virtual int32_t eod_id() const = 0;  // the end-of-document token --append-eod adds
  virtual std::string describe() const = 0;
};

struct TokenizerOptions {
  std::string type;            // "gpt2-bpe" | "hf-json"
  std::string vocab_file;      // gpt2-bpe: encoder.json
  std::string merge_file;      // gpt2-bpe: vocab.bpe
  std::string tokenizer_file;  // hf-json: tokenizer.json
  std::string eod_token;       // hf-json: token text of EOD (default: a known end-of-text token)
  bool add_special_tokens = true;  // hf-json: apply the post-processor template (e.g. Llama-3's BOS)
};

// Throws mt::Error naming the missing flag or file.
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerOptions& options);

// Refuses a tokenizer flag that the chosen tokenizer would not read, instead of ignoring it: --vocab-file and
// --merge-file are gpt2-bpe's; --tokenizer-file, --eod-token and --no-add-special-tokens (add_special_tokens false)
// hf-json's. `given` holds only what the command line gave, its type the tokenizer chosen ("" for none);
// `type_flag` names the flag that chooses it (--tokenizer, or generate's --tokenizer-type).
void check_tokenizer_flags(const TokenizerOptions& given, const std::string& type_flag);

}  // namespace mt::data
