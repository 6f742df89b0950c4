// Tokenizers: GPT-2 test vectors and corpus round trip, GPT-2 files as a tokenizer.json, the
// Hugging Face pipeline on a small tokenizer.json in three styles, the BPE cache, load errors.
// Expected ids of the small tokenizer were produced by Hugging Face `tokenizers` 0.23.2 (npm
// package `tokenizers`, the Rust library) from the same JSON.
#include "data_tools/bpe.h"
#include "data_tools/gpt2_tokenizer.h"
#include "data_tools/hf_tokenizer.h"
#include "data_tools/tokenizer.h"
#include "core/check.h"
#include "test_helpers.h"

using namespace mt::data;
using dt_test::error_of;
using dt_test::TempDir;
using Ids = std::vector<int32_t>;

namespace {

const std::vector<std::pair<std::string, Ids>> kGpt2Vectors = {
    {"Hello world", {15496, 995}},
    {" The quick brown fox jumps over the lazy dog.", {383, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13}},
    {"I'm here!\n\n  tabs\tand 123456 numbers", {40, 1101, 994, 0, 628, 220, 22524, 197, 392, 17031, 29228, 3146}},
};

std::unique_ptr<Tokenizer> gpt2(const std::string& dir) {
  return make_tokenizer({"gpt2-bpe", dir + "/encoder.json", dir + "/vocab.bpe", "", "", true});
}

std::unique_ptr<Tokenizer> hf(const std::string& path, bool special = true) {
  return make_tokenizer({"hf-json", "", "", path, "", special});
}


}  // namespace

TEST_CASE("gpt2-bpe: GPT-2 test vectors", "[tokenizer]") {
  const std::string dir = dt_test::gpt2_dir();
  if (dir.empty()) return;
  auto tok = gpt2(dir);
  CHECK(tok->vocab_size() == 50257);
  CHECK(tok->eod_id() == 50256);
  for (const auto& [text, ids] : kGpt2Vectors) {
    CHECK(tok->encode(text) == ids);
    CHECK(tok->decode(ids) == text);
  }
  // <|endoftext|> in text is plain text for GPT-2's encoder (and Megatron's GPT2BPETokenizer).
  CHECK(tok->encode("<|endoftext|>") == Ids{27, 91, 437, 1659, 5239, 91, 29});
  CHECK(tok->decode(Ids{50256}) == "<|endoftext|>");
  CHECK_THROWS_AS(tok->decode(Ids{50257}), mt::Error);
}

TEST_CASE("gpt2-bpe: decode(encode(x)) == x over the whole bible corpus", "[tokenizer]") {
  const std::string dir = dt_test::gpt2_dir();
  if (dir.empty()) return;
  const std::string corpus = dt_test::required_file("corpus/bible_kjv.jsonl", "scripts/make_corpus_jsonl.sh");
  if (corpus.empty()) return;
  auto tok = gpt2(dir);
  auto clone = tok->clone();  // a clone shares the model and gives the same ids
  std::ifstream f(corpus);
  std::string line;
  int docs = 0, mismatches = 0;
  int64_t tokens = 0;
  while (std::getline(f, line)) {
    const std::string text = nlohmann::json::parse(line).at("text").get<std::string>();
    const Ids ids = tok->encode(text);
    tokens += static_cast<int64_t>(ids.size());
    if (tok->decode(ids) != text) ++mismatches;
    if (docs % 100 == 0) CHECK(clone->encode(text) == ids);
    ++docs;
  }
  CHECK(docs == 1189);
  CHECK(mismatches == 0);
  CHECK(tokens > 1000000);
}

