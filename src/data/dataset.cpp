// build_datasets: mock data, or data.paths (one GPTDataset, or a BlendedDataset of several) per
// split; the sample counts Megatron requests; building the caches ahead of training.
#include "data/dataset.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/check.h"
#include "core/log.h"
#include "data/blended_dataset.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "data/mock_dataset.h"

namespace mt::data {

namespace {

// Tokens scanned at open for ids outside the vocabulary (the rest is checked sample by sample).
constexpr int64_t kOpenScanTokens = int64_t{64} << 20;

double split_weight(const Config& cfg, int s) {
  return s < static_cast<int>(cfg.data.split.size()) ? cfg.data.split[static_cast<size_t>(s)] : 0.0;
}

std::shared_ptr<const IndexedDataset> open_prefix(const std::string& prefix, int64_t vocab_size) {
  const std::string idx = prefix + ".idx";
  if (::access(idx.c_str(), R_OK) != 0) {
    MT_CHECK(false, "data.paths: cannot open '", idx, "' (", std::strerror(errno),
             "); run megatrain-data preprocess or fix the prefix");
  }
  auto ds = std::make_shared<const IndexedDataset>(prefix);
  const auto [lo, hi] = ds->token_range(kOpenScanTokens);
  MT_CHECK(lo >= 0 && hi < vocab_size, "data file '", prefix, ".bin': token id ", (lo < 0 ? lo : hi),
           " is outside model.vocab_size = ", vocab_size,
           " (the data was tokenized with another vocabulary: set model.vocab_size to the tokenizer's, or preprocess "
           "the data again)");
  return ds;
}

}  // namespace

SampleCounts megatron_sample_counts(const Config& cfg, const DerivedConfig& derived) {
  const int64_t G = derived.global_batch_size > 0 ? derived.global_batch_size
                    : cfg.training.global_batch_size > 0
                        ? cfg.training.global_batch_size
                        : int64_t{cfg.training.micro_batch_size} * derived.data_parallel_size;
  const auto& t = cfg.training;
  SampleCounts c;
  c.train = t.train_iters * G;
  const int64_t evaluations = t.eval_iters > 0 ? (t.eval_interval > 0 ? t.train_iters / t.eval_interval : 0) + 1 : 0;
  c.valid = evaluations * t.eval_iters * G;
  c.test = t.eval_iters * G;
  return c;
}

Datasets build_datasets(const Config& cfg, const DerivedConfig& derived, int64_t train_samples,
                        int64_t valid_samples, int64_t test_samples) {
  (void)derived;
  const int L = cfg.model.seq_length;
  const int64_t V = cfg.model.vocab_size;
  MT_CHECK(L > 0, "model.seq_length must be positive (got ", L, ")");
  MT_CHECK(V > 0, "model.vocab_size must be positive (got ", V, ")");
  MT_CHECK(train_samples >= 0 && valid_samples >= 0 && test_samples >= 0, "negative sample counts");
  const int64_t counts[3] = {train_samples, valid_samples, test_samples};
  (void)split_document_ranges(cfg.data.split, 1);  // validates data.split
  auto wanted = [&](int s) { return split_weight(cfg, s) > 0 && (s == 0 || counts[s] > 0); };

  std::shared_ptr<SampleDataset> out[3];
  if (cfg.data.mock) {
    for (int s = 0; s < 3; ++s)
      if (wanted(s)) out[s] = std::make_shared<MockDataset>(V, L, cfg.training.seed, static_cast<Split>(s), counts[s]);
    return Datasets{out[0], out[1], out[2]};
  }

  MT_CHECK(!cfg.data.paths.empty(), "data.paths is empty: give [weight, prefix, ...] or [prefix], or set data.mock: true");
  std::vector<std::pair<double, std::string>> paths;
  for (const auto& [w, prefix] : cfg.data.paths) {
    MT_CHECK(w >= 0 && std::isfinite(w), "data.paths: weight ", w, " of '", prefix, "' must be >= 0");
    if (w > 0) paths.emplace_back(w, prefix);
  }
  MT_CHECK(!paths.empty(), "data.paths: every weight is 0; give at least one prefix a positive weight");
  std::map<std::string, std::shared_ptr<const IndexedDataset>> opened;
  for (const auto& [w, prefix] : paths)
    if (!opened.count(prefix)) opened[prefix] = open_prefix(prefix, V);

  double total = 0;
  for (const auto& p : paths) total += p.first;
  for (int s = 0; s < 3; ++s) {
    if (!wanted(s)) continue;
    const Split split = static_cast<Split>(s);
    std::vector<std::shared_ptr<SampleDataset>> parts;
    std::vector<double> weights;
    std::string key;
    for (const auto& [w, prefix] : paths) {
      const auto& ds = opened[prefix];
      const DocRange range = split_document_ranges(cfg.data.split, ds->num_documents())[static_cast<size_t>(s)];
      GPTDatasetOptions opt;
      opt.seq_length = L;
      opt.num_samples = paths.size() == 1 ? counts[s] : blended_component_size(w / total, counts[s]);
      opt.seed = cfg.training.seed;
      opt.split = split;
      opt.cache_dir = cache_dir_for(cfg.data.cache_dir, prefix);
      opt.vocab_size = V;
      MT_CHECK(range.end > range.begin, "data.paths: the ", split_name(split), " split of '", prefix,
               "' is empty: data.split gives it documents [", range.begin, ", ", range.end, ") of ",
               ds->num_documents(), "; use more data or change data.split");
      parts.push_back(std::make_shared<GPTDataset>(ds, range, opt));
      weights.push_back(w / total);
      key += str_cat(std::filesystem::path(prefix).filename().string(), ":", ds->num_documents(), ":",
                     ds->num_tokens(), ":", range.begin, "-", range.end, ":", opt.num_samples, ";");
    }
    if (parts.size() == 1) {
      out[s] = parts[0];
    } else {
      key += str_cat(split_name(split), ":L", L, ":seed", cfg.training.seed);
      out[s] = std::make_shared<BlendedDataset>(std::move(parts), weights, std::max<int64_t>(counts[s], 1),
                                                cache_dir_for(cfg.data.cache_dir, paths[0].second), key);
    }
  }
  return Datasets{out[0], out[1], out[2]};
}

void build_sample_index_cache(const Config& cfg, const DerivedConfig& derived) {
  const SampleCounts c = megatron_sample_counts(cfg, derived);
  const Datasets ds = build_datasets(cfg, derived, c.train, c.valid, c.test);
  const char* names[3] = {"train", "valid", "test"};
  const std::shared_ptr<SampleDataset>* all[3] = {&ds.train, &ds.valid, &ds.test};
  for (int s = 0; s < 3; ++s)
    if (*all[s]) log::info("{}: {}", names[s], (*all[s])->describe());
}

}  // namespace mt::data
