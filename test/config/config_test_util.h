// Helpers shared by the config tests.
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

#include "core/check.h"

namespace mt::test {

// The message of the mt::Error that f() throws, or "<no mt::Error thrown>".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const mt::Error& e) {
    return e.what();
  }
  return "<no mt::Error thrown>";
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

inline bool one_line(const std::string& s) { return s.find('\n') == std::string::npos; }

// A small valid config (llama, CPU, mock data) that tests modify.
inline const char* kBaseYaml = R"(model:
  num_layers: 2
  hidden_size: 64
  num_attention_heads: 4
  ffn_hidden_size: 128
  vocab_size: 128
  seq_length: 32
training:
  train_iters: 10
  device: cpu
data:
  mock: true
)";

// Number of members of an aggregate (counted by brace-initializing it from convertible-to-anything
// arguments; valid for structs of scalars, strings and vectors, which the config sections are).
struct AnyArg {
  template <class T>
  operator T() const;
};

template <class T, class... A>
constexpr std::size_t aggregate_member_count() {
  if constexpr (requires { T{std::declval<A>()..., std::declval<AnyArg>()}; })
    return aggregate_member_count<T, A..., AnyArg>();
  else
    return sizeof...(A);
}

}  // namespace mt::test
