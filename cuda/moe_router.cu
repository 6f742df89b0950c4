// The MoE router and its losses on CUDA (tensor/cpu/moe_router.cpp has the math): one thread per row, sums in
// fp64 in the CPU reference's order; loss values summed over the per-row partials by one block in a fixed order
// (strided per thread, then a tree): deterministic, within fp64 rounding of the CPU's sequential sum. The balancing
// loss's per-(group, expert) counts are shared-memory histograms added with integer atomics (exact). Scratch
// (fp64 partials, counts) comes from the caller (the tensor layer's caching allocator).
#include "cuda/kernel_utils.cuh"
#include "cuda/moe_cuda.h"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {
constexpr int kThreads = 128;

__global__ void router_forward_kernel(int32_t* indices, float* weights, float* scores, const float* logits,
                                      const float* bias, int64_t N, int64_t E, RouterSpec spec) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float* l = logits + n * E;
  float* s = scores + n * E;
  if (spec.sigmoid) {
    for (int64_t e = 0; e < E; ++e) s[e] = float(1.0 / (1.0 + exp(-double(l[e]))));
  } else {
    double mx = -INFINITY, sum = 0;
    for (int64_t e = 0; e < E; ++e) mx = fmax(mx, double(l[e]));
    for (int64_t e = 0; e < E; ++e) sum += exp(double(l[e]) - mx);
    for (int64_t e = 0; e < E; ++e) s[e] = float(exp(double(l[e]) - mx) / sum);
  }
  const int64_t k = spec.topk;
  int32_t* idx = indices + n * k;
  double chosen = 0;
  for (int64_t j = 0; j < k; ++j) {  // selection: the best not yet taken, ties to the lower index
    int64_t best = -1;
    double bv = 0;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken |= idx[i] == e;
      if (taken) continue;
      const double v = double(s[e]) + (bias ? double(bias[e]) : 0.0);
      if (best < 0 || v > bv) {
        best = e;
        bv = v;
      }
    }
    idx[j] = int32_t(best);
    chosen += double(s[best]);
  }
  const bool norm = spec.sigmoid ? spec.topk > 1 : !spec.pre_softmax;
  const double f = (norm ? 1.0 / chosen : 1.0) * spec.scaling;
  for (int64_t j = 0; j < k; ++j) weights[n * k + j] = float(double(s[idx[j]]) * f);
}

__global__ void router_backward_kernel(float* dlogits, const float* dweights, const float* scores,
                                       const int32_t* indices, int64_t N, int64_t E, RouterSpec spec) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const int64_t k = spec.topk;
  const float* s = scores + n * E;
  const int32_t* idx = indices + n * k;
  const bool norm = spec.sigmoid ? spec.topk > 1 : !spec.pre_softmax;
  double S = 0, dot = 0;
  for (int64_t j = 0; j < k; ++j) {
    S += double(s[idx[j]]);
    dot += double(dweights[n * k + j]) * double(s[idx[j]]);
  }
  // ds is nonzero only at the chosen experts
  auto ds = [&](int64_t e) {
    for (int64_t j = 0; j < k; ++j)
      if (idx[j] == e) {
        const double dw = double(dweights[n * k + j]) * spec.scaling;
        return norm ? (dw - spec.scaling * dot / S) / S : dw;
      }
    return 0.0;
  };
  float* dl = dlogits + n * E;
  if (spec.sigmoid) {
    for (int64_t e = 0; e < E; ++e) dl[e] = float(ds(e) * double(s[e]) * (1.0 - double(s[e])));
  } else {
    double sd = 0;
    for (int64_t j = 0; j < k; ++j) sd += ds(idx[j]) * double(s[idx[j]]);
    for (int64_t e = 0; e < E; ++e) dl[e] = float(double(s[e]) * (ds(e) - sd));
  }
}

// cnt (groups, E) += the histogram of a tile of group blockIdx.y's rows * k slots (cnt zeroed before)
constexpr int kTile = 4096, kHistThreads = 256, kSumThreads = 1024;
__global__ void aux_counts_kernel(int32_t* cnt, const int32_t* indices, int64_t E, int64_t slots_per_group) {
  extern __shared__ int32_t hist[];
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const int64_t g = blockIdx.y, s0 = int64_t(blockIdx.x) * kTile, s1 = min(slots_per_group, s0 + kTile);
  const int32_t* idx = indices + g * slots_per_group;
  for (int64_t s = s0 + threadIdx.x; s < s1; s += blockDim.x) {
    const int32_t i = idx[s];
    if (i >= 0) atomicAdd(&hist[i], 1);
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
    if (hist[e]) atomicAdd(&cnt[g * E + e], hist[e]);
}

// a (groups, E) = coeff / groups * E * count_ge / (rows * k * rows); one thread per (group, expert)
__global__ void aux_coeff_kernel(double* a, const int32_t* cnt, int64_t E, int64_t k, int64_t groups, int64_t rows,
                                 double coeff) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= groups * E) return;
  a[t] = double(cnt[t]) * coeff / double(groups) * double(E) / double(rows * k * rows);
}

__global__ void aux_rows_kernel(double* partial, float* dlogits, const float* scores, const double* a, int64_t N,
                                int64_t E, int64_t rows, bool sigmoid, double dloss) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float* s = scores + n * E;
  const double* ag = a + (n / rows) * E;
  double S = 0;
  for (int64_t e = 0; e < E; ++e) S += double(s[e]);
  const double inv = sigmoid ? 1.0 / S : 1.0;
  double ap = 0;
  for (int64_t e = 0; e < E; ++e) ap += ag[e] * double(s[e]) * inv;
  partial[n] = ap;
  if (!dlogits) return;
  for (int64_t e = 0; e < E; ++e) {
    const double se = double(s[e]);
    const double d = sigmoid ? (ag[e] - ap) / S * se * (1.0 - se) : se * (ag[e] - ap);
    dlogits[n * E + e] = float(double(dlogits[n * E + e]) + dloss * d);
  }
}

