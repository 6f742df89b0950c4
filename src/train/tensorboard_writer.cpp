#include "train/tensorboard_writer.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/check.h"

namespace mt {

namespace tensorboard {

namespace {

// CRC-32C: reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF.
const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

// Protobuf wire format: key = (field << 3) | wire type; 0 varint, 1 64-bit, 2 length-delimited, 5 32-bit.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, int field, int wire_type) { put_varint(out, (static_cast<uint64_t>(field) << 3) | wire_type); }
template <typename T>
void put_fixed(std::string& out, T v) {  // little endian (x86 and Arm as we build them)
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

// Event fields 1 (wall_time) and 2 (step).
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  put_key(e, 1, 1);
  put_fixed<double>(e, wall_time);
  put_key(e, 2, 0);
  put_varint(e, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto& t = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string encode_file_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string encode_session_start_event(double wall_time, int64_t step) {
  std::string session;
  put_key(session, 1, 0);
  put_varint(session, 1);  // SessionLog.START
  std::string e = event_head(wall_time, step);
  put_bytes(e, 7, session);  // Event.session_log (6 is the deprecated log_message)
  return e;
}

std::string encode_scalars_event(double wall_time, int64_t step, const Scalars& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, 1, tag);
    put_key(v, 2, 5);
    put_fixed<float>(v, static_cast<float>(value));
    put_bytes(summary, 1, v);
  }
  std::string e = event_head(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

std::string frame_record(const std::string& data) {
  std::string r;
  put_fixed<uint64_t>(r, data.size());
  const uint32_t len_crc = masked_crc32c(r.data(), 8);
  put_fixed<uint32_t>(r, len_crc);
  r += data;
  put_fixed<uint32_t>(r, masked_crc32c(data.data(), data.size()));
  return r;
}

}  // namespace tensorboard

namespace {
double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t start_step) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MT_CHECK(!ec, "logging.tensorboard_dir: cannot create '", dir, "': ", ec.message(),
           "; give a writable directory or \"\" for no TensorBoard files");
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  const auto unix_time = static_cast<long long>(wall_seconds());
  path_ = str_cat(dir, "/events.out.tfevents.", unix_time, ".", host);
  // Two runs started in the same second (a quick resume) must not share a file.
  if (std::filesystem::exists(path_)) path_ = str_cat(path_, ".", ::getpid());
  file_ = std::fopen(path_.c_str(), "wb");
  MT_CHECK(file_ != nullptr, "logging.tensorboard_dir: cannot create '", path_, "': ", std::strerror(errno),
           "; give a writable directory or \"\" for no TensorBoard files");
  const double t = wall_seconds();
  write(tensorboard::encode_file_version_event(t));
  write(tensorboard::encode_session_start_event(t, start_step));
  std::fflush(file_);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::add_scalars(int64_t step, const Scalars& scalars) {
  if (scalars.empty()) return;
  write(tensorboard::encode_scalars_event(wall_seconds(), step, scalars));
  std::fflush(file_);
}

void TensorBoardWriter::write(const std::string& data) {
  const std::string record = tensorboard::frame_record(data);
  MT_CHECK(std::fwrite(record.data(), 1, record.size(), file_) == record.size(), "logging.tensorboard_dir: writing '",
           path_, "' failed (disk full?)");
}

}  // namespace mt
