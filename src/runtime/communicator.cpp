#include "runtime/communicator.h"

namespace mt {

double Communicator::all_reduce_scalar(double v, ReduceOp op) {
  Tensor t = Tensor::from_blob(&v, {1}, DType::F64);
  all_reduce(t, op);
  return v;
}

int64_t Communicator::all_reduce_int(int64_t v, ReduceOp op) {
  Tensor t = Tensor::from_blob(&v, {1}, DType::I64);
  all_reduce(t, op);
  return v;
}

}  // namespace mt
