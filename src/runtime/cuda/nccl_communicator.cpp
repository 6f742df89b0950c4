// The NCCL communicator (see nccl_communicator.h).
#include "runtime/cuda/nccl_communicator.h"

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/cuda_context.h"
#include "runtime/watchdog.h"

namespace mt::cuda {

namespace {

using Event = std::shared_ptr<CUevent_st>;

// Recycled CUDA events: a Work's completion event is shared with the watchdog, which may poll it
// after the Work is gone, so events return to the pool when the last holder drops them.
class EventPool {
 public:
  explicit EventPool(unsigned flags) : flags_(flags) {}
  Event get() {
    cudaEvent_t e = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        e = free_.back();
        free_.pop_back();
      }
    }
    if (!e) MT_CUDA_CHECK(cudaEventCreateWithFlags(&e, flags_));
    return Event(e, [this](cudaEvent_t ev) {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(ev);
    });
  }

 private:
  unsigned flags_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

EventPool& sync_events() {
  static auto* pool = new EventPool(cudaEventDisableTiming);
  return *pool;
}
EventPool& timing_events() {
  static auto* pool = new EventPool(cudaEventDefault);
  return *pool;
}

// (before, after) events recorded on the compute stream around each wait for communication.
std::mutex g_exposed_mu;
std::vector<std::pair<Event, Event>> g_exposed;

class NcclWork final : public Work {
 public:
  explicit NcclWork(Event done) : done_(std::move(done)) {}
  ~NcclWork() override {
    if (!waited_) cudaStreamWaitEvent(current_stream(), done_.get(), 0);  // never let a buffer be reused early
  }
  void wait() override {
    if (waited_) return;
    waited_ = true;
    cudaStream_t s = current_stream();
    Event before = timing_events().get(), after = timing_events().get();
    MT_CUDA_CHECK(cudaEventRecord(before.get(), s));
    MT_CUDA_CHECK(cudaStreamWaitEvent(s, done_.get(), 0));
    MT_CUDA_CHECK(cudaEventRecord(after.get(), s));
    std::lock_guard<std::mutex> lock(g_exposed_mu);
    g_exposed.emplace_back(std::move(before), std::move(after));
  }

 private:
  Event done_;
  bool waited_ = false;
};

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
    case DType::U16: break;
  }
  MT_INTERNAL_ASSERT(false, "NCCL reductions do not support ", dtype_name(t));
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

