#include "runtime/communicator.h"

namespace mt {

std::unique_ptr<Work> Communicator::all_reduce_async(Tensor& x, ReduceOp op) {
  all_reduce(x, op);
  return std::make_unique<DoneWork>();
}

std::unique_ptr<Work> Communicator::reduce_scatter_async(Tensor& out, const Tensor& in, ReduceOp op) {
  reduce_scatter(out, in, op);
  return std::make_unique<DoneWork>();
}

std::unique_ptr<Work> Communicator::all_gather_async(Tensor& out, const Tensor& in) {
  all_gather(out, in);
  return std::make_unique<DoneWork>();
}

std::unique_ptr<Work> Communicator::batch_p2p_async(const std::vector<P2POp>& ops) {
  batch_p2p(ops);
  return std::make_unique<DoneWork>();
}

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
