// Weighted blend of datasets: see blended_dataset.h.
#include "data/blended_dataset.h"

#include <cmath>
#include <limits>

#include "core/check.h"
#include "core/log.h"

namespace mt::data {

int64_t blended_component_size(double normalized_weight, int64_t size) {
  const double target = std::ceil(static_cast<double>(size) * normalized_weight);
  return static_cast<int64_t>(std::ceil(target * (1.0 + 0.005)));
}

void build_blending_indices(const std::vector<double>& weights, int64_t size, std::vector<int16_t>* dataset_index,
                            std::vector<int64_t>* dataset_sample_index) {
  const size_t n = weights.size();
  MT_INTERNAL_ASSERT(n >= 1 && n <= static_cast<size_t>(std::numeric_limits<int16_t>::max()), n, " datasets");
  dataset_index->resize(static_cast<size_t>(size));
  dataset_sample_index->resize(static_cast<size_t>(size));
  std::vector<int64_t> count(n, 0);
  for (int64_t i = 0; i < size; ++i) {
    const double progress = std::max(static_cast<double>(i), 1.0);
    size_t best = 0;
    double best_error = weights[0] * progress - static_cast<double>(count[0]);
    for (size_t d = 1; d < n; ++d) {
      const double error = weights[d] * progress - static_cast<double>(count[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    (*dataset_index)[i] = static_cast<int16_t>(best);
    (*dataset_sample_index)[i] = count[best]++;
  }
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<SampleDataset>> datasets, std::vector<double> weights,
                               int64_t size, const std::string& cache_dir, const std::string& cache_key)
    : datasets_(std::move(datasets)), weights_(std::move(weights)), size_(size) {
  MT_INTERNAL_ASSERT(!datasets_.empty() && datasets_.size() == weights_.size() && size_ > 0, "blend arguments");
  double total = 0;
  for (double w : weights_) total += w;
  for (double& w : weights_) w /= total;
  for (const auto& d : datasets_)
    MT_INTERNAL_ASSERT(d && d->seq_length() == datasets_[0]->seq_length(), "blend of different sequence lengths");

  nlohmann::json key = {{"format", "megatrain BlendedDataset index v1"}, {"components", cache_key},
                        {"weights", weights_}, {"size", size_}};
  IndexCache cache(cache_dir, "blend", key);
  if (cache.find() && cache.load("dataset_index", &dataset_index_) &&
      cache.load("dataset_sample_index", &dataset_sample_index_)) {
    std::string why;
    if (dataset_index_.size() != size_ || dataset_sample_index_.size() != size_)
      why = str_cat(dataset_index_.size(), " and ", dataset_sample_index_.size(), " entries, expected ", size_);
    for (int64_t i = 0; why.empty() && i < size_; ++i) {
      if (dataset_index_[i] < 0 || static_cast<size_t>(dataset_index_[i]) >= datasets_.size() ||
          dataset_sample_index_[i] < 0)
        why = str_cat("entry ", i, " = (", dataset_index_[i], ", ", dataset_sample_index_[i], ") is out of range");
    }
    if (why.empty()) {
      loaded_from_cache_ = true;
      return;
    }
    cache.reject(cache.path("description.json"), why);
  }
  std::vector<int16_t> di;
  std::vector<int64_t> dsi;
  build_blending_indices(weights_, size_, &di, &dsi);
  cache.add("dataset_index", di);
  cache.add("dataset_sample_index", dsi);
  cache.commit();
  dataset_index_ = Array<int16_t>(std::move(di));
  dataset_sample_index_ = Array<int64_t>(std::move(dsi));
}

void BlendedDataset::get(int64_t idx, int32_t* out) const {
  const int64_t i = ((idx % size_) + size_) % size_;
  datasets_[static_cast<size_t>(dataset_index_[i])]->get(dataset_sample_index_[i], out);
}

std::string BlendedDataset::describe() const {
  std::string s = str_cat("BlendedDataset of ", datasets_.size(), " datasets, ", size_, " samples:");
  for (size_t d = 0; d < datasets_.size(); ++d) s += str_cat(" [weight ", weights_[d], "] ", datasets_[d]->describe(), ";");
  s.pop_back();
  return s;
}

}  // namespace mt::data
