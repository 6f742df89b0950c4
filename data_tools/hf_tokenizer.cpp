// Hugging Face tokenizer.json loader and encode/decode pipeline (see hf_tokenizer.h).
#include "data_tools/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "core/check.h"
#include "data_tools/gpt2_tokenizer.h"
#include "data_tools/unicode.h"

namespace mt::data {

using nlohmann::json;

namespace {

struct AddedToken {
  int32_t id;
  std::string content;
  bool lstrip, rstrip, single_word;
};

struct PreStage {
  bool byte_level;              // ByteLevel, else Split
  PreTokenizerPattern pattern;  // Split's regex, or GPT-2's for ByteLevel with use_regex
  bool add_prefix_space;
  bool use_regex;
};

std::string type_of(const json& j) { return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : ""; }

bool flag(const json& j, const char* key, bool def) {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : def;
}

}  // namespace

struct HfTokenizer::Config {
  std::string path;
  std::shared_ptr<const BpeModel> model;
  std::vector<AddedToken> added;
  std::array<std::vector<int>, 256> added_by_byte;  // indices into added by first byte, longest first
  std::unordered_map<int32_t, int> added_by_id;
  bool nfc = false;
  std::vector<PreStage> stages;
  std::vector<int32_t> prefix, suffix;  // the post-processor's ids around the text
  bool add_special_tokens = true;
  int64_t vocab_size = 0;
  int32_t eod = -1;
  std::string eod_text;
};

namespace {

void parse_pre_tokenizer(const json& j, const std::string& where, std::vector<PreStage>* stages) {
  const std::string type = type_of(j);
  if (j.is_null()) return;
  if (type == "Sequence") {
    MT_CHECK(j.contains("pretokenizers") && j["pretokenizers"].is_array(), where, ": Sequence without a \"pretokenizers\" array");
    for (size_t i = 0; i < j["pretokenizers"].size(); ++i)
      parse_pre_tokenizer(j["pretokenizers"][i], where + ".pretokenizers[" + std::to_string(i) + "]", stages);
  } else if (type == "ByteLevel") {
    stages->push_back({true, PreTokenizerPattern::kGpt2, flag(j, "add_prefix_space", false), flag(j, "use_regex", true)});
  } else if (type == "Split") {
    MT_CHECK(j.contains("pattern") && j["pattern"].is_object() && j["pattern"].contains("Regex"), where,
             ": Split needs a {\"Regex\": ...} pattern (string patterns are not supported)");
    const std::string re = j["pattern"]["Regex"].get<std::string>();
    auto p = pattern_from_regex(re);
    MT_CHECK(p.has_value(), where, ": Split regex ", json(re).dump(),
             " is not supported; supported: the GPT-2 and Llama-3 pre-tokenizer patterns");
    const std::string behavior = j.value("behavior", "Isolated");
    MT_CHECK(behavior == "Isolated" && !flag(j, "invert", false), where, ": Split with behavior \"", behavior,
             "\" / invert is not supported (only Isolated, invert false)");
    stages->push_back({false, *p, false, true});
  } else {
    MT_CHECK(false, where, ": pre-tokenizer type \"", type, "\" is not supported (ByteLevel, Split, Sequence)");
  }
}

// Appends the post-processor's ids before / after the text to prefix / suffix.
void parse_post_processor(const json& j, const std::string& where, std::vector<int32_t>* prefix,
                          std::vector<int32_t>* suffix) {
  if (j.is_null()) return;
  const std::string type = type_of(j);
  std::vector<int32_t> pre, post;
  if (type == "ByteLevel") {
    return;
  } else if (type == "Sequence") {
    MT_CHECK(j.contains("processors") && j["processors"].is_array(), where, ": Sequence without a \"processors\" array");
    for (size_t i = 0; i < j["processors"].size(); ++i)
      parse_post_processor(j["processors"][i], where + ".processors[" + std::to_string(i) + "]", prefix, suffix);
    return;
  } else if (type == "TemplateProcessing") {
    MT_CHECK(j.contains("single") && j["single"].is_array(), where, ": TemplateProcessing without a \"single\" template");
    bool seen_sequence = false;
    for (const json& item : j["single"]) {
      if (item.contains("Sequence")) {
        seen_sequence = true;
      } else if (item.contains("SpecialToken")) {
        const std::string name = item["SpecialToken"].value("id", "");
        MT_CHECK(j.contains("special_tokens") && j["special_tokens"].contains(name), where,
                 ": template token \"", name, "\" is not in \"special_tokens\"");
        for (const json& id : j["special_tokens"][name]["ids"]) (seen_sequence ? post : pre).push_back(id.get<int32_t>());
      } else {
        MT_CHECK(false, where, ": unknown template item ", item.dump());
      }
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    MT_CHECK(j.contains("cls") && j.contains("sep"), where, ": ", type, " without \"cls\" / \"sep\"");
    pre.push_back(j["cls"][1].get<int32_t>());
    post.push_back(j["sep"][1].get<int32_t>());
  } else {
    MT_CHECK(false, where, ": post-processor type \"", type,
             "\" is not supported (TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel, Sequence)");
  }
  prefix->insert(prefix->begin(), pre.begin(), pre.end());
  suffix->insert(suffix->end(), post.begin(), post.end());
}

std::shared_ptr<const BpeModel> parse_model(const json& m, const std::string& path) {
  const std::string where = path + ": model";
  MT_CHECK(m.is_object(), where, " is missing");
  const std::string type = type_of(m);
  MT_CHECK(type == "BPE" || (type.empty() && m.contains("merges")), where, ".type is \"", type,
           "\"; only BPE models are supported");
  MT_CHECK(!m.contains("dropout") || m["dropout"].is_null() || m["dropout"].get<double>() == 0.0, where,
           ".dropout is set; BPE dropout is not deterministic, set it to null");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    MT_CHECK(!m.contains(key) || m[key].is_null() || m[key].get<std::string>().empty(), where, ".", key,
             " is not supported (byte-level BPE has none)");
  MT_CHECK(!flag(m, "byte_fallback", false), where, ".byte_fallback is true: SentencePiece-style BPE is not supported");
  MT_CHECK(m.contains("vocab"), where, ".vocab is missing");
  const std::vector<std::string> texts = vocab_texts_by_id(m["vocab"], where + ".vocab");
  MT_CHECK(m.contains("merges") && m["merges"].is_array(), where, ".merges must be an array");
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(m["merges"].size());
  for (size_t i = 0; i < m["merges"].size(); ++i) {
    const json& e = m["merges"][i];
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      MT_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, where, ".merges[", i,
               "] = \"", s, "\": expected \"left right\"");
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else {
      MT_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(), where, ".merges[", i,
               "]: expected \"left right\" or [\"left\", \"right\"]");
      merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    }
  }
  return std::make_shared<const BpeModel>(texts, merges, flag(m, "ignore_merges", false), path,
                                          [&](size_t i) { return where + ".merges[" + std::to_string(i) + "]"; });
}

}  // namespace

