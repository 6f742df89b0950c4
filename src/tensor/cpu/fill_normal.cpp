// Standard-normal fill with the counter-based generator: no state, every value a pure function of its index.
//   out[i] = normal01(seed, stream, offset + i)   (core/counter_rng.h: SplitMix64 bits, Box-Muller in fp64)
// rounded once to T. Any shape, n elements; callers derive offset from global coordinates so that every parallel
// layout draws the same values.
#include "core/counter_rng.h"
#include "tensor/cpu/cpu_ops.h"

namespace mt::ops::cpu {

template <typename T>
void fill_normal_cpu(T* out, int64_t n, uint64_t seed, uint64_t stream, uint64_t offset) {
  const uint64_t skey = rng::key(seed, stream);
#pragma omp parallel for schedule(static) if (n > (1 << 14))
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(rng::normal01_keyed(skey, offset + static_cast<uint64_t>(i)));
}

template void fill_normal_cpu<float>(float*, int64_t, uint64_t, uint64_t, uint64_t);
template void fill_normal_cpu<double>(double*, int64_t, uint64_t, uint64_t, uint64_t);

}  // namespace mt::ops::cpu
