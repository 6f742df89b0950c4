// build_datasets from a Config: mock, one prefix, a blend, caches, and the errors a user can hit.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/blended_dataset.h"
#include "data/dataset.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "data/mock_dataset.h"
#include "test/catch.h"
#include "test/common/temp_dir.h"

using namespace mt;
using namespace mt::data;

namespace {

using mt::test::TempDir;

// n documents of 5..40 tokens, ids below max_id, first token = tag (to tell datasets apart).
void write(const std::string& prefix, int n, int32_t tag, int32_t max_id = 500) {
  IndexedDatasetWriter w(prefix, DType::U16);
  for (int d = 0; d < n; ++d) {
    std::vector<int32_t> doc(static_cast<size_t>(5 + (d * 13) % 36));
    for (size_t k = 0; k < doc.size(); ++k) doc[k] = static_cast<int32_t>(1 + (d * 7 + k * 3) % (max_id - 1));
    doc[0] = tag;
    w.add_item(doc.data(), static_cast<int64_t>(doc.size()));
    w.end_document();
  }
  w.finalize();
}

Config config(const std::string& cache_dir) {
  Config c;
  c.model.vocab_size = 512;
  c.model.seq_length = 16;
  c.training.micro_batch_size = 2;
  c.training.global_batch_size = 8;
  c.training.train_iters = 20;
  c.training.eval_interval = 10;
  c.training.eval_iters = 2;
  c.data.cache_dir = cache_dir;
  return c;
}

DerivedConfig derived(const Config& c) {
  DerivedConfig d;
  d.global_batch_size = c.training.global_batch_size;
  d.data_parallel_size = 1;
  d.num_microbatches = d.global_batch_size / c.training.micro_batch_size;
  return d;
}

std::string error_of(const Config& c, int64_t train = 10) {
  try {
    build_datasets(c, derived(c), train, 0, 0);
  } catch (const mt::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("build datasets: Megatron's sample counts", "[data][build]") {
  Config c = config("");
  SampleCounts n = megatron_sample_counts(c, derived(c));
  CHECK(n.train == 160);
  CHECK(n.valid == (20 / 10 + 1) * 2 * 8);
  CHECK(n.test == 16);
  c.training.eval_interval = 0;
  CHECK(megatron_sample_counts(c, derived(c)).valid == 16);
  c.training.eval_iters = 0;
  CHECK(megatron_sample_counts(c, derived(c)).valid == 0);
}

TEST_CASE("build datasets: mock splits, weight 0 and no samples give null", "[data][build]") {
  Config c = config("");
  c.data.mock = true;
  Datasets d = build_datasets(c, derived(c), 100, 10, 10);
  REQUIRE(d.train);
  REQUIRE(d.valid);
  REQUIRE(d.test);
  CHECK(dynamic_cast<MockDataset*>(d.train.get()));
  CHECK(d.train->size() == 100);
  CHECK(d.train->seq_length() == 16);
  std::vector<int32_t> a(17), b(17);
  d.train->get(0, a.data());
  d.valid->get(0, b.data());
  CHECK(a != b);
  c.data.split = {9, 0, 1};
  d = build_datasets(c, derived(c), 100, 10, 10);
  CHECK(d.train);
  CHECK_FALSE(d.valid);
  CHECK(d.test);
  d = build_datasets(c, derived(c), 100, 10, 0);
  CHECK_FALSE(d.test);
}

TEST_CASE("build datasets: one prefix is one GPTDataset, cached next to the data", "[data][build]") {
  TempDir tmp;
  write(tmp.path + "/a_text_document", 200, 3);
  Config c = config("");
  c.data.paths = {{1.0, tmp.path + "/a_text_document"}};
  c.data.split = {90, 5, 5};
  Datasets d = build_datasets(c, derived(c), 300, 20, 0);
  auto* train = dynamic_cast<GPTDataset*>(d.train.get());
  auto* valid = dynamic_cast<GPTDataset*>(d.valid.get());
  REQUIRE(train);
  REQUIRE(valid);
  CHECK_FALSE(d.test);
  CHECK(train->size() >= 300);
  CHECK(valid->size() >= 20);
  CHECK(train->document_index().size() % 180 == 0);
  CHECK(valid->document_index().size() % 10 == 0);
  CHECK(std::filesystem::exists(tmp.path + "/megatrain_cache"));
  CHECK(train->saved_to_cache());
  d = build_datasets(c, derived(c), 300, 20, 0);
  CHECK(dynamic_cast<GPTDataset*>(d.train.get())->loaded_from_cache());
  CHECK(d.train->describe().find("loaded from cache") != std::string::npos);
}

TEST_CASE("build datasets: a blend of prefixes follows the weights; the cache can be built ahead", "[data][build]") {
  TempDir tmp;
  write(tmp.path + "/a", 150, 1);
  write(tmp.path + "/b", 120, 2);
  Config c = config(tmp.path + "/cache");
  c.data.paths = {{0.7, tmp.path + "/a"}, {0.3, tmp.path + "/b"}};
  c.data.split = {80, 10, 10};
  build_sample_index_cache(c, derived(c));
  const SampleCounts n = megatron_sample_counts(c, derived(c));
  Datasets d = build_datasets(c, derived(c), n.train, n.valid, n.test);
  auto* blend = dynamic_cast<BlendedDataset*>(d.train.get());
  REQUIRE(blend);
  CHECK(blend->loaded_from_cache());
  REQUIRE(blend->datasets().size() == 2);
  for (const auto& part : blend->datasets()) CHECK(dynamic_cast<GPTDataset*>(part.get())->loaded_from_cache());
  CHECK(blend->size() == n.train);
  CHECK(blend->datasets()[0]->size() >= blended_component_size(0.7, n.train));
  CHECK(blend->datasets()[1]->size() >= blended_component_size(0.3, n.train));
  int from_a = 0;
  std::vector<int32_t> s(17), t(17);
  for (int64_t i = 0; i < blend->size(); ++i) {
    blend->get(i, s.data());
    const int which = blend->dataset_index()[i];
    blend->datasets()[static_cast<size_t>(which)]->get(blend->dataset_sample_index()[i], t.data());
    REQUIRE(s == t);
    from_a += which == 0;
  }
  CHECK(std::abs(from_a - 0.7 * n.train) <= 1.0);
  REQUIRE(d.valid);
  CHECK(dynamic_cast<BlendedDataset*>(d.valid.get()));
}

TEST_CASE("build datasets: user errors name the file and the fix", "[data][build]") {
  TempDir tmp;
  Config c = config("");
  c.data.paths = {{1.0, tmp.path + "/nothing_here"}};
  std::string e = error_of(c);
  CHECK(e.find("data.paths: cannot open '" + tmp.path + "/nothing_here.idx' (") == 0);
  CHECK(e.find("run megatrain-data preprocess or fix the prefix") != std::string::npos);

  write(tmp.path + "/big_ids", 50, 1, 1000);
  c.data.paths = {{1.0, tmp.path + "/big_ids"}};
  c.model.vocab_size = 300;
  e = error_of(c);
  CHECK(e.find(tmp.path + "/big_ids.bin") != std::string::npos);
  CHECK(e.find("model.vocab_size = 300") != std::string::npos);
  INFO(e);
  const int64_t max_id = IndexedDataset(tmp.path + "/big_ids").token_range().second;
  CHECK(max_id >= 300);
  CHECK(e.find(str_cat("token id ", max_id, " ")) != std::string::npos);  // the largest id of the data

  c.model.vocab_size = 1000;
  c.data.paths = {};
  CHECK(error_of(c).find("data.paths is empty") == 0);

  write(tmp.path + "/tiny", 3, 1);
  c.data.paths = {{1.0, tmp.path + "/tiny"}};
  c.data.split = {98, 1, 1};
  e = error_of(c);  // 3 documents: valid and test get none... but valid has no samples wanted
  CHECK(e.empty());
  try {
    build_datasets(c, derived(c), 10, 5, 0);
    FAIL("no error");
  } catch (const mt::Error& err) {
    CHECK(std::string(err.what()).find("the valid split of '" + tmp.path + "/tiny' is empty") != std::string::npos);
  }
}
