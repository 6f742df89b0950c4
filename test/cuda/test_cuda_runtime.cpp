// CUDA runtime tests (main_gpu.cpp skips the whole executable, saying why, without a GPU).
#include "catch.h"

#if defined(MEGATRAIN_HAVE_CUDA)
#include <cstring>
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

// Blocks of 1 MiB or more: a request with no free block of its size takes the smallest free block of at most 1/8
// more (no cudaMalloc), counted at the block's size, and returns it to the block's own free list.
TEST_CASE("the caching allocator reuses a slightly larger free block for a new size", "[cuda][allocator]") {
  mt::cuda::initialize(0);
  mt::cuda::empty_cache();  // no free blocks from earlier tests
  const int64_t MiB = int64_t(1) << 20;
  const size_t base = mt::cuda::allocator_stats().allocated;
  const void* big_ptr = nullptr;
  {
    mt::Tensor big = mt::Tensor::empty({100 * MiB}, mt::DType::U8, mt::Device::CUDA);  // 100 MiB, new block
    big_ptr = big.raw();
  }
  const size_t mallocs = mt::cuda::allocator_stats().num_cuda_mallocs;
  {
    mt::Tensor t = mt::Tensor::empty({95 * MiB}, mt::DType::U8, mt::Device::CUDA);  // 96 MiB: the 100 MiB block
    CHECK(t.raw() == big_ptr);
    CHECK(mt::cuda::allocator_stats().num_cuda_mallocs == mallocs);
    CHECK(mt::cuda::allocator_stats().allocated == base + size_t(100 * MiB));
    // 80 MiB: 100 is more than 80 + 80/8 = 90: a new block (and the 100 MiB one is in use anyway)
    mt::Tensor u = mt::Tensor::empty({80 * MiB}, mt::DType::U8, mt::Device::CUDA);
    CHECK(u.raw() != big_ptr);
    CHECK(mt::cuda::allocator_stats().num_cuda_mallocs == mallocs + 1);
  }
  CHECK(mt::cuda::allocator_stats().allocated == base);
  {
    // the 100 MiB block went back to its own list: an exact 100 MiB request gets it without a cudaMalloc
    mt::Tensor again = mt::Tensor::empty({100 * MiB}, mt::DType::U8, mt::Device::CUDA);
    CHECK(again.raw() == big_ptr);
    mt::Tensor small = mt::Tensor::empty({80 * MiB}, mt::DType::U8, mt::Device::CUDA);
    CHECK(mt::cuda::allocator_stats().num_cuda_mallocs == mallocs + 1);
  }
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
