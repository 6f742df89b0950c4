// Environment switches (MT_* comparison switches and the like), read where they are used.
#pragma once

#include <cstdlib>
#include <cstring>

namespace mt {

// True when the environment variable `var` is set to exactly `value`. Callers that ask on a hot path
// keep the answer in a function-local static (the environment is read once per process).
inline bool env_equals(const char* var, const char* value) {
  const char* v = std::getenv(var);
  return v != nullptr && std::strcmp(v, value) == 0;
}

}  // namespace mt
