// JsonLineParser: recursive descent over one line, values of other keys validated and skipped.
#include "data_tools/json_line.h"

#include <cstring>

#include "data_tools/unicode.h"

namespace mt::data {

namespace {
constexpr int kMaxDepth = 500;

bool is_digit(char c) { return c >= '0' && c <= '9'; }

int hex4(const char* p) {
  int v = 0;
  for (int i = 0; i < 4; ++i) {
    const char c = p[i];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= c - '0';
    else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
    else return -1;
  }
  return v;
}
}  // namespace

struct JsonLineParser::Cursor {
  const char* begin;
  const char* p;
  const char* end;
  std::string error;
  bool fail(const std::string& what) {
    if (error.empty()) error = "column " + std::to_string(p - begin + 1) + ": " + what;
    return false;
  }
  void ws() {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) ++p;
  }
  bool literal(const char* word) {
    const size_t n = std::strlen(word);
    if (static_cast<size_t>(end - p) < n || std::memcmp(p, word, n) != 0) return false;
    p += n;
    return true;
  }
};

JsonLineParser::JsonLineParser(std::vector<std::string> keys) : keys_(std::move(keys)), fields_(keys_.size()) {}

bool JsonLineParser::parse_string(Cursor& c, std::string_view* out) {
  ++c.p;  // the opening quote
  const char* start = c.p;
  std::string* buf = nullptr;
  for (;;) {
    const char* q = c.p;
    while (q < c.end) {  // the plain run up to a quote, backslash, control or non-ASCII byte
      const unsigned char ch = static_cast<unsigned char>(*q);
      if (ch == '"' || ch == '\\' || ch < 0x20 || ch >= 0x80) break;
      ++q;
    }
    if (buf) buf->append(c.p, q);
    c.p = q;
    if (c.p >= c.end) return c.fail("unterminated string");
    const unsigned char ch = static_cast<unsigned char>(*c.p);
    if (ch == '"') {
      if (out) *out = buf ? std::string_view(*buf) : std::string_view(start, c.p - start);
      ++c.p;
      return true;
    }
    if (ch < 0x20) return c.fail("control character in a string (escape it)");
    if (ch >= 0x80) {
      char32_t cp;
      const int n = utf8_decode(reinterpret_cast<const unsigned char*>(c.p), reinterpret_cast<const unsigned char*>(c.end), &cp);
      if (cp == 0xFFFD && n == 1) return c.fail("invalid UTF-8");
      if (buf) buf->append(c.p, static_cast<size_t>(n));
      c.p += n;
      continue;
    }
    // A backslash escape: from here on the string is built in a buffer.
    if (!buf && out) {
      buf = &unescaped_.emplace_back(start, c.p);
    }
    if (c.end - c.p < 2) return c.fail("unterminated string");
    const char e = c.p[1];
    char32_t cp = 0;
    switch (e) {
      case '"': case '\\': case '/': cp = static_cast<char32_t>(e); break;
      case 'b': cp = '\b'; break;
      case 'f': cp = '\f'; break;
      case 'n': cp = '\n'; break;
      case 'r': cp = '\r'; break;
      case 't': cp = '\t'; break;
      case 'u': {
        const int hi = c.end - c.p >= 6 ? hex4(c.p + 2) : -1;
        if (hi < 0) return c.fail("invalid \\u escape");
        cp = static_cast<char32_t>(hi);
        if (hi >= 0xD800 && hi <= 0xDBFF) {
          const int lo = (c.end - c.p >= 12 && c.p[6] == '\\' && c.p[7] == 'u') ? hex4(c.p + 8) : -1;
          if (lo < 0xDC00 || lo > 0xDFFF) return c.fail("lone UTF-16 surrogate \\u" + std::string(c.p + 2, 4));
          cp = 0x10000 + ((static_cast<char32_t>(hi) - 0xD800) << 10) + (static_cast<char32_t>(lo) - 0xDC00);
          c.p += 6;
        } else if (hi >= 0xDC00 && hi <= 0xDFFF) {
          return c.fail("lone UTF-16 surrogate \\u" + std::string(c.p + 2, 4));
        }
        c.p += 4;
        break;
      }
      default: return c.fail(std::string("invalid escape \\") + e);
    }
    c.p += 2;
    if (buf) utf8_append(cp, buf);
  }
}

