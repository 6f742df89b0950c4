// GPT sample index against a naive reconstruction, determinism, split ranges, index cache.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "test/catch.h"
#include "test/common/temp_dir.h"

using namespace mt;
using namespace mt::data;

namespace {

using mt::test::TempDir;

// Documents of varied lengths (some empty, some of several sequences); token = distinct per place.
std::vector<std::vector<int32_t>> make_docs(int n, uint32_t seed) {
  std::vector<std::vector<int32_t>> docs(static_cast<size_t>(n));
  uint32_t x = seed;
  for (int d = 0; d < n; ++d) {
    x = x * 1664525u + 1013904223u;
    const int len = (d % 7 == 3) ? 0 : 1 + static_cast<int>((x >> 8) % 23);
    for (int k = 0; k < len; ++k) docs[d].push_back((d * 31 + k) % 997);
  }
  return docs;
}

void write(const std::string& prefix, const std::vector<std::vector<int32_t>>& docs, int max_seq = 1000) {
  IndexedDatasetWriter w(prefix, DType::U16);
  for (const auto& d : docs) {
    for (size_t k = 0; k < d.size(); k += max_seq)  // long documents as several sequences
      w.add_item(d.data() + k, static_cast<int64_t>(std::min<size_t>(max_seq, d.size() - k)));
    w.end_document();
  }
  w.finalize();
}

GPTDatasetOptions options(int L, int64_t n, uint64_t seed, const std::string& cache_dir = "") {
  GPTDatasetOptions o;
  o.seq_length = L;
  o.num_samples = n;
  o.seed = seed;
  o.cache_dir = cache_dir;
  return o;
}

std::vector<int32_t> sample(const SampleDataset& ds, int64_t i) {
  std::vector<int32_t> out(static_cast<size_t>(ds.seq_length()) + 1);
  ds.get(i, out.data());
  return out;
}

template <typename T>
std::vector<T> vec(const Array<T>& a) {
  return std::vector<T>(a.data(), a.data() + a.size());
}

}  // namespace

TEST_CASE("gpt dataset: split ranges follow Megatron's rounding", "[data][gpt]") {
  auto r = split_document_ranges({98, 1, 1}, 1000);
  CHECK((r[0].begin == 0 && r[0].end == 980 && r[0].enabled));
  CHECK((r[1].begin == 980 && r[1].end == 990 && r[1].enabled));
  CHECK((r[2].begin == 990 && r[2].end == 1000 && r[2].enabled));
  r = split_document_ranges({1, 1}, 5);  // 2.5 rounds to even: 2
  CHECK((r[0].begin == 0 && r[0].end == 2));
  CHECK((r[1].begin == 2 && r[1].end == 5));
  CHECK_FALSE(r[2].enabled);
  r = split_document_ranges({1, 1}, 7);  // 3.5 -> 4
  CHECK(r[0].end == 4);
  r = split_document_ranges({8, 0, 2}, 10);
  CHECK((r[0].end == 8 && !r[1].enabled && r[2].begin == 8 && r[2].end == 10));
  r = split_document_ranges({969, 30, 1}, 17);
  CHECK((r[0].end == 16 && r[1].begin == 16 && r[1].end == 17 && r[2].begin == 17 && r[2].end == 17));
  CHECK_THROWS_AS(split_document_ranges({0, 0, 0}, 10), mt::Error);
  CHECK_THROWS_AS(split_document_ranges({1, -1, 0}, 10), mt::Error);
}