bool on_host(const Tensor& t) { return t.device() == Device::CPU; }

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(std::unique_ptr<Communicator> host) : host_(std::move(host)) {}
  // The NCCL communicator is not destroyed: at exit a peer may already be gone, and destroying it
  // then can block; the process's end releases it.

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& name() const override { return host_->name(); }

  void all_reduce(Tensor& x, ReduceOp op) override { all_reduce_async(x, op)->wait(); }
  void reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) override {
    reduce_scatter_async(out, in, op)->wait();
  }
  void all_gather(Tensor& out, const Tensor& in) override { all_gather_async(out, in)->wait(); }
  void batch_p2p(const std::vector<P2POp>& ops) override { batch_p2p_async(ops)->wait(); }

  std::unique_ptr<Work> all_reduce_async(Tensor& x, ReduceOp op) override {
    if (on_host(x)) return host_->all_reduce_async(x, op);
    if (size() == 1) return std::make_unique<DoneWork>();
    return launch("all_reduce", x.nbytes(), [&] {
      MT_NCCL_CHECK(ncclAllReduce(x.raw(), x.raw(), x.numel(), nccl_type(x.dtype()), nccl_op(op), comm_, stream_));
    });
  }
  std::unique_ptr<Work> reduce_scatter_async(Tensor& out, const Tensor& in, ReduceOp op) override {
    if (on_host(in)) return host_->reduce_scatter_async(out, in, op);
    MT_INTERNAL_ASSERT(in.numel() == out.numel() * size() && in.dtype() == out.dtype(), "reduce_scatter ", in.str(),
                       " -> ", out.str());
    if (size() == 1) {
      if (out.raw() != in.raw()) out.copy_from(in);
      return std::make_unique<DoneWork>();
    }
    return launch("reduce_scatter", in.nbytes(), [&] {
      MT_NCCL_CHECK(ncclReduceScatter(in.raw(), out.raw(), out.numel(), nccl_type(in.dtype()), nccl_op(op), comm_,
                                      stream_));
    });
  }
  std::unique_ptr<Work> all_gather_async(Tensor& out, const Tensor& in) override {
    if (on_host(in)) return host_->all_gather_async(out, in);
    MT_INTERNAL_ASSERT(out.numel() == in.numel() * size() && in.dtype() == out.dtype(), "all_gather ", in.str(),
                       " -> ", out.str());
    if (size() == 1) {
      if (out.raw() != in.raw()) out.copy_from(in);
      return std::make_unique<DoneWork>();
    }
    return launch("all_gather", out.nbytes(), [&] {
      MT_NCCL_CHECK(ncclAllGather(in.raw(), out.raw(), in.nbytes(), ncclUint8, comm_, stream_));
    });
  }
  void all_to_all(Tensor& out, const Tensor& in) override {
    if (on_host(in)) return host_->all_to_all(out, in);
    MT_INTERNAL_ASSERT(out.numel() == in.numel() && in.numel() % size() == 0, "all_to_all ", in.str(), " -> ",
                       out.str());
    const size_t chunk = in.nbytes() / size();
    launch("all_to_all", in.nbytes(), [&] {
      MT_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < size(); ++r) {
        MT_NCCL_CHECK(ncclSend(static_cast<const char*>(in.raw()) + r * chunk, chunk, ncclUint8, r, comm_, stream_));
        MT_NCCL_CHECK(ncclRecv(static_cast<char*>(out.raw()) + r * chunk, chunk, ncclUint8, r, comm_, stream_));
      }
      MT_NCCL_CHECK(ncclGroupEnd());
    })->wait();
  }
  void all_to_all_v(Tensor& out, const Tensor& in, const std::vector<int64_t>& send_rows,
                    const std::vector<int64_t>& recv_rows) override {
    all_to_all_v_async(out, in, send_rows, recv_rows)->wait();
  }
  // Grouped ncclSend / ncclRecv, one pair per peer (zero-byte pairs skipped: both sides know the counts).
  std::unique_ptr<Work> all_to_all_v_async(Tensor& out, const Tensor& in, const std::vector<int64_t>& send_rows,
                                           const std::vector<int64_t>& recv_rows) override {
    if (on_host(in)) return host_->all_to_all_v_async(out, in, send_rows, recv_rows);
    const size_t row = all_to_all_v_row_bytes(out, in, send_rows, recv_rows, size());
    int64_t total = 0;
    for (int64_t r : send_rows) total += r;
    return launch("all_to_all_v", static_cast<size_t>(total) * row, [&] {
      MT_NCCL_CHECK(ncclGroupStart());
      size_t so = 0, ro = 0;
      for (int r = 0; r < size(); ++r) {
        const size_t sb = static_cast<size_t>(send_rows[r]) * row, rb = static_cast<size_t>(recv_rows[r]) * row;
        if (sb > 0)
          MT_NCCL_CHECK(ncclSend(static_cast<const char*>(in.raw()) + so, sb, ncclUint8, r, comm_, stream_));
        if (rb > 0) MT_NCCL_CHECK(ncclRecv(static_cast<char*>(out.raw()) + ro, rb, ncclUint8, r, comm_, stream_));
        so += sb;
        ro += rb;
      }
      MT_NCCL_CHECK(ncclGroupEnd());
    });
  }
  void broadcast(Tensor& x, int root) override {
    if (on_host(x)) return host_->broadcast(x, root);
    if (size() == 1) return;
    launch("broadcast", x.nbytes(), [&] {
      MT_NCCL_CHECK(ncclBroadcast(x.raw(), x.raw(), x.nbytes(), ncclUint8, root, comm_, stream_));
    })->wait();
  }
  void send(const Tensor& x, int peer) override {
    if (on_host(x)) return host_->send(x, peer);
    launch("send", x.nbytes(), [&] { MT_NCCL_CHECK(ncclSend(x.raw(), x.nbytes(), ncclUint8, peer, comm_, stream_)); })
        ->wait();
  }
  void recv(Tensor& x, int peer) override {
    if (on_host(x)) return host_->recv(x, peer);
    launch("recv", x.nbytes(), [&] { MT_NCCL_CHECK(ncclRecv(x.raw(), x.nbytes(), ncclUint8, peer, comm_, stream_)); })
        ->wait();
  }
  void barrier() override { host_->barrier(); }

  void ensure_init() {
    if (comm_) return;
    ncclUniqueId id{};
    if (rank() == 0) MT_NCCL_CHECK(ncclGetUniqueId(&id));
    Tensor blob = Tensor::from_blob(&id, {static_cast<int64_t>(sizeof id)}, DType::U8);
    host_->broadcast(blob, 0);
    {
      watchdog::Scope wd("ncclCommInitRank", name(), 0);
      MT_NCCL_CHECK(ncclCommInitRank(&comm_, size(), id, rank()));
    }
    int least = 0, greatest = 0;
    MT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    MT_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    device_ = context().device;
    ncclComm_t c = comm_;
    watchdog::on_abort([c] { ncclCommAbort(c); });
  }

  // NCCL pairs the sends and receives between two ranks in issue order, ignoring tags; issuing each
  // batch sorted by tag makes both sides list the messages between them in the same order (a tag
  // names one message), as MPI's tag matching would.
  std::unique_ptr<Work> batch_p2p_async(const std::vector<P2POp>& ops) override {
    MT_INTERNAL_ASSERT(!ops.empty(), "empty point-to-point batch");
    if (on_host(*ops.front().tensor)) return host_->batch_p2p_async(ops);
    std::vector<P2POp> sorted = ops;
    std::stable_sort(sorted.begin(), sorted.end(), [](const P2POp& a, const P2POp& b) { return a.tag < b.tag; });
    int64_t bytes = 0;
    for (const P2POp& op : sorted) bytes += op.tensor->nbytes();
    return launch("batched send/recv", bytes, [&] {
      MT_NCCL_CHECK(ncclGroupStart());
      for (const P2POp& op : sorted) {
        MT_INTERNAL_ASSERT(!on_host(*op.tensor), "point-to-point batch mixes host and device buffers");
        if (op.kind == P2POp::Kind::Send)
          MT_NCCL_CHECK(ncclSend(op.tensor->raw(), op.tensor->nbytes(), ncclUint8, op.peer, comm_, stream_));
        else
          MT_NCCL_CHECK(ncclRecv(op.tensor->raw(), op.tensor->nbytes(), ncclUint8, op.peer, comm_, stream_));
      }
      MT_NCCL_CHECK(ncclGroupEnd());
    });
  }

 private:
  // Runs `issue` (the NCCL calls) on this group's stream after the compute stream's queued work.
  template <typename F>
  std::unique_ptr<Work> launch(const char* what, int64_t bytes, F&& issue) {
    ensure_init();
    MT_CUDA_CHECK(cudaEventRecord(ready_, current_stream()));
    MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    issue();
    Event done = sync_events().get();
    MT_CUDA_CHECK(cudaEventRecord(done.get(), stream_));
    if (watchdog::enabled()) {
      const int dev = device_;
      watchdog::begin(what, name(), bytes, [done, dev] {
        cudaSetDevice(dev);
        return cudaEventQuery(done.get()) != cudaErrorNotReady;
      });
    }
    return std::make_unique<NcclWork>(std::move(done));
  }

  std::unique_ptr<Communicator> host_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  int device_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host) {
  return std::make_unique<NcclCommunicator>(std::move(host));
}

void init_nccl(Communicator& comm) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&comm);
  MT_INTERNAL_ASSERT(nccl != nullptr, "init_nccl on group '", comm.name(), "', which is not an NCCL communicator");
  if (nccl->size() > 1) nccl->ensure_init();
}

double take_exposed_comm_ms() {
  std::vector<std::pair<Event, Event>> pairs;
  {
    std::lock_guard<std::mutex> lock(g_exposed_mu);
    pairs.swap(g_exposed);
  }
  double total = 0;
  for (auto& [before, after] : pairs) {
    MT_CUDA_CHECK(cudaEventSynchronize(after.get()));
    float ms = 0;
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms, before.get(), after.get()));
    total += ms;
  }
  return total;
}

}  // namespace mt::cuda
