#include "tensor/fp8/fp8_recipe.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/check.h"

namespace mt {

Fp8Options Fp8Options::from_config(const TrainingConfig& t, const DerivedConfig& d) {
  Fp8Options o;
  o.recipe = d.fp8;
  o.format = d.fp8_format;
  o.amax_history_len = t.fp8_amax_history_len;
  o.amax_compute_algo = d.fp8_amax_compute_algo;
  o.margin = t.fp8_margin;
  o.first_last_layers_bf16 = t.fp8_first_last_layers_bf16;
  o.num_layers_at_start_in_bf16 = t.num_layers_at_start_in_bf16;
  o.num_layers_at_end_in_bf16 = t.num_layers_at_end_in_bf16;
  return o;
}

bool Fp8Options::layer_in_fp8(int layer_number, int num_layers) const {
  if (!enabled()) return false;
  if (!first_last_layers_bf16) return true;
  return layer_number >= num_layers_at_start_in_bf16 && layer_number < num_layers - num_layers_at_end_in_bf16;
}

const char* fp8_recipe_name(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::None: return "none";
    case Fp8Recipe::Tensorwise: return "tensorwise";
    case Fp8Recipe::Delayed: return "delayed";
    case Fp8Recipe::Blockwise: return "blockwise";
  }
  return "?";
}

std::string fp8_describe(const Fp8Options& o) {
  if (!o.enabled()) return "fp8 off";
  std::string s = str_cat("fp8 ", fp8_recipe_name(o.recipe), " (",
                          o.format == Fp8Format::Hybrid ? "hybrid: e4m3 forward, e5m2 gradients" : "e4m3");
  if (o.recipe == Fp8Recipe::Delayed)
    s += str_cat("; amax history ", o.amax_history_len, ", ",
                 o.amax_compute_algo == Fp8AmaxAlgo::Max ? "max" : "most_recent");
  if (o.recipe == Fp8Recipe::Blockwise) s += "; 1x128 tiles, 128x128 weight blocks, power-of-2 scales";
  if (o.margin) s += str_cat("; margin ", o.margin);
  if (o.first_last_layers_bf16)
    s += str_cat("; first ", o.num_layers_at_start_in_bf16, " / last ", o.num_layers_at_end_in_bf16,
                 " layers in bf16");
  return s + ")";
}

void AmaxHistory::push(float amax, const Fp8Options& o, fp8::Fp8Dtype t) {
  if (!std::isfinite(amax)) return;  // a non-finite step (skipped by nan_policy) leaves the history as it was
  history.insert(history.begin(), amax);
  if (static_cast<int>(history.size()) > o.amax_history_len) history.resize(static_cast<size_t>(o.amax_history_len));
  float a = history.front();
  if (o.amax_compute_algo == Fp8AmaxAlgo::Max) a = *std::max_element(history.begin(), history.end());
  // TransformerEngine keeps the previous scale when the amax is 0 or not finite.
  if (a > 0.0f && std::isfinite(a)) scale = fp8::scale_from_amax(a, fp8::fp8_max(t), o.margin, false);
}

int Fp8Context::add_linear(const std::string& name) {
  MT_INTERNAL_ASSERT(!scales_.defined(), "FP8 linear ", name, " registered after the state was allocated");
  names_.push_back(name);
  hist_.resize(names_.size() * kFp8Roles);
  return static_cast<int>(names_.size()) - 1;
}

void Fp8Context::ensure_buffers() {
  if (scales_.defined() || names_.empty()) return;
  const int64_t n = static_cast<int64_t>(names_.size()) * kFp8Roles;
  scales_ = Tensor::empty({n}, DType::F32, device_);
  amax_ = Tensor::zeros({n}, DType::F32, device_);
  upload_scales();
}

void Fp8Context::upload_scales() {
  std::vector<float> host(hist_.size());
  for (size_t i = 0; i < hist_.size(); ++i) host[i] = hist_[i].scale;
  scales_.copy_from(Tensor::from_blob(host.data(), {static_cast<int64_t>(host.size())}, DType::F32));
}

Tensor Fp8Context::scale(int linear, Fp8Role r) {
  ensure_buffers();
  return scales_.slice(linear * kFp8Roles + static_cast<int>(r), 1);
}

Tensor Fp8Context::amax(int linear, Fp8Role r) {
  ensure_buffers();
  return amax_.slice(linear * kFp8Roles + static_cast<int>(r), 1);
}

Tensor& Fp8Context::pending_amax() {
  ensure_buffers();
  return amax_;
}

void Fp8Context::begin_step() {
  ensure_buffers();
  if (amax_.defined()) amax_.zero_();
}

void Fp8Context::end_step() {
  ensure_buffers();
  if (names_.empty()) return;
  std::vector<float> host(hist_.size());
  Tensor::from_blob(host.data(), {static_cast<int64_t>(host.size())}, DType::F32).copy_from(amax_);
  for (size_t i = 0; i < hist_.size(); ++i)
    hist_[i].push(host[i], opts_, opts_.dtype(static_cast<Fp8Role>(i % kFp8Roles)));
  upload_scales();
  amax_.zero_();
}

namespace {
const char* role_name(int r) { return r == 0 ? "input" : r == 1 ? "weight" : "grad"; }
}  // namespace

std::vector<std::pair<std::string, std::vector<float>>> Fp8Context::state() const {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (size_t i = 0; i < hist_.size(); ++i) {
    std::vector<float> v{hist_[i].scale};
    v.insert(v.end(), hist_[i].history.begin(), hist_[i].history.end());
    out.emplace_back(str_cat(names_[i / kFp8Roles], ".", role_name(static_cast<int>(i % kFp8Roles))), std::move(v));
  }
  return out;
}

void Fp8Context::set_state(const std::vector<std::pair<std::string, std::vector<float>>>& entries) {
  if (entries.empty()) return;
  std::map<std::string, const std::vector<float>*> by_name;
  for (const auto& [k, v] : entries) by_name[k] = &v;
  for (size_t i = 0; i < hist_.size(); ++i) {
    const std::string key = str_cat(names_[i / kFp8Roles], ".", role_name(static_cast<int>(i % kFp8Roles)));
    auto it = by_name.find(key);
    MT_CHECK(it != by_name.end() && !it->second->empty(), "the checkpoint's FP8 state has no entry for ", key,
             " (saved with another model or training.fp8_first_last_layers_bf16); resume with the run's settings");
    const std::vector<float>& v = *it->second;
    hist_[i].scale = v[0];
    hist_[i].history.assign(v.begin() + 1, v.end());
    if (static_cast<int>(hist_[i].history.size()) > opts_.amax_history_len)
      hist_[i].history.resize(static_cast<size_t>(opts_.amax_history_len));
  }
  if (scales_.defined()) upload_scales();
}

}  // namespace mt
