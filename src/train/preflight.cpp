#include "train/preflight.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>

#if defined(MEGATRAIN_HAVE_CUDA)
#include "runtime/cuda/cuda_runtime.h"
#endif
#include "config/config_loader.h"
#include "config/config_schema.h"
#include "core/check.h"
#include "core/log.h"

namespace mt {

namespace fs = std::filesystem;

std::string checkpoint_dir_problem(const std::string& dir) {
  if (dir.empty()) return "";
  std::error_code ec;
  fs::path p = fs::absolute(fs::path(dir), ec);
  if (ec) return str_cat("cannot resolve the path (", ec.message(), ")");
  // The nearest part of the path that exists: the directory itself, or where it would be created.
  fs::path existing = p;
  while (!fs::exists(existing, ec) && existing.has_parent_path() && existing != existing.parent_path())
    existing = existing.parent_path();
  if (!fs::is_directory(existing, ec))
    return str_cat("'", existing.string(), "' is ", fs::exists(existing, ec) ? "a file, not a directory" : "missing");
  if (::access(existing.c_str(), W_OK | X_OK) != 0)
    return str_cat(existing == p ? "" : "cannot create it in ", "'", existing.string(), "' (", std::strerror(errno), ")");
  return "";
}

MemoryBudget host_memory_available() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kib) == 1)
      return {static_cast<int64_t>(kib) * 1024, "the host's available memory (MemAvailable of /proc/meminfo)"};
  }
  return {};
}

MemoryBudget gpu_memory_free() {
#if defined(MEGATRAIN_HAVE_CUDA)
  size_t free_b = 0, total_b = 0;
  if (cuda::device_memory(&free_b, &total_b))
    return {static_cast<int64_t>(free_b), "the GPU's free memory (cudaMemGetInfo)"};
#endif
  return {};
}

int64_t plan_peak_bytes_per_rank(const PlanReport& r) {
  int mode = 0;
  for (int i = 0; i < kNumRecomputeModes; ++i)
    if (kRecomputeModes[i] == r.recompute_mode) mode = i;
  int64_t peak = 0;
  for (const PlanStage& st : r.stages) peak = std::max(peak, st.total(mode));
  return peak;
}

std::string memory_warning(int64_t per_rank_bytes, int ranks, const MemoryBudget& budget) {
  const int64_t need = per_rank_bytes * std::max(ranks, 1);
  if (budget.bytes < 0 || need <= budget.bytes) return "";
  auto gib = [](int64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0));
    return std::string(buf);
  };
  return str_cat("the memory estimate (megatrain plan) of ", gib(per_rank_bytes), " per rank",
                 ranks > 1 ? str_cat(" x ", ranks, " ranks = ", gib(need)) : std::string(), " exceeds ", budget.source,
                 ", ", gib(budget.bytes), "; training will likely run out of memory: lower training.micro_batch_size, "
                 "set training.recompute, or spread the model over more ranks");
}

MemoryBudget plan_memory_budget(const DerivedConfig& d, int world_size, int* ranks_on_host) {
  *ranks_on_host = 1;
  if (d.device != DeviceMode::CPU) {
#if defined(MEGATRAIN_HAVE_CUDA)
    if (cuda::device_count() > 0) return gpu_memory_free();
#endif
    // No GPU here: a cuda or bf16/fp16 run is planned for GPUs elsewhere; nothing here to compare with.
    if (d.device == DeviceMode::CUDA || d.precision != Precision::FP32) return {};
  }
  *ranks_on_host = world_size;  // a CPU run: every rank on this host
  return host_memory_available();
}

std::string mpirun_kill_timeout_warning(const std::string& checkpoint_dir, const char* hnp_uri, const char* timeout,
                                        const char* launched_by) {
  if (checkpoint_dir.empty() || !hnp_uri || !*hnp_uri) return "";
  if (launched_by && std::string_view(launched_by) == "launch_mpirun.sh") return "";  // stops reach mpirun as SIGUSR1
  long seconds = 1;  // Open MPI's default
  if (timeout && *timeout) {
    char* end = nullptr;
    seconds = std::strtol(timeout, &end, 10);
    if (end == timeout || *end != '\0') seconds = 1;  // not a number: mpirun falls back to its default too
  }
  if (seconds >= kStopSaveSeconds) return "";
  return str_cat("under mpirun, Ctrl-C or a SIGTERM to mpirun makes Open MPI pass SIGTERM to the ranks and kill them ",
                 seconds, " s later (Open MPI's odls_base_sigkill_timeout), before a checkpoint is written: to stop "
                 "with a checkpoint send SIGUSR1 or SIGTERM to one rank (kill -USR1 <pid of a rank>: every rank stops "
                 "after the same iteration; SLURM's scancel --signal signals them all), or start the job with "
                 "scripts/launch_mpirun.sh, which turns Ctrl-C and SIGTERM into that");
}

void train_preflight(const Config& cfg, const DerivedConfig& d, Device device, int world_rank) {
  const std::string problem = checkpoint_dir_problem(cfg.checkpoint.dir);
  MT_CHECK(problem.empty(), config_error_prefix(cfg.source_file), "checkpoint.dir '", cfg.checkpoint.dir,
           "' cannot be created: ", problem, "; set checkpoint.dir to a writable directory (or \"\" for no checkpoints)");
  if (world_rank != 0) return;
  if (cfg.model.moe_router_force_load_balancing)
    log::warn("model.moe_router_force_load_balancing: the MoE routing is forced balanced (standard-normal random "
              "router logits, the gradient passed straight through): for benchmarking only, the routing does not "
              "depend on the model");
  const std::string kill_timeout = mpirun_kill_timeout_warning(
      cfg.checkpoint.dir, std::getenv("OMPI_MCA_orte_hnp_uri"), std::getenv("OMPI_MCA_odls_base_sigkill_timeout"),
      std::getenv("MT_LAUNCHED_BY"));
  if (!kill_timeout.empty()) log::warn("{}", kill_timeout);
  MemoryBudget budget;
  int ranks = 1;
  if (device == Device::CUDA) {
    budget = gpu_memory_free();
  } else {
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");  // ranks on this host under mpirun
    ranks = local ? std::max(1, std::atoi(local)) : d.world_size;
    budget = host_memory_available();
  }
  const PlanReport plan = make_plan(cfg, d.world_size);
  const std::string warning = memory_warning(plan_peak_bytes_per_rank(plan), ranks, budget);
  if (!warning.empty()) log::warn("{}", warning);
  const std::string attention = device == Device::CUDA ? attention_workspace_warning(plan) : "";
  if (!attention.empty()) log::warn("{}", attention);
}

}  // namespace mt
