// LineReader: lines longer than its buffer, the last line without '\n', byte counts, gzip.
#include <zlib.h>

#include "core/check.h"
#include "data_tools/jsonl_reader.h"
#include "test_helpers.h"

using mt::data::LineReader;

TEST_CASE("LineReader: long lines, counts, plain and gzip alike", "[reader]") {
  dt_test::TempDir dir("reader");
  std::vector<std::string> lines = {"short", "", std::string(3'000'000, 'x'), "crlf\r", std::string(1 << 20, 'y'), "last"};
  std::string text;
  for (size_t i = 0; i < lines.size(); ++i) text += lines[i] + (i + 1 < lines.size() ? "\n" : "");
  dt_test::write_file(dir / "plain.jsonl", text);
  gzFile gz = gzopen((dir / "z.gz").c_str(), "wb");
  gzwrite(gz, text.data(), static_cast<unsigned>(text.size()));
  gzclose(gz);
  for (const std::string name : {"plain.jsonl", "z.gz"}) {
    LineReader r(dir / name);
    std::string_view line;
    size_t n = 0;
    while (r.next(&line)) {
      REQUIRE(n < lines.size());
      CHECK(line == lines[n]);
      CHECK(r.line_number() == static_cast<int64_t>(n + 1));
      ++n;
    }
    CHECK(n == lines.size());
    CHECK(r.bytes_read() == static_cast<int64_t>(text.size()));
    CHECK(r.file_offset() == LineReader::file_size(dir / name));
  }
  CHECK_THROWS_AS(LineReader(dir / "missing.jsonl"), mt::Error);
  dt_test::write_file(dir / "empty.jsonl", "");
  LineReader e(dir / "empty.jsonl");
  std::string_view line;
  CHECK_FALSE(e.next(&line));
}
