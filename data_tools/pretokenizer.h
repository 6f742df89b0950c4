// Pre-tokenization: splitting text into the pieces that BPE then encodes one by one, as the
// regexes of GPT-2 (also Hugging Face's ByteLevel pre-tokenizer, used by GPT-NeoX) and Llama-3
// do with Python `regex` / Oniguruma findall. Hand-written matchers over UTF-8, not std::regex
// (slow, and it has no \p{..}): each follows its regex alternative by alternative, including the
// backtracking of \s+(?!\S) and \s*[\r\n]+. The pieces always cover the whole text.
//   GPT-2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   Llama-3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// \s is the White_Space property, \p{L} / \p{N} the general categories L* / N* (see unicode.h).
#pragma once

#include <functional>
#include <optional>
#include <string_view>
#include <vector>

namespace mt::data {

enum class PreTokenizerPattern { kGpt2, kLlama3 };

// The exact pattern strings, as written in GPT-2's encoder.py and in tokenizer.json files.
extern const std::string_view kGpt2Pattern;
extern const std::string_view kLlama3Pattern;

// The matcher for a regex string from a tokenizer.json, or nullopt when it is not one we know.
std::optional<PreTokenizerPattern> pattern_from_regex(std::string_view regex);
const char* pattern_name(PreTokenizerPattern p);

// Appends the regex's matches in text, left to right, to out (views into text).
void pretokenize(PreTokenizerPattern pattern, std::string_view text, std::vector<std::string_view>* out);
// The same pieces, handed to emit one by one, in memory bounded by a window of characters (and
// the longest piece), whatever the text's length. window: characters decoded at a time (tests
// use small ones; the pieces never depend on it).
void pretokenize_each(PreTokenizerPattern pattern, std::string_view text,
                      const std::function<void(std::string_view)>& emit, size_t window = size_t{1} << 16);

}  // namespace mt::data
