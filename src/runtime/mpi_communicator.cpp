#include "runtime/mpi_communicator.h"

#include <mpi.h>

#include <cstdlib>
#include <limits>

#include "core/check.h"
#include "runtime/watchdog.h"

namespace mt {

namespace {

#define MT_MPI_CHECK(call, group)                                                                     \
  do {                                                                                                \
    int rc_ = (call);                                                                                 \
    if (rc_ != MPI_SUCCESS) {                                                                         \
      char buf_[MPI_MAX_ERROR_STRING];                                                                \
      int len_ = 0;                                                                                   \
      MPI_Error_string(rc_, buf_, &len_);                                                             \
      throw ::mt::Error(::mt::str_cat("rank ", mpi_world_rank(), " group ", group, ": ", #call,       \
                                      " failed at ", __FILE__, ":", __LINE__, ": ", std::string(buf_, len_))); \
    }                                                                                                 \
  } while (0)

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U16: case DType::BF16: case DType::F16: return MPI_UINT16_T;
    case DType::U8: return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op, DType t) {
  MT_INTERNAL_ASSERT(t == DType::F32 || t == DType::F64 || t == DType::I32 || t == DType::I64,
                     "MPI reductions need fp32/fp64/int32/int64, got ", dtype_name(t));
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::string name, bool owned) : comm_(comm), name_(std::move(name)), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  void all_reduce(Tensor& x, ReduceOp op) override {
    check_host(x);
    if (size_ == 1) return;
    watchdog::Scope wd("all_reduce", name_, x.nbytes());
    MT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, x.raw(), static_cast<int>(x.numel()), mpi_type(x.dtype()),
                               mpi_op(op, x.dtype()), comm_), name_);
  }
  void reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) override {
    check_host(out);
    check_host(in);
    MT_INTERNAL_ASSERT(in.numel() == out.numel() * size_, "reduce_scatter ", in.str(), " -> ", out.str());
    if (size_ == 1) {
      if (out.raw() != in.raw()) out.copy_from(in);
      return;
    }
    watchdog::Scope wd("reduce_scatter", name_, in.nbytes());
    if (aliases(out, in)) {  // in place: MPI has no in-place form that leaves the result at the chunk
      Tensor tmp = in.clone();
      MT_MPI_CHECK(MPI_Reduce_scatter_block(tmp.raw(), out.raw(), static_cast<int>(out.numel()), mpi_type(in.dtype()),
                                            mpi_op(op, in.dtype()), comm_), name_);
      return;
    }
    MT_MPI_CHECK(MPI_Reduce_scatter_block(in.raw(), out.raw(), static_cast<int>(out.numel()), mpi_type(in.dtype()),
                                          mpi_op(op, in.dtype()), comm_), name_);
  }
  void all_gather(Tensor& out, const Tensor& in) override {
    check_host(out);
    check_host(in);
    MT_INTERNAL_ASSERT(out.numel() == in.numel() * size_, "all_gather ", in.str(), " -> ", out.str());
    if (size_ == 1) {
      if (out.raw() != in.raw()) out.copy_from(in);
      return;
    }
    watchdog::Scope wd("all_gather", name_, out.nbytes());
    const bool in_place = aliases(in, out);
    MT_MPI_CHECK(MPI_Allgather(in_place ? MPI_IN_PLACE : in.raw(), static_cast<int>(in.nbytes()), MPI_BYTE, out.raw(),
                               static_cast<int>(in.nbytes()), MPI_BYTE, comm_), name_);
  }
  void all_to_all(Tensor& out, const Tensor& in) override {
    check_host(out);
    check_host(in);
    MT_INTERNAL_ASSERT(out.numel() == in.numel() && in.numel() % size_ == 0, "all_to_all ", in.str(), " -> ", out.str());
    int chunk = static_cast<int>(in.nbytes() / size_);
    watchdog::Scope wd("all_to_all", name_, in.nbytes());
    MT_MPI_CHECK(MPI_Alltoall(in.raw(), chunk, MPI_BYTE, out.raw(), chunk, MPI_BYTE, comm_), name_);
  }
  void all_to_all_v(Tensor& out, const Tensor& in, const std::vector<int64_t>& send_rows,
                    const std::vector<int64_t>& recv_rows) override {
    check_host(out);
    check_host(in);
    const size_t row = all_to_all_v_row_bytes(out, in, send_rows, recv_rows, size_);
    std::vector<int> sc(static_cast<size_t>(size_)), sd(sc.size()), rc(sc.size()), rd(sc.size());
    int64_t so = 0, ro = 0;
    for (size_t j = 0; j < sc.size(); ++j) {
      const int64_t sb = send_rows[j] * static_cast<int64_t>(row), rb = recv_rows[j] * static_cast<int64_t>(row);
      MT_INTERNAL_ASSERT(so + sb <= std::numeric_limits<int>::max() && ro + rb <= std::numeric_limits<int>::max(), "all_to_all_v over 2 GiB on ", name_);
      sc[j] = static_cast<int>(sb);
      sd[j] = static_cast<int>(so);
      rc[j] = static_cast<int>(rb);
      rd[j] = static_cast<int>(ro);
      so += sb;
      ro += rb;
    }
    watchdog::Scope wd("all_to_all_v", name_, static_cast<size_t>(so));
    // empty tensors may have no storage behind them: MPI gets a valid dummy address for zero bytes
    char dummy = 0;
    void* sp = in.numel() > 0 ? in.raw() : &dummy;
    void* rp = out.numel() > 0 ? out.raw() : &dummy;
    MT_MPI_CHECK(MPI_Alltoallv(sp, sc.data(), sd.data(), MPI_BYTE, rp, rc.data(), rd.data(), MPI_BYTE, comm_), name_);
  }
  void broadcast(Tensor& x, int root) override {
    check_host(x);
    if (size_ == 1) return;
    watchdog::Scope wd("broadcast", name_, x.nbytes());
    MT_MPI_CHECK(MPI_Bcast(x.raw(), static_cast<int>(x.nbytes()), MPI_BYTE, root, comm_), name_);
  }
  void send(const Tensor& x, int peer) override {
    check_host(x);
    watchdog::Scope wd("send", name_, x.nbytes());
    MT_MPI_CHECK(MPI_Send(x.raw(), static_cast<int>(x.nbytes()), MPI_BYTE, peer, 0, comm_), name_);
  }
  void recv(Tensor& x, int peer) override {
    check_host(x);
    watchdog::Scope wd("recv", name_, x.nbytes());
    MT_MPI_CHECK(MPI_Recv(x.raw(), static_cast<int>(x.nbytes()), MPI_BYTE, peer, 0, comm_, MPI_STATUS_IGNORE), name_);
  }
  void barrier() override {
    watchdog::Scope wd("barrier", name_, 0);
    MT_MPI_CHECK(MPI_Barrier(comm_), name_);
  }
  void batch_p2p(const std::vector<P2POp>& ops) override {
    std::vector<MPI_Request> reqs(ops.size());
    int64_t bytes_total = 0;
    for (const P2POp& op : ops) bytes_total += op.tensor->nbytes();
    watchdog::Scope wd("batched send/recv", name_, bytes_total);
    for (size_t i = 0; i < ops.size(); ++i) {
      const P2POp& op = ops[i];
      check_host(*op.tensor);
      const int bytes = static_cast<int>(op.tensor->nbytes());
      if (op.kind == P2POp::Kind::Send)
        MT_MPI_CHECK(MPI_Isend(op.tensor->raw(), bytes, MPI_BYTE, op.peer, op.tag, comm_, &reqs[i]), name_);
      else
        MT_MPI_CHECK(MPI_Irecv(op.tensor->raw(), bytes, MPI_BYTE, op.peer, op.tag, comm_, &reqs[i]), name_);
    }
    if (!reqs.empty())
      MT_MPI_CHECK(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), name_);
  }

 private:
  // `part` is this rank's chunk of `whole` (the in-place forms of reduce_scatter / all_gather).
  bool aliases(const Tensor& part, const Tensor& whole) const {
    return static_cast<const char*>(part.raw()) == static_cast<const char*>(whole.raw()) + rank_ * part.nbytes();
  }
  void check_host(const Tensor& x) const {
    MT_INTERNAL_ASSERT(x.device() == Device::CPU, "MPI communicator '", name_, "' needs host buffers, got ",
                       device_name(x.device()));
  }
  MPI_Comm comm_;
  std::string name_;
  bool owned_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

