// Unicode tables, UTF-8 decoding, NFC and the GPT-2 / Llama-3 pre-tokenizer matchers.
#include <cstdio>
#include <random>

#include "data_tools/pretokenizer.h"
#include "data_tools/unicode.h"
#include "test_helpers.h"

using namespace mt::data;

namespace {
std::vector<std::string> split(PreTokenizerPattern p, const std::string& text) {
  std::vector<std::string_view> views;
  pretokenize(p, text, &views);
  return std::vector<std::string>(views.begin(), views.end());
}
std::string u8(char32_t c) {
  std::string s;
  utf8_append(c, &s);
  return s;
}
}  // namespace

TEST_CASE("char_flags: letters, numbers, White_Space", "[unicode]") {
  CHECK(char_flags('a') == kLetter);
  CHECK(char_flags('7') == kNumber);
  CHECK(char_flags(' ') == kSpace);
  CHECK(char_flags('\x1c') == kOther);  // Python's str.isspace() says yes; \s (White_Space) says no
  CHECK(char_flags('!') == kOther);
  CHECK(char_flags(U'é') == kLetter);
  CHECK(char_flags(U'中') == kLetter);
  CHECK(char_flags(U'ǅ') == kLetter);       // Lt
  CHECK(char_flags(U'\u0663') == kNumber);  // ARABIC-INDIC DIGIT THREE (Nd)
  CHECK(char_flags(U'½') == kNumber);       // No
  CHECK(char_flags(U'Ⅻ') == kNumber);       // Nl
  CHECK(char_flags(U'\u0301') == kOther);   // combining acute (Mn)
  CHECK(char_flags(U'😀') == kOther);
  CHECK(char_flags(U'\U00020000') == kLetter);  // CJK Extension B (a First/Last range)
  // The hand-written non-ASCII White_Space test equals the generated table.
  int spaces = 0;
  for (char32_t c = 0; c < 0x110000; ++c) spaces += (char_flags(c) & kSpace) != 0;
  CHECK(spaces == static_cast<int>(unicode_tables::kNumWhiteSpace));
  for (size_t i = 0; i < unicode_tables::kNumWhiteSpace; ++i) CHECK(char_flags(unicode_tables::kWhiteSpace[i]) == kSpace);
}

TEST_CASE("utf8_decode: valid and invalid sequences", "[unicode]") {
  auto dec = [](const std::string& s, char32_t* cp) {
    auto p = reinterpret_cast<const unsigned char*>(s.data());
    return utf8_decode(p, p + s.size(), cp);
  };
  char32_t cp;
  CHECK(dec("\xF0\x9F\x98\x80", &cp) == 4);
  CHECK(cp == U'😀');
  CHECK(dec("\xC3\xA9", &cp) == 2);
  CHECK(cp == U'é');
  for (const char* bad : {"\x80", "\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xC3", "\xE2\x82", "\xFF"}) {
    CHECK(dec(bad, &cp) == 1);
    CHECK(cp == 0xFFFD);
  }
  CHECK(is_valid_utf8("plain ascii é 😀"));
  CHECK_FALSE(is_valid_utf8("bad \xC3("));
}

TEST_CASE("nfc: composition, reordering, exclusions, Hangul", "[unicode]") {
  CHECK(nfc("e\xCC\x81") == "\xC3\xA9");                      // e + U+0301 -> é
  CHECK(nfc(u8(0x212B)) == u8(0xC5));                         // ANGSTROM SIGN -> Å
  CHECK(nfc(u8(0x1100) + u8(0x1161) + u8(0x11A8)) == u8(0xAC01));  // jamo -> 각
  CHECK(nfc(u8(U'q') + u8(0x307) + u8(0x323)) == u8(U'q') + u8(0x323) + u8(0x307));  // canonical order
  CHECK(nfc(u8(0x958)) == u8(0x915) + u8(0x93C));             // composition exclusion stays decomposed
  CHECK(nfc("plain ascii") == "plain ascii");
}

TEST_CASE("nfc: the Unicode conformance file NormalizationTest.txt", "[unicode]") {
  const char* path = "/usr/share/unicode/NormalizationTest.txt.bz2";
  std::FILE* f = std::filesystem::exists(path) ? popen((std::string("bzcat ") + path + " 2>/dev/null").c_str(), "r") : nullptr;
  if (!f) {
    WARN("SKIPPED: " << path << " not found (Debian package unicode-data)");
    return;
  }
  char buf[4096];
  int lines = 0, failures = 0;
  while (std::fgets(buf, sizeof buf, f)) {
    if (buf[0] == '#' || buf[0] == '@' || buf[0] == '\n') continue;
    std::string cols[5];
    const char* p = buf;
    for (auto& c : cols) {
      while (*p && *p != ';') {
        char* end;
        const unsigned long v = std::strtoul(p, &end, 16);
        if (end == p) { ++p; continue; }
        utf8_append(static_cast<char32_t>(v), &c);
        p = end;
      }
      if (*p == ';') ++p;
    }
    ++lines;
    const bool ok = nfc(cols[0]) == cols[1] && nfc(cols[1]) == cols[1] && nfc(cols[2]) == cols[1] &&
                    nfc(cols[3]) == cols[3] && nfc(cols[4]) == cols[3];
    if (!ok && ++failures <= 3) FAIL_CHECK("NFC mismatch: " << buf);
  }
  pclose(f);
  if (lines == 0) {
    WARN("SKIPPED: bzcat could not read " << path);
    return;
  }
  CHECK(lines > 15000);
  CHECK(failures == 0);
}

