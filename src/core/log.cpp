#include "core/log.h"

#include <cstdlib>
#include <string>

namespace mt::log {

void init(int global_rank, int world_size, const std::string& level) {
  // One process: the level is coloured when stdout is a terminal (spdlog checks). Under mpirun a
  // rank's stdout is a pseudo-terminal even when mpirun's own output goes to a file or a pipe, so
  // several ranks never colour (no %^ %$ colour range: plain text).
  std::string pattern = "[%Y-%m-%d %H:%M:%S] %^%l%$: %v";
  if (world_size > 1) pattern = "[%Y-%m-%d %H:%M:%S] [rank " + std::to_string(global_rank) + "] %l: %v";
  spdlog::set_pattern(pattern);
  const char* all = std::getenv("MEGATRAIN_LOG_ALL_RANKS");
  bool quiet = global_rank != 0 && !(all && std::string(all) == "1");
  spdlog::set_level(quiet ? spdlog::level::warn : spdlog::level::from_str(level));
}

}  // namespace mt::log
