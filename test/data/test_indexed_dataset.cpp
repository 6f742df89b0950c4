// Indexed dataset: the writer's bytes against the format spelled out by hand, reader round trip,
// add_index, and every corruption the reader must name.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/indexed_dataset.h"
#include "test/catch.h"
#include "test/common/temp_dir.h"

using namespace mt;
using namespace mt::data;

namespace {

using mt::test::TempDir;

std::vector<unsigned char> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void spit(const std::string& path, const std::vector<unsigned char>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
template <typename T>
void put(std::vector<unsigned char>& b, T v) {  // little-endian, byte by byte
  for (size_t i = 0; i < sizeof(T); ++i) b.push_back(static_cast<unsigned char>(static_cast<uint64_t>(v) >> (8 * i)));
}

// docs: each document a list of sequences.
using Docs = std::vector<std::vector<std::vector<int32_t>>>;
void write_docs(const std::string& prefix, DType t, const Docs& docs) {
  IndexedDatasetWriter w(prefix, t);
  for (const auto& d : docs) {
    for (const auto& s : d) w.add_item(s.data(), static_cast<int64_t>(s.size()));
    w.end_document();
  }
  w.finalize();
}

// The expected .idx, built from the format description (indexed_dataset.h), not from the writer.
std::vector<unsigned char> expected_idx(uint8_t code, size_t esize, const Docs& docs) {
  std::vector<int32_t> lengths;
  std::vector<int64_t> doc_idx{0};
  for (const auto& d : docs) {
    for (const auto& s : d) lengths.push_back(static_cast<int32_t>(s.size()));
    doc_idx.push_back(static_cast<int64_t>(lengths.size()));
  }
  std::vector<unsigned char> b = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  put<uint64_t>(b, 1);
  put<uint8_t>(b, code);
  put<uint64_t>(b, lengths.size());
  put<uint64_t>(b, doc_idx.size());
  for (int32_t l : lengths) put<int32_t>(b, l);
  int64_t ptr = 0;
  for (int32_t l : lengths) {
    put<int64_t>(b, ptr);
    ptr += l * static_cast<int64_t>(esize);
  }
  for (int64_t d : doc_idx) put<int64_t>(b, d);
  return b;
}

const Docs kDocs = {{{1, 2, 3}}, {{4, 5}, {6}, {}}, {{7, 8, 9, 10, 11}}, {{65535, 0}}};

void check_error(const std::string& prefix, const std::string& file, const std::string& what) {
  try {
    IndexedDataset ds(prefix);
    FAIL("no error for " << what);
  } catch (const mt::Error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find(file) != std::string::npos);
    CHECK(std::string(e.what()).find(what) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("indexed dataset: writer bytes match the format (uint16 and int32)", "[data][indexed]") {
  TempDir tmp;
  for (DType t : {DType::U16, DType::I32}) {
    const std::string prefix = tmp.path + "/ds_" + dtype_name(t);
    Docs docs = kDocs;
    if (t == DType::I32) docs.push_back({{100000, 2147483647}});
    write_docs(prefix, t, docs);
    const uint8_t code = t == DType::U16 ? 8 : 4;
    const size_t esize = t == DType::U16 ? 2 : 4;
    CHECK(slurp(prefix + ".idx") == expected_idx(code, esize, docs));
    std::vector<unsigned char> bin;
    for (const auto& d : docs)
      for (const auto& s : d)
        for (int32_t v : s) esize == 2 ? put<uint16_t>(bin, static_cast<uint16_t>(v)) : put<int32_t>(bin, v);
    CHECK(slurp(prefix + ".bin") == bin);
    CHECK_FALSE(std::filesystem::exists(prefix + ".bin.tmp"));
    CHECK_FALSE(std::filesystem::exists(prefix + ".idx.tmp"));

    IndexedDataset ds(prefix);
    CHECK(ds.dtype() == t);
    CHECK(ds.num_sequences() == 6 + (t == DType::I32));
    CHECK(ds.num_documents() == static_cast<int64_t>(docs.size()));
    int64_t seq = 0, ntok = 0;
    for (size_t d = 0; d < docs.size(); ++d) {
      CHECK(ds.document_indices()[d] == seq);
      for (const auto& s : docs[d]) {
        REQUIRE(ds.sequence_length(seq) == static_cast<int32_t>(s.size()));
        std::vector<int32_t> out(s.size() + 1, -7);
        ds.read(seq, 0, static_cast<int64_t>(s.size()), out.data());
        CHECK(std::vector<int32_t>(out.begin(), out.end() - 1) == s);
        CHECK(out.back() == -7);
        if (s.size() >= 3) {
          int32_t mid[2];
          ds.read(seq, 1, 2, mid);
          CHECK(mid[0] == s[1]);
          CHECK(mid[1] == s[2]);
        }
        ntok += static_cast<int64_t>(s.size());
        ++seq;
      }
    }
    CHECK(ds.document_indices().back() == seq);
    CHECK(ds.num_tokens() == ntok);
    auto [lo, hi] = ds.token_range();
    CHECK(lo == 0);
    CHECK(hi == (t == DType::U16 ? 65535 : 2147483647));
    CHECK(ds.token_range(3) == std::pair<int64_t, int64_t>(1, 3));
  }
}

TEST_CASE("indexed dataset: token dtype choice and format codes", "[data][indexed]") {
  CHECK(token_dtype_for_vocab(50257) == DType::U16);
  CHECK(token_dtype_for_vocab(65499) == DType::U16);
  CHECK(token_dtype_for_vocab(65500) == DType::I32);
  CHECK(token_dtype_for_vocab(128256) == DType::I32);
  CHECK(indexed_dtype_code(DType::U8) == 1);
  CHECK(indexed_dtype_code(DType::I32) == 4);
  CHECK(indexed_dtype_code(DType::I64) == 5);
  CHECK(indexed_dtype_code(DType::F64) == 6);
  CHECK(indexed_dtype_code(DType::F32) == 7);
  CHECK(indexed_dtype_code(DType::U16) == 8);
  CHECK_THROWS_AS(indexed_dtype_code(DType::BF16), mt::Error);
}

TEST_CASE("indexed dataset: writer rejects tokens outside the dtype, cleans up without finalize", "[data][indexed]") {
  TempDir tmp;
  const std::string prefix = tmp.path + "/w";
  {
    IndexedDatasetWriter w(prefix, DType::U16);
    const int32_t bad[2] = {5, 70000};
    CHECK_THROWS_AS(w.add_item(bad, 2), mt::Error);
    const int32_t good[2] = {5, 6};
    w.add_item(good, 2);
    CHECK(std::filesystem::exists(prefix + ".bin.tmp"));
  }
  CHECK_FALSE(std::filesystem::exists(prefix + ".bin.tmp"));
  CHECK_FALSE(std::filesystem::exists(prefix + ".bin"));
  CHECK_FALSE(std::filesystem::exists(prefix + ".idx"));
  // A pending document is closed by finalize().
  {
    IndexedDatasetWriter w(prefix, DType::U16);
    const int32_t a[3] = {1, 2, 3};
    w.add_item(a, 3);
    w.add_item(a, 2);
    CHECK(w.num_sequences() == 2);
    CHECK(w.num_documents() == 0);
    CHECK(w.num_tokens() == 5);
    w.finalize();
  }
  IndexedDataset ds(prefix);
  CHECK(ds.num_documents() == 1);
  CHECK(ds.document_indices() == std::vector<int64_t>{0, 2});
}

TEST_CASE("indexed dataset: add_index appends with offsets fixed up", "[data][indexed]") {
  TempDir tmp;
  const Docs a = {{{1, 2}}, {{3}, {4, 5, 6}}}, b = {{{7}}, {{8, 9}}, {{10, 11, 12}, {13}}};
  write_docs(tmp.path + "/a", DType::U16, a);
  write_docs(tmp.path + "/b", DType::U16, b);
  {
    IndexedDatasetWriter w(tmp.path + "/ab", DType::U16);
    w.add_index(tmp.path + "/a");
    const int32_t extra[2] = {20, 21};
    w.add_item(extra, 2);
    w.end_document();
    w.add_index(tmp.path + "/b");
    w.finalize();
  }
  Docs all = a;
  all.push_back({{20, 21}});
  all.insert(all.end(), b.begin(), b.end());
  CHECK(slurp(tmp.path + "/ab.idx") == expected_idx(8, 2, all));
  write_docs(tmp.path + "/all", DType::U16, all);
  CHECK(slurp(tmp.path + "/ab.bin") == slurp(tmp.path + "/all.bin"));
  IndexedDataset ds(tmp.path + "/ab");
  CHECK(ds.document_indices() == std::vector<int64_t>{0, 1, 3, 4, 5, 6, 8});
  // Another dtype is refused.
  write_docs(tmp.path + "/c32", DType::I32, a);
  IndexedDatasetWriter w(tmp.path + "/bad", DType::U16);
  CHECK_THROWS_AS(w.add_index(tmp.path + "/c32"), mt::Error);
}

TEST_CASE("indexed dataset: corrupt files give errors naming the file", "[data][indexed]") {
  TempDir tmp;
  const std::string p = tmp.path + "/ds";
  write_docs(p, DType::U16, kDocs);
  const auto idx = slurp(p + ".idx"), bin = slurp(p + ".bin");
  const std::string idx_name = p + ".idx", bin_name = p + ".bin";
  auto with_idx = [&](std::vector<unsigned char> b) { spit(idx_name, b); };
  auto restore = [&] {
    spit(idx_name, idx);
    spit(bin_name, bin);
  };

  check_error(tmp.path + "/missing", tmp.path + "/missing.idx", "cannot open");

  with_idx({idx.begin(), idx.begin() + 20});
  check_error(p, idx_name, "truncated");
  with_idx({idx.begin(), idx.end() - 8});  // truncated inside the arrays
  check_error(p, idx_name, "truncated");
  with_idx({});
  check_error(p, idx_name, "truncated");

  auto bad = idx;
  bad[0] = 'X';
  with_idx(bad);
  check_error(p, idx_name, "bad magic");

  bad = idx;
  bad[9] = 2;
  with_idx(bad);
  check_error(p, idx_name, "unsupported version 2");

  bad = idx;
  bad[17] = 42;
  with_idx(bad);
  check_error(p, idx_name, "unknown dtype code 42");

  bad = idx;
  bad[18] = 200;  // sequence count far beyond the file
  with_idx(bad);
  check_error(p, idx_name, "truncated");

  bad = idx;
  bad.push_back(0);
  with_idx(bad);
  check_error(p, idx_name, "trailing");

  // Document indices: the doc array is the last 8*D bytes (D = 5).
  const size_t docs_at = idx.size() - 8 * 5;
  bad = idx;
  bad[docs_at] = 1;
  with_idx(bad);
  check_error(p, idx_name, "not 0");
  bad = idx;
  bad[docs_at + 8 * 2] = 0;  // 1, 0 ... decreasing
  with_idx(bad);
  check_error(p, idx_name, "smaller than the previous");
  bad = idx;
  bad[docs_at + 8 * 4] = 5;  // last 5 != 6 sequences
  with_idx(bad);
  check_error(p, idx_name, "last document index");

  // A length that runs past the .bin / pointers inconsistent.
  bad = idx;
  bad[34] = 100;  // length of sequence 0
  with_idx(bad);
  check_error(p, idx_name, "sequence 1 starts at byte");
  bad = idx;
  bad[34 + 4 * 6 + 8] = 99;  // pointer of sequence 1
  with_idx(bad);
  check_error(p, idx_name, "corrupt index");
  bad = idx;
  bad[34 + 4 * 5] = 50;  // the last sequence grows: the .bin is too short
  with_idx(bad);
  check_error(p, bin_name, "truncated");
  restore();

  spit(bin_name, {bin.begin(), bin.end() - 2});
  check_error(p, bin_name, "truncated");
  auto longer = bin;
  longer.push_back(0);
  longer.push_back(0);
  spit(bin_name, longer);
  check_error(p, bin_name, "does not belong");
  std::filesystem::remove(bin_name);
  check_error(p, bin_name, "cannot open");
  restore();
  IndexedDataset ok(p);
  CHECK(ok.num_sequences() == 6);
}
