// Blending indices and BlendedDataset; the mock dataset's determinism and Markov structure.
#include <spdlog/spdlog.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/blended_dataset.h"
#include "data/mock_dataset.h"
#include "test/catch.h"

using namespace mt;
using namespace mt::data;

namespace {

const int kQuietLogs = (spdlog::set_level(spdlog::level::warn), 0);

// Sample idx of dataset `id`: tokens id*1'000'000 + idx*10 + k.
struct Numbered : SampleDataset {
  int id, L;
  int64_t n;
  Numbered(int id_, int L_, int64_t n_) : id(id_), L(L_), n(n_) {}
  int64_t size() const override { return n; }
  int seq_length() const override { return L; }
  void get(int64_t idx, int32_t* out) const override {
    for (int k = 0; k <= L; ++k) out[k] = static_cast<int32_t>(id * 1000000 + (idx % n) * 10 + k);
  }
  std::string describe() const override { return "numbered"; }
};

}  // namespace

TEST_CASE("blending: every prefix follows the weights", "[data][blend]") {
  (void)kQuietLogs;
  const std::vector<double> w = {0.5, 0.3, 0.2};
  std::vector<int16_t> di;
  std::vector<int64_t> dsi;
  build_blending_indices(w, 10000, &di, &dsi);
  std::vector<int64_t> count(3, 0);
  for (int64_t i = 0; i < 10000; ++i) {
    const int d = di[i];
    REQUIRE(dsi[i] == count[d]);  // each dataset's samples are taken in order
    ++count[d];
    for (int k = 0; k < 3; ++k) REQUIRE(std::abs(static_cast<double>(count[k]) - w[k] * (i + 1)) <= 1.0);
  }
  CHECK(count == std::vector<int64_t>{5000, 3000, 2000});
  // Uneven weights converge too.
  build_blending_indices({0.7, 0.29, 0.01}, 100000, &di, &dsi);
  std::vector<int64_t> c2(3, 0);
  for (int16_t d : di) ++c2[d];
  CHECK(std::abs(c2[0] - 70000) <= 1);
  CHECK(std::abs(c2[1] - 29000) <= 1);
  CHECK(std::abs(c2[2] - 1000) <= 1);
  // Megatron's component sizes: ceil(ceil(w * N) * 1.005).
  CHECK(blended_component_size(0.5, 1000) == 503);
  CHECK(blended_component_size(0.25, 10) == 4);  // ceil(2.5) = 3, ceil(3.015) = 4
  CHECK(blended_component_size(1.0, 0) == 0);
}

TEST_CASE("blending: BlendedDataset routes samples to its components", "[data][blend]") {
  std::vector<std::shared_ptr<SampleDataset>> parts = {std::make_shared<Numbered>(1, 4, 700),
                                                       std::make_shared<Numbered>(2, 4, 400)};
  BlendedDataset blend(parts, {2.0, 1.0}, 900, "", "test");
  CHECK(blend.size() == 900);
  CHECK(blend.seq_length() == 4);
  std::map<int, int64_t> next;
  std::vector<int32_t> out(5);
  for (int64_t i = 0; i < 900; ++i) {
    blend.get(i, out.data());
    const int id = out[0] / 1000000;
    REQUIRE(out[0] == id * 1000000 + next[id] * 10);
    ++next[id];
  }
  CHECK(next[1] == 600);
  CHECK(next[2] == 300);
  CHECK(blend.describe().find("BlendedDataset of 2 datasets") == 0);
}

TEST_CASE("mock dataset: deterministic, random access, per split", "[data][mock]") {
  MockDataset a(1000, 32, 7, Split::Train, 100), b(1000, 32, 7, Split::Train, 100);
  MockDataset v(1000, 32, 7, Split::Valid, 100), s(1000, 32, 8, Split::Train, 100);
  std::vector<int32_t> x(33), y(33);
  int differ_split = 0, differ_seed = 0;
  for (int64_t i = 99; i >= 0; --i) {  // any order
    a.get(i, x.data());
    b.get(i, y.data());
    REQUIRE(x == y);
    a.get(i, y.data());
    REQUIRE(x == y);  // no state
    v.get(i, y.data());
    differ_split += x != y;
    s.get(i, y.data());
    differ_seed += x != y;
  }
  CHECK(differ_split == 100);
  CHECK(differ_seed == 100);
  a.get(3, x.data());
  a.get(103, y.data());
  CHECK(x == y);  // wraps at size()
  CHECK(a.size() == 100);
  CHECK(a.eod() == 999);
}

TEST_CASE("mock dataset: Markov successors, probabilities and documents", "[data][mock]") {
  const int64_t V = 50000;
  const int L = 64;
  MockDataset m(V, L, 1234, Split::Train, 2000);
  std::vector<int32_t> x(L + 1);
  std::vector<int64_t> picks(4, 0);
  int64_t eods = 0, transitions = 0, run = 0, max_run = 0;
  int last_eod = -1;
  std::set<int64_t> doc_lengths;
  for (int64_t i = 0; i < 2000; ++i) {
    m.get(i, x.data());
    for (int k = 0; k <= L; ++k) REQUIRE((x[k] >= 0 && x[k] < V));
    for (int k = 1; k <= L; ++k) {
      if (x[k] == m.eod()) {
        ++eods;
        REQUIRE(x[k - 1] != m.eod());
        if (last_eod >= 0) doc_lengths.insert(k - last_eod - 1);  // a whole document inside the sample
        last_eod = k;
        run = 0;
        continue;
      }
      ++run;
      max_run = std::max(max_run, run);
      int which = -1;
      for (int c = 0; c < 4 && which < 0; ++c)
        if (m.successor(x[k - 1], c) == x[k]) which = c;
      REQUIRE(which >= 0);  // every token follows its predecessor's successor list
      ++picks[which];
      ++transitions;
    }
    run = 0;
    last_eod = -1;
  }
  for (int c = 0; c < 4; ++c) CHECK(std::abs(static_cast<double>(picks[c]) / transitions - MockDataset::kProbabilities[c]) < 0.01);
  CHECK(eods > 0);
  CHECK(max_run <= m.max_document_length());
  REQUIRE(!doc_lengths.empty());
  CHECK(*doc_lengths.begin() >= m.min_document_length());
  CHECK(*doc_lengths.rbegin() <= m.max_document_length());
  CHECK(m.successor(m.eod(), 0) != m.eod());
}
