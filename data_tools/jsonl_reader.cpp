// LineReader over zlib's gzread, which reads gzip and plain files alike (see jsonl_reader.h).
#include "data_tools/jsonl_reader.h"

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "core/check.h"

namespace mt::data {

namespace {
constexpr size_t kBufferBytes = 1 << 20;
gzFile as_gz(void* p) { return static_cast<gzFile>(p); }
}  // namespace

LineReader::LineReader(const std::string& path) : path_(path) {
  gz_ = path == "-" ? gzdopen(dup(STDIN_FILENO), "rb") : gzopen(path.c_str(), "rb");
  MT_CHECK(gz_ != nullptr, path, ": cannot open the input file (", std::strerror(errno), "); check --input");
  gzbuffer(as_gz(gz_), 256 * 1024);
  buf_.resize(kBufferBytes);
}

LineReader::~LineReader() {
  if (gz_) gzclose(as_gz(gz_));
}

int64_t LineReader::file_size(const std::string& path) {
  struct stat st;
  if (path == "-" || ::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return -1;
  return static_cast<int64_t>(st.st_size);
}

int64_t LineReader::file_offset() const { return static_cast<int64_t>(gzoffset(as_gz(gz_))); }

void LineReader::fill() {
  pos_ = 0;
  end_ = 0;
  const int n = gzread(as_gz(gz_), buf_.data(), static_cast<unsigned>(buf_.size()));
  int err = Z_OK;
  const char* msg = gzerror(as_gz(gz_), &err);
  MT_CHECK(n >= 0 && (err == Z_OK || err == Z_STREAM_END), path_, ":", line_no_ + 1,
           ": read error (", (err == Z_ERRNO ? std::strerror(errno) : msg),
           "); the file is unreadable or its gzip data is corrupt or truncated");
  if (n == 0) eof_ = true;
  end_ = static_cast<size_t>(n);
}

bool LineReader::next(std::string_view* line) {
  owned_ = false;
  if (!next_raw(line)) return false;
  owned_ = line->data() == long_line_.data();
  // A UTF-8 byte order mark at the start of the file (Windows editors write one) is not text.
  if (line_no_ == 1 && line->substr(0, 3) == "\xEF\xBB\xBF") {
    line->remove_prefix(3);
    if (owned_) {
      long_line_.erase(0, 3);
      *line = long_line_;
    }
  }
  return true;
}

std::string LineReader::release_line() {
  MT_INTERNAL_ASSERT(owned_, "release_line without an owned line");
  owned_ = false;
  std::string out;
  out.swap(long_line_);
  return out;
}

bool LineReader::next_raw(std::string_view* line) {
  long_line_.clear();
  bool spanning = false;
  for (;;) {
    if (pos_ == end_) {
      if (eof_) break;
      fill();
      if (eof_) break;
    }
    const char* start = buf_.data() + pos_;
    const void* nl = std::memchr(start, '\n', end_ - pos_);
    if (nl) {
      const size_t len = static_cast<const char*>(nl) - start;
      pos_ += len + 1;
      ++line_no_;
      if (!spanning) {
        *line = std::string_view(start, len);
      } else {
        long_line_.append(start, len);
        *line = long_line_;
      }
      bytes_ += static_cast<int64_t>(line->size()) + 1;
      return true;
    }
    long_line_.append(start, end_ - pos_);  // no newline in the buffer: keep it and read on
    spanning = true;
    pos_ = end_;
  }
  if (!spanning) return false;  // clean end (the file ended with '\n' or is empty)
  ++line_no_;                   // last line without '\n'
  bytes_ += static_cast<int64_t>(long_line_.size());
  *line = long_line_;
  return true;
}

}  // namespace mt::data
