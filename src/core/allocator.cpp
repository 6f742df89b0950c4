#include "core/allocator.h"

#include <cstdlib>

#include "core/check.h"

namespace mt {

namespace {
class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    MT_CHECK(p != nullptr, "out of host memory allocating ", bytes, " bytes");
    return p;
  }
  void deallocate(void* ptr, size_t) override { std::free(ptr); }
};

CpuAllocator g_cpu_allocator;
Allocator* g_allocators[3] = {&g_cpu_allocator, nullptr, nullptr};
}  // namespace

Allocator* allocator_for(Device d) { return g_allocators[static_cast<int>(d)]; }
void set_allocator(Device d, Allocator* a) { g_allocators[static_cast<int>(d)] = a; }

}  // namespace mt
