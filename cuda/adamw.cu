// AdamW step on CUDA over one long flat buffer of master weights, per element:
//   g = grad * grad_scale;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr * ((m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps) + wd * p)
// (decoupled weight decay on the old p), as tensor/cpu/adamw.cpp. Arithmetic in fp32, as PyTorch's fused AdamW, every
// operation rounded explicitly; the CPU reference computes in fp64 and the GPU agrees within fp32 rounding (tests).
// The kernel is memory-bound either way, but fp64's divisions and square roots draw power that, with the GPU at its
// power cap, the GEMMs running beside the update lose in clock (H200, moe-8x-top2: -0.7 ms a step in fp32;
// benchmarks/RESULTS.md session 34). The bias corrections are computed once on the host. Grid-stride over 4-element
// vectors when every buffer is aligned for them. Optionally the weight decay by element range (a table of runs): one
// launch for parameters with and without decay.
// The master weights, one of (the kernel's Weights policy):
// - fp32 (Fp32Weights), optionally with the compute copy (bf16 / fp16) written rounded, as cast_cuda would: 2 more
//   bytes an element here instead of a separate cast pass of 6. 28 bytes an element, 30 with the copy.
// - two 16-bit halves (HalfWeights, core/master_halves.h): the bf16 values themselves and a uint16 low half, both
//   read and written: 28 bytes an element, and no separate copy.
#include <algorithm>
#include <cmath>

#include "cuda/cuda_ops.h"
#include "core/master_halves.h"
#include "cuda/kernel_utils.cuh"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {

// The step's constants in fp32, from the host's fp64: c1 = 1 - b1, c2 = 1 - b2, inv_bc1 = 1 / (1 - b1^step),
// inv_sqrt_bc2 = 1 / sqrt(1 - b2^step) (one division per element instead of three).
struct AdamWParams {
  float lr, beta1, c1, beta2, c2, eps, wd, grad_scale, inv_bc1, inv_sqrt_bc2;
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
__device__ __forceinline__ float run_wd(const DecayTable& t, int& r, int64_t i, float wd) {
  while (r + 1 < t.count && i >= t.start[r + 1]) ++r;
  return t.decay[r] ? wd : 0.0f;
}

// Every operation rounded explicitly (no fma contraction, which the compiler may choose differently in each
// instantiation of the kernel: the table's variant and the one writing a compute copy must give the same bits).
__device__ __forceinline__ void adamw_update(float& p, float& m, float& v, float grad, const AdamWParams& a,
                                             float wd) {
  const float g = __fmul_rn(grad, a.grad_scale);
  m = __fadd_rn(__fmul_rn(a.beta1, m), __fmul_rn(a.c1, g));
  v = __fadd_rn(__fmul_rn(a.beta2, v), __fmul_rn(__fmul_rn(a.c2, g), g));
  const float den = __fadd_rn(__fmul_rn(__fsqrt_rn(v), a.inv_sqrt_bc2), a.eps);
  const float step = __fadd_rn(__fdiv_rn(__fmul_rn(m, a.inv_bc1), den), __fmul_rn(wd, p));
  p = __fsub_rn(p, __fmul_rn(a.lr, step));
}

// The fp32 master weights and (CT != float) their compute copy, written rounded.
template <typename CT>
struct Fp32Weights {
  float* p;
  CT* copy;
  bool vectorizable() const { return aligned(p, 16) && aligned(copy, 8); }
  Fp32Weights at(int64_t b) const { return {p + b, copy ? copy + b : copy}; }
  template <int VEC>
  __device__ __forceinline__ void load(int64_t i, float (&w)[VEC]) const {
    load_vec<VEC>(w, p + i);
  }
  template <int VEC>
  __device__ __forceinline__ void store(int64_t i, const float (&w)[VEC]) const {
    store_vec<VEC>(p + i, w);
    if constexpr (!std::is_same_v<CT, float>) {
      CT c[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) c[k] = from_float<CT>(w[k]);
      store_vec<VEC>(copy + i, c);
    }
  }
};

// The master weights as halves: hi = the bf16 values' bits, lo = the low halves (core/master_halves.h).
struct HalfWeights {
  uint16_t* hi;
  uint16_t* lo;
  bool vectorizable() const { return aligned(hi, 8) && aligned(lo, 8); }
  HalfWeights at(int64_t b) const { return {hi + b, lo + b}; }
  template <int VEC>
  __device__ __forceinline__ void load(int64_t i, float (&w)[VEC]) const {
    uint16_t h[VEC], l[VEC];
    load_vec<VEC>(h, hi + i);
    load_vec<VEC>(l, lo + i);
#pragma unroll
    for (int k = 0; k < VEC; ++k) w[k] = master_halves::join(h[k], l[k]);
  }
  template <int VEC>
  __device__ __forceinline__ void store(int64_t i, const float (&w)[VEC]) const {
    uint16_t h[VEC], l[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const uint32_t u = float_bits(w[k]);
      h[k] = master_halves::high_half(u);
      l[k] = master_halves::low_half(u);
    }
    store_vec<VEC>(hi + i, h);
    store_vec<VEC>(lo + i, l);
  }
};

// The update of elements [i, i + V) (one run table lookup for them). W: the master weights' policy (Fp32Weights<CT>
// or HalfWeights). kRuns: weight decay from the table, else a.wd everywhere.
// G: the gradients' type, float or __nv_bfloat16 (parallel.grad_reduce_in_fp32: false).
template <int V, typename W, typename G, bool kRuns>
__device__ __forceinline__ void update_at(const W& w, float* m, float* v, const G* grad, int64_t i,
                                          const AdamWParams& a, const DecayTable& runs) {
  float p[V], mm[V], vv[V];
  G g[V];
  w.template load<V>(i, p);
  load_vec<V>(mm, m + i);
  load_vec<V>(vv, v + i);
  load_vec<V>(g, grad + i);
  int r = kRuns ? run_of(runs, i) : 0;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    float wd = a.wd;
    if constexpr (kRuns) wd = run_wd(runs, r, i + k, a.wd);
    adamw_update(p[k], mm[k], vv[k], to_float(g[k]), a, wd);
  }
  w.template store<V>(i, p);
  store_vec<V>(m + i, mm);
  store_vec<V>(v + i, vv);
}

