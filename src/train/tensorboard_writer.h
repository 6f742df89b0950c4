// TensorBoard event files written natively (logging.tensorboard_dir, Megatron's --tensorboard-dir),
// without TensorFlow or a protobuf library.
//
// File: TFRecord framing, one record per Event:
//   uint64 length (little endian) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
//   masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xa282ead8, c = CRC-32C (Castagnoli) of x.
// Data: the protobuf encoding of tensorflow.Event (fields we write, wire types in brackets):
//   Event   { double wall_time = 1 [64-bit]; int64 step = 2 [varint]; string file_version = 3 [len];
//             Summary summary = 5 [len]; SessionLog session_log = 7 [len] }
//   Summary { repeated Value value = 1 [len] }   Value { string tag = 1 [len]; float simple_value = 2 [32-bit] }
//   SessionLog { SessionStatus status = 1 [varint] }   (START = 1)
// The first event of a file has file_version "brain.Event:2", the second SessionLog START at the
// run's first step (R + 1 for a run resumed at iteration R, else 1): TensorBoard then drops what an
// earlier run logged from that step on (past its last checkpoint), as the metrics file does.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace mt {

// (tag, value) pairs of one step; any module can add its own (e.g. per-layer expert load).
using Scalars = std::vector<std::pair<std::string, double>>;

namespace tensorboard {

uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

// The serialized Event protos (exposed for tests).
std::string encode_file_version_event(double wall_time);
std::string encode_session_start_event(double wall_time, int64_t step);
std::string encode_scalars_event(double wall_time, int64_t step, const Scalars& scalars);

// One record: length, its masked CRC, the data, its masked CRC.
std::string frame_record(const std::string& data);

}  // namespace tensorboard

class TensorBoardWriter {
 public:
  // Creates dir and a new file events.out.tfevents.<unix time>.<hostname>[.<pid>] in it; throws
  // mt::Error naming logging.tensorboard_dir when that fails. Writes file_version, then SessionLog
  // START at start_step (the run's first iteration: 1, or the resumed checkpoint's + 1).
  TensorBoardWriter(const std::string& dir, int64_t start_step);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event with every scalar at this step, flushed to disk.
  void add_scalars(int64_t step, const Scalars& scalars);
  const std::string& path() const { return path_; }

 private:
  void write(const std::string& data);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace mt
