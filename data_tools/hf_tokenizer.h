// Hugging Face tokenizer.json with a byte-level BPE model (GPT-2, GPT-NeoX, Llama-3, ...).
// The pipeline of the `tokenizers` library, for the pieces these models use:
//   1. added tokens ("added_tokens", special or not) are cut out of the raw text first,
//      leftmost-longest, honouring lstrip / rstrip / single_word (all are matched on the raw
//      text, also those marked "normalized", which differs only under NFC for non-NFC content);
//   2. normalizer: none or NFC (GPT-NeoX);
//   3. pre_tokenizer: ByteLevel (add_prefix_space, use_regex with GPT-2's pattern), Split with
//      the GPT-2 or Llama-3 regex (behavior Isolated), or a Sequence of those;
//   4. model: BPE over bytes (merges as "a b" strings or [a, b] pairs; ignore_merges);
//   5. post_processor (when add_special_tokens): TemplateProcessing "single", Roberta/Bert
//      processing, ByteLevel (no ids), or a Sequence of those.
// Anything else is rejected with an error naming the tokenizer.json key.
// decode: added tokens give their content, other ids their bytes (ByteLevel decoder).
#pragma once


#include "data_tools/bpe.h"
#include "data_tools/pretokenizer.h"
#include "data_tools/tokenizer.h"

namespace mt::data {

class HfTokenizer : public Tokenizer {
 public:
  // eod_token: text of the EOD token; empty picks the first of <|endoftext|>, <|end_of_text|>,
  // </s>, <eos> that the tokenizer has.
  HfTokenizer(const std::string& path, const std::string& eod_token = "", bool add_special_tokens = true);
  std::unique_ptr<Tokenizer> clone() const override;
  void encode(std::string_view text, std::vector<int32_t>* ids) override;
  using Tokenizer::encode;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override;
  int32_t eod_id() const override;
  std::string describe() const override;

  struct Config;  // everything loaded from the file, shared by clones

 private:
  explicit HfTokenizer(std::shared_ptr<const Config> config);
  void encode_segment(std::string_view text, std::vector<int32_t>* ids);

  std::shared_ptr<const Config> cfg_;
  std::unique_ptr<BpeEncoder> encoder_;
};

}  // namespace mt::data