TEST_CASE("hf-json: GPT-2's files as a tokenizer.json give the gpt2-bpe ids", "[tokenizer]") {
  const std::string dir = dt_test::gpt2_dir();
  if (dir.empty()) return;
  TempDir tmp("hf_gpt2");
  // What Hugging Face's GPT-2 tokenizer.json holds: the vocabulary, the merges, a ByteLevel
  // pre-tokenizer and decoder, <|endoftext|> as an added special token.
  nlohmann::json j;
  j["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
                {"end_of_word_suffix", ""}, {"fuse_unk", false},
                {"vocab", nlohmann::json::parse(dt_test::read_file(dir + "/encoder.json"))}};
  std::vector<size_t> lines;
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [l, r] : read_gpt2_merges(dir + "/vocab.bpe", &lines)) merges.push_back(l + " " + r);
  j["model"]["merges"] = merges;
  j["added_tokens"] = {{{"id", 50256}, {"content", "<|endoftext|>"}, {"single_word", false}, {"lstrip", false},
                        {"rstrip", false}, {"normalized", true}, {"special", true}}};
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  j["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  dt_test::write_file(tmp / "tokenizer.json", j.dump());
  auto h = hf(tmp / "tokenizer.json");
  auto g = gpt2(dir);
  CHECK(h->vocab_size() == 50257);
  CHECK(h->eod_id() == 50256);
  for (const auto& [text, ids] : kGpt2Vectors) {
    CHECK(h->encode(text) == ids);
    CHECK(h->decode(ids) == text);
  }
  const std::string mixed = "naïve café 日本語 😀 I'M 1234567 \t\n  x";
  CHECK(h->encode(mixed) == g->encode(mixed));
  CHECK(h->encode("a<|endoftext|>b") == Ids{64, 50256, 65});  // an added token, unlike gpt2-bpe
}

TEST_CASE("hf-json: small tokenizer.json in GPT-2, NeoX and Llama-3 styles (ids from HF tokenizers)", "[tokenizer]") {
  TempDir tmp("hf_small");
  const std::vector<std::string> texts = {"hello world",      "hello<|endoftext|>world", "I'M 12345",
                                          "e\u0301 caf\u00e9", "a <mask> b",               "xyz hello",
                                          "  hello\n\n world  ", "<|begin_of_text|>hello"};
  struct Style {
    dt_test::Style style;
    const char* name;
    std::vector<Ids> expect;
  };
  const std::vector<Style> styles = {
      {dt_test::Style::kGpt2, "gpt2",  // ByteLevel pre-tokenizer (GPT-2's regex)
       {{259, 264}, {259, 270, 119, 261, 263}, {73, 39, 77, 32, 49, 50, 265, 53}, {101, 204, 129, 32, 99, 97, 102, 268},
        {97, 271, 32, 98}, {120, 121, 122, 267}, {32, 267, 10, 10, 264, 32, 32}, {272, 259}}},
      {dt_test::Style::kNeox, "neox",  // NFC normalizer, ByteLevel with add_prefix_space (per segment)
       {{267, 264}, {267, 270, 264}, {32, 73, 39, 77, 32, 49, 50, 265, 53}, {32, 268, 32, 99, 97, 102, 268},
        {32, 97, 271, 32, 98}, {32, 120, 121, 122, 267}, {32, 267, 10, 10, 264, 32, 32}, {272, 267}}},
      {dt_test::Style::kLlama3, "llama3",  // Split(Llama-3 regex) + ByteLevel, ignore_merges, BOS template
       {{272, 259, 264}, {272, 259, 270, 119, 261, 263}, {272, 73, 266, 32, 49, 50, 51, 52, 53},
        {272, 101, 204, 129, 32, 99, 97, 102, 268}, {272, 97, 271, 32, 98}, {272, 269, 267},
        {272, 32, 267, 10, 10, 264, 32, 32}, {272, 272, 259}}},
  };
  for (const Style& s : styles) {
    const std::string path = tmp / (std::string(s.name) + ".json");
    dt_test::write_file(path, dt_test::small_tokenizer_json(s.style).dump());
    auto tok = hf(path);
    INFO(s.name << ": " << tok->describe());
    CHECK(tok->vocab_size() == 273);
    CHECK(tok->eod_id() == 270);
    for (size_t i = 0; i < texts.size(); ++i) {
      INFO("text " << i << ": " << texts[i]);
      CHECK(tok->encode(texts[i]) == s.expect[i]);
    }
  }
  // Without the post-processor template; decoding gives added tokens their content.
  auto llama = hf(tmp / "llama3.json", /*special=*/false);
  CHECK(llama->encode("hello world") == Ids{259, 264});
  CHECK(llama->decode(Ids{272, 259, 270, 264}) == "<|begin_of_text|>hello<|endoftext|> world");
  CHECK(llama->decode(Ids{268}) == "\xC3\xA9");
  CHECK_THROWS_AS(llama->decode(Ids{273}), mt::Error);
  // Round trip for text without prefix-space or normalization effects.
  auto plain = hf(tmp / "gpt2.json");
  for (const std::string t : {"hello world", "  hello\n\n world  ", "\xF0\x9F\x98\x80 x\ty", "hello<|endoftext|>world"})
    CHECK(plain->decode(plain->encode(t)) == t);
}

