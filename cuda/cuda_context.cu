// The backend context (see cuda_context.h): one stream, one cuBLASLt handle and its 32 MiB
// workspace, created on first use under a mutex and kept for the life of the process.
#include <mutex>

#include "cuda/cuda_check.h"
#include "cuda/cuda_context.h"

namespace mt::cuda {

namespace {
std::once_flag g_once;
Context* g_ctx = nullptr;
cudaStream_t g_own_stream = nullptr;

void create_context() {
  auto* c = new Context();  // lives for the process (destroying handles at exit races the driver)
  MT_CUDA_CHECK(cudaGetDevice(&c->device));
  // One priority level above the default, which the side streams keep (the optimizer update beside the forward, the
  // snapshot copies): when SMs free up, the compute stream's blocks go first. NCCL's streams stay at the greatest.
  // (H200, moe-8x-top2: -0.27 ms a step in two calls; benchmarks/RESULTS.md session 39)
  int least = 0, greatest = 0;
  MT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  MT_CUDA_CHECK(cudaStreamCreateWithPriority(&g_own_stream, cudaStreamDefault, least > greatest ? least - 1 : least));
  c->stream = g_own_stream;
  MT_CUBLAS_CHECK(cublasLtCreate(&c->lt));
  c->workspace_bytes = kCublasWorkspaceBytes;
  MT_CUDA_CHECK(cudaMalloc(&c->workspace, c->workspace_bytes));
  cudaDeviceProp p{};
  MT_CUDA_CHECK(cudaGetDeviceProperties(&p, c->device));
  c->sm_count = p.multiProcessorCount;
  c->smem_optin = p.sharedMemPerBlockOptin;
  g_ctx = c;
}
}  // namespace

Context& context() {
  std::call_once(g_once, create_context);
  return *g_ctx;
}

void set_current_stream(cudaStream_t stream) { context().stream = stream ? stream : g_own_stream; }

}  // namespace mt::cuda
