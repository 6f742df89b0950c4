// AdamW step on CUDA over one long flat fp32 buffer (the master weights), per element:
//   g = grad * grad_scale;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr * ((m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps) + wd * p)
// (decoupled weight decay on the old p), as tensor/cpu/adamw.cpp. Arithmetic in fp64 like the
// reference (the kernel is memory-bound: 28 bytes per element); the bias corrections are computed
// once on the host. Grid-stride over 4-float vectors when all four buffers are 16-byte aligned (and the copy 8).
// Optionally the weight decay by element range (a table of runs): one launch for parameters with and without decay.
// With a copy (bf16 / fp16), the updated weights are also written rounded, as cast_cuda would: 2 more bytes per
// element here instead of a separate cast pass of 6 (reading the fp32 weights again).
#include <algorithm>
#include <cmath>

#include "cuda/cuda_ops.h"
#include "cuda/kernel_utils.cuh"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {

// inv_bc1 = 1 / (1 - b1^step), inv_sqrt_bc2 = 1 / sqrt(1 - b2^step), from the host: one fp64 division per element
// instead of three (the fp64 pipe, with the conversions, held the kernel below the memory rate).
struct AdamWParams {
  double lr, beta1, beta2, eps, wd, grad_scale, inv_bc1, inv_sqrt_bc2;
};

// Weight decay by element range over one launch (decaying matrices and non-decaying norms in one pass): run r holds
// elements [start[r], start[r + 1]) of the launch (the last one to its end) and decays iff decay[r].
constexpr int kMaxRuns = 192;
struct DecayTable {
  int count;
  int64_t start[kMaxRuns];
  uint8_t decay[kMaxRuns];
};

// The run holding element i (start[0] = 0 <= i): binary search over the table in the kernel's parameter space.
__device__ __forceinline__ int run_of(const DecayTable& t, int64_t i) {
  int lo = 0, hi = t.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t.start[mid] <= i) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// wd of element i + k, r the run of element i (advanced past the runs that end at or before i + k)
__device__ __forceinline__ double run_wd(const DecayTable& t, int& r, int64_t i, double wd) {
  while (r + 1 < t.count && i >= t.start[r + 1]) ++r;
  return t.decay[r] ? wd : 0.0;
}

// Every fp64 operation rounded explicitly (no fma contraction, which the compiler may choose differently in each
// instantiation of the kernel: the table's variant gave other bits in m than the plain one before this).
__device__ __forceinline__ void adamw_update(float& p, float& m, float& v, float grad, const AdamWParams& a,
                                             double wd) {
  const double g = __dmul_rn(static_cast<double>(grad), a.grad_scale);
  const double mi = __dadd_rn(__dmul_rn(a.beta1, static_cast<double>(m)), __dmul_rn(1.0 - a.beta1, g));
  const double vi = __dadd_rn(__dmul_rn(a.beta2, static_cast<double>(v)), __dmul_rn(__dmul_rn(1.0 - a.beta2, g), g));
  const double pd = static_cast<double>(p);
  m = static_cast<float>(mi);
  v = static_cast<float>(vi);
  const double den = __dadd_rn(__dmul_rn(__dsqrt_rn(vi), a.inv_sqrt_bc2), a.eps);
  const double step = __dadd_rn(__ddiv_rn(__dmul_rn(mi, a.inv_bc1), den), __dmul_rn(wd, pd));
  p = static_cast<float>(__dsub_rn(pd, __dmul_rn(a.lr, step)));
}

