#include "model/param_store.h"

#include <cmath>

#include "tensor/cpu/counter_rng.h"
#include "tensor/ops.h"

namespace mt {

namespace {
// FNV-1a: a stable hash of a parameter name (std::hash may differ between standard libraries).
uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}
}  // namespace

std::vector<ParamBox> param_boxes(const ParamSpec& spec, int tp_rank, int tp_size, Shape* local_shape) {
  const Shape& g = spec.global_shape;
  Shape local = g;
  std::vector<ParamBox> boxes;
  if (spec.partition_dim < 0 || tp_size == 1) {
    boxes.push_back({Shape(g.size(), 0), g, 0});
    if (local_shape) *local_shape = local;
    return boxes;
  }
  const int d = spec.partition_dim;
  const int chunks = spec.partition_chunks;
  MT_INTERNAL_ASSERT(g[d] % (chunks * tp_size) == 0, spec.name, ": dim ", d, " of ", shape_str(g),
                     " not divisible by ", chunks, " x tp ", tp_size);
  const int64_t chunk = g[d] / chunks, part = chunk / tp_size;
  local[d] = part * chunks;
  MT_INTERNAL_ASSERT(d == 0 || chunks == 1, spec.name, ": multi-chunk splits only along dim 0");
  for (int c = 0; c < chunks; ++c) {
    ParamBox b;
    b.global_offset = Shape(g.size(), 0);
    b.global_offset[d] = c * chunk + tp_rank * part;
    b.shape = g;
    b.shape[d] = part;
    b.local_row_begin = d == 0 ? c * part : 0;
    boxes.push_back(b);
  }
  if (local_shape) *local_shape = local;
  return boxes;
}

int64_t global_flat_index(const Param& p, int64_t local_index) {
  const Shape& g = p.spec.global_shape;
  const Shape& l = p.local_shape;
  // Local multi-index.
  Shape idx(l.size());
  int64_t rem = local_index;
  for (int i = static_cast<int>(l.size()) - 1; i >= 0; --i) {
    idx[i] = rem % l[i];
    rem /= l[i];
  }
  // Find the box holding this local row (boxes differ only along dim 0, or one box along dim 1+).
  const ParamBox* box = &p.boxes[0];
  for (const ParamBox& b : p.boxes)
    if (idx[0] >= b.local_row_begin && idx[0] < b.local_row_begin + b.shape[0]) box = &b;
  int64_t flat = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    int64_t gi = box->global_offset[i] + (i == 0 ? idx[0] - box->local_row_begin : idx[i]);
    flat = flat * g[i] + gi;
  }
  return flat;
}

Param* ParamStore::add(const ParamSpec& spec) {
  MT_INTERNAL_ASSERT(find(spec.name) == nullptr, "duplicate parameter ", spec.name);
  auto p = std::make_unique<Param>();
  p->spec = spec;
  p->boxes = param_boxes(spec, tp_rank_, tp_size_, &p->local_shape);
  p->flat_offset = static_cast<size_t>(total_);
  total_ += shape_numel(p->local_shape);
  params_.push_back(std::move(p));
  return params_.back().get();
}

void ParamStore::allocate(DType dtype, Device device, int64_t pad_multiple) {
  const int64_t padded = (total_ + pad_multiple - 1) / pad_multiple * pad_multiple;
  const bool low_precision = dtype == DType::BF16 || dtype == DType::F16;
  flat_values_ = Tensor::zeros({padded}, dtype, device);
  flat_grads_ = Tensor::zeros({padded}, low_precision ? DType::F32 : dtype, device);
  if (low_precision) flat_master_ = Tensor::zeros({padded}, DType::F32, device);
  for (auto& p : params_) {
    int64_t n = shape_numel(p->local_shape);
    p->value = flat_values_.slice(static_cast<int64_t>(p->flat_offset), n).view(p->local_shape);
    p->grad = flat_grads_.slice(static_cast<int64_t>(p->flat_offset), n).view(p->local_shape);
  }
}

void ParamStore::initialize(uint64_t seed, double std, int num_layers) {
  for (auto& p : params_) {
    const ParamSpec& s = p->spec;
    int64_t n = shape_numel(p->local_shape);
    // Generated in fp64 on the host, then cast into the parameter's dtype/device.
    Tensor host = Tensor::empty(p->local_shape, DType::F64);
    double* h = host.data<double>();
    const uint64_t stream = name_hash(s.name);
    const double sd = s.init == ParamInit::ScaledNormal ? std / std::sqrt(2.0 * num_layers) : std;
    for (int64_t i = 0; i < n; ++i) {
      switch (s.init) {
        case ParamInit::Ones: h[i] = 1.0; break;
        case ParamInit::Zeros: h[i] = 0.0; break;
        case ParamInit::Normal:
        case ParamInit::ScaledNormal: {
          int64_t gi = global_flat_index(*p, i);
          const int64_t row_len = shape_numel(s.global_shape) / s.global_shape[0];
          bool padding = s.valid_rows >= 0 && gi / row_len >= s.valid_rows;
          h[i] = padding ? 0.0 : sd * rng::normal01(seed, stream, static_cast<uint64_t>(gi));
          break;
        }
      }
    }
    Tensor dst = master(*p);
    if (dst.dtype() == DType::F64 && dst.device() == Device::CPU) {
      dst.copy_from(host);
    } else if (dst.device() == Device::CPU) {
      ops::cast(dst, host);
    } else {
      Tensor tmp = Tensor::empty(p->local_shape, dst.dtype());
      ops::cast(tmp, host);
      dst.copy_from(tmp);
    }
  }
  if (has_separate_master()) sync_values_from_master(0, flat_values_.numel());
}

Tensor ParamStore::master(const Param& p) {
  return flat_master().slice(static_cast<int64_t>(p.flat_offset), shape_numel(p.local_shape)).view(p.local_shape);
}

void ParamStore::sync_values_from_master(int64_t begin, int64_t n) {
  if (!has_separate_master() || n == 0) return;
  Tensor v = flat_values_.slice(begin, n);
  ops::cast(v, flat_master_.slice(begin, n));
}

void ParamStore::zero_grads() { flat_grads_.zero_(); }

std::vector<Param*> ParamStore::params() const {
  std::vector<Param*> v;
  for (auto& p : params_) v.push_back(p.get());
  return v;
}

Param* ParamStore::find(const std::string& name) const {
  for (auto& p : params_)
    if (p->spec.name == name) return p.get();
  return nullptr;
}

}  // namespace mt
