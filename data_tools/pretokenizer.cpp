// Hand-written matchers for the GPT-2 and Llama-3 pre-tokenizer regexes (see pretokenizer.h).
// Text is decoded once into Char records; each matcher returns the end of the match starting at
// position i, trying the regex alternatives in order as a backtracking regex engine would.
#include "data_tools/pretokenizer.h"

#include <algorithm>
#include <cstddef>
#include <functional>

#include "core/check.h"
#include "data_tools/unicode.h"

namespace mt::data {

const std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::optional<PreTokenizerPattern> pattern_from_regex(std::string_view regex) {
  if (regex == kGpt2Pattern) return PreTokenizerPattern::kGpt2;
  if (regex == kLlama3Pattern) return PreTokenizerPattern::kLlama3;
  return std::nullopt;
}

const char* pattern_name(PreTokenizerPattern p) { return p == PreTokenizerPattern::kGpt2 ? "gpt2" : "llama3"; }

namespace {

struct Char {
  uint32_t off;  // byte offset in the text
  char32_t cp;
  uint8_t f;     // CharFlags
};

bool is_l(const Char& c) { return c.f & kLetter; }
bool is_n(const Char& c) { return c.f & kNumber; }
bool is_s(const Char& c) { return c.f & kSpace; }
bool is_other(const Char& c) { return c.f == kOther; }
bool is_crlf(const Char& c) { return c.cp == '\r' || c.cp == '\n'; }

// End of the run of characters satisfying pred starting at i.
template <typename Pred>
size_t run(const Char* c, size_t i, size_t n, Pred pred) {
  while (i < n && pred(c[i])) ++i;
  return i;
}

// 's|'t|'re|'ve|'m|'ll|'d at i; returns the end or 0. Case-insensitive (Unicode simple case
// folding, where U+017F LONG S folds to 's') when fold is set.
size_t contraction(const Char* c, size_t i, size_t n, bool fold) {
  if (c[i].cp != '\'' || i + 1 >= n) return 0;
  auto low = [&](size_t k) -> char32_t {
    if (k >= n) return 0;
    char32_t x = c[k].cp;
    if (!fold) return x;
    if (x >= 'A' && x <= 'Z') return x + 32;
    return x == 0x17F ? U's' : x;
  };
  const char32_t a = low(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
  const char32_t b = low(i + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  return 0;
}

// \s+(?!\S) then \s+, for a white-space character at i.
size_t trailing_space(const Char* c, size_t i, size_t n) {
  const size_t e = run(c, i, n, is_s);
  if (e == n || e - i < 2) return e;  // all of it (at the end of text), or \s+ of one character
  return e - 1;                       // backtrack one: leave the last space to the next word
}

size_t match_gpt2(const Char* c, size_t i, size_t n) {
  if (size_t e = contraction(c, i, n, false)) return e;
  const size_t k = (c[i].cp == ' ' && i + 1 < n) ? i + 1 : i;  // the optional leading space
  if (is_l(c[k])) return run(c, k, n, is_l);
  if (is_n(c[k])) return run(c, k, n, is_n);
  if (is_other(c[k])) return run(c, k, n, is_other);
  // Here c[i] is white space (a lone ' ' before white space, or any other space character).
  return trailing_space(c, i, n);
}

size_t match_llama3(const Char* c, size_t i, size_t n) {
  if (size_t e = contraction(c, i, n, true)) return e;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (!is_l(c[i]) && !is_n(c[i]) && !is_crlf(c[i]) && i + 1 < n && is_l(c[i + 1])) return run(c, i + 1, n, is_l);
  if (is_l(c[i])) return run(c, i, n, is_l);
  // \p{N}{1,3}
  if (is_n(c[i])) {
    size_t e = i;
    while (e < n && e - i < 3 && is_n(c[e])) ++e;
    return e;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  const size_t k = (c[i].cp == ' ' && i + 1 < n) ? i + 1 : i;
  if (is_other(c[k])) return run(c, run(c, k, n, is_other), n, is_crlf);
  // \s*[\r\n]+ : up to the last CR/LF of the white-space run
  const size_t e = run(c, i, n, is_s);
  for (size_t j = e; j > i; --j)
    if (is_crlf(c[j - 1])) return j;
  return trailing_space(c, i, n);
}

}  // namespace

// Decodes the text a window of characters at a time (memory bounded by the window and the longest
// piece, not by the text: one 50 MB line used to take 12 bytes per character here). A match is
// kept only when the window cannot have changed it: the matchers read forward from i only, and
// what decides a match's end is the run of white space after it (\s+(?!\S), \s*[\r\n]+) and a
// few characters more; otherwise the unmatched rest moves to the front and the window refills.
void pretokenize_each(PreTokenizerPattern pattern, std::string_view text,
                      const std::function<void(std::string_view)>& emit, size_t window) {
  if (text.empty()) return;
  MT_CHECK(text.size() < (size_t{1} << 32), "pre-tokenizer: a text of ", text.size(),
           " bytes is over the 4 GiB limit of one document; split the document");
  const size_t kWindow = std::max<size_t>(window, 8);  // characters
  constexpr size_t kMargin = 4;                        // characters past a match that may decide it
  std::vector<Char> chars;  // not thread_local: pre-tokenizer stages nest (hf_tokenizer.cpp)
  auto p = reinterpret_cast<const unsigned char*>(text.data());
  auto end = p + text.size();
  auto q = p;  // next byte to decode
  size_t want = kWindow;
  for (;;) {
    while (q < end && chars.size() < want) {
      Char ch;
      ch.off = static_cast<uint32_t>(q - p);
      q += utf8_decode(q, end, &ch.cp);
      ch.f = char_flags(ch.cp);
      chars.push_back(ch);
    }
    const bool last = q == end;
    const size_t n = chars.size();
    chars.push_back(Char{static_cast<uint32_t>(q - p), 0, kOther});  // sentinel: offset of the window's end
    const Char* c = chars.data();
    size_t i = 0;
    while (i < n) {
      const size_t e = pattern == PreTokenizerPattern::kGpt2 ? match_gpt2(c, i, n) : match_llama3(c, i, n);
      if (!last) {
        size_t j = e;
        while (j < n && is_s(c[j])) ++j;
        if (j + kMargin > n) break;  // the window's end may change this match: refill first
      }
      emit(text.substr(c[i].off, c[e].off - c[i].off));
      i = e;
    }
    chars.pop_back();
    if (last) break;
    chars.erase(chars.begin(), chars.begin() + static_cast<std::ptrdiff_t>(i));
    want = i == 0 ? 2 * want : kWindow;  // one piece longer than the window: widen it
    want = std::max(want, chars.size() + kWindow / 2);
  }
}

void pretokenize(PreTokenizerPattern pattern, std::string_view text, std::vector<std::string_view>* out) {
  pretokenize_each(pattern, text, [out](std::string_view piece) { out->push_back(piece); });
}

}  // namespace mt::data
