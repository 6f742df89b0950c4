// Shared by the test mains (main_*.cpp): Catch2's session header (v2 or v3), and the rule that a GPU test
// without its GPUs prints one SKIPPED line saying why and exits 77, which ctest reports as "Skipped"
// (SKIP_RETURN_CODE): a GPU test never passes silently on a machine without them.
#pragma once
#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif
#include <cstdio>
#include <string>

#if defined(MEGATRAIN_HAVE_CUDA)
#include "runtime/cuda/cuda_runtime.h"
#endif

namespace mt::test {

inline constexpr int kSkipExitCode = 77;

// The visible GPU count when it is at least `needed`; otherwise prints "SKIPPED: <what> need N GPUs, ..."
// and returns -1 (the caller exits with kSkipExitCode).
inline int gpus_or_skip(int needed, const char* what) {
#if defined(MEGATRAIN_HAVE_CUDA)
  std::string why;
  const int n = mt::cuda::device_count(&why);  // cudaGetDeviceCount
  if (n >= needed) return n;
  std::printf("SKIPPED: %s need %d GPU%s, %d visible%s%s\n", what, needed, needed == 1 ? "" : "s", n,
              why.empty() ? "" : ": ", why.c_str());
#else
  (void)needed;
  std::printf("SKIPPED: %s need the CUDA backend; this build has none (MEGATRAIN_CUDA=OFF or no CUDA toolkit)\n",
              what);
#endif
  return -1;
}

}  // namespace mt::test