void mpi_init(int* argc, char*** argv) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) return;
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

void mpi_finalize() {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Finalize();
}

int mpi_world_rank() {
  int inited = 0, r = 0;
  MPI_Initialized(&inited);
  if (inited) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int mpi_world_size() {
  int inited = 0, s = 1;
  MPI_Initialized(&inited);
  if (inited) MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

void mpi_abort(int code) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited && mpi_world_size() > 1) MPI_Abort(MPI_COMM_WORLD, code);
  mpi_finalize();  // a single rank exits cleanly (no MPI abort banner)
  std::exit(code);
}

std::unique_ptr<Communicator> make_world_communicator() {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world", false);
}

std::unique_ptr<Communicator> make_mpi_subgroup(const std::vector<int>& ranks, const std::string& name) {
  MPI_Group world_group, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, static_cast<int>(ranks.size()), ranks.data(), &group);
  MPI_Comm comm;
  // MPI_Comm_create_group is collective only over the members of `group`.
  MT_MPI_CHECK(MPI_Comm_create_group(MPI_COMM_WORLD, group, 0, &comm), name);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  MT_INTERNAL_ASSERT(comm != MPI_COMM_NULL, "rank ", mpi_world_rank(), " is not in group ", name);
  return std::make_unique<MpiCommunicator>(comm, name, true);
}

std::unique_ptr<Communicator> make_mpi_split(int color, int key, const std::string& name) {
  MPI_Comm comm = MPI_COMM_NULL;
  MT_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color < 0 ? MPI_UNDEFINED : color, key, &comm), name);
  if (comm == MPI_COMM_NULL) {
    MT_INTERNAL_ASSERT(color < 0, "rank ", mpi_world_rank(), " got no communicator for group ", name, " color ", color);
    return nullptr;
  }
  return std::make_unique<MpiCommunicator>(comm, name, true);
}

}  // namespace mt
