// TensorBoard event files (logging.tensorboard_dir), read back by a reader written here from the
// format alone (TFRecord framing, CRC-32C computed bit by bit, protobuf wire format): every record's
// two checksums hold, the first event is file_version "brain.Event:2", and the scalars of each step
// are the values of the metrics file's records at that iteration. Each file's second event is
// SessionLog START at the run's first step (a resumed run: the first new one).
#include <cstring>

#include "catch.h"
#include "observe_runs.h"
#include "train/tensorboard_writer.h"

using namespace mt::test;

namespace {

// CRC-32C (Castagnoli), one bit at a time: reflected polynomial 0x82F63B78.
uint32_t crc32c_bitwise(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}
uint32_t masked(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

template <typename T>
T read_le(const std::string& s, size_t pos) {
  REQUIRE(pos + sizeof(T) <= s.size());
  T v;
  std::memcpy(&v, s.data() + pos, sizeof(T));
  return v;
}

// One protobuf field: number, wire type, and the varint, fixed bytes or length-delimited bytes.
struct Field {
  int number = 0, wire = 0;
  uint64_t varint = 0;
  std::string bytes;
};

uint64_t read_varint(const std::string& s, size_t& pos) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    REQUIRE(pos < s.size());
    REQUIRE(shift < 64);
    const auto b = static_cast<unsigned char>(s[pos++]);
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if (!(b & 0x80)) return v;
  }
}

std::vector<Field> parse_message(const std::string& s) {
  std::vector<Field> out;
  size_t pos = 0;
  while (pos < s.size()) {
    const uint64_t key = read_varint(s, pos);
    Field f;
    f.number = static_cast<int>(key >> 3);
    f.wire = static_cast<int>(key & 7);
    if (f.wire == 0) {
      f.varint = read_varint(s, pos);
    } else if (f.wire == 1 || f.wire == 5) {
      const size_t n = f.wire == 1 ? 8 : 4;
      REQUIRE(pos + n <= s.size());
      f.bytes = s.substr(pos, n);
      pos += n;
    } else {
      REQUIRE(f.wire == 2);
      const uint64_t n = read_varint(s, pos);
      REQUIRE(pos + n <= s.size());
      f.bytes = s.substr(pos, n);
      pos += n;
    }
    out.push_back(f);
  }
  return out;
}

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::map<std::string, float> scalars;
  int session_status = 0;
};

Event decode_event(const std::string& data) {
  Event e;
  for (const Field& f : parse_message(data)) {
    if (f.number == 1 && f.wire == 1) e.wall_time = read_le<double>(f.bytes, 0);
    if (f.number == 2 && f.wire == 0) e.step = static_cast<int64_t>(f.varint);
    if (f.number == 3 && f.wire == 2) e.file_version = f.bytes;
    if (f.number == 5 && f.wire == 2)
      for (const Field& v : parse_message(f.bytes)) {
        REQUIRE((v.number == 1 && v.wire == 2));
        std::string tag;
        float value = NAN;
        for (const Field& x : parse_message(v.bytes)) {
          if (x.number == 1 && x.wire == 2) tag = x.bytes;
          if (x.number == 2 && x.wire == 5) value = read_le<float>(x.bytes, 0);
        }
        REQUIRE(!tag.empty());
        e.scalars[tag] = value;
      }
    if (f.number == 7 && f.wire == 2)  // session_log
      for (const Field& x : parse_message(f.bytes))
        if (x.number == 1 && x.wire == 0) e.session_status = static_cast<int>(x.varint);
  }
  return e;
}

