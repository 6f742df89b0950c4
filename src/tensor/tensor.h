// Tensor: storage + dtype + shape. Dimensions in PyTorch order (the last one is contiguous);
// every tensor is contiguous (row-major). Views share storage: view() reshapes, slice() takes a
// range of the first dimension. Memory comes from the device's Allocator (the CUDA backend installs
// a caching one), so Tensor::empty inside a training step never calls cudaMalloc.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/allocator.h"
#include "core/dtype.h"

namespace mt {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3]"
int64_t shape_numel(const Shape& s);

struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  Device device = Device::CPU;
  Allocator* owner = nullptr;  // null: borrowed memory, not freed
  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::CPU);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::CPU);
  // Wraps memory owned elsewhere (not freed by the tensor).
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device = Device::CPU);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::CPU; }
  const Shape& shape() const { return shape_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  std::string str() const;  // "fp32[2, 3]"

  void* raw() const;
  template <typename T>
  T* data() const {
    MT_INTERNAL_ASSERT(dtype_ == dtype_of<T>, "tensor is ", str(), ", accessed as ", dtype_name(dtype_of<T>));
    return static_cast<T*>(raw());
  }

  // Same storage, new shape (same numel; one -1 is inferred).
  Tensor view(const Shape& shape) const;
  // Rows [start, start + len) of the first dimension, sharing storage.
  Tensor slice(int64_t start, int64_t len) const;

  Tensor& zero_();
  // Copies data from src (same numel and dtype; CPU<->CPU here, other devices via the backend).
  void copy_from(const Tensor& src);
  Tensor clone() const;

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  DType dtype_ = DType::F32;
  Shape shape_;
};

// Copy between any two devices (CPU <-> CUDA through the backend hook).
using DeviceCopyFn = void (*)(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);
void set_device_copy(DeviceCopyFn fn);
// Zeroes device memory (the CUDA backend installs a memset on its stream).
using DeviceZeroFn = void (*)(void* dst, size_t bytes);
void set_device_zero(DeviceZeroFn fn);
// Device -> host reads the host waits for later (the CUDA backend installs them: a copy on the compute stream into
// page-locked memory with an event behind it): start returns a handle; finish blocks until the copy has landed,
// copies it to dst and releases the handle.
using DeviceReadStartFn = void* (*)(const void* src, size_t bytes);
using DeviceReadFinishFn = void (*)(void* handle, void* dst, size_t bytes);
void set_device_read(DeviceReadStartFn start, DeviceReadFinishFn finish);
// Host -> device copies that do not wait for the device (the CUDA backend installs one: through page-locked
// staging memory, on the compute stream), so the host goes on queueing work: upload() copies src (host) into dst
// (any device); without a hook, or between host tensors, it is copy_from.
using DeviceUploadFn = void (*)(void* dst, const void* src, size_t bytes);
void set_device_upload(DeviceUploadFn fn);
void upload(Tensor& dst, const Tensor& src);

// A host copy of a small tensor whose wait comes later: the device work queued between the constructor and wait()
// runs while the host waits (the MoE layer reads its expert counts this way, behind the router's losses). Host
// tensors, or no backend hook: copied at once.
class PendingRead {
 public:
  explicit PendingRead(const Tensor& src);
  PendingRead(const PendingRead&) = delete;
  PendingRead& operator=(const PendingRead&) = delete;
  ~PendingRead();
  // The host copy (blocks until it has landed).
  const Tensor& wait();

 private:
  Tensor src_, host_;  // src_ held until the copy has landed
  void* handle_ = nullptr;
};

}  // namespace mt
