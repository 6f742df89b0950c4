// CUDA runtime tests (main_gpu.cpp skips the whole executable, saying why, without a GPU).
#include "catch.h"

#if defined(MEGATRAIN_HAVE_CUDA)
#include <random>

#include "runtime/cuda/cuda_runtime.h"
#include "tensor/tensor.h"


TEST_CASE("device tensors round-trip through the caching allocator", "[cuda]") {
  mt::cuda::initialize(0);
  INFO(mt::cuda::device_description() << " | " << mt::cuda::library_versions());
  std::mt19937 g(1);
  std::uniform_real_distribution<float> u(-1, 1);
  mt::Tensor h = mt::Tensor::empty({1000, 37}, mt::DType::F32);
  for (int64_t i = 0; i < h.numel(); ++i) h.data<float>()[i] = u(g);
  size_t mallocs_before = 0;
  for (int round = 0; round < 3; ++round) {
    mt::Tensor d = mt::Tensor::empty(h.shape(), mt::DType::F32, mt::Device::CUDA);
    d.copy_from(h);
    mt::Tensor back = mt::Tensor::empty(h.shape(), mt::DType::F32);
    back.copy_from(d);
    REQUIRE(std::memcmp(back.raw(), h.raw(), h.nbytes()) == 0);
    if (round == 0) mallocs_before = mt::cuda::allocator_stats().num_cuda_mallocs;
  }
  // Same sizes again: served from the cache, no new cudaMalloc.
  CHECK(mt::cuda::allocator_stats().num_cuda_mallocs == mallocs_before);
  CHECK(mt::cuda::allocator_stats().peak_allocated >= h.nbytes());
}

TEST_CASE("an impossible allocation names the request and the free memory", "[cuda]") {
  mt::cuda::initialize(0);
  try {
    mt::Tensor t = mt::Tensor::empty({int64_t(1) << 42}, mt::DType::F32, mt::Device::CUDA);
    FAIL("allocated 16 TiB");
  } catch (const mt::Error& e) {
    CHECK(std::string(e.what()).find("CUDA out of memory: asked for") != std::string::npos);
  }
}
#endif
