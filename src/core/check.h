// Error checks used everywhere (plain header: usable from .cu files, no spdlog/fmt).
//
//   MT_CHECK(cond, msg...)          input can cause it (config, data, checkpoint, command line):
//                                   throws mt::Error with the message, which should name the file,
//                                   the key and the fix. main() prints it as one line, exits 1.
//   MT_INTERNAL_ASSERT(cond, msg...) our own invariant: throws mt::InternalError with file:line and
//                                   "this is a bug in megatrain".
// Both are always on (Release defines NDEBUG; never use assert() for real checks).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace mt {

// An error the user can fix; what() is the whole one-line message.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// A broken invariant inside megatrain.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& msg) : std::logic_error(msg) {}
};

namespace detail {
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  ((os << args), ...);
  return os.str();
}
[[noreturn]] inline void throw_error(const std::string& msg) { throw Error(msg); }
[[noreturn]] inline void throw_internal(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError(str_cat(file, ":", line, ": internal check failed: ", cond, (msg.empty() ? "" : ": "), msg,
                              " (this is a bug in megatrain)"));
}
}  // namespace detail

// Builds a message from any streamable pieces: mt::str_cat("key ", k, " = ", v).
using detail::str_cat;

}  // namespace mt

#define MT_CHECK(cond, ...)                                          \
  do {                                                               \
    if (!(cond)) ::mt::detail::throw_error(::mt::str_cat(__VA_ARGS__)); \
  } while (0)

#define MT_INTERNAL_ASSERT(cond, ...)                                                           \
  do {                                                                                          \
    if (!(cond)) ::mt::detail::throw_internal(__FILE__, __LINE__, #cond, ::mt::str_cat(__VA_ARGS__)); \
  } while (0)