TEST_CASE("hf-json: EOD choice, --eod-token, int32-size vocabularies", "[tokenizer]") {
  TempDir tmp("hf_eod");
  auto j = dt_test::small_tokenizer_json(dt_test::Style::kGpt2);
  j["added_tokens"].push_back({{"id", 70000}, {"content", "<big>"}, {"special", true}});
  dt_test::write_file(tmp / "t.json", j.dump());
  auto tok = make_tokenizer({"hf-json", "", "", tmp / "t.json", "<big>", true});
  CHECK(tok->eod_id() == 70000);
  CHECK(tok->vocab_size() == 70001);
  CHECK(tok->encode("a<big>") == Ids{97, 70000});
  const std::string err = error_of([&] { make_tokenizer({"hf-json", "", "", tmp / "t.json", "<nope>", true}); });
  CHECK_THAT(err, dt_test::has_text("--eod-token \"<nope>\" is not a token"));
}

TEST_CASE("tokenizer errors name the file and the fix", "[tokenizer]") {
  TempDir tmp("tok_errors");
  CHECK_THAT(error_of([&] { make_tokenizer({"gpt2-bpe", tmp / "none.json", tmp / "none.bpe", "", "", true}); }),
             dt_test::has_text("none.json: cannot open") && dt_test::has_text("fetch_gpt2_tokenizer.sh"));
  CHECK_THAT(error_of([&] { make_tokenizer({"sentencepiece", "", "", "", "", true}); }),
             dt_test::has_text("use gpt2-bpe or hf-json"));
  // A bad merge line is named by file:line.
  nlohmann::json enc;
  for (int b = 0; b < 256; ++b) enc[bytes_to_token_text(std::string(1, static_cast<char>(b)))] = b;
  enc["<|endoftext|>"] = 256;
  dt_test::write_file(tmp / "encoder.json", enc.dump());
  dt_test::write_file(tmp / "vocab.bpe", "#version: 0.2\na b\nthree tokens here\n");
  CHECK_THAT(error_of([&] { Gpt2Tokenizer(tmp / "encoder.json", tmp / "vocab.bpe"); }),
             dt_test::has_text("vocab.bpe:3: expected a merge"));
  dt_test::write_file(tmp / "vocab.bpe", "#version: 0.2\na b\n");  // "ab" is not in the vocabulary
  CHECK_THAT(error_of([&] { Gpt2Tokenizer(tmp / "encoder.json", tmp / "vocab.bpe"); }),
             dt_test::has_text("vocab.bpe:2: merge \"a b\": the merged token \"ab\" is not in the vocabulary"));
  // Unsupported tokenizer.json parts are named by their key.
  auto j = dt_test::small_tokenizer_json(dt_test::Style::kGpt2);
  j["normalizer"] = {{"type", "Lowercase"}};
  dt_test::write_file(tmp / "t.json", j.dump());
  CHECK_THAT(error_of([&] { hf(tmp / "t.json"); }), dt_test::has_text("normalizer type \"Lowercase\" is not supported"));
  j = dt_test::small_tokenizer_json(dt_test::Style::kGpt2);
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Isolated"}};
  dt_test::write_file(tmp / "t.json", j.dump());
  CHECK_THAT(error_of([&] { hf(tmp / "t.json"); }), dt_test::has_text("pre_tokenizer: Split regex"));
  j = dt_test::small_tokenizer_json(dt_test::Style::kGpt2);
  j["model"]["type"] = "WordPiece";
  dt_test::write_file(tmp / "t.json", j.dump());
  CHECK_THAT(error_of([&] { hf(tmp / "t.json"); }), dt_test::has_text("only BPE models are supported"));
}

