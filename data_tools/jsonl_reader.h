// Line reader for JSONL inputs: plain text or gzip (detected from the content, so a .gz name is
// not required), "-" for stdin. Lines come without their '\n', numbered from 1; the line counter
// and the compressed-byte offset support error messages ("FILE:LINE: ...") and progress / ETA.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace mt::data {

class LineReader {
 public:
  explicit LineReader(const std::string& path);  // throws mt::Error when it cannot be opened
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line (a view valid until the next call); false at the end of the file. A UTF-8 byte
  // order mark at the start of the file is dropped.
  // Throws mt::Error naming the file and line for read errors and corrupt gzip data.
  bool next(std::string_view* line);
  int64_t line_number() const { return line_no_; }  // of the line last returned
  // True when the line last returned spanned buffer refills (it lives in a string of its own);
  // then release_line() hands that string over (the view from next() points into it).
  bool line_is_owned() const { return owned_; }
  std::string release_line();
  int64_t bytes_read() const { return bytes_; }      // uncompressed bytes returned so far, with '\n'
  int64_t file_offset() const;                       // bytes of the file itself consumed so far
  const std::string& path() const { return path_; }

  // Size of the file in bytes, or -1 when unknown (stdin, a pipe).
  static int64_t file_size(const std::string& path);

 private:
  void fill();
  bool next_raw(std::string_view* line);
  std::string path_;
  void* gz_ = nullptr;  // gzFile
  std::string buf_;     // buf_[pos_, end_) is unread data
  size_t pos_ = 0, end_ = 0;
  std::string long_line_;  // a line spanning refills
  bool eof_ = false, owned_ = false;
  int64_t line_no_ = 0, bytes_ = 0;
};

}  // namespace mt::data
