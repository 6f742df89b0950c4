// Collective communication over one process group. Two implementations share this interface:
// MPI on host buffers (mpi_communicator.h, the CPU backend and CI) and NCCL on device buffers
// (multi-GPU). Model code never includes this header: it goes through the mappings in src/parallel.
// Every member is collective over the group unless it says otherwise; buffers are contiguous.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace mt {

enum class ReduceOp { Sum, Max, Min };

// One point-to-point transfer of a batch (see Communicator::batch_p2p).
struct P2POp {
  enum class Kind { Send, Recv } kind;
  Tensor* tensor;  // source (Send) or destination (Recv), contiguous, sized by the caller
  int peer;        // rank in this group
  int tag;         // matched together with the peer: sends and receives pair up in issue order per (peer, tag)
};

// An operation started by one of the *_async calls. wait() makes its result visible to what runs
// next on this rank (on a GPU: the compute stream waits for it, the host does not); idempotent.
// Buffers given to an asynchronous call must stay alive and untouched until wait() returned.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

// A Work that is already complete (blocking implementations).
class DoneWork final : public Work {
 public:
  void wait() override {}
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  // rank inside this group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // "world", "tp", "dp", ... (for error messages)

  virtual void all_reduce(Tensor& x, ReduceOp op) = 0;  // in place
  // in: size() equal chunks along dim 0; out: this rank's chunk, reduced over the group.
  virtual void reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) = 0;
  // out: the group's `in` tensors concatenated along dim 0, in rank order.
  virtual void all_gather(Tensor& out, const Tensor& in) = 0;
  // in/out: size() equal chunks along dim 0; chunk j of `in` goes to rank j, arriving as chunk rank().
  virtual void all_to_all(Tensor& out, const Tensor& in) = 0;
  // Blocks of rows of different sizes (all-to-all-v; the MoE token dispatch): `in` holds size() consecutive
  // blocks along dim 0, block j (send_rows[j] rows) going to rank j; `out` receives recv_rows[j] rows from rank j,
  // blocks in rank order. A row is the product of the other dims (the same in `in` and `out`, on every rank);
  // blocks of zero rows and empty tensors are allowed. Every rank of the group calls it, whatever its counts.
  virtual void all_to_all_v(Tensor& out, const Tensor& in, const std::vector<int64_t>& send_rows,
                            const std::vector<int64_t>& recv_rows) = 0;
  virtual void broadcast(Tensor& x, int root) = 0;
  virtual void send(const Tensor& x, int peer) = 0;  // point-to-point (not collective)
  virtual void recv(Tensor& x, int peer) = 0;
  virtual void barrier() = 0;
  // Starts every transfer of `ops` at once and returns when all have completed (like
  // torch.distributed.batch_isend_irecv + wait): a stage may send forward and receive backward in
  // one call without deadlock, whatever order its peer lists them in.
  virtual void batch_p2p(const std::vector<P2POp>& ops) = 0;

  // Asynchronous forms, for overlapping communication with computation (gradient buckets,
  // parameter all-gathers, pipeline transfers, the MoE token exchange). The default runs the
  // blocking call and returns a completed Work, so that the CPU backend computes exactly what the
  // GPU one does, only unhidden.
  // In-place forms are allowed: reduce_scatter with `out` the rank's chunk of `in`, all_gather with
  // `in` the rank's chunk of `out`.
  virtual std::unique_ptr<Work> all_reduce_async(Tensor& x, ReduceOp op);
  virtual std::unique_ptr<Work> reduce_scatter_async(Tensor& out, const Tensor& in, ReduceOp op);
  virtual std::unique_ptr<Work> all_gather_async(Tensor& out, const Tensor& in);
  virtual std::unique_ptr<Work> batch_p2p_async(const std::vector<P2POp>& ops);
  // The MoE token exchange started while the shared experts compute (parallel/token_dispatcher.h).
  virtual std::unique_ptr<Work> all_to_all_v_async(Tensor& out, const Tensor& in, const std::vector<int64_t>& send_rows,
                                                   const std::vector<int64_t>& recv_rows);

  // Host-value helpers (built on the tensor calls).
  double all_reduce_scalar(double v, ReduceOp op);
  int64_t all_reduce_int(int64_t v, ReduceOp op);
};

// Bytes of one row of an all_to_all_v; checks the shapes and that the counts add up to the tensors' rows.
size_t all_to_all_v_row_bytes(const Tensor& out, const Tensor& in, const std::vector<int64_t>& send_rows,
                              const std::vector<int64_t>& recv_rows, int group_size);

}  // namespace mt
