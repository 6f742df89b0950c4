// GPT sample index (document / sample / shuffle index), split ranges: see gpt_dataset.h.
#include "data/gpt_dataset.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>

#include "core/check.h"
#include "core/log.h"

namespace mt::data {

namespace {

constexpr const char* kIndexVersion = "megatrain GPTDataset index v1";

std::string base_name(const std::string& prefix) { return std::filesystem::path(prefix).filename().string(); }

}  // namespace

const char* split_name(Split s) {
  switch (s) {
    case Split::Train: return "train";
    case Split::Valid: return "valid";
    case Split::Test: return "test";
  }
  return "?";
}

std::array<DocRange, 3> split_document_ranges(const std::vector<double>& split, int64_t num_documents) {
  MT_CHECK(!split.empty() && split.size() <= 3, "data.split must have 1 to 3 weights (train, valid, test), got ",
           split.size());
  double w[3] = {0, 0, 0}, total = 0;
  for (size_t i = 0; i < split.size(); ++i) {
    MT_CHECK(split[i] >= 0 && std::isfinite(split[i]), "data.split: weight ", split[i], " must be >= 0");
    w[i] = split[i];
    total += split[i];
  }
  MT_CHECK(total > 0, "data.split: the weights sum to 0; give the train split a positive weight, e.g. [98, 1, 1]");
  std::array<DocRange, 3> out;
  double lo = 0;
  for (int i = 0; i < 3; ++i) {
    const double hi = lo + w[i] / total;  // cumulative bookends, as Megatron sums them
    if (hi > lo) {
      const double n = static_cast<double>(num_documents);
      out[i].begin = static_cast<int64_t>(std::nearbyint(lo * n));  // ties to even, like Python's round
      out[i].end = static_cast<int64_t>(std::nearbyint(hi * n));
      out[i].enabled = true;
    }
    lo = hi;
  }
  return out;
}

std::string cache_dir_for(const std::string& cache_dir, const std::string& prefix) {
  if (!cache_dir.empty()) return cache_dir;
  std::filesystem::path dir = std::filesystem::path(prefix).parent_path();
  return (dir / "megatrain_cache").string();
}

GPTDataset::GPTDataset(std::shared_ptr<const IndexedDataset> data, DocRange documents, const GPTDatasetOptions& opt)
    : data_(std::move(data)), range_(documents), opt_(opt) {
  const std::string& prefix = data_->prefix();
  MT_INTERNAL_ASSERT(opt_.seq_length > 0 && opt_.num_samples >= 0, "GPTDataset options");
  MT_INTERNAL_ASSERT(range_.begin >= 0 && range_.begin <= range_.end && range_.end <= data_->num_documents(),
                     "document range [", range_.begin, ", ", range_.end, ") of ", data_->num_documents());
  const auto& di = data_->document_indices();
  doc_lengths_.resize(static_cast<size_t>(range_.end - range_.begin));
  uint64_t lengths_hash = 0;  // fingerprint of the document lengths: the cache must match the data
  for (int64_t d = range_.begin; d < range_.end; ++d) {
    int64_t n = 0;
    for (int64_t s = di[d]; s < di[d + 1]; ++s) n += data_->sequence_length(s);
    doc_lengths_[d - range_.begin] = n;
    tokens_per_epoch_ += n;
    lengths_hash = mix64(lengths_hash ^ static_cast<uint64_t>(n));
  }
  const int64_t L = opt_.seq_length;
  MT_CHECK(tokens_per_epoch_ >= L + 1, "data.paths: the ", split_name(opt_.split), " split of '", prefix,
           "' (documents [", range_.begin, ", ", range_.end, ") of ", data_->num_documents(), ") has ",
           tokens_per_epoch_, " tokens, fewer than model.seq_length + 1 = ", L + 1,
           "; use more data or change data.split");
  // Megatron's _get_num_epochs: whole epochs until num_samples * L + 1 tokens are covered.
  num_epochs_ = 1;
  while (num_epochs_ * tokens_per_epoch_ < opt_.num_samples * L + 1) ++num_epochs_;

  nlohmann::json key = {{"format", kIndexVersion},
                        {"dataset", base_name(prefix)},
                        {"dataset_documents", data_->num_documents()},
                        {"dataset_sequences", data_->num_sequences()},
                        {"dataset_tokens", data_->num_tokens()},
                        {"split", split_name(opt_.split)},
                        {"documents", {range_.begin, range_.end}},
                        {"document_lengths_hash", lengths_hash},
                        {"seq_length", L},
                        {"num_samples", opt_.num_samples},
                        {"seed", opt_.seed}};
  IndexCache cache(opt_.cache_dir, base_name(prefix) + "-" + split_name(opt_.split), key);
  cache_description_path_ = cache.enabled() ? cache.path("description.json") : "";
  if (cache.find() && cache.load("document_index", &document_index_) && cache.load("sample_index", &sample_index_) &&
      cache.load("shuffle_index", &shuffle_index_)) {
    const std::string why = check_index();
    if (why.empty()) {
      loaded_from_cache_ = true;
      log::debug("loaded the {} index of '{}' from {}", split_name(opt_.split), prefix, cache_description_path_);
      return;
    }
    cache.reject(cache.path("description.json"), why);
    document_index_ = sample_index_ = shuffle_index_ = Array<int64_t>();
  }
  build(cache);
}

// Everything get() relies on, so that a loaded index can never read out of bounds: every epoch of
// the document index is a permutation of the range; sample i starts at token i * L of the stream
// (a position in the document index and an offset inside that document); the shuffle index is a
// permutation of the samples. Returns "" when the arrays are sound, else what is wrong.
std::string GPTDataset::check_index() const {
  const int64_t L = opt_.seq_length, ndocs = range_.end - range_.begin;
  const int64_t num_samples = (num_epochs_ * tokens_per_epoch_ - 1) / L;
  if (document_index_.size() != num_epochs_ * ndocs)
    return str_cat("document_index has ", document_index_.size(), " entries, expected ", num_epochs_ * ndocs);
  if (shuffle_index_.size() != num_samples)
    return str_cat("shuffle_index has ", shuffle_index_.size(), " entries, expected ", num_samples);
  if (sample_index_.size() != 2 * (num_samples + 1))
    return str_cat("sample_index has ", sample_index_.size(), " entries, expected ", 2 * (num_samples + 1));
  std::vector<char> seen(static_cast<size_t>(std::max(ndocs, num_samples)));
  for (int64_t e = 0; e < num_epochs_; ++e) {
    std::fill(seen.begin(), seen.end(), 0);
    for (int64_t k = 0; k < ndocs; ++k) {
      const int64_t d = document_index_[e * ndocs + k];
      if (d < range_.begin || d >= range_.end || seen[d - range_.begin]++)
        return str_cat("document_index[", e * ndocs + k, "] = ", d, " is not part of a permutation of documents [",
                       range_.begin, ", ", range_.end, ")");
    }
  }
  int64_t pos = 0, start = 0;  // start: stream position of document_index[pos]
  for (int64_t s = 0; s <= num_samples; ++s) {
    const int64_t p = sample_index_[2 * s], o = sample_index_[2 * s + 1];
    if (p < pos || p >= document_index_.size()) return str_cat("sample_index[", 2 * s, "] = ", p, " is out of order");
    for (; pos < p; ++pos) start += document_length(document_index_[pos]);
    const bool inside = s == 0 ? o == 0 : (o >= 0 && o < document_length(document_index_[p]));
    if (!inside || start + o != s * L)
      return str_cat("sample ", s, " starts at (", p, ", ", o, "), not at token ", s * L);
  }
  std::fill(seen.begin(), seen.end(), 0);
  for (int64_t i = 0; i < num_samples; ++i) {
    const int64_t v = shuffle_index_[i];
    if (v < 0 || v >= num_samples || seen[v]++)
      return str_cat("shuffle_index[", i, "] = ", v, " is not part of a permutation of ", num_samples, " samples");
  }
  return "";
}

void GPTDataset::build(IndexCache& cache) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t L = opt_.seq_length, ndocs = range_.end - range_.begin;
  Shuffler rng(mix64(opt_.seed ^ hash_string(base_name(data_->prefix()) + "/" + split_name(opt_.split))));