__global__ void z_rows_kernel(double* partial, float* dlogits, const float* logits, int64_t N, int64_t E,
                              double coeff, double dloss) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float* l = logits + n * E;
  double mx = -INFINITY, sum = 0;
  for (int64_t e = 0; e < E; ++e) mx = fmax(mx, double(l[e]));
  for (int64_t e = 0; e < E; ++e) sum += exp(double(l[e]) - mx);
  const double lse = mx + log(sum);
  partial[n] = lse * lse;
  if (!dlogits) return;
  const double f = dloss * coeff * 2.0 * lse / double(N);
  for (int64_t e = 0; e < E; ++e) dlogits[n * E + e] = float(double(dlogits[n * E + e]) + f * exp(double(l[e]) - lse));
}

// loss = scale * sum(partial): one block; thread t adds partial[t], partial[t + 1024], ... in order, then a fixed tree
__global__ void sum_kernel(float* loss, const double* partial, int64_t N, double scale) {
  __shared__ double red[32];
  double s = 0;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) s += partial[n];
  s = block_sum(s, red);
  if (threadIdx.x == 0) *loss = float(s * scale);
}
}  // namespace

void moe_router_forward_cuda(int32_t* indices, float* weights, float* scores, const float* logits, const float* bias,
                             int64_t N, int64_t E, const RouterSpec& spec) {
  if (N == 0) return;
  router_forward_kernel<<<unsigned(ceil_div(N, kThreads)), kThreads, 0, current_stream()>>>(indices, weights, scores,
                                                                                            logits, bias, N, E, spec);
  MT_CUDA_CHECK_LAUNCH("moe_router_forward");
}

void moe_router_backward_cuda(float* dlogits, const float* dweights, const float* scores, const int32_t* indices,
                              int64_t N, int64_t E, const RouterSpec& spec) {
  if (N == 0) return;
  router_backward_kernel<<<unsigned(ceil_div(N, kThreads)), kThreads, 0, current_stream()>>>(
      dlogits, dweights, scores, indices, N, E, spec);
  MT_CUDA_CHECK_LAUNCH("moe_router_backward");
}

void moe_aux_loss_cuda(float* loss, float* dlogits, const float* scores, const int32_t* indices, int64_t N, int64_t E,
                       int64_t k, int64_t groups, double coeff, bool sigmoid, double dloss, const double* a_host) {
  const int64_t rows = N / groups;
  Scratch scratch(size_t(2 * groups * E + N) * sizeof(double));
  double* a = scratch.as<double>();                              // (groups, E)
  double* partial = a + groups * E;                              // (N)
  auto* cnt = reinterpret_cast<int32_t*>(partial + N);           // (groups, E) int32 in groups * E doubles
  cudaStream_t st = current_stream();
  if (a_host) {  // a group split over ranks: its coefficients (groups 1), from pageable memory (staged at once)
    MT_CUDA_CHECK(cudaMemcpyAsync(a, a_host, size_t(E) * sizeof(double), cudaMemcpyHostToDevice, st));
  } else {
    MT_CUDA_CHECK(cudaMemsetAsync(cnt, 0, size_t(groups * E) * sizeof(int32_t), st));
    if (rows * k > 0) {
      const dim3 grid(unsigned(ceil_div(rows * k, int64_t{kTile})), unsigned(groups));
      aux_counts_kernel<<<grid, kHistThreads, size_t(E) * sizeof(int32_t), st>>>(cnt, indices, E, rows * k);
      MT_CUDA_CHECK_LAUNCH("moe_aux_loss (counts)");
    }
    aux_coeff_kernel<<<unsigned(ceil_div(groups * E, kThreads)), kThreads, 0, st>>>(a, cnt, E, k, groups, rows, coeff);
    MT_CUDA_CHECK_LAUNCH("moe_aux_loss (coefficients)");
  }
  if (N > 0) {
    aux_rows_kernel<<<unsigned(ceil_div(N, kThreads)), kThreads, 0, st>>>(partial, dlogits, scores, a, N, E, rows,
                                                                           sigmoid, dloss);
    MT_CUDA_CHECK_LAUNCH("moe_aux_loss (rows)");
  }
  if (loss) {
    sum_kernel<<<1, kSumThreads, 0, st>>>(loss, partial, N, 1.0);
    MT_CUDA_CHECK_LAUNCH("moe_aux_loss (sum)");
  }
}

void moe_z_loss_cuda(float* loss, float* dlogits, const float* logits, int64_t N, int64_t E, double coeff,
                     double dloss) {
  Scratch scratch(size_t(N) * sizeof(double));
  double* partial = scratch.as<double>();
  cudaStream_t st = current_stream();
  if (N > 0) {
    z_rows_kernel<<<unsigned(ceil_div(N, kThreads)), kThreads, 0, st>>>(partial, dlogits, logits, N, E, coeff, dloss);
    MT_CUDA_CHECK_LAUNCH("moe_z_loss (rows)");
  }
  if (loss) {
    sum_kernel<<<1, kSumThreads, 0, st>>>(loss, partial, N, N > 0 ? coeff / double(N) : 0.0);
    MT_CUDA_CHECK_LAUNCH("moe_z_loss (sum)");
  }
}

}  // namespace mt::ops::cuda
