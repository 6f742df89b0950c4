// Test main for GPU tests: without a usable GPU it prints why and exits 77 (ctest: "Skipped").
#include "test_main.h"

int main(int argc, char** argv) {
  if (mt::test::gpus_or_skip(1, "the GPU tests") < 0) return mt::test::kSkipExitCode;
  return Catch::Session().run(argc, argv);
}