  // Document index: each epoch's documents, shuffled per epoch.
  std::vector<int64_t> doc_index(static_cast<size_t>(num_epochs_ * ndocs));
  for (int64_t e = 0; e < num_epochs_; ++e) {
    int64_t* epoch = doc_index.data() + e * ndocs;
    for (int64_t k = 0; k < ndocs; ++k) epoch[k] = range_.begin + k;
    rng.shuffle(epoch, ndocs);
  }

  // Sample index: walk the stream L tokens at a time; each sample also takes the next sample's
  // first token (hence L + 1), so the next sample starts on the last token this one read.
  const int64_t total_tokens = num_epochs_ * tokens_per_epoch_;
  const int64_t num_samples = (total_tokens - 1) / L;
  std::vector<int64_t> sample_index(static_cast<size_t>(2 * (num_samples + 1)));
  int64_t pos = 0, offset = 0;
  sample_index[0] = 0;
  sample_index[1] = 0;
  for (int64_t s = 1; s <= num_samples; ++s) {
    int64_t need = L + 1;  // tokens of sample s - 1 still to read, starting at (pos, offset)
    for (;;) {
      const int64_t avail = document_length(doc_index[pos]) - offset;
      if (need <= avail) {
        offset += need - 1;  // the last token read starts the next sample
        break;
      }
      need -= avail;
      ++pos;
      offset = 0;
      MT_INTERNAL_ASSERT(pos < static_cast<int64_t>(doc_index.size()), "sample index ran off the documents");
    }
    sample_index[2 * s] = pos;
    sample_index[2 * s + 1] = offset;
  }