HfTokenizer::HfTokenizer(const std::string& path, const std::string& eod_token, bool add_special_tokens) {
  auto cfg = std::make_shared<Config>();
  cfg->path = path;
  cfg->add_special_tokens = add_special_tokens;
  std::ifstream f(path, std::ios::binary);
  MT_CHECK(f.good(), path, ": cannot open the tokenizer file (--tokenizer-file)");
  json j;
  try {
    j = json::parse(f);
  } catch (const json::exception& e) {
    MT_CHECK(false, path, ": not valid JSON (", e.what(), "); --tokenizer-file must be a Hugging Face tokenizer.json");
  }
  MT_CHECK(j.is_object() && j.contains("model"), path, ": no \"model\"; --tokenizer-file must be a Hugging Face tokenizer.json");
  cfg->model = parse_model(j["model"], path);
  cfg->vocab_size = cfg->model->num_ids();

  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (size_t i = 0; i < j["added_tokens"].size(); ++i) {
      const json& a = j["added_tokens"][i];
      MT_CHECK(a.contains("id") && a.contains("content"), path, ": added_tokens[", i, "] needs \"id\" and \"content\"");
      AddedToken t{a["id"].get<int32_t>(), a["content"].get<std::string>(), flag(a, "lstrip", false),
                   flag(a, "rstrip", false), flag(a, "single_word", false)};
      MT_CHECK(t.id >= 0, path, ": added_tokens[", i, "] has a negative id");
      if (t.content.empty()) continue;
      cfg->vocab_size = std::max<int64_t>(cfg->vocab_size, int64_t{t.id} + 1);
      cfg->added_by_id[t.id] = static_cast<int>(cfg->added.size());
      cfg->added.push_back(std::move(t));
    }
  }
  for (size_t i = 0; i < cfg->added.size(); ++i)
    cfg->added_by_byte[static_cast<unsigned char>(cfg->added[i].content[0])].push_back(static_cast<int>(i));
  for (auto& bucket : cfg->added_by_byte)
    std::stable_sort(bucket.begin(), bucket.end(), [&](int a, int b) {
      return cfg->added[a].content.size() > cfg->added[b].content.size();
    });

  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const std::string type = type_of(j["normalizer"]);
    MT_CHECK(type == "NFC", path, ": normalizer type \"", type, "\" is not supported (none or NFC)");
    cfg->nfc = true;
  }
  parse_pre_tokenizer(j.value("pre_tokenizer", json()), path + ": pre_tokenizer", &cfg->stages);
  bool byte_level = type_of(j.value("decoder", json())) == "ByteLevel";
  for (const PreStage& s : cfg->stages) byte_level |= s.byte_level;
  MT_CHECK(byte_level, path, ": neither the pre_tokenizer nor the decoder is ByteLevel; only byte-level BPE is supported");
  if (add_special_tokens)
    parse_post_processor(j.value("post_processor", json()), path + ": post_processor", &cfg->prefix, &cfg->suffix);

  // EOD: the named token, or the first known end-of-text token.
  std::vector<std::string> candidates = {eod_token};
  if (eod_token.empty()) candidates = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"};
  for (const std::string& c : candidates) {
    for (const AddedToken& t : cfg->added)
      if (t.content == c && cfg->eod < 0) cfg->eod = t.id;
    if (auto id = cfg->model->id_of_bytes(c); id && cfg->eod < 0) cfg->eod = *id;
    if (cfg->eod >= 0) { cfg->eod_text = c; break; }
  }
  MT_CHECK(cfg->eod >= 0, path, ": ", eod_token.empty() ? "none of <|endoftext|>, <|end_of_text|>, </s>, <eos> is a token"
                                                        : "--eod-token \"" + eod_token + "\" is not a token",
           "; pass the end-of-document token with --eod-token");
  cfg_ = std::move(cfg);
  encoder_ = std::make_unique<BpeEncoder>(cfg_->model);
}