TEST_CASE("BPE engine: lowest rank first, leftmost on ties; bounded cache", "[tokenizer][bpe]") {
  std::vector<std::string> texts;
  for (int b = 0; b < 256; ++b) texts.push_back(bytes_to_token_text(std::string(1, static_cast<char>(b))));
  texts.push_back("aa");   // 256
  texts.push_back("ab");   // 257
  texts.push_back("aab");  // 258
  const std::vector<std::pair<std::string, std::string>> merges = {{"a", "b"}, {"a", "a"}, {"a", "ab"}, {"aa", "b"}};
  auto model = std::make_shared<const BpeModel>(texts, merges, false, "test", [](size_t i) { return std::to_string(i); });
  BpeEncoder enc(model, /*cache_capacity=*/4);
  auto run = [&](const std::string& s) {
    Ids ids;
    enc.encode(s, &ids);
    return ids;
  };
  CHECK(run("aab") == Ids{258});             // "a b" (rank 0) first, then "a ab" (rank 2)
  CHECK(run("aaa") == Ids{256, 'a'});        // "a a" leftmost
  CHECK(run("aaaa") == Ids{256, 256});
  CHECK(run("ba") == Ids{'b', 'a'});
  for (int i = 0; i < 100; ++i) {
    const std::string s = "aab" + std::to_string(i);
    CHECK(run(s) == run(s));
    CHECK(enc.cache_size() <= 4);
  }
  // A long piece (not cached) of 20,000 bytes.
  const Ids big = run(std::string(20000, 'a'));
  CHECK(big == Ids(10000, 256));
  CHECK(byte_to_unicode(' ') == U'Ġ');
  CHECK(unicode_to_byte(U'Ġ') == ' ');
  std::string raw;
  CHECK(token_text_to_bytes("Ġhello", &raw));
  CHECK(raw == " hello");
}

TEST_CASE("tokenizer flags the chosen tokenizer does not read are refused, naming the flag and the fix", "[tokenizer]") {
  using mt::data::check_tokenizer_flags;
  using mt::data::TokenizerOptions;
  const auto err = [](const TokenizerOptions& o) { return error_of([&] { check_tokenizer_flags(o, "--tokenizer"); }); };
  // each tokenizer with its own flags: fine
  check_tokenizer_flags({"gpt2-bpe", "e.json", "v.bpe", "", "", true}, "--tokenizer");
  check_tokenizer_flags({"hf-json", "", "", "t.json", "<eos>", false}, "--tokenizer");
  check_tokenizer_flags({"", "", "", "", "", true}, "--tokenizer");
  CHECK_THAT(err({"hf-json", "e.json", "", "t.json", "", true}),
             dt_test::has_text("--vocab-file is read by the gpt2-bpe tokenizer, not hf-json; remove --vocab-file or "
                               "use --tokenizer gpt2-bpe"));
  CHECK_THAT(err({"hf-json", "", "v.bpe", "t.json", "", true}), dt_test::has_text("--merge-file is read by the gpt2-bpe"));
  CHECK_THAT(err({"gpt2-bpe", "e.json", "v.bpe", "t.json", "", true}),
             dt_test::has_text("--tokenizer-file is read by the hf-json tokenizer, not gpt2-bpe"));
  CHECK_THAT(err({"gpt2-bpe", "e.json", "v.bpe", "", "<eos>", true}), dt_test::has_text("--eod-token is read by the hf-json"));
  CHECK_THAT(err({"gpt2-bpe", "e.json", "v.bpe", "", "", false}),
             dt_test::has_text("--no-add-special-tokens is read by the hf-json"));
  CHECK_THAT(err({"", "e.json", "", "", "", true}),
             dt_test::has_text("--vocab-file is read by the gpt2-bpe tokenizer but no tokenizer was chosen; add "
                               "--tokenizer gpt2-bpe or remove --vocab-file"));
}