TEST_CASE("gpt dataset: samples are the windows of the shuffled document stream", "[data][gpt]") {
  TempDir tmp;
  const auto docs = make_docs(40, 7);
  write(tmp.path + "/ds", docs, /*max_seq=*/5);  // documents of several sequences too
  auto data = std::make_shared<const IndexedDataset>(tmp.path + "/ds");
  REQUIRE(data->num_documents() == 40);
  const int L = 8;
  const DocRange range{5, 33, true};
  int64_t tokens = 0;
  for (int64_t d = range.begin; d < range.end; ++d) tokens += static_cast<int64_t>(docs[d].size());

  for (int64_t requested : {int64_t{1}, int64_t{30}, 3 * tokens / L + 5}) {
    GPTDataset ds(data, range, options(L, requested, 1234));
    CHECK(ds.tokens_per_epoch() == tokens);
    // Fewest whole epochs covering requested * L + 1 tokens.
    CHECK(ds.num_epochs() * tokens >= requested * L + 1);
    CHECK((ds.num_epochs() - 1) * tokens < requested * L + 1);
    const int64_t n = (ds.num_epochs() * tokens - 1) / L;
    REQUIRE(ds.size() == n);
    CHECK(n >= requested);

    // Each epoch of the document index is a permutation of the range.
    const auto di = vec(ds.document_index());
    REQUIRE(static_cast<int64_t>(di.size()) == ds.num_epochs() * (range.end - range.begin));
    for (int64_t e = 0; e < ds.num_epochs(); ++e) {
      std::vector<int64_t> epoch(di.begin() + e * 28, di.begin() + (e + 1) * 28);
      std::sort(epoch.begin(), epoch.end());
      std::vector<int64_t> expect(28);
      std::iota(expect.begin(), expect.end(), range.begin);
      CHECK(epoch == expect);
    }
    // The shuffle index is a permutation of the samples.
    auto sh = vec(ds.shuffle_index());
    std::sort(sh.begin(), sh.end());
    std::vector<int64_t> all(static_cast<size_t>(n));
    std::iota(all.begin(), all.end(), 0);
    CHECK(sh == all);

    // Naive reconstruction: the concatenation of the documents in document-index order.
    std::vector<int32_t> stream;
    for (int64_t d : di) stream.insert(stream.end(), docs[d].begin(), docs[d].end());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t s = ds.shuffle_index()[i];
      const std::vector<int32_t> expect(stream.begin() + s * L, stream.begin() + s * L + L + 1);
      REQUIRE(sample(ds, i) == expect);
    }
    CHECK(sample(ds, n + 3) == sample(ds, 3));  // wraps
  }
}

TEST_CASE("gpt dataset: a barely used last epoch is shuffled separately", "[data][gpt]") {
  TempDir tmp;
  write(tmp.path + "/ds", make_docs(30, 3));
  auto data = std::make_shared<const IndexedDataset>(tmp.path + "/ds");
  const int L = 4;
  const DocRange range{0, 30, true};
  GPTDataset probe(data, range, options(L, 1, 1));
  const int64_t T = probe.tokens_per_epoch();
  const int64_t per_epoch = (T - 1) / L, sans_final = (2 * T - 1) / L;
  GPTDataset ds(data, range, options(L, sans_final + 2, 1));  // 3 epochs, the last one for 2 samples
  REQUIRE(ds.num_epochs() == 3);
  REQUIRE(2 < static_cast<int64_t>(0.8 * per_epoch));
  for (int64_t i = 0; i < ds.size(); ++i) CHECK((ds.shuffle_index()[i] < sans_final) == (i < sans_final));
}

TEST_CASE("gpt dataset: same seed same samples, another seed another order", "[data][gpt]") {
  TempDir tmp;
  write(tmp.path + "/ds", make_docs(50, 11));
  auto data = std::make_shared<const IndexedDataset>(tmp.path + "/ds");
  const DocRange range{0, 50, true};
  GPTDataset a(data, range, options(6, 100, 42)), b(data, range, options(6, 100, 42)), c(data, range, options(6, 100, 43));
  CHECK(vec(a.document_index()) == vec(b.document_index()));
  CHECK(vec(a.shuffle_index()) == vec(b.shuffle_index()));
  for (int64_t i = 0; i < a.size(); ++i) REQUIRE(sample(a, i) == sample(b, i));
  CHECK(vec(a.document_index()) != vec(c.document_index()));
  CHECK(vec(a.shuffle_index()) != vec(c.shuffle_index()));
  // The valid split of the same range is another stream.
  GPTDatasetOptions ov = options(6, 100, 42);
  ov.split = Split::Valid;
  GPTDataset v(data, range, ov);
  CHECK(vec(a.document_index()) != vec(v.document_index()));
}

