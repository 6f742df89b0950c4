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

std::unique_ptr<Work> Communicator::all_to_all_v_async(Tensor& out, const Tensor& in,
                                                       const std::vector<int64_t>& send_rows,
                                                       const std::vector<int64_t>& recv_rows) {
  all_to_all_v(out, in, send_rows, recv_rows);
  return std::make_unique<DoneWork>();
}

size_t all_to_all_v_row_bytes(const Tensor& out, const Tensor& in, const std::vector<int64_t>& send_rows,
                               const std::vector<int64_t>& recv_rows, int group_size) {
  MT_INTERNAL_ASSERT(in.dim() >= 1 && out.dim() >= 1 && in.dtype() == out.dtype(), "all_to_all_v ", in.str(), " -> ",
                     out.str());
  Shape in_row(in.shape().begin() + 1, in.shape().end()), out_row(out.shape().begin() + 1, out.shape().end());
  MT_INTERNAL_ASSERT(in_row == out_row, "all_to_all_v rows differ: ", in.str(), " -> ", out.str());
  MT_INTERNAL_ASSERT(static_cast<int>(send_rows.size()) == group_size && static_cast<int>(recv_rows.size()) == group_size,
                     "all_to_all_v needs ", group_size, " send and receive counts");
  int64_t s = 0, r = 0;
  for (int j = 0; j < group_size; ++j) {
    MT_INTERNAL_ASSERT(send_rows[j] >= 0 && recv_rows[j] >= 0, "all_to_all_v negative count");
    s += send_rows[j];
    r += recv_rows[j];
  }
  MT_INTERNAL_ASSERT(s == in.size(0) && r == out.size(0), "all_to_all_v counts (send ", s, ", receive ", r,
                     ") do not match ", in.str(), " -> ", out.str());
  return static_cast<size_t>(shape_numel(in_row)) * dtype_size(in.dtype());
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
