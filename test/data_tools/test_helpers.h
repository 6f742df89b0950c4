// Shared helpers of the data_tools tests: temporary directories, the GPT-2 / corpus file lookup
// with the skip rule, a small byte-level BPE tokenizer.json built in code, and an independent
// reader of Megatron's .idx/.bin written from the format's specification (raw fread).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "catch.h"
#include "core/check.h"
#include "data_tools/bpe.h"

namespace dt_test {

namespace fs = std::filesystem;

// Substring matcher (catch.h maps Catch::Contains onto both Catch2 majors).
inline auto has_text(const std::string& s) { return Catch::Contains(s); }

// A fresh directory under the build tree, removed at the end of the test.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name) {
    path = fs::path(MT_BINARY_DIR) / "test_tmp" / "data_tools" / name;
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& f) const { return (path / f).string(); }
};

// The message of the mt::Error that f throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const mt::Error& e) {
    return e.what();
  }
  return "(no error)";
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// The data folder of the set-up scripts: $MEGATRAIN_DATA_DIR, else data/ of the source tree.
inline std::string data_dir() {
  const char* env = std::getenv("MEGATRAIN_DATA_DIR");
  return env && *env ? std::string(env) : std::string(MT_SOURCE_DIR) + "/data";
}

// Path of a file (relative to data_dir()) made by a set-up script, or "" after a SKIPPED
// message; with MEGATRAIN_REQUIRE_TOKENIZER=1 a missing file fails the test instead.
inline std::string required_file(const std::string& rel, const std::string& script) {
  const std::string path = data_dir() + "/" + rel;
  if (fs::exists(path)) return path;
  const char* req = std::getenv("MEGATRAIN_REQUIRE_TOKENIZER");
  if (req && std::string(req) == "1") FAIL(path << " is missing (MEGATRAIN_REQUIRE_TOKENIZER=1): run " << script);
  WARN("SKIPPED: " << path << " is missing; run " << script << " (set MEGATRAIN_REQUIRE_TOKENIZER=1 to make this fail)");
  return "";
}
inline std::string gpt2_dir() {
  if (required_file("tokenizers/gpt2/encoder.json", "scripts/fetch_gpt2_tokenizer.sh").empty() ||
      required_file("tokenizers/gpt2/vocab.bpe", "scripts/fetch_gpt2_tokenizer.sh").empty())
    return "";
  return data_dir() + "/tokenizers/gpt2";
}

// A small byte-level BPE tokenizer.json: ids 0-255 are the bytes (id = byte value), then the
// merges' results in order, then "xyz" (a token no merge makes), then added tokens
// <|endoftext|> 270, <mask> 271 (lstrip), <|begin_of_text|> 272.
enum class Style { kGpt2, kNeox, kLlama3 };
inline nlohmann::json small_tokenizer_json(Style style) {
  using nlohmann::json;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"},   {"l", "l"},    {"he", "ll"},    {"hell", "o"}, {"Ġ", "w"},     {"o", "r"}, {"Ġw", "or"},
      {"l", "d"},   {"Ġwor", "ld"}, {"3", "4"},      {"'", "M"},    {"Ġ", "hello"}, {"Ã", "©"}};
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[mt::data::bytes_to_token_text(std::string(1, static_cast<char>(b)))] = b;
  int next = 256;
  json jm = json::array();
  for (const auto& [l, r] : merges) {
    vocab[l + r] = next++;
    if (style == Style::kLlama3) jm.push_back(json::array({l, r}));  // the newer [a, b] form
    else jm.push_back(l + " " + r);
  }
  vocab["xyz"] = next++;  // 269
  auto added = [](int id, const std::string& content, bool lstrip, bool special) {
    return json{{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", lstrip}, {"rstrip", false},
                {"normalized", false}, {"special", special}};
  };
  json j = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr},
            {"added_tokens", json::array({added(270, "<|endoftext|>", false, true), added(271, "<mask>", true, false),
                                          added(272, "<|begin_of_text|>", false, true)})},
            {"normalizer", nullptr},
            {"post_processor", nullptr},
            {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
            {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
                       {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
                       {"ignore_merges", style == Style::kLlama3}, {"vocab", vocab}, {"merges", jm}}}};
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", style == Style::kNeox}, {"trim_offsets", true}, {"use_regex", true}};
  if (style == Style::kLlama3) {
    const std::string re =
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    byte_level["use_regex"] = false;
    j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", json::array({
        {{"type", "Split"}, {"pattern", {{"Regex", re}}}, {"behavior", "Isolated"}, {"invert", false}}, byte_level})}};
    j["post_processor"] = {
        {"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", json::array()},
        {"special_tokens", {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {272}}, {"tokens", {"<|begin_of_text|>"}}}}}}};
  } else {
    j["pre_tokenizer"] = byte_level;
  }
  if (style == Style::kNeox) j["normalizer"] = {{"type", "NFC"}};
  return j;
}