// Parses one value. field (for a requested key) records strings or what the value is instead.
bool JsonLineParser::parse_value(Cursor& c, int depth, JsonField* field) {
  if (depth > kMaxDepth) return c.fail("nesting deeper than 500 levels");
  c.ws();
  if (c.p >= c.end) return c.fail("expected a value, got the end of the line");
  auto other = [&](const char* what) {
    if (field) { field->kind = JsonField::kOther; field->other = what; }
    return true;
  };
  const char ch = *c.p;
  if (ch == '"') {
    std::string_view s;
    if (!parse_string(c, field ? &s : nullptr)) return false;
    if (field) { field->kind = JsonField::kString; field->strings.assign(1, s); }
    return true;
  }
  if (ch == '{' || ch == '[') {
    const bool object = ch == '{';
    const char close = object ? '}' : ']';
    const bool list_field = field && !object;
    if (list_field) { field->kind = JsonField::kStringList; field->strings.clear(); }
    ++c.p;
    c.ws();
    if (c.p < c.end && *c.p == close) { ++c.p; return object ? other("an object") : true; }
    for (;;) {
      c.ws();
      if (object) {
        if (c.p >= c.end || *c.p != '"') return c.fail("expected a \"key\"");
        if (!parse_string(c, nullptr)) return false;
        c.ws();
        if (c.p >= c.end || *c.p != ':') return c.fail("expected ':' after a key");
        ++c.p;
        if (!parse_value(c, depth + 1, nullptr)) return false;
      } else if (list_field && c.p < c.end && *c.p == '"') {
        std::string_view s;
        if (!parse_string(c, &s)) return false;
        if (field->kind == JsonField::kStringList) field->strings.push_back(s);
      } else {
        JsonField elem;
        if (!parse_value(c, depth + 1, list_field ? &elem : nullptr)) return false;
        if (list_field && field->kind == JsonField::kStringList) {
          field->kind = JsonField::kOther;
          field->other = "a list holding " + (elem.kind == JsonField::kStringList ? std::string("a list") : elem.other);
        }
      }
      c.ws();
      if (c.p < c.end && *c.p == ',') { ++c.p; continue; }
      if (c.p < c.end && *c.p == close) { ++c.p; break; }
      return c.fail(object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
    return object ? other("an object") : true;
  }
  if (c.literal("true") || c.literal("false")) return other("a boolean");
  if (c.literal("null")) return other("null");
  if (c.literal("NaN") || c.literal("Infinity") || c.literal("-Infinity")) return other("a number");
  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?
  const char* q = c.p;
  if (q < c.end && *q == '-') ++q;
  if (q < c.end && *q == '0') {
    ++q;
  } else if (q < c.end && is_digit(*q)) {
    while (q < c.end && is_digit(*q)) ++q;
  } else {
    return c.fail("expected a value");
  }
  if (q < c.end && *q == '.') {
    ++q;
    if (q >= c.end || !is_digit(*q)) { c.p = q; return c.fail("expected a digit after '.'"); }
    while (q < c.end && is_digit(*q)) ++q;
  }
  if (q < c.end && (*q == 'e' || *q == 'E')) {
    ++q;
    if (q < c.end && (*q == '+' || *q == '-')) ++q;
    if (q >= c.end || !is_digit(*q)) { c.p = q; return c.fail("expected a digit in the exponent"); }
    while (q < c.end && is_digit(*q)) ++q;
  }
  c.p = q;
  return other("a number");
}

std::string JsonLineParser::parse(std::string_view line) {
  unescaped_.clear();
  for (JsonField& f : fields_) { f.kind = JsonField::kMissing; f.strings.clear(); f.other.clear(); }
  Cursor c{line.data(), line.data(), line.data() + line.size(), {}};
  c.ws();
  if (c.p >= c.end) return "the line is empty";
  if (*c.p != '{') {
    const char first = *c.p;
    if (!parse_value(c, 0, nullptr)) return c.error;
    c.ws();
    if (c.p != c.end) { c.fail("extra data after the JSON value"); return c.error; }
    return std::string("expected a JSON object, got ") + (first == '[' ? "an array" : first == '"' ? "a string"
                                                          : first == 't' || first == 'f' ? "a boolean"
                                                          : first == 'n' ? "null" : "a number");
  }
  ++c.p;
  c.ws();
  if (c.p < c.end && *c.p == '}') {
    ++c.p;
  } else {
    for (;;) {
      c.ws();
      if (c.p >= c.end || *c.p != '"') { c.fail("expected a \"key\""); return c.error; }
      std::string_view key;
      if (!parse_string(c, &key)) return c.error;
      c.ws();
      if (c.p >= c.end || *c.p != ':') { c.fail("expected ':' after a key"); return c.error; }
      ++c.p;
      JsonField* field = nullptr;
      for (size_t k = 0; k < keys_.size(); ++k)
        if (keys_[k] == key) field = &fields_[k];  // a repeated key: the last value wins
      if (!parse_value(c, 1, field)) return c.error;
      c.ws();
      if (c.p < c.end && *c.p == ',') { ++c.p; continue; }
      if (c.p < c.end && *c.p == '}') { ++c.p; break; }
      c.fail("expected ',' or '}'");
      return c.error;
    }
  }
  c.ws();
  if (c.p != c.end) { c.fail("extra data after the JSON object"); return c.error; }
  return "";
}

}  // namespace mt::data
