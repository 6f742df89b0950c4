#include "tensor/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>
#include <utility>

namespace mt {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::F64: return "fp64";
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::U16: return "uint16";
    case DType::U8: return "uint8";
  }
  return "?";
}

bool dtype_from_name(const std::string& name, DType* out) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (name == dtype_name(static_cast<DType>(i))) {
      *out = static_cast<DType>(i);
      return true;
    }
  }
  return false;
}

const char* device_name(Device d) {
  switch (d) {
    case Device::CPU: return "cpu";
    case Device::CUDA: return "cuda";
    case Device::Meta: return "meta";
  }
  return "?";
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

namespace {

void default_copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  MT_INTERNAL_ASSERT(dst_dev == Device::CPU && src_dev == Device::CPU, "copy ", device_name(src_dev), " -> ",
                     device_name(dst_dev), " needs the CUDA backend");
  std::memcpy(dst, src, bytes);
}
DeviceCopyFn g_copy = default_copy;
DeviceZeroFn g_zero = nullptr;
DeviceReadStartFn g_read_start = nullptr;
DeviceReadFinishFn g_read_finish = nullptr;
DeviceUploadFn g_upload = nullptr;
}  // namespace

void set_device_upload(DeviceUploadFn fn) { g_upload = fn; }
void upload(Tensor& dst, const Tensor& src) {
  MT_INTERNAL_ASSERT(src.device() == Device::CPU && src.numel() == dst.numel() && src.dtype() == dst.dtype(),
                     "upload ", src.str(), " into ", dst.str());
  if (dst.device() == Device::CPU || !g_upload || dst.numel() == 0) return dst.copy_from(src);
  g_upload(dst.raw(), src.raw(), dst.nbytes());
}

void set_device_copy(DeviceCopyFn fn) { g_copy = fn; }
void set_device_zero(DeviceZeroFn fn) { g_zero = fn; }
void set_device_read(DeviceReadStartFn start, DeviceReadFinishFn finish) {
  g_read_start = start;
  g_read_finish = finish;
}

PendingRead::PendingRead(const Tensor& src) : host_(Tensor::empty(src.shape(), src.dtype())) {
  if (src.device() == Device::CPU || !g_read_start || src.numel() == 0) {
    host_.copy_from(src);
    return;
  }
  src_ = src;
  handle_ = g_read_start(src.raw(), src.nbytes());
}

const Tensor& PendingRead::wait() {
  if (handle_) {
    void* h = std::exchange(handle_, nullptr);
    g_read_finish(h, host_.raw(), host_.nbytes());
    src_ = Tensor();
  }
  return host_;
}

PendingRead::~PendingRead() {
  if (!handle_) return;
  try {
    g_read_finish(handle_, host_.raw(), host_.nbytes());  // the copy must land before its buffer is reused
  } catch (...) {  // a device error: reported by whatever touches the device next
  }
}

Storage::~Storage() {
  if (owner && data) owner->deallocate(data, bytes);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) MT_INTERNAL_ASSERT(d >= 0, "negative dimension in ", shape_str(shape));
  Tensor t;
  t.storage_ = std::make_shared<Storage>();
  t.storage_->device = device;
  t.storage_->bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  t.dtype_ = dtype;
  t.shape_ = shape;
  if (device != Device::Meta) {
    Allocator* a = allocator_for(device);
    MT_INTERNAL_ASSERT(a != nullptr, "no allocator for device ", device_name(device));
    t.storage_->owner = a;
    t.storage_->data = a->allocate(t.storage_->bytes);
  }
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.storage_ = std::make_shared<Storage>();
  t.storage_->data = data;
  t.storage_->bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  t.storage_->device = device;
  t.dtype_ = dtype;
  t.shape_ = shape;
  return t;
}

int64_t Tensor::size(int d) const {
  int n = dim();
  if (d < 0) d += n;
  MT_INTERNAL_ASSERT(d >= 0 && d < n, "dimension ", d, " out of range for ", str());
  return shape_[d];
}

std::string Tensor::str() const { return std::string(dtype_name(dtype_)) + shape_str(shape_); }

void* Tensor::raw() const {
  MT_INTERNAL_ASSERT(storage_ != nullptr, "undefined tensor");
  MT_INTERNAL_ASSERT(storage_->device != Device::Meta, "meta tensor ", str(), " has no data");
  return static_cast<char*>(storage_->data) + offset_;
}

Tensor Tensor::view(const Shape& shape) const {
  Shape s = shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      MT_INTERNAL_ASSERT(infer < 0, "two -1 in view ", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) s[infer] = known == 0 ? 0 : numel() / known;
  MT_INTERNAL_ASSERT(shape_numel(s) == numel(), "view ", shape_str(shape), " of ", str());
  Tensor t = *this;
  t.shape_ = s;
  return t;
}

Tensor Tensor::slice(int64_t start, int64_t len) const {
  MT_INTERNAL_ASSERT(dim() >= 1 && start >= 0 && len >= 0 && start + len <= shape_[0], "slice [", start, ", ",
                     start + len, ") of ", str());
  Tensor t = *this;
  int64_t row = shape_numel(shape_) / (shape_[0] == 0 ? 1 : shape_[0]);
  t.offset_ += static_cast<size_t>(start * row) * dtype_size(dtype_);
  t.shape_[0] = len;
  return t;
}

Tensor& Tensor::zero_() {
  if (device() == Device::Meta || numel() == 0) return *this;
  if (device() == Device::CPU) {
    std::memset(raw(), 0, nbytes());
  } else if (g_zero) {
    g_zero(raw(), nbytes());
  } else {
    std::vector<char> z(nbytes(), 0);
    g_copy(raw(), device(), z.data(), Device::CPU, nbytes());
  }
  return *this;
}

void Tensor::copy_from(const Tensor& src) {
  MT_INTERNAL_ASSERT(src.numel() == numel() && src.dtype() == dtype(), "copy ", src.str(), " into ", str());
  if (numel() == 0) return;
  g_copy(raw(), device(), src.raw(), src.device(), nbytes());
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  if (device() != Device::Meta) t.copy_from(*this);
  return t;
}

}  // namespace mt