// CT: the copy's element type, or float for none. kRuns: weight decay from the table, else a.wd everywhere.
template <int VEC, typename CT, bool kRuns>
__global__ void adamw_step_kernel(float* param, float* m, float* v, const float* grad, int64_t n, AdamWParams a,
                                  CT* copy, const __grid_constant__ DecayTable runs) {
  constexpr bool kCopy = !std::is_same_v<CT, float>;
  auto wd_at = [&](int& r, int64_t i) {
    if constexpr (kRuns) return run_wd(runs, r, i, a.wd);
    else return a.wd;
  };
  const int64_t chunks = n / VEC, stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t c = tid; c < chunks; c += stride) {
    const int64_t i = c * VEC;
    float p[VEC], mm[VEC], vv[VEC], g[VEC];
    load_vec<VEC>(p, param + i);
    load_vec<VEC>(mm, m + i);
    load_vec<VEC>(vv, v + i);
    load_vec<VEC>(g, grad + i);
    int r = kRuns ? run_of(runs, i) : 0;
#pragma unroll
    for (int k = 0; k < VEC; ++k) adamw_update(p[k], mm[k], vv[k], g[k], a, wd_at(r, i + k));
    store_vec<VEC>(param + i, p);
    store_vec<VEC>(m + i, mm);
    store_vec<VEC>(v + i, vv);
    if constexpr (kCopy) {
      CT c[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) c[k] = from_float<CT>(p[k]);
      store_vec<VEC>(copy + i, c);
    }
  }
  for (int64_t i = chunks * VEC + tid; i < n; i += stride) {
    int r = kRuns ? run_of(runs, i) : 0;
    adamw_update(param[i], m[i], v[i], grad[i], a, wd_at(r, i));
    if constexpr (kCopy) copy[i] = from_float<CT>(param[i]);
  }
}

template <bool kRuns, typename CT>
void launch_adamw(float* param, float* m, float* v, const float* grad, int64_t n, const AdamWParams& a, CT* copy,
                  const DecayTable& runs) {
  constexpr int kThreads = 256;
  cudaStream_t s = current_stream();
  if (aligned(param, 16) && aligned(m, 16) && aligned(v, 16) && aligned(grad, 16) && aligned(copy, 8))
    adamw_step_kernel<4, CT, kRuns><<<grid_for(ceil_div(n, 4), kThreads), kThreads, 0, s>>>(param, m, v, grad, n, a,
                                                                                          copy, runs);
  else
    adamw_step_kernel<1, CT, kRuns><<<grid_for(n, kThreads), kThreads, 0, s>>>(param, m, v, grad, n, a, copy, runs);
}

// One launch per kMaxRuns runs at most (a launch per span without a table); a launch ends, where it can, before a
// run starting at a multiple of 4 elements, so that the next one keeps the 16-byte vectors.
template <typename CT>
void launch_adamw_runs(float* param, float* m, float* v, const float* grad, int64_t n, const AdamWParams& a, CT* copy,
                       const int64_t* run_starts, const uint8_t* run_decay, int64_t runs) {
  DecayTable t{};
  if (runs == 0) return launch_adamw<false>(param, m, v, grad, n, a, copy, t);
  for (int64_t r0 = 0, r1 = 0; r0 < runs; r0 = r1) {
    r1 = std::min(runs, r0 + kMaxRuns);
    for (int64_t c = r1; r1 < runs && c > r0 + 1; --c)
      if (run_starts[c] % 4 == 0) {
        r1 = c;
        break;
      }
    const int64_t b = run_starts[r0], e = r1 < runs ? run_starts[r1] : n;
    t.count = int(r1 - r0);
    for (int64_t r = r0; r < r1; ++r) {
      t.start[r - r0] = run_starts[r] - b;
      t.decay[r - r0] = run_decay[r];
    }
    launch_adamw<true>(param + b, m + b, v + b, grad + b, e - b, a, copy ? copy + b : copy, t);
  }
}

}  // namespace

void adamw_step_cuda(float* param, float* m, float* v, const float* grad, int64_t n, double lr, double beta1,
                     double beta2, double eps, double weight_decay, int64_t step, double grad_scale, void* copy,
                     bool copy_f16, const int64_t* run_starts, const uint8_t* run_decay, int64_t runs) {
  if (n <= 0) return;
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  const AdamWParams a{lr, beta1, beta2, eps, weight_decay, grad_scale, 1.0 / bc1, 1.0 / std::sqrt(bc2)};
  if (!copy)
    launch_adamw_runs<float>(param, m, v, grad, n, a, nullptr, run_starts, run_decay, runs);
  else if (!copy_f16)
    launch_adamw_runs(param, m, v, grad, n, a, static_cast<__nv_bfloat16*>(copy), run_starts, run_decay, runs);
  else
    launch_adamw_runs(param, m, v, grad, n, a, static_cast<__half*>(copy), run_starts, run_decay, runs);
  MT_CUDA_CHECK_LAUNCH("adamw_step_cuda");
}

}  // namespace mt::ops::cuda
