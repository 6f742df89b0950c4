// inspect: counts, histograms and decoded samples of an indexed dataset (see inspect.h).
#include "data_tools/inspect.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "data/indexed_dataset.h"

namespace mt::data {

namespace {

std::string with_commas(int64_t v) {
  const std::string digits = std::to_string(v < 0 ? -v : v);
  std::string s = v < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s.push_back(',');
    s.push_back(digits[i]);
  }
  return s;
}

// Histogram over buckets {0}, [1,2), [2,4), [4,8), ...
void histogram(const char* title, const std::vector<int64_t>& values, std::ostream& out) {
  if (values.empty()) return;
  std::vector<int64_t> counts(66, 0);
  int64_t total = 0, lo = values[0], hi = values[0];
  for (int64_t v : values) {
    const int b = v <= 0 ? 0 : 1 + (63 - __builtin_clzll(static_cast<unsigned long long>(v)));
    ++counts[b];
    total += v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  char line[160];
  std::snprintf(line, sizeof line, "%s: min %lld, mean %.1f, max %lld\n", title, static_cast<long long>(lo),
                static_cast<double>(total) / values.size(), static_cast<long long>(hi));
  out << line;
  const int64_t peak = *std::max_element(counts.begin(), counts.end());
  const int first = static_cast<int>(std::find_if(counts.begin(), counts.end(), [](int64_t c) { return c > 0; }) - counts.begin());
  const int last = static_cast<int>(counts.rend() - std::find_if(counts.rbegin(), counts.rend(), [](int64_t c) { return c > 0; })) - 1;
  for (int b = first; b <= last; ++b) {
    char range[48] = "0";
    if (b > 0) std::snprintf(range, sizeof range, "[%lld, %lld)", 1LL << (b - 1), 1LL << b);
    const int bar = peak > 0 ? static_cast<int>((40 * counts[b] + peak - 1) / peak) : 0;
    std::snprintf(line, sizeof line, "  %-22s %12s  %s\n", range, with_commas(counts[b]).c_str(),
                  std::string(static_cast<size_t>(bar), '#').c_str());
    out << line;
  }
}

}  // namespace

void inspect_dataset(const InspectOptions& o, std::ostream& out) {
  IndexedDataset ds(o.prefix);
  const auto& docs = ds.document_indices();
  std::vector<int64_t> seq_lens(static_cast<size_t>(ds.num_sequences()));
  for (int64_t i = 0; i < ds.num_sequences(); ++i) seq_lens[i] = ds.sequence_length(i);
  std::vector<int64_t> doc_lens;
  int64_t empty_docs = 0;
  for (size_t d = 0; d + 1 < docs.size(); ++d) {
    int64_t n = 0;
    for (int64_t s = docs[d]; s < docs[d + 1]; ++s) n += seq_lens[s];
    empty_docs += docs[d + 1] == docs[d];
    doc_lens.push_back(n);
  }
  const auto [lo, hi] = ds.token_range();
  out << "dataset     " << o.prefix << " (.idx + .bin)\n"
      << "dtype       " << dtype_name(ds.dtype()) << "\n"
      << "sequences   " << with_commas(ds.num_sequences()) << "\n"
      << "documents   " << with_commas(ds.num_documents()) << " (" << with_commas(empty_docs) << " empty)\n"
      << "tokens      " << with_commas(ds.num_tokens()) << "\n"
      << "token ids   " << (hi < lo ? std::string("none") : with_commas(lo) + " .. " + with_commas(hi)) << "\n";
  histogram("sequence length (tokens)", seq_lens, out);
  histogram("document length (tokens)", doc_lens, out);

  if (o.tokenizer.type.empty() || o.samples <= 0 || doc_lens.empty()) return;
  std::unique_ptr<Tokenizer> tok = make_tokenizer(o.tokenizer);
  out << "tokenizer   " << tok->describe() << "\n";
  if (hi >= tok->vocab_size())
    out << "WARNING: token id " << hi << " is outside this tokenizer's " << tok->vocab_size()
        << " ids: the dataset was made with another tokenizer\n";
  const int64_t n = std::min<int64_t>(o.samples, static_cast<int64_t>(doc_lens.size()));
  for (int64_t k = 0; k < n; ++k) {
    const int64_t d = k * static_cast<int64_t>(doc_lens.size()) / n;
    std::vector<int32_t> ids;
    for (int64_t s = docs[d]; s < docs[d + 1]; ++s) {
      const size_t at = ids.size();
      ids.resize(at + static_cast<size_t>(seq_lens[s]));
      ds.read(s, 0, seq_lens[s], ids.data() + at);
    }
    std::string text;
    try {
      text = tok->decode(ids);
    } catch (const std::exception& e) {
      text = std::string("<cannot decode: ") + e.what() + ">";
    }
    const bool cut = text.size() > o.max_chars;
    if (cut) text.resize(o.max_chars);
    out << "document " << d << " (" << ids.size() << " tokens): "
        << nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << (cut ? " ..." : "") << "\n";
  }
}

}  // namespace mt::data
