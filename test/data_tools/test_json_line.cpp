// JsonLineParser: what Python's json.loads accepts and rejects, the extracted values, and the
// same strings as nlohmann::json on valid lines.
#include <random>

#include "data_tools/json_line.h"
#include "test_helpers.h"

using mt::data::JsonField;
using mt::data::JsonLineParser;

TEST_CASE("json line: extracted strings, escapes, lists, duplicate keys", "[json]") {
  JsonLineParser p({"text", "title"});
  CHECK(p.parse(R"({"id": 3, "text": "plain", "title": "t", "x": {"text": "nested"}})") == "");
  CHECK(p.fields()[0].kind == JsonField::kString);
  CHECK(p.fields()[0].strings.at(0) == "plain");
  CHECK(p.fields()[1].strings.at(0) == "t");
  CHECK(p.parse(R"({"text": "a\"b\\c\/d\b\f\n\r\t\u00e9\ud83d\ude00", "title": ""})") == "");
  CHECK(p.fields()[0].strings.at(0) == "a\"b\\c/d\b\f\n\r\t\xC3\xA9\xF0\x9F\x98\x80");
  CHECK(p.fields()[1].strings.at(0) == "");
  CHECK(p.parse(R"({"te\u0078t": ["s1", "", "s\n2"], "title": "x", "title": "last"})") == "");
  CHECK(p.fields()[0].kind == JsonField::kStringList);
  CHECK(p.fields()[0].strings == std::vector<std::string_view>{"s1", "", "s\n2"});
  CHECK(p.fields()[1].strings.at(0) == "last");
  CHECK(p.parse("{\"text\": \"caf\xC3\xA9 \xE6\x97\xA5\"}  \r") == "");
  CHECK(p.fields()[0].strings.at(0) == "caf\xC3\xA9 \xE6\x97\xA5");
  CHECK(p.fields()[1].kind == JsonField::kMissing);
  CHECK(p.parse(R"({"text": 1.5e-3, "title": [1]})") == "");
  CHECK(p.fields()[0].kind == JsonField::kOther);
  CHECK(p.fields()[0].other == "a number");
  CHECK(p.fields()[1].other == "a list holding a number");
  CHECK(p.parse(R"({"text": null, "title": {"a": [true, false, NaN, -Infinity, Infinity, -0.0, 12E+4]}})") == "");
  CHECK(p.fields()[0].other == "null");
  CHECK(p.fields()[1].other == "an object");
  CHECK(p.parse(R"({"text": []})") == "");
  CHECK(p.fields()[0].kind == JsonField::kStringList);
  CHECK(p.fields()[0].strings.empty());
  CHECK(p.parse("{}") == "");
}

TEST_CASE("json line: malformed lines are rejected with a column", "[json]") {
  JsonLineParser p({"text"});
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"text": "unterminated)", "column 23: unterminated string"},
      {R"({"text": "a" "b"})", "expected ',' or '}'"},
      {R"({"text": "a",})", "expected a \"key\""},
      {R"({"text" "a"})", "expected ':' after a key"},
      {R"({"text": "a"} x)", "extra data after the JSON object"},
      {R"({"text": 01})", "expected ',' or '}'"},
      {R"({"text": 1.})", "expected a digit after '.'"},
      {R"({"text": tru})", "expected a value"},
      {R"({"text": "\x"})", "invalid escape \\x"},
      {R"({"text": "\u12G4"})", "invalid \\u escape"},
      {R"({"text": "\ud83d"})", "lone UTF-16 surrogate \\ud83d"},
      {R"({"text": "\ude00x"})", "lone UTF-16 surrogate \\ude00"},
      {"{\"text\": \"tab\there\"}", "control character in a string"},
      {"{\"text\": \"bad \xC3(\"}", "invalid UTF-8"},
      {R"({"text": [1, 2})", "expected ',' or ']'"},
      {R"({'text': 1})", "expected a \"key\""},
      {std::string(600, '[') + std::string(600, ']'), "nesting deeper than 500 levels"},
      {R"([1, 2])", "expected a JSON object, got an array"},
      {R"("text")", "expected a JSON object, got a string"},
  };
  for (const auto& [line, what] : bad) {
    INFO(line);
    CHECK_THAT(p.parse(line), dt_test::has_text(what));
  }
}

TEST_CASE("json line: the same strings as nlohmann::json on generated lines", "[json]") {
  std::mt19937 rng(11);
  const std::vector<std::string> pieces = {"a", " ", "\"", "\\", "/", "\n", "\t", "\x01", "\xC3\xA9", "\xF0\x9F\x98\x80",
                                           "\xE2\x80\xA8", "{", "}", "[", "]", ",", ":", "0", "x"};
  JsonLineParser p({"text", "meta"});
  for (int i = 0; i < 500; ++i) {
    std::string text, meta;
    for (int k = static_cast<int>(rng() % 20); k > 0; --k) text += pieces[rng() % pieces.size()];
    for (int k = static_cast<int>(rng() % 5); k > 0; --k) meta += pieces[rng() % pieces.size()];
    nlohmann::json j = {{"text", text}, {"n", static_cast<int>(rng() % 1000) - 500}, {"meta", {meta, "m2"}},
                        {"obj", {{"k", nullptr}, {"f", 0.25}, {"b", true}}}};
    const std::string line = j.dump(rng() % 2 ? -1 : 1, ' ', rng() % 2 == 0);  // with and without \u escapes
    INFO(line);
    REQUIRE(p.parse(line) == "");
    CHECK(p.fields()[0].strings.at(0) == text);
    CHECK(p.fields()[1].strings == std::vector<std::string_view>{meta, "m2"});
  }
}
