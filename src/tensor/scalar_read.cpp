#include "tensor/scalar_read.h"

#include "core/check.h"
#include "tensor/ops.h"

namespace mt {

std::vector<double> read_scalars(const std::vector<Tensor>& scalars) {
  std::vector<double> out(scalars.size());
  for (DType dt : {DType::F32, DType::F64}) {
    std::vector<size_t> which;
    for (size_t i = 0; i < scalars.size(); ++i) {
      const Tensor& t = scalars[i];
      MT_INTERNAL_ASSERT(t.dtype() == DType::F32 || t.dtype() == DType::F64, "read_scalars: ", t.str(),
                         " is not F32 or F64");
      if (t.dtype() == dt) which.push_back(i);
    }
    if (which.empty()) continue;
    const Device dev = scalars[which.front()].device();
    std::vector<Tensor> group;
    for (size_t i : which) group.push_back(scalars[i]);
    Tensor host = Tensor::empty({static_cast<int64_t>(which.size())}, dt);
    if (dev == Device::CPU) {
      ops::gather_scalars(host, group);
    } else {
      Tensor gathered = Tensor::empty(host.shape(), dt, dev);
      ops::gather_scalars(gathered, group);  // one launch on the stream, no wait
      host.copy_from(gathered);              // the one wait for the device
    }
    for (size_t j = 0; j < which.size(); ++j)
      out[which[j]] = dt == DType::F64 ? host.data<double>()[j] : static_cast<double>(host.data<float>()[j]);
  }
  return out;
}

}  // namespace mt
