#include "params/param_store.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "core/counter_rng.h"
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

Param* ParamStore::add(const ParamSpec& spec) {
  MT_INTERNAL_ASSERT(find(spec.name) == nullptr, "duplicate parameter ", spec.name);
  auto p = std::make_unique<Param>();
  p->spec = spec;
  p->boxes = param_boxes(spec, tp_rank_, tp_size_, &p->local_shape);
  // Expert parameters: an offset inside the expert region, made absolute by allocate.
  const int64_t n = shape_numel(p->local_shape);
  p->flat_offset = static_cast<size_t>(spec.expert_parallel ? expert_total_ : total_ - expert_total_);
  total_ += n;
  if (spec.expert_parallel) expert_total_ += n;
  params_.push_back(std::move(p));
  return params_.back().get();
}

void ParamStore::allocate(DType dtype, Device device, int64_t pad_multiple, int64_t expert_pad_multiple,
                          bool bf16_grads) {
  MT_INTERNAL_ASSERT(!allocated(), "ParamStore::allocate called twice");
  MT_INTERNAL_ASSERT(!bf16_grads || (dtype == DType::BF16 && device != Device::CPU),
                     "bf16 main grads need bf16 values on a GPU");
  auto round_up = [](int64_t n, int64_t m) { return (n + m - 1) / m * m; };
  const int64_t dense = total_ - expert_total_, dense_padded = round_up(dense, pad_multiple);
  regions_.push_back({0, dense, dense_padded, false});
  int64_t padded = dense_padded;
  if (expert_total_ > 0) {
    padded = dense_padded + round_up(expert_total_, expert_pad_multiple);
    regions_.push_back({dense_padded, dense_padded + expert_total_, padded, true});
    for (auto& p : params_)
      if (p->spec.expert_parallel) p->flat_offset += static_cast<size_t>(dense_padded);
  }
  const bool low_precision = dtype == DType::BF16 || dtype == DType::F16;
  flat_values_ = Tensor::zeros({padded}, dtype, device);
  flat_grads_ = Tensor::zeros({padded}, bf16_grads ? DType::BF16 : low_precision ? DType::F32 : dtype, device);
  separate_master_ = low_precision;
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
    MT_INTERNAL_ASSERT(s.global_shape.size() == 1 || s.global_shape.size() == 2, s.name, ": parameters are 1-D or 2-D");
    // Generated in fp64 on the host, box by box (each box is a block of global rows x columns),
    // then cast into the master weights' dtype/device.
    Tensor host = Tensor::empty(p->local_shape, DType::F64);
    double* h = host.data<double>();
    const uint64_t stream = name_hash(s.name);
    const double sd = s.init == ParamInit::ScaledNormal ? std / std::sqrt(2.0 * num_layers) : std;
    const bool two_d = s.global_shape.size() == 2;
    const int64_t gcols = two_d ? s.global_shape[1] : 1, lcols = two_d ? p->local_shape[1] : 1;
    for (const ParamBox& b : p->boxes) {
      const int64_t rows = b.shape[0], cols = two_d ? b.shape[1] : 1;
      const int64_t col0 = two_d ? b.global_offset[1] : 0;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t grow = b.global_offset[0] + i;
        double* out = h + (b.local_row_begin + i) * lcols;
        const bool padding = s.valid_rows >= 0 && grow >= s.valid_rows;
        for (int64_t j = 0; j < cols; ++j) {
          switch (s.init) {
            case ParamInit::Ones: out[j] = 1.0; break;
            case ParamInit::Zeros: out[j] = 0.0; break;
            case ParamInit::Normal:
            case ParamInit::ScaledNormal:
              out[j] = padding ? 0.0 : sd * rng::normal01(seed, stream, static_cast<uint64_t>(grow * gcols + col0 + j));
              break;
          }
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

Tensor& ParamStore::flat_master() {
  MT_INTERNAL_ASSERT(!master_released_, "the store's master weights were released to the distributed optimizer");
  return separate_master_ ? flat_master_ : flat_values_;
}

void ParamStore::release_master() {
  MT_INTERNAL_ASSERT(separate_master_, "release_master: the values are the master weights");
  flat_master_ = Tensor();
  master_released_ = true;
}

Tensor ParamStore::master(const Param& p) {
  return flat_master().slice(static_cast<int64_t>(p.flat_offset), shape_numel(p.local_shape)).view(p.local_shape);
}

void ParamStore::sync_values_from_master(int64_t begin, int64_t n) {
  if (!has_separate_master() || n == 0) return;
  Tensor v = flat_values_.slice(begin, n);
  ops::cast(v, flat_master().slice(begin, n));
}

ops::GradMode grad_write_mode(Param& p) {
  const bool first = p.grad_unwritten;
  p.grad_unwritten = false;
  return first ? ops::GradMode::Overwrite : ops::GradMode::Accumulate;
}

void prepare_grad_accumulate(Param& p) {
  if (p.grad_unwritten) p.grad.zero_();
  p.grad_unwritten = false;
}

void ParamStore::zero_grads() {
  for (auto& p : params_) p->grad_unwritten = true;
  grad_squares_.clear();
}

void ParamStore::record_grad_squares(int64_t begin, int64_t end, Tensor parts) {
  MT_INTERNAL_ASSERT(begin < end, "record_grad_squares: empty range [", begin, ", ", end, ")");
  auto it = std::lower_bound(grad_squares_.begin(), grad_squares_.end(), begin,
                             [](const GradSquares& g, int64_t b) { return g.begin < b; });
  if (it != grad_squares_.end() && it->begin == begin) {
    MT_INTERNAL_ASSERT(it->end == end, "record_grad_squares: [", begin, ", ", end, ") over [", it->begin, ", ",
                       it->end, ")");
    if (parts.defined()) it->parts = std::move(parts);
    else grad_squares_.erase(it);
    return;
  }
  if (!parts.defined()) return;
  MT_INTERNAL_ASSERT((it == grad_squares_.end() || end <= it->begin) &&
                         (it == grad_squares_.begin() || std::prev(it)->end <= begin),
                     "record_grad_squares: [", begin, ", ", end, ") overlaps another range");
  grad_squares_.insert(it, GradSquares{begin, end, std::move(parts)});
}

void ParamStore::zero_unwritten(int64_t begin, int64_t end) {
  for (auto& p : params_) {
    const auto off = static_cast<int64_t>(p->flat_offset);
    if (off >= begin && off < end) prepare_grad_accumulate(*p);
  }
}

std::vector<Param*> ParamStore::params() const {
  std::vector<Param*> v;
  for (auto& p : params_) v.push_back(p.get());
  if (expert_total_ > 0)  // ascending offsets: the dense parameters (registration order), then the experts'
    std::stable_partition(v.begin(), v.end(), [](const Param* p) { return !p->spec.expert_parallel; });
  return v;
}

Param* ParamStore::find(const std::string& name) const {
  for (auto& p : params_)
    if (p->spec.name == name) return p.get();
  return nullptr;
}

}  // namespace mt