// Every record of an event file, both checksums verified.
std::vector<Event> read_events(const fs::path& file) {
  const std::string s = read_file(file);
  std::vector<Event> out;
  size_t pos = 0;
  while (pos < s.size()) {
    INFO("record at byte " << pos << " of " << file);
    const auto len = read_le<uint64_t>(s, pos);
    CHECK(read_le<uint32_t>(s, pos + 8) == masked(crc32c_bitwise(s.substr(pos, 8))));
    REQUIRE(pos + 12 + len + 4 <= s.size());
    const std::string data = s.substr(pos + 12, len);
    CHECK(read_le<uint32_t>(s, pos + 12 + len) == masked(crc32c_bitwise(data)));
    out.push_back(decode_event(data));
    pos += 12 + len + 4;
  }
  return out;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("CRC-32C: the check value and the reference vectors of RFC 3720", "[tensorboard]") {
  for (const std::string& s : {std::string("123456789"), std::string(32, '\0'), std::string(32, '\xff'), std::string()})
    CHECK(mt::tensorboard::crc32c(s.data(), s.size()) == crc32c_bitwise(s));
  CHECK(crc32c_bitwise("123456789") == 0xE3069283u);
  CHECK(crc32c_bitwise(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(crc32c_bitwise(std::string(32, '\xff')) == 0x62A8AB43u);
  std::string inc;
  for (int i = 0; i < 32; ++i) inc.push_back(static_cast<char>(i));
  CHECK(mt::tensorboard::crc32c(inc.data(), inc.size()) == 0x46DD794Eu);
}

TEST_CASE("encoded events decode to what was written", "[tensorboard]") {
  const std::string rec =
      mt::tensorboard::frame_record(mt::tensorboard::encode_scalars_event(1.5e9, 300, {{"a", 1.25}, {"lm loss", -3e-7}}));
  const fs::path f = temp_dir() / "one.tfevents";
  std::ofstream(f, std::ios::binary) << rec;
  const auto ev = read_events(f);
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].wall_time == 1.5e9);
  CHECK(ev[0].step == 300);
  CHECK(ev[0].scalars.at("a") == 1.25f);
  CHECK(ev[0].scalars.at("lm loss") == static_cast<float>(-3e-7));
}

TEST_CASE("a training run's event file holds the scalars of every log line", "[tensorboard][e2e]") {
  const MainRun& run = main_run();
  INFO(run.log);
  REQUIRE(run.code == 0);
  const auto files = event_files(run.dir / "tb");
  REQUIRE(files.size() == 1);
  CHECK_THAT(files[0].filename().string(), Catch::Contains("events.out.tfevents."));
  const auto events = read_events(files[0]);
  REQUIRE(events.size() >= 3);
  CHECK(events[0].file_version == "brain.Event:2");
  CHECK(events[0].wall_time > 1.6e9);  // seconds since 1970, a 2020s date
  CHECK(events[1].session_status == 1);  // START at the first step
  CHECK(events[1].step == 1);

  // step -> tag -> value, from the event file.
  std::map<int64_t, std::map<std::string, float>> tb;
  for (size_t i = 2; i < events.size(); ++i) {
    CHECK(events[i].wall_time >= events[i - 1].wall_time);
    for (const auto& [tag, v] : events[i].scalars) tb[events[i].step][tag] = v;
  }
  // Every record of the metrics file is there, at its iteration, with the same value.
  int train = 0, val = 0, test = 0;
  for (const auto& j : metrics_records(run.dir / "metrics.jsonl")) {
    const int64_t it = j["iteration"].get<int64_t>();
    INFO(j.dump());
    REQUIRE(tb.count(it));
    const auto& s = tb[it];
    if (j.contains("loss")) {
      ++train;
      CHECK(s.at("lm loss") == static_cast<float>(j["loss"].get<double>()));
      CHECK(s.at("grad-norm") == static_cast<float>(j["grad_norm"].get<double>()));
      CHECK(s.at("learning-rate") == Approx(j["lr"].get<double>()).epsilon(1e-6));
      CHECK(s.at("tokens-per-sec") == Approx(j["tokens_per_s"].get<double>()).epsilon(1e-5));
      CHECK(s.at("iteration-time") == Approx(j["ms_per_iter"].get<double>() / 1e3).epsilon(1e-5));
      CHECK(s.at("consumed-samples") == static_cast<float>(j["consumed_samples"].get<int64_t>()));
      CHECK(s.at("skipped-iterations") == static_cast<float>(j["skipped"].get<int64_t>()));
    } else if (j.contains("val_loss")) {
      ++val;
      CHECK(s.at("lm loss validation") == static_cast<float>(j["val_loss"].get<double>()));
      CHECK(s.at("lm loss validation ppl") == Approx(std::exp(j["val_loss"].get<double>())).epsilon(1e-6));
    } else {
      REQUIRE(j.contains("test_loss"));
      ++test;
      CHECK(s.at("lm loss test") == static_cast<float>(j["test_loss"].get<double>()));
    }
  }
  CHECK(train == 4);  // iterations 1, 5, 10, 12
  CHECK(val == 2);    // 10 and 12
  CHECK(test == 1);   // 12
  // No step that the metrics file does not have.
  CHECK(tb.size() == 4);
}

TEST_CASE("each event file starts with SessionLog START at the run's first step (resumed: the first new one)", "[tensorboard][e2e]") {
  const fs::path dir = temp_dir() / "tbresume";
  const std::string args = tiny_train_args("tbresume", "--set training.train_iters=6 --set logging.log_interval=1 "
                                                       "--set logging.tensorboard_dir=" +
                                                           (dir / "tb").string());
  REQUIRE(run_megatrain(args + " --set training.exit_interval=3", "tbresume1").code == 0);
  REQUIRE(run_megatrain(args, "tbresume2").code == 0);
  const auto files = event_files(dir / "tb");
  REQUIRE(files.size() == 2);
  // The files are told apart by creation time (and pid within a second): the one starting at step 4 is the resumed one.
  std::vector<Event> first = read_events(files[0]), second = read_events(files[1]);
  REQUIRE(first.size() >= 2);
  if (first[1].step == 4) std::swap(first, second);
  CHECK(first[1].session_status == 1);
  CHECK(first[1].step == 1);
  REQUIRE(second.size() >= 3);
  CHECK(second[0].file_version == "brain.Event:2");
  CHECK(second[1].session_status == 1);  // START
  CHECK(second[1].step == 4);
  CHECK(second[2].step == 4);
  CHECK(second[2].scalars.count("lm loss"));
  for (const Event& e : first) CHECK(e.step <= 3);
}
