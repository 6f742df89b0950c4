// Reading many one-element device tensors (losses, sums of squares) with one wait for the device: the values are
// gathered on their device (one launch, ops::gather_scalars: no host synchronization), then one copy per dtype
// brings them to the host. The step reads its loss, its gradient sums of squares and the MoE layers' loss values this way at the
// end of the backward.
#pragma once

#include <vector>

#include "tensor/tensor.h"

namespace mt {

// The values of `scalars` (each one element, F32 or F64, all on one device; host tensors are read directly), in
// order, as doubles.
std::vector<double> read_scalars(const std::vector<Tensor>& scalars);

}  // namespace mt