template <int VEC, typename W, typename G, bool kRuns>
__global__ void adamw_step_kernel(W w, float* m, float* v, const G* grad, int64_t n, AdamWParams a,
                                  const __grid_constant__ DecayTable runs) {
  const int64_t chunks = n / VEC, stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t c = tid; c < chunks; c += stride) update_at<VEC, W, G, kRuns>(w, m, v, grad, c * VEC, a, runs);
  for (int64_t i = chunks * VEC + tid; i < n; i += stride) update_at<1, W, G, kRuns>(w, m, v, grad, i, a, runs);
}

template <bool kRuns, typename W, typename G>
void launch_adamw(const W& w, float* m, float* v, const G* grad, int64_t n, const AdamWParams& a,
                  const DecayTable& runs) {
  constexpr int kThreads = 256;
  cudaStream_t s = current_stream();
  if (w.vectorizable() && aligned(m, 16) && aligned(v, 16) && aligned(grad, 4 * sizeof(G)))
    adamw_step_kernel<4, W, G, kRuns><<<grid_for(ceil_div(n, 4), kThreads), kThreads, 0, s>>>(w, m, v, grad, n, a,
                                                                                               runs);
  else
    adamw_step_kernel<1, W, G, kRuns><<<grid_for(n, kThreads), kThreads, 0, s>>>(w, m, v, grad, n, a, runs);
}

// One launch per kMaxRuns runs at most (a launch per span without a table); a launch ends, where it can, before a
// run starting at a multiple of 4 elements, so that the next one keeps the vectors.
template <typename W, typename G>
void launch_adamw_runs(const W& w, float* m, float* v, const G* grad, int64_t n, const AdamWParams& a,
                       const int64_t* run_starts, const uint8_t* run_decay, int64_t runs) {
  DecayTable t{};
  if (runs == 0) return launch_adamw<false>(w, m, v, grad, n, a, t);
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
    launch_adamw<true>(w.at(b), m + b, v + b, grad + b, e - b, a, t);
  }
}

AdamWParams adamw_params(double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step,
                         double grad_scale) {
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  auto f = [](double x) { return static_cast<float>(x); };
  return {f(lr),         f(beta1), f(1.0 - beta1),    f(beta2), f(1.0 - beta2), f(eps), f(weight_decay),
          f(grad_scale), f(1.0 / bc1), f(1.0 / std::sqrt(bc2))};
}

// f(typed gradient pointer): fp32, or bf16 main grads
template <typename F>
void with_grad(const void* grad, bool grad_bf16, F&& f) {
  if (grad_bf16)
    f(static_cast<const __nv_bfloat16*>(grad));
  else
    f(static_cast<const float*>(grad));
}

}  // namespace

void adamw_step_cuda(float* param, float* m, float* v, const void* grad, bool grad_bf16, int64_t n, double lr,
                     double beta1, double beta2, double eps, double weight_decay, int64_t step, double grad_scale,
                     void* copy, bool copy_f16, const int64_t* run_starts, const uint8_t* run_decay, int64_t runs) {
  if (n <= 0) return;
  const AdamWParams a = adamw_params(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
  with_grad(grad, grad_bf16, [&](auto g) {
    if (!copy)
      launch_adamw_runs(Fp32Weights<float>{param, nullptr}, m, v, g, n, a, run_starts, run_decay, runs);
    else if (!copy_f16)
      launch_adamw_runs(Fp32Weights<__nv_bfloat16>{param, static_cast<__nv_bfloat16*>(copy)}, m, v, g, n, a,
                        run_starts, run_decay, runs);
    else
      launch_adamw_runs(Fp32Weights<__half>{param, static_cast<__half*>(copy)}, m, v, g, n, a, run_starts, run_decay,
                        runs);
  });
  MT_CUDA_CHECK_LAUNCH("adamw_step_cuda");
}

void adamw_step_halves_cuda(uint16_t* hi, uint16_t* lo, float* m, float* v, const void* grad, bool grad_bf16,
                            int64_t n, double lr, double beta1, double beta2, double eps, double weight_decay,
                            int64_t step, double grad_scale, const int64_t* run_starts, const uint8_t* run_decay,
                            int64_t runs) {
  if (n <= 0) return;
  const AdamWParams a = adamw_params(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
  with_grad(grad, grad_bf16, [&](auto g) {
    launch_adamw_runs(HalfWeights{hi, lo}, m, v, g, n, a, run_starts, run_decay, runs);
  });
  MT_CUDA_CHECK_LAUNCH("adamw_step_halves_cuda");
}

}  // namespace mt::ops::cuda
