// Test main for GPU tests: without a usable GPU it prints why and exits 77, which ctest reports
// as "Skipped" (SKIP_RETURN_CODE), so a GPU test never passes silently on a machine without one.
#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif
#include <cstdio>
#include <string>

#if defined(MEGATRAIN_HAVE_CUDA)
#include "cuda/cuda_runtime.h"
#endif

int main(int argc, char** argv) {
#if defined(MEGATRAIN_HAVE_CUDA)
  std::string why;
  if (mt::cuda::device_count(&why) == 0) {
    std::printf("SKIPPED: no usable GPU (%s)\n", why.c_str());
    return 77;
  }
#else
  std::printf("SKIPPED: built without the CUDA backend (MEGATRAIN_CUDA=OFF or no CUDA toolkit)\n");
  return 77;
#endif
  return Catch::Session().run(argc, argv);
}
