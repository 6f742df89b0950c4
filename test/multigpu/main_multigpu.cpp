// Test main for the multi-GPU tests: they start `mpirun -np 2|4|8 megatrain` on as many GPUs, so
// without the CUDA backend or with fewer than 2 visible GPUs it prints why and exits 77, which
// ctest reports as "Skipped" (SKIP_RETURN_CODE); a multi-GPU test never passes silently. With fewer GPUs
// than a case needs, the cases tagged [4gpu] (with 2 or 3 GPUs) and [8gpu] (with fewer than 8) are left
// out, and a line printed first says so.
// The environment every run inherits is set here, so that the binary behaves the same under ctest
// (which already sets the Open MPI variables) and when started by hand: NCCL_NVLS_ENABLE=0 always
// (NVLink multicast must stay off on the shared GPU machines), mpirun allowed as root.
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "test_main.h"

int main(int argc, char** argv) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  constexpr int kGpusNeeded = 2;
  const int n = mt::test::gpus_or_skip(kGpusNeeded, "the multi-GPU tests");
  if (n < 0) return mt::test::kSkipExitCode;
  // [4gpu]: tensor 2 x pipeline 2, data 2 x tensor 2, expert 4, tensor 2 x expert 2, context 4;
  // [8gpu]: tensor 2 x pipeline 2 x data 2.
  for (const auto& [tag, needed] : {std::pair<const char*, int>{"[4gpu]", 4}, {"[8gpu]", 8}}) {
    if (n >= needed) continue;  // every test spec (or none: all tests) without the cases of this tag
    std::printf("SKIPPED: the cases tagged %s (they need %d GPUs, %d visible); running the rest\n", tag, needed, n);
    std::vector<std::string>& specs = session.configData().testsOrTags;
    if (specs.empty()) specs.push_back(std::string("~") + tag);
    else
      for (std::string& spec : specs) spec += std::string(" ~") + tag;
  }
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  return session.run();
}
