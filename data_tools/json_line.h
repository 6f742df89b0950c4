// A fast, strict parser for one JSONL line that extracts only the requested top-level keys.
// It accepts what Python's json.loads accepts (Megatron's preprocess_data.py reads lines with
// it): RFC 8259 JSON plus NaN / Infinity / -Infinity, duplicate keys (the last one wins); and
// it rejects the same: control characters in strings, trailing data, invalid UTF-8. A lone
// UTF-16 surrogate escape is rejected too (Python accepts it but then cannot encode the text).
// Strings without escapes are returned as views into the line (no copy).
#pragma once

#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace mt::data {

struct JsonField {
  enum Kind { kMissing, kString, kStringList, kOther };
  Kind kind = kMissing;
  std::vector<std::string_view> strings;  // kString: one; kStringList: each element
  std::string other;                      // kOther: what it is ("a number", "a list holding null", ...)
};

class JsonLineParser {
 public:
  explicit JsonLineParser(std::vector<std::string> keys);
  // Parses line (which must outlive the returned views); "" on success, else the error
  // ("column 17: unterminated string"). fields()[k] describes keys[k].
  std::string parse(std::string_view line);
  const std::vector<JsonField>& fields() const { return fields_; }

 private:
  struct Cursor;
  bool parse_value(Cursor& c, int depth, JsonField* field);
  bool parse_string(Cursor& c, std::string_view* out);

  std::vector<std::string> keys_;
  std::vector<JsonField> fields_;
  std::deque<std::string> unescaped_;
};

}  // namespace mt::data