TEST_CASE("gpt dataset: the index cache is built once and reused", "[data][gpt]") {
  TempDir tmp;
  write(tmp.path + "/ds", make_docs(60, 5));
  auto data = std::make_shared<const IndexedDataset>(tmp.path + "/ds");
  const DocRange range{0, 50, true};
  const std::string cache = tmp.path + "/cache";
  GPTDataset first(data, range, options(8, 200, 9, cache));
  CHECK_FALSE(first.loaded_from_cache());
  CHECK(first.saved_to_cache());
  CHECK(std::filesystem::exists(first.cache_description_path()));
  GPTDataset second(data, range, options(8, 200, 9, cache));
  CHECK(second.loaded_from_cache());
  CHECK(vec(second.document_index()) == vec(first.document_index()));
  CHECK(vec(second.sample_index()) == vec(first.sample_index()));
  CHECK(vec(second.shuffle_index()) == vec(first.shuffle_index()));
  for (int64_t i = 0; i < first.size(); ++i) REQUIRE(sample(first, i) == sample(second, i));
  // Another request is another cache entry.
  GPTDataset other(data, range, options(8, 201, 9, cache));
  CHECK_FALSE(other.loaded_from_cache());
  // A damaged array file is detected (size) and rebuilt.
  const std::string shuffle_file =
      first.cache_description_path().substr(0, first.cache_description_path().size() - 16) + "shuffle_index.int64";
  REQUIRE(std::filesystem::exists(shuffle_file));
  std::filesystem::resize_file(shuffle_file, 16);
  GPTDataset rebuilt(data, range, options(8, 200, 9, cache));
  CHECK_FALSE(rebuilt.loaded_from_cache());
  CHECK(vec(rebuilt.shuffle_index()) == vec(first.shuffle_index()));
  GPTDataset again(data, range, options(8, 200, 9, cache));
  CHECK(again.loaded_from_cache());
  // Data rewritten under the same name with the same counts but other document lengths: rebuilt.
  auto docs = make_docs(60, 5);
  std::swap(docs[0], docs[1]);
  REQUIRE(docs[0].size() != docs[1].size());
  write(tmp.path + "/ds", docs);
  auto data2 = std::make_shared<const IndexedDataset>(tmp.path + "/ds");
  GPTDataset changed(data2, range, options(8, 200, 9, cache));
  CHECK_FALSE(changed.loaded_from_cache());
  // No temporary files are left behind.
  for (const auto& e : std::filesystem::directory_iterator(cache))
    CHECK(e.path().string().find(".tmp") == std::string::npos);
}

TEST_CASE("gpt dataset: token ids beyond the vocabulary and too little data are errors", "[data][gpt]") {
  TempDir tmp;
  write(tmp.path + "/ds", make_docs(20, 2));
  auto data = std::make_shared<const IndexedDataset>(tmp.path + "/ds");
  GPTDatasetOptions o = options(4, 10, 1);
  o.vocab_size = 100;  // the data has ids up to 996
  GPTDataset ds(data, DocRange{0, 20, true}, o);
  std::vector<int32_t> out(5);
  bool thrown = false;
  for (int64_t i = 0; i < ds.size() && !thrown; ++i) {
    try {
      ds.get(i, out.data());
    } catch (const mt::Error& e) {
      thrown = true;
      const std::string msg = e.what();
      CHECK(msg.find(tmp.path + "/ds.bin") != std::string::npos);
      CHECK(msg.find("model.vocab_size = 100") != std::string::npos);
    }
  }
  CHECK(thrown);
  try {
    GPTDataset tiny(data, DocRange{0, 1, true}, options(4000, 1, 1));
    FAIL("no error");
  } catch (const mt::Error& e) {
    CHECK(std::string(e.what()).find("fewer than model.seq_length + 1") != std::string::npos);
  }
}

namespace {

std::vector<int64_t> read_i64(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<int64_t> v(std::filesystem::file_size(path) / 8);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 8));
  return v;
}

void write_i64(const std::string& path, const std::vector<int64_t>& v) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 8));
}

// Rewrites the checksum recorded for NAME as that of its current file (a cache edited consistently:
// only the structural checks can catch it).
void reseal(const std::string& desc_path, const std::string& name, const std::string& file) {
  std::ifstream in(desc_path);
  auto j = nlohmann::json::parse(in);
  const auto v = read_i64(file);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(checksum_bytes(v.data(), v.size() * 8)));
  j["checksums"][name] = hex;
  j["arrays"][name] = v.size();
  std::ofstream(desc_path, std::ios::trunc) << j.dump(2);
}

}  // namespace

