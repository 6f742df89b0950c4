// The safetensors reader against hand-made files (each of the format's rules broken once) and the
// writer by a write -> read round trip.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/check.h"
#include "test/catch.h"

using namespace mt;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/mt_test_st_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { fs::remove_all(path); }
};

// A file with the given header text and `data_bytes` bytes of data (0, 1, 2, ...).
std::string make_file(const std::string& dir, const std::string& header, size_t data_bytes, const std::string& name = "m.safetensors") {
  std::string p = dir + "/" + name;
  std::ofstream f(p, std::ios::binary);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>(n >> (8 * i)));
  f << header;
  for (size_t i = 0; i < data_bytes; ++i) f.put(static_cast<char>(i));
  return p;
}

std::string error_of(const std::string& path) {
  try {
    st::File f(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("safetensors: a valid hand-made file reads back", "[safetensors]") {
  TempDir d;
  const std::string p = make_file(d.path,
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}   )", 12);
  st::File f(p);
  REQUIRE(f.tensors().size() == 2);
  CHECK(f.tensors()[0].name == "a");  // offset order
  CHECK(f.metadata().at("format") == "pt");
  const st::TensorInfo* b = f.find("b");
  REQUIRE(b != nullptr);
  CHECK(b->dtype == DType::BF16);
  CHECK(b->shape == Shape{2});
  CHECK(f.data(*b)[0] == 8);
  CHECK(f.find("c") == nullptr);
}

TEST_CASE("safetensors: every broken rule is an error naming the file and the problem", "[safetensors]") {
  TempDir d;
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[2],"data_offsets":[8,12]}})";
  SECTION("shorter than 8 bytes") {
    std::string p = d.path + "/short.safetensors";
    std::ofstream(p) << "abc";
    CHECK_THAT(error_of(p), Catch::Contains(p) && Catch::Contains("shorter than the 8-byte header length"));
  }
  SECTION("header length past the end") {
    std::string p = make_file(d.path, ok, 12);
    fs::resize_file(p, 8 + 20);
    CHECK_THAT(error_of(p), Catch::Contains(p) && Catch::Contains("truncated"));
  }
  SECTION("truncated data section") {
    std::string p = make_file(d.path, ok, 10);
    CHECK_THAT(error_of(p), Catch::Contains(p) && Catch::Contains("tensor 'b'") && Catch::Contains("run past the data section"));
  }
  SECTION("huge header length") {
    std::string p = d.path + "/huge.safetensors";
    std::ofstream f(p, std::ios::binary);
    for (int i = 0; i < 8; ++i) f.put(i == 7 ? 1 : 0);
    f << "{}";
    f.close();
    CHECK_THAT(error_of(p), Catch::Contains(p) && Catch::Contains("exceeds the format's limit"));
  }
  SECTION("not JSON") {
    std::string p = make_file(d.path, "{\"a\": [", 0);
    CHECK_THAT(error_of(p), Catch::Contains(p) && Catch::Contains("not valid JSON"));
  }
  SECTION("overlapping offsets") {
    std::string p = make_file(d.path,
        R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[2],"data_offsets":[4,8]}})", 8);
    CHECK_THAT(error_of(p), Catch::Contains(p) && Catch::Contains("overlaps"));
  }
  SECTION("a gap between tensors") {
    std::string p = make_file(d.path,
        R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[2],"data_offsets":[10,14]}})", 14);
    CHECK_THAT(error_of(p), Catch::Contains(p) && Catch::Contains("gap of 2 bytes before tensor 'b'"));
  }
  SECTION("bytes after the last tensor") {
    std::string p = make_file(d.path, ok, 16);
    CHECK_THAT(error_of(p), Catch::Contains(p) && Catch::Contains("4 bytes after the last tensor"));
  }
  SECTION("out-of-range offsets") {
    std::string p = make_file(d.path, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[100,108]}})", 8);
    CHECK_THAT(error_of(p), Catch::Contains(p) && Catch::Contains("run past the data section"));
  }
  SECTION("a dtype megatrain does not read") {
    std::string p = make_file(d.path, R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8);
    CHECK_THAT(error_of(p), Catch::Contains(p) && Catch::Contains("tensor 'a' has dtype I64"));
  }
  SECTION("size does not match shape x dtype") {
    std::string p = make_file(d.path, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
    CHECK_THAT(error_of(p), Catch::Contains(p) && Catch::Contains("needs 12 bytes"));
  }
  SECTION("a malformed entry") {
    std::string p = make_file(d.path, R"({"a":{"dtype":"F32","shape":[2]}})", 0);
    CHECK_THAT(error_of(p), Catch::Contains(p) && Catch::Contains("data_offsets"));
  }
}

