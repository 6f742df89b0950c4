// GPT-2 tokenizer: loading encoder.json / vocab.bpe, encode and decode (see gpt2_tokenizer.h).
#include "data_tools/gpt2_tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"
#include "data_tools/pretokenizer.h"

namespace mt::data {

namespace {
std::string read_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  MT_CHECK(f.good(), path, ": cannot open the ", what, " (fetch the GPT-2 files with scripts/fetch_gpt2_tokenizer.sh)");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
}  // namespace

std::vector<std::string> vocab_texts_by_id(const nlohmann::json& vocab, const std::string& where) {
  MT_CHECK(vocab.is_object(), where, ": expected a JSON object {token: id}");
  std::vector<std::string> texts;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    MT_CHECK(it.value().is_number_integer(), where, ": the id of token \"", it.key(), "\" is not an integer");
    const int64_t id = it.value().get<int64_t>();
    MT_CHECK(id >= 0 && id < (int64_t{1} << 31), where, ": token \"", it.key(), "\" has id ", id, " out of range");
    if (static_cast<size_t>(id) >= texts.size()) texts.resize(id + 1);
    MT_CHECK(texts[id].empty(), where, ": id ", id, " is given to both \"", texts[id], "\" and \"", it.key(), "\"");
    MT_CHECK(!it.key().empty(), where, ": empty token text for id ", id);
    texts[id] = it.key();
  }
  MT_CHECK(!texts.empty(), where, ": the vocabulary is empty");
  return texts;
}

std::vector<std::string> read_gpt2_encoder_json(const std::string& path) {
  const std::string text = read_file(path, "GPT-2 vocabulary (--vocab-file encoder.json)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    MT_CHECK(false, path, ": not valid JSON (", e.what(), "); --vocab-file must be GPT-2's encoder.json");
  }
  return vocab_texts_by_id(j, path);
}

std::vector<std::pair<std::string, std::string>> read_gpt2_merges(const std::string& path, std::vector<size_t>* line_of) {
  const std::string text = read_file(path, "GPT-2 merges (--merge-file vocab.bpe)");
  std::vector<std::pair<std::string, std::string>> merges;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const size_t sp = line.find(' ');
    MT_CHECK(sp != std::string_view::npos && sp > 0 && sp + 1 < line.size() &&
                 line.find(' ', sp + 1) == std::string_view::npos,
             path, ":", line_no, ": expected a merge \"left right\" (two tokens, one space), got \"", line, "\"");
    merges.emplace_back(std::string(line.substr(0, sp)), std::string(line.substr(sp + 1)));
    line_of->push_back(line_no);
  }
  return merges;
}

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& vocab_file, const std::string& merge_file)
    : vocab_file_(vocab_file) {
  std::vector<std::string> texts = read_gpt2_encoder_json(vocab_file);
  std::vector<size_t> line_of;
  auto merges = read_gpt2_merges(merge_file, &line_of);
  vocab_size_ = static_cast<int64_t>(texts.size());
  for (size_t id = 0; id < texts.size(); ++id)
    if (texts[id] == "<|endoftext|>") eod_id_ = static_cast<int32_t>(id);
  MT_CHECK(eod_id_ >= 0, vocab_file, ": has no <|endoftext|> token; --vocab-file must be GPT-2's encoder.json");
  model_ = std::make_shared<const BpeModel>(texts, merges, /*ignore_merges=*/false, vocab_file,
                                            [&](size_t i) { return merge_file + ":" + std::to_string(line_of[i]); });
  encoder_ = std::make_unique<BpeEncoder>(model_);
}

Gpt2Tokenizer::Gpt2Tokenizer(const Gpt2Tokenizer& o)
    : vocab_file_(o.vocab_file_), vocab_size_(o.vocab_size_), eod_id_(o.eod_id_), model_(o.model_),
      encoder_(std::make_unique<BpeEncoder>(o.model_)) {}

std::unique_ptr<Tokenizer> Gpt2Tokenizer::clone() const { return std::unique_ptr<Tokenizer>(new Gpt2Tokenizer(*this)); }

void Gpt2Tokenizer::encode(std::string_view text, std::vector<int32_t>* ids) {
  pretokenize_each(PreTokenizerPattern::kGpt2, text, [&](std::string_view p) { encoder_->encode(p, ids); });
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    MT_CHECK(model_->has_id(id), "decode: token id ", id, " is not in the GPT-2 vocabulary of ", vocab_size_, " ids");
    out += model_->bytes_of(id);
  }
  return out;
}

std::string Gpt2Tokenizer::describe() const {
  return "gpt2-bpe (" + vocab_file_ + ", " + std::to_string(vocab_size_) + " ids, eod " + std::to_string(eod_id_) + ")";
}

}  // namespace mt::data