// Issue #20: edited cache files gave SIGSEGV (document / sample / shuffle entries out of range, a
// negative shuffle entry), internal errors (a sample offset moved, a shuffle duplicate reading a
// sample twice is silent; an offset past the document), or a silently different run (a reversed
// shuffle). Each is now detected (checksum; structure when the checksum is rewritten too) and the
// index rebuilt, identical to a fresh build.
TEST_CASE("gpt dataset: every corrupted cache is rebuilt, never used", "[data][gpt][reliability]") {
  TempDir tmp;
  write(tmp.path + "/ds", make_docs(60, 5));
  auto data = std::make_shared<const IndexedDataset>(tmp.path + "/ds");
  const DocRange range{0, 50, true};
  const GPTDataset reference(data, range, options(8, 200, 9));
  struct Case {
    const char* name;
    const char* array;
    std::function<void(std::vector<int64_t>&)> edit;
  };
  const std::vector<Case> cases = {
      {"document id far out of range", "document_index", [](auto& v) { v[3] = 1LL << 40; }},
      {"negative document id", "document_index", [](auto& v) { v[0] = -7; }},
      {"document id of another split", "document_index", [](auto& v) { v[1] = 55; }},
      {"duplicate document", "document_index", [](auto& v) { v[1] = v[0]; }},
      {"sample position far out of range", "sample_index", [](auto& v) { v[10] = 1LL << 40; }},
      {"sample offset far out of range", "sample_index", [](auto& v) { v[11] = 1LL << 40; }},
      {"sample offset moved by one", "sample_index", [](auto& v) { v[11] += 1; }},
      {"sample positions out of order", "sample_index", [](auto& v) { std::swap(v[10], v[20]); }},
      {"shuffle entry far out of range", "shuffle_index", [](auto& v) { v[5] = 1LL << 40; }},
      {"negative shuffle entry", "shuffle_index", [](auto& v) { v[5] = -1; }},
      {"duplicate shuffle entry", "shuffle_index", [](auto& v) { v[5] = v[6]; }},
      {"reversed shuffle", "shuffle_index", [](auto& v) { std::reverse(v.begin(), v.end()); }},
      {"truncated shuffle", "shuffle_index", [](auto& v) { v.resize(v.size() / 2); }},
      {"truncated sample index", "sample_index", [](auto& v) { v.resize(v.size() - 2); }},
      {"empty document index", "document_index", [](auto& v) { v.clear(); }},
  };
  int detected = 0;
  for (const bool resealed : {false, true}) {
    for (const auto& c : cases) {
      // The reversed shuffle is still a permutation: only the checksum can tell.
      if (resealed && std::string(c.name) == "reversed shuffle") continue;
      {
        INFO(c.name << (resealed ? " (checksum rewritten)" : ""));
        const std::string cache = tmp.path + "/cache";
        std::filesystem::remove_all(cache);
        GPTDataset first(data, range, options(8, 200, 9, cache));
        REQUIRE(first.saved_to_cache());
        const std::string desc = first.cache_description_path();
        const std::string file = desc.substr(0, desc.size() - 16) + c.array + ".int64";
        auto v = read_i64(file);
        const auto before = v;
        c.edit(v);
        REQUIRE(v != before);
        write_i64(file, v);
        if (resealed) reseal(desc, c.array, file);
        GPTDataset loaded(data, range, options(8, 200, 9, cache));
        CHECK_FALSE(loaded.loaded_from_cache());
        CHECK(vec(loaded.document_index()) == vec(reference.document_index()));
        CHECK(vec(loaded.sample_index()) == vec(reference.sample_index()));
        CHECK(vec(loaded.shuffle_index()) == vec(reference.shuffle_index()));
        for (int64_t i = 0; i < reference.size(); ++i) REQUIRE(sample(loaded, i) == sample(reference, i));
        GPTDataset again(data, range, options(8, 200, 9, cache));  // the rebuilt cache is sound
        CHECK(again.loaded_from_cache());
        ++detected;
      }
    }
  }
  CHECK(detected == static_cast<int>(2 * cases.size() - 1));
}

TEST_CASE("gpt dataset: a cache description without checksums is rebuilt", "[data][gpt][reliability]") {
  TempDir tmp;
  write(tmp.path + "/ds", make_docs(30, 3));
  auto data = std::make_shared<const IndexedDataset>(tmp.path + "/ds");
  const std::string cache = tmp.path + "/cache";
  GPTDataset first(data, DocRange{0, 30, true}, options(8, 50, 1, cache));
  auto j = nlohmann::json::parse(std::ifstream(first.cache_description_path()));
  j.erase("checksums");
  std::ofstream(first.cache_description_path(), std::ios::trunc) << j.dump(2);
  GPTDataset second(data, DocRange{0, 30, true}, options(8, 50, 1, cache));
  CHECK_FALSE(second.loaded_from_cache());
  CHECK(vec(second.shuffle_index()) == vec(first.shuffle_index()));
}