HfTokenizer::HfTokenizer(std::shared_ptr<const Config> config)
    : cfg_(std::move(config)), encoder_(std::make_unique<BpeEncoder>(cfg_->model)) {}

std::unique_ptr<Tokenizer> HfTokenizer::clone() const { return std::unique_ptr<Tokenizer>(new HfTokenizer(cfg_)); }

int64_t HfTokenizer::vocab_size() const { return cfg_->vocab_size; }
int32_t HfTokenizer::eod_id() const { return cfg_->eod; }

std::string HfTokenizer::describe() const {
  std::string pat;
  for (const PreStage& s : cfg_->stages) pat += std::string(pat.empty() ? "" : "+") + (s.byte_level ? "ByteLevel" : "Split:") +
                                                (s.byte_level ? "" : pattern_name(s.pattern));
  return "hf-json (" + cfg_->path + ", " + std::to_string(cfg_->vocab_size) + " ids, " + std::to_string(cfg_->added.size()) +
         " added tokens, pre-tokenizer " + (pat.empty() ? "none" : pat) + (cfg_->nfc ? ", NFC" : "") + ", eod " +
         cfg_->eod_text + " = " + std::to_string(cfg_->eod) + ")";
}

void HfTokenizer::encode(std::string_view text, std::vector<int32_t>* ids) {
  const Config& c = *cfg_;
  ids->insert(ids->end(), c.prefix.begin(), c.prefix.end());
  auto at = [&](size_t k) { return reinterpret_cast<const unsigned char*>(text.data()) + k; };
  auto end = at(text.size());
  auto flags_before = [&](size_t k) -> uint8_t {  // flags of the character ending at byte k
    if (k == 0) return kOther;
    size_t s = k - 1;
    while (s > 0 && (*at(s) & 0xC0) == 0x80) --s;
    char32_t cp;
    utf8_decode(at(s), end, &cp);
    return char_flags(cp);
  };
  auto flags_at = [&](size_t k) -> uint8_t {
    if (k >= text.size()) return kOther;
    char32_t cp;
    utf8_decode(at(k), end, &cp);
    return char_flags(cp);
  };
  size_t seg = 0;  // start of the text not yet emitted
  for (size_t pos = 0; pos < text.size();) {
    const std::vector<int>& bucket = c.added_by_byte[*at(pos)];
    const AddedToken* hit = nullptr;
    for (int k : bucket) {
      const AddedToken& t = c.added[k];
      if (text.compare(pos, t.content.size(), t.content) != 0) continue;
      if (t.single_word && ((flags_before(pos) & (kLetter | kNumber)) || (flags_at(pos + t.content.size()) & (kLetter | kNumber))))
        continue;
      hit = &t;
      break;
    }
    if (!hit) { ++pos; continue; }
    size_t start = pos, stop = pos + hit->content.size();
    if (hit->lstrip)
      while (start > seg && (flags_before(start) & kSpace)) {
        --start;
        while (start > seg && (*at(start) & 0xC0) == 0x80) --start;
      }
    if (hit->rstrip)
      while (stop < text.size() && (flags_at(stop) & kSpace)) {
        char32_t cp;
        stop += utf8_decode(at(stop), end, &cp);
      }
    encode_segment(text.substr(seg, start - seg), ids);
    ids->push_back(hit->id);
    seg = pos = stop;
  }
  encode_segment(text.substr(seg), ids);
  ids->insert(ids->end(), c.suffix.begin(), c.suffix.end());
}

