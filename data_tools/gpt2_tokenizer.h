// GPT-2's byte-level BPE tokenizer from the original encoder.json (token text -> id) and
// vocab.bpe ("#version" line, then one merge "left right" a line, in rank order), with
// GPT-2's pre-tokenizer regex. <|endoftext|> in text is plain text, as in GPT-2's encoder.py
// (and Megatron's GPT2BPETokenizer); it is only the EOD id.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "data_tools/bpe.h"
#include "data_tools/tokenizer.h"

namespace mt::data {

class Gpt2Tokenizer : public Tokenizer {
 public:
  Gpt2Tokenizer(const std::string& vocab_file, const std::string& merge_file);
  std::unique_ptr<Tokenizer> clone() const override;
  void encode(std::string_view text, std::vector<int32_t>* ids) override;
  using Tokenizer::encode;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod_id() const override { return eod_id_; }
  std::string describe() const override;

 private:
  Gpt2Tokenizer(const Gpt2Tokenizer& other);
  std::string vocab_file_;
  int64_t vocab_size_ = 0;
  int32_t eod_id_ = -1;
  std::shared_ptr<const BpeModel> model_;
  std::unique_ptr<BpeEncoder> encoder_;
};

// Token texts by id from a JSON object {token: id} (encoder.json, tokenizer.json's model.vocab);
// ids without a token get "". Throws mt::Error naming `where` on any problem.
std::vector<std::string> vocab_texts_by_id(const nlohmann::json& vocab, const std::string& where);
// Reads encoder.json into texts by id (throws mt::Error naming the file on any problem).
std::vector<std::string> read_gpt2_encoder_json(const std::string& path);
// Reads vocab.bpe merges; line_of[i] is the 1-based line of merge i.
std::vector<std::pair<std::string, std::string>> read_gpt2_merges(const std::string& path, std::vector<size_t>* line_of);

}  // namespace mt::data