TEST_CASE("pretokenize GPT-2: the regex's matches", "[pretokenizer]") {
  using V = std::vector<std::string>;
  const auto g = PreTokenizerPattern::kGpt2;
  CHECK(split(g, "I'm here!\n\n  tabs\tand 123456 numbers") ==
        V{"I", "'m", " here", "!", "\n\n ", " tabs", "\t", "and", " 123456", " numbers"});
  CHECK(split(g, "Hello world") == V{"Hello", " world"});
  CHECK(split(g, "I'M it's 'll'") == V{"I", "'", "M", " it", "'s", " '", "ll", "'"});  // case-sensitive
  CHECK(split(g, "trailing   ") == V{"trailing", "   "});
  CHECK(split(g, "a  b") == V{"a", " ", " b"});
  CHECK(split(g, " ") == V{" "});
  CHECK(split(g, "x\t y") == V{"x", "\t", " y"});
  CHECK(split(g, "caf\xC3\xA9 12\xC2\xBD ...!") == V{"caf\xC3\xA9", " 12\xC2\xBD", " ...!"});
  CHECK(split(g, "e\xCC\x81x") == V{"e", "\xCC\x81", "x"});  // a combining mark is [^\s\p{L}\p{N}]
  CHECK(split(g, "").empty());
}

TEST_CASE("pretokenize Llama-3: the regex's matches", "[pretokenizer]") {
  using V = std::vector<std::string>;
  const auto l = PreTokenizerPattern::kLlama3;
  CHECK(split(l, "I'M 12345\r\n\r\n  x") == V{"I", "'M", " ", "123", "45", "\r\n\r\n", " ", " x"});
  CHECK(split(l, "Hello world") == V{"Hello", " world"});
  CHECK(split(l, "don'T we'Re x'\xC5\xBF") == V{"don", "'T", " we", "'Re", " x", "'\xC5\xBF"});  // (?i), U+017F folds to s
  CHECK(split(l, "(hello) $x") == V{"(hello", ")", " $", "x"});  // [^\r\n\p{L}\p{N}]?\p{L}+
  CHECK(split(l, "$x") == V{"$x"});
  CHECK(split(l, " ...\n\nnext") == V{" ...\n\n", "next"});   //  ?[^\s\p{L}\p{N}]+[\r\n]*
  CHECK(split(l, "a \n b") == V{"a", " \n", " b"});           // \s*[\r\n]+
  CHECK(split(l, "end  ") == V{"end", "  "});
  CHECK(split(l, "\tword") == V{"\tword"});
}

TEST_CASE("pretokenize: pieces cover any input, invalid UTF-8 included", "[pretokenizer]") {
  std::mt19937 rng(7);
  const std::string alphabet[] = {"a", "Z", "1", " ", "  ", "\n", "\r", "\t", "'", "s", "!", "\xC3\xA9", "\xE4\xB8\xAD",
                                  "\xF0\x9F\x98\x80", "\xCC\x81", "\xC2\xA0", "\x80", "\xC3", "'S"};
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text;
    const int n = static_cast<int>(rng() % 24);
    for (int i = 0; i < n; ++i) text += alphabet[rng() % std::size(alphabet)];
    for (auto p : {PreTokenizerPattern::kGpt2, PreTokenizerPattern::kLlama3}) {
      std::string joined;
      for (const auto& piece : split(p, text)) {
        CHECK_FALSE(piece.empty());
        joined += piece;
      }
      REQUIRE(joined == text);
    }
  }
  CHECK(pattern_from_regex(kGpt2Pattern) == PreTokenizerPattern::kGpt2);
  CHECK(pattern_from_regex(kLlama3Pattern) == PreTokenizerPattern::kLlama3);
  CHECK_FALSE(pattern_from_regex("\\w+").has_value());
}

// Issue #20 (memory on one huge line): the pre-tokenizer decodes a window of characters at a time.
// The pieces must be those of one window holding the whole text, for every window size.
TEST_CASE("pretokenize: the pieces do not depend on the decoding window", "[pretokenizer]") {
  std::mt19937 rng(11);
  const std::string alphabet[] = {"a", "bc", "Z", "1", "234", " ", "  ", "   ", "\n", "\r\n", "\t", "'", "s", "'ll",
                                  "!", "?!", "\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "\xC2\xA0", "\x80", "'S"};
  auto pieces = [](PreTokenizerPattern p, const std::string& text, size_t window) {
    std::vector<std::string> out;
    pretokenize_each(p, text, [&](std::string_view v) { out.emplace_back(v); }, window);
    return out;
  };
  int compared = 0;
  for (int iter = 0; iter < 300; ++iter) {
    std::string text;
    const int n = static_cast<int>(rng() % 400);
    // Runs of one kind (long white space, long words) cross window ends most often.
    for (int i = 0; i < n; ++i) {
      const std::string& a = alphabet[rng() % std::size(alphabet)];
      const int reps = rng() % 4 == 0 ? static_cast<int>(rng() % 30) : 1;
      for (int r = 0; r < reps; ++r) text += a;
    }
    for (auto p : {PreTokenizerPattern::kGpt2, PreTokenizerPattern::kLlama3}) {
      const auto whole = pieces(p, text, text.size() + 8);
      for (size_t w : {8u, 9u, 13u, 32u, 100u}) {
        INFO("window " << w << ", text of " << text.size() << " bytes");
        REQUIRE(pieces(p, text, w) == whole);
        ++compared;
      }
    }
  }
  CHECK(compared == 300 * 2 * 5);
}
