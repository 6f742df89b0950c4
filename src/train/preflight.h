// Checks before anything is allocated that need this machine, not the config alone (the config's
// verdict is derive_config): can checkpoint.dir be created, and does the plan's memory estimate
// fit the memory this machine has. `train` refuses / warns at start, before iteration 1;
// `config` and `plan` warn (they may run on another machine than the job).
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"
#include "tensor/tensor.h"
#include "train/plan.h"

namespace mt {

// "" when `dir` is an existing writable directory or could be created (its nearest existing
// ancestor is a writable directory); else why not ("'/a/f' is a file, not a directory").
// Only inspects the file system; creates nothing.
std::string checkpoint_dir_problem(const std::string& dir);

// Memory a rank can use: bytes (< 0: unknown) and where the number comes from.
struct MemoryBudget {
  int64_t bytes = -1;
  std::string source;  // "MemAvailable of /proc/meminfo", "free memory of the GPU (cudaMemGetInfo)"
};
MemoryBudget host_memory_available();  // MemAvailable of /proc/meminfo
MemoryBudget gpu_memory_free();        // the current GPU (CUDA build, after cuda::initialize); unknown otherwise

// The plan's per-rank memory in the training.recompute column, the largest over the stages.
int64_t plan_peak_bytes_per_rank(const PlanReport& r);

// A one-line warning (without its "warning: " prefix: log::warn and plan add it) when `ranks` ranks of
// `per_rank_bytes` each exceed `budget`, else "".
std::string memory_warning(int64_t per_rank_bytes, int ranks, const MemoryBudget& budget);

// Under Open MPI's mpirun (4.x, ORTE: hnp_uri is OMPI_MCA_orte_hnp_uri, set in every rank it starts), Ctrl-C or a
// SIGTERM to mpirun makes it pass SIGTERM to the ranks and kill them odls_base_sigkill_timeout seconds later
// (`timeout`: OMPI_MCA_odls_base_sigkill_timeout; unset = Open MPI's default, 1 s): too soon to finish the iteration
// and write the checkpoint the signal asks for. A stop signal to any one rank stops every rank after the same
// iteration (not every Open MPI forwards SIGUSR1 to mpirun on: Ubuntu 24.04's 4.1.6 did not on our GPU machine), and
// scripts/launch_mpirun.sh turns Ctrl-C / SIGTERM into that (`launched_by`: MT_LAUNCHED_BY, "launch_mpirun.sh" there).
// A one-line warning (for log::warn, which prefixes "warning:") naming the ways to stop with a checkpoint when
// checkpoint.dir is set, the timeout is short and the launcher is not in between; else "".
constexpr int kStopSaveSeconds = 60;  // a kill timeout from this long on is taken as the user's choice
std::string mpirun_kill_timeout_warning(const std::string& checkpoint_dir, const char* hnp_uri, const char* timeout,
                                        const char* launched_by);

// The budget `plan` compares with on this machine: a visible GPU's free memory when training would
// run on it; the host's available memory for all ranks when training would run on the CPU
// (training.device cpu, or auto in fp32 without a GPU); unknown otherwise (a GPU run planned on a
// machine without one). `ranks_on_host` is set to the ranks sharing the budget.
MemoryBudget plan_memory_budget(const DerivedConfig& d, int world_size, int* ranks_on_host);

// `train`, before anything is allocated (every rank): refuses a checkpoint.dir that cannot be
// created (naming the file and the key), and warns (world rank 0) when the plan's estimate exceeds
// this machine's memory: the GPU's free memory, or on the CPU the host's for the ranks it runs, and
// when model.moe_router_force_load_balancing makes the routing random (a benchmark, not training).
void train_preflight(const Config& cfg, const DerivedConfig& d, Device device, int world_rank);

}  // namespace mt
