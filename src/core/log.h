// Logging: spdlog behind a tiny facade so that the rank prefix is set once.
// Only rank 0 logs at info level unless MEGATRAIN_LOG_ALL_RANKS=1; warnings and errors from every rank.
#pragma once

#include <spdlog/spdlog.h>

namespace mt::log {

// Sets the pattern "[time] [rank R] level: msg" and the level ("trace".."off").
void init(int global_rank, int world_size, const std::string& level = "info");

template <typename... Args>
void info(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  spdlog::info(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void warn(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  spdlog::warn(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void error(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  spdlog::error(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void debug(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  spdlog::debug(fmt, std::forward<Args>(args)...);
}

}  // namespace mt::log
