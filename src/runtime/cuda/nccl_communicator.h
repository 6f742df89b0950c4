// The NCCL communicator: the Communicator interface over one NCCL communicator per process group,
// for device (GPU) buffers; host buffers (loss and norm scalars, ids) go to the group's MPI
// communicator it wraps. Plain header (no CUDA/NCCL types), so src/ can include it.
//
// Streams: each group has its own high-priority communication stream. A call waits (on the GPU)
// for the work already queued on the compute stream, runs on its stream, and returns a Work whose
// wait() makes the compute stream wait for it: the host never blocks, and communication overlaps
// whatever the compute stream runs until the result is needed. The blocking calls are async + wait.
// The time the compute stream spends waiting in those waits is the exposed communication time
// (measured with events around each wait, see take_exposed_comm_ms).
//
// The NCCL communicator is created on the group's first device operation (unique id from the
// group's rank 0, broadcast over MPI), so groups that never carry device data cost nothing.
// Every operation is reported to the hang watchdog (runtime/watchdog.h), which can abort them.
#pragma once

#include <memory>

#include "runtime/communicator.h"

namespace mt::cuda {

// `host`: the MPI communicator of the same group (same ranks, same order).
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host);

// Creates the NCCL communicator of `comm` (made by make_nccl_communicator) now rather than at its
// first device operation. Collective over the group. Calling it for the groups that carry device
// data in one fixed order on every rank keeps the blocking inits from waiting on each other in a
// cycle (a rank whose first transfer is a pipeline receive vs one whose first is a TP all-reduce).
void init_nccl(Communicator& comm);

// Milliseconds the compute stream waited on communication since the last call (synchronizes with
// the device to read the events).
double take_exposed_comm_ms();

}  // namespace mt::cuda