void HfTokenizer::encode_segment(std::string_view text, std::vector<int32_t>* ids) {
  if (text.empty()) return;
  const Config& c = *cfg_;
  std::string normalized;
  if (c.nfc) {
    normalized = nfc(text);
    text = normalized;
  }
  // Each pre-tokenizer stage splits the pieces of the one before and hands its own on, the last
  // to BPE: no stage holds a list of the whole text's pieces (memory bounded on a huge line).
  std::function<void(std::string_view, size_t)> stage = [&](std::string_view p, size_t k) {
    if (k == c.stages.size()) {
      encoder_->encode(p, ids);
      return;
    }
    const PreStage& s = c.stages[k];
    std::string spaced;
    if (s.byte_level && s.add_prefix_space && !p.starts_with(' ')) {
      spaced = " ";
      spaced.append(p);
      p = spaced;
    }
    if (s.use_regex)
      pretokenize_each(s.pattern, p, [&](std::string_view q) { stage(q, k + 1); });
    else
      stage(p, k + 1);
  };
  stage(text, 0);
}

std::string HfTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    auto it = cfg_->added_by_id.find(id);
    if (it != cfg_->added_by_id.end()) {
      out += cfg_->added[it->second].content;
    } else {
      MT_CHECK(cfg_->model->has_id(id), "decode: token id ", id, " is not in ", cfg_->path, " (", cfg_->vocab_size, " ids)");
      out += cfg_->model->bytes_of(id);
    }
  }
  return out;
}

}  // namespace mt::data
