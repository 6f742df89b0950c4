// BatchLoader: sample assignment over DP ranks, exact resume, errors from the loader thread.
#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/dataset.h"
#include "test/catch.h"

using namespace mt;
using namespace mt::data;

namespace {

// Sample idx: tokens idx*100 + k; throws at fail_at.
struct Counting : SampleDataset {
  int L;
  int64_t n, fail_at;
  Counting(int L_, int64_t n_, int64_t fail_at_ = -1) : L(L_), n(n_), fail_at(fail_at_) {}
  int64_t size() const override { return n; }
  int seq_length() const override { return L; }
  void get(int64_t idx, int32_t* out) const override {
    MT_CHECK(idx != fail_at, "sample ", idx, " is broken");
    for (int k = 0; k <= L; ++k) out[k] = static_cast<int32_t>((idx % n) * 100 + k);
  }
  std::string describe() const override { return "counting"; }
};

// The global sample indices of one rank's iteration, micro-batch by micro-batch, checking contents.
std::vector<int64_t> samples_of(const std::vector<MicroBatch>& batch, int M, int L) {
  std::vector<int64_t> out;
  for (const auto& mb : batch) {
    REQUIRE(mb.rows == M);
    REQUIRE(mb.seq_length == L);
    REQUIRE(mb.tokens.size() == static_cast<size_t>(M * L));
    for (int j = 0; j < M; ++j) {
      const int64_t idx = mb.tokens[static_cast<size_t>(j * L)] / 100;
      REQUIRE(idx == mb.first_sample + j);
      for (int k = 0; k < L; ++k) {
        REQUIRE(mb.tokens[static_cast<size_t>(j * L + k)] == idx * 100 + k);
        REQUIRE(mb.labels[static_cast<size_t>(j * L + k)] == idx * 100 + k + 1);
      }
      out.push_back(idx);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("batch loader: one rank reads the global batch in order", "[data][loader]") {
  auto ds = std::make_shared<Counting>(6, 100000);
  BatchLoader loader(ds, /*global*/ 8, /*micro*/ 2, 0, 1, /*consumed*/ 0, /*prefetch*/ 2);
  for (int64_t k = 0; k < 5; ++k) {
    const auto batch = loader.next();
    REQUIRE(batch.size() == 4);
    std::vector<int64_t> expect(8);
    for (int i = 0; i < 8; ++i) expect[i] = k * 8 + i;
    CHECK(samples_of(batch, 2, 6) == expect);
    CHECK(loader.consumed_samples() == (k + 1) * 8);
  }
}

TEST_CASE("batch loader: two DP ranks get disjoint slices whose union is the global batch", "[data][loader]") {
  auto ds = std::make_shared<Counting>(4, 100000);
  const int G = 12, M = 3, dp = 2;
  BatchLoader r0(ds, G, M, 0, dp, 24, 1), r1(ds, G, M, 1, dp, 24, 3);
  for (int64_t k = 0; k < 4; ++k) {
    const auto b0 = r0.next(), b1 = r1.next();
    REQUIRE(b0.size() == 2);
    const auto s0 = samples_of(b0, M, 4), s1 = samples_of(b1, M, 4);
    // Micro-batch i of rank r: start + k*G + i*M*dp + r*M + [0, M).
    for (int i = 0; i < 2; ++i) {
      CHECK(b0[i].first_sample == 24 + k * G + i * M * dp);
      CHECK(b1[i].first_sample == 24 + k * G + i * M * dp + M);
    }
    std::set<int64_t> u(s0.begin(), s0.end());
    for (int64_t s : s1) CHECK(u.insert(s).second);  // disjoint
    std::set<int64_t> expect;
    for (int i = 0; i < G; ++i) expect.insert(24 + k * G + i);
    CHECK(u == expect);
  }
  CHECK(r0.consumed_samples() == 24 + 4 * G);
  CHECK(r1.consumed_samples() == 24 + 4 * G);
}

TEST_CASE("batch loader: resume from consumed_samples continues exactly", "[data][loader]") {
  auto ds = std::make_shared<Counting>(5, 50);  // small: samples wrap around the dataset
  std::vector<std::vector<int32_t>> uninterrupted, resumed;
  int64_t saved = 0;
  {
    BatchLoader a(ds, 8, 4, 1, 2, 0, 2);
    for (int k = 0; k < 10; ++k) {
      for (const auto& mb : a.next()) uninterrupted.push_back(mb.tokens);
      if (k == 3) saved = a.consumed_samples();
    }
  }
  CHECK(saved == 32);
  BatchLoader b(ds, 8, 4, 1, 2, saved, 2);
  for (int k = 4; k < 10; ++k)
    for (const auto& mb : b.next()) resumed.push_back(mb.tokens);
  CHECK(std::vector<std::vector<int32_t>>(uninterrupted.begin() + 4, uninterrupted.end()) == resumed);
}

TEST_CASE("batch loader: an error in the loader thread is re-thrown by next()", "[data][loader]") {
  auto ds = std::make_shared<Counting>(3, 1000, /*fail_at=*/21);
  BatchLoader loader(ds, 4, 2, 0, 1, 0, 4);
  for (int k = 0; k < 5; ++k) CHECK(loader.next().size() == 2);  // samples 0..19
  CHECK_THROWS_WITH(loader.next(), Catch::Contains("sample 21 is broken"));
  CHECK_THROWS_AS(loader.next(), mt::Error);
  CHECK(loader.consumed_samples() == 20);
}

TEST_CASE("batch loader: destruction with a full queue and invalid shapes", "[data][loader]") {
  auto ds = std::make_shared<Counting>(3, 1000);
  { BatchLoader loader(ds, 4, 2, 0, 1, 0, 3); }  // never read: the thread blocks on the full queue, then joins
  {
    BatchLoader loader(ds, 4, 2, 0, 1, 0, 0);  // prefetch 0 behaves as 1
    CHECK(loader.next().size() == 2);
  }
  CHECK_THROWS_AS(BatchLoader(ds, 6, 4, 0, 1, 0, 1), mt::Error);
}
