#include "tensor/scalar_read.h"

#include <memory>

#include "core/check.h"
#include "tensor/ops.h"

namespace mt {

std::vector<double> read_scalars(const std::vector<Tensor>& scalars) {
  std::vector<double> out(scalars.size());
  // Per dtype: the values gathered on their device (one launch, no wait) and their copy to the host started; then
  // the host waits (once: both copies are queued before the first wait).
  struct Group {
    DType dt;
    std::vector<size_t> which;
    std::unique_ptr<PendingRead> read;
  };
  std::vector<Group> groups;
  for (DType dt : {DType::F32, DType::F64}) {
    Group g{dt, {}, nullptr};
    for (size_t i = 0; i < scalars.size(); ++i) {
      const Tensor& t = scalars[i];
      MT_INTERNAL_ASSERT(t.dtype() == DType::F32 || t.dtype() == DType::F64, "read_scalars: ", t.str(),
                         " is not F32 or F64");
      if (t.dtype() == dt) g.which.push_back(i);
    }
    if (g.which.empty()) continue;
    std::vector<Tensor> values;
    for (size_t i : g.which) values.push_back(scalars[i]);
    Tensor gathered = Tensor::empty({static_cast<int64_t>(g.which.size())}, dt, values.front().device());
    ops::gather_scalars(gathered, values);
    g.read = std::make_unique<PendingRead>(gathered);
    groups.push_back(std::move(g));
  }
  for (Group& g : groups) {
    const Tensor& host = g.read->wait();
    for (size_t j = 0; j < g.which.size(); ++j)
      out[g.which[j]] = g.dt == DType::F64 ? host.data<double>()[j] : static_cast<double>(host.data<float>()[j]);
  }
  return out;
}

}  // namespace mt
