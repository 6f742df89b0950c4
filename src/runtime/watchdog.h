// Hang watchdog: a thread that watches every collective and point-to-point batch in flight and,
// when one has not completed within training.collective_timeout_s, logs on this rank which
// operation, which group, the rank's coordinates and the last completed iteration, aborts the
// communicators (NCCL: ncclCommAbort) and exits the process with kExitCode, so that the launcher
// (mpirun, srun) takes the job down instead of hanging. Inside a training iteration it also fires
// when nothing at all has progressed for the timeout (a rank stuck outside any collective, which is
// what its peers are waiting for), so that every rank of a hung job says where it is.
//
// Communicators report operations: blocking ones (MPI) with a Scope around the call; asynchronous
// ones (NCCL) with begin(..., done) where done() says whether the GPU has finished it, polled by
// the watchdog thread. Disabled (begin/end are a flag test) until start() with a timeout > 0.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace mt::watchdog {

inline constexpr int kExitCode = 3;

// timeout_s <= 0 disables. coords: this rank's place, e.g. "rank 3 (tp 1, pp 0, dp 1, cp 0)".
void start(double timeout_s, const std::string& coords);
void stop();
bool enabled();

// The training loop brackets each iteration: the no-progress check is armed only inside one.
void iteration_begin(int64_t iteration);
void iteration_end(int64_t iteration);  // also records the last completed iteration

// Run (once, with a bounded wait) before the process exits on a timeout.
void on_abort(std::function<void()> fn);

// An operation in flight. `done` (nullable) is polled from the watchdog thread; with no `done`
// the operation is complete when end() is called. Returns 0 when disabled.
uint64_t begin(const char* op, const std::string& group, int64_t bytes, std::function<bool()> done = nullptr);
void end(uint64_t id);

class Scope {
 public:
  Scope(const char* op, const std::string& group, int64_t bytes) : id_(begin(op, group, bytes)) {}
  ~Scope() { end(id_); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  uint64_t id_;
};

}  // namespace mt::watchdog