  // Shuffle index, with Megatron's separate final epoch rule.
  int64_t first_part = num_samples;
  if (num_epochs_ > 1) {
    const int64_t sans_final = ((num_epochs_ - 1) * tokens_per_epoch_ - 1) / L;
    const int64_t per_epoch = (tokens_per_epoch_ - 1) / L;
    const int64_t from_final = opt_.num_samples - sans_final;
    if (from_final < static_cast<int64_t>(0.8 * static_cast<double>(per_epoch))) first_part = sans_final;
  }
  std::vector<int64_t> shuffle(static_cast<size_t>(num_samples));
  for (int64_t i = 0; i < num_samples; ++i) shuffle[i] = i;
  rng.shuffle(shuffle.data(), first_part);
  rng.shuffle(shuffle.data() + first_part, num_samples - first_part);

  cache.add("document_index", doc_index);
  cache.add("sample_index", sample_index);
  cache.add("shuffle_index", shuffle);
  cache.commit();
  saved_to_cache_ = cache.saved();
  document_index_ = Array<int64_t>(std::move(doc_index));
  sample_index_ = Array<int64_t>(std::move(sample_index));
  shuffle_index_ = Array<int64_t>(std::move(shuffle));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log::info("built the {} sample index of '{}': {} samples, {} epoch(s), {:.2f} s{}", split_name(opt_.split),
            data_->prefix(), num_samples, num_epochs_, secs,
            saved_to_cache_ ? " (saved to " + cache_description_path_ + ")" : "");
}

void GPTDataset::read_document(int64_t d, int64_t offset, int64_t count, int32_t* out) const {
  const auto& di = data_->document_indices();
  int64_t s = di[d];
  while (count > 0) {
    MT_INTERNAL_ASSERT(s < di[d + 1], "read past document ", d, " of '", data_->prefix(), "'");
    const int64_t len = data_->sequence_length(s);
    if (offset >= len) {
      offset -= len;
      ++s;
      continue;
    }
    const int64_t n = std::min(count, len - offset);
    data_->read(s, offset, n, out);
    out += n;
    count -= n;
    offset = 0;
    ++s;
  }
}

void GPTDataset::get(int64_t idx, int32_t* out) const {
  const int64_t n = size();
  const int64_t s = shuffle_index_[((idx % n) + n) % n];
  const int64_t p0 = sample_index_[2 * s], o0 = sample_index_[2 * s + 1];
  const int64_t p1 = sample_index_[2 * s + 2], o1 = sample_index_[2 * s + 3];
  int32_t* dst = out;
  for (int64_t p = p0; p <= p1; ++p) {
    const int64_t doc = document_index_[p];
    const int64_t from = p == p0 ? o0 : 0;
    const int64_t to = p == p1 ? o1 + 1 : document_length(doc);
    read_document(doc, from, to - from, dst);
    dst += to - from;
  }
  MT_INTERNAL_ASSERT(dst - out == opt_.seq_length + 1, "sample ", s, " of '", data_->prefix(), "' has ", dst - out,
                     " tokens");
  if (opt_.vocab_size > 0) {
    for (int64_t k = 0; k <= opt_.seq_length; ++k) {
      MT_CHECK(out[k] >= 0 && out[k] < opt_.vocab_size, "data file '", data_->prefix(), ".bin': token id ", out[k],
               " is outside model.vocab_size = ", opt_.vocab_size,
               " (the data was tokenized with another vocabulary: set model.vocab_size to the tokenizer's, or "
               "preprocess the data again)");
    }
  }
}

std::string GPTDataset::describe() const {
  return str_cat("GPTDataset '", data_->prefix(), "' ", split_name(opt_.split), ": documents [", range_.begin, ", ",
                 range_.end, ") of ", data_->num_documents(), ", ", tokens_per_epoch_, " tokens per epoch, ",
                 num_epochs_, " epoch(s), ", size(), " samples of ", opt_.seq_length + 1, " tokens (index ",
                 loaded_from_cache_ ? "loaded from cache" : saved_to_cache_ ? "built and cached" : "built in memory",
                 ")");
}

}  // namespace mt::data