// ----------------------------------------------------------------- independent .idx/.bin reader
// Written from the format's specification only (raw fread, little-endian host):
//   magic "MMIDIDX\0\0", uint64 version 1, uint8 dtype code, uint64 S, uint64 D,
//   int32 lengths[S], int64 pointers[S] (byte offsets into .bin), int64 document_indices[D].
struct RawDataset {
  uint8_t dtype_code = 0;
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers, doc_indices;
  std::vector<std::vector<int64_t>> sequences;  // tokens of each sequence
};

inline RawDataset read_raw_dataset(const std::string& prefix) {
  RawDataset d;
  std::FILE* f = std::fopen((prefix + ".idx").c_str(), "rb");
  REQUIRE(f != nullptr);
  char magic[9];
  uint64_t version = 0, S = 0, D = 0;
  REQUIRE(std::fread(magic, 1, 9, f) == 9);
  REQUIRE(std::string(magic, 9) == std::string("MMIDIDX\0\0", 9));
  REQUIRE(std::fread(&version, 8, 1, f) == 1);
  REQUIRE(version == 1);
  REQUIRE(std::fread(&d.dtype_code, 1, 1, f) == 1);
  REQUIRE(std::fread(&S, 8, 1, f) == 1);
  REQUIRE(std::fread(&D, 8, 1, f) == 1);
  d.lengths.resize(S);
  d.pointers.resize(S);
  d.doc_indices.resize(D);
  REQUIRE(std::fread(d.lengths.data(), 4, S, f) == S);
  REQUIRE(std::fread(d.pointers.data(), 8, S, f) == S);
  REQUIRE(std::fread(d.doc_indices.data(), 8, D, f) == D);
  char extra;
  REQUIRE(std::fread(&extra, 1, 1, f) == 0);  // nothing after the document indices
  std::fclose(f);
  const int esize = d.dtype_code == 8 ? 2 : d.dtype_code == 4 ? 4 : 0;
  REQUIRE(esize != 0);  // uint16 or int32 tokens
  const std::string bin = read_file(prefix + ".bin");
  int64_t expect_ptr = 0;
  for (uint64_t i = 0; i < S; ++i) {
    REQUIRE(d.pointers[i] == expect_ptr);
    std::vector<int64_t> seq(static_cast<size_t>(d.lengths[i]));
    for (int32_t k = 0; k < d.lengths[i]; ++k) {
      const size_t at = static_cast<size_t>(d.pointers[i]) + static_cast<size_t>(k) * esize;
      REQUIRE(at + esize <= bin.size());
      if (esize == 2) { uint16_t v; std::memcpy(&v, bin.data() + at, 2); seq[k] = v; }
      else { int32_t v; std::memcpy(&v, bin.data() + at, 4); seq[k] = v; }
    }
    d.sequences.push_back(std::move(seq));
    expect_ptr += static_cast<int64_t>(d.lengths[i]) * esize;
  }
  REQUIRE(static_cast<int64_t>(bin.size()) == expect_ptr);
  return d;
}

}  // namespace dt_test