TEST_CASE("safetensors: write -> read round trip, single and sharded", "[safetensors]") {
  TempDir d;
  std::vector<float> a = {1.5f, -2.f, 3.25f, 0.f, 7.f, 8.f};
  std::vector<uint16_t> b = {0x3f80, 0xc000, 0x1234};
  std::vector<uint16_t> c = {0x3c00};
  std::vector<st::WriteTensor> ts = {{"x.a", DType::F32, {2, 3}, a.data()},
                                     {"x.b", DType::BF16, {3}, b.data()},
                                     {"x.c", DType::F16, {1, 1}, c.data()}};
  SECTION("one file") {
    auto names = st::write_model(d.path, ts, 1000);
    REQUIRE(names == std::vector<std::string>{"model.safetensors"});
    // The header is padded so that the data section starts 8-byte aligned.
    std::ifstream f(d.path + "/model.safetensors", std::ios::binary);
    uint64_t n = 0;
    f.read(reinterpret_cast<char*>(&n), 8);
    CHECK(n % 8 == 0);
  }
  SECTION("shards") {
    auto names = st::write_model(d.path, ts, 24);
    REQUIRE(names.size() == 3);  // 24 bytes | 6 + 2 bytes, + the index
    CHECK(names[0] == "model-00001-of-00002.safetensors");
  }
  st::Archive ar(d.path);
  REQUIRE(ar.entries().size() == 3);
  for (const auto& t : ts) {
    const st::Archive::Entry* e = ar.find(t.name);
    REQUIRE(e != nullptr);
    CHECK(e->info->dtype == t.dtype);
    CHECK(e->info->shape == t.shape);
    const size_t n = static_cast<size_t>(shape_numel(t.shape)) * dtype_size(t.dtype);
    CHECK(std::memcmp(e->file->data(*e->info), t.data, n) == 0);
  }
}

TEST_CASE("safetensors: the index must agree with its shards", "[safetensors]") {
  TempDir d;
  std::vector<float> a = {1, 2};
  st::write_file(d.path + "/s1.safetensors", {{"a", DType::F32, {2}, a.data()}, {"b", DType::F32, {2}, a.data()}});
  SECTION("a tensor the index does not name") {
    std::ofstream(d.path + "/model.safetensors.index.json") << R"({"weight_map": {"a": "s1.safetensors"}})";
    CHECK_THROWS_WITH(st::Archive(d.path), Catch::Contains("s1.safetensors") && Catch::Contains("holds tensor 'b'"));
  }
  SECTION("a tensor the shard does not hold") {
    std::ofstream(d.path + "/model.safetensors.index.json")
        << R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s1.safetensors"}})";
    CHECK_THROWS_WITH(st::Archive(d.path), Catch::Contains("model.safetensors.index.json") &&
                                               Catch::Contains("names tensor 'c'"));
  }
  SECTION("no weights") {
    CHECK_THROWS_WITH(st::Archive(d.path + "/"), Catch::Contains("no model.safetensors"));
  }
  CHECK(st::parse_size("5GB") == 5000000000ull);
  CHECK(st::parse_size("2MiB") == 2097152ull);
  CHECK_THROWS_WITH(st::parse_size("5XB"), Catch::Contains("--max-shard-size"));
}
