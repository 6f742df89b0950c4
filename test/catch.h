// Catch2 v2 / v3 shim: Debian 12 ships v2 (<catch2/catch.hpp>), Ubuntu 24.04 v3. Tests write the v2
// names (Catch::Contains for substrings); this maps them onto v3.
#pragma once
#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
using Catch::Approx;
namespace Catch {
// v2's substring matcher under its v2 name (v3 calls it Matchers::ContainsSubstring).
inline Matchers::StringContainsMatcher Contains(const std::string& s, CaseSensitive cs = CaseSensitive::Yes) {
  return Matchers::ContainsSubstring(s, cs);
}
}  // namespace Catch
#else
#include <catch2/catch.hpp>
#endif
