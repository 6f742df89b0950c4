// The MoE router and its losses on CUDA (tensor/cpu/moe_router.cpp has the math): a segment of lanes per row, in
// fp64; sums over a row's experts by a fixed butterfly (so within fp64 rounding of the CPU's sequential sums),
// sums over the picked experts in pick order as the CPU; loss values summed over the per-row partials by one block
// in a fixed order (strided per thread, then a tree): deterministic. The balancing loss's per-(group, expert)
// counts are shared-memory histograms added with integer atomics (exact). Scratch (fp64 partials, counts) comes
// from the caller (the tensor layer's caching allocator).
#include "cuda/kernel_utils.cuh"
#include "cuda/moe_cuda.h"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {
constexpr int kThreads = 128;
// The per-row kernels give each row a segment of W lanes of a warp (W = E rounded up to a power of two, at most
// 32: 32 / W rows per warp, kRowWarps warps per block): lane l of a segment holds experts l, l + W, ...; loads of
// a row are coalesced, and sums over experts are a fixed butterfly inside the segment (every lane of it gets the
// same bits). A warp's rows past N still run (on row N - 1) so that every shuffle has all 32 lanes; they write
// nothing. (One thread per row took 0.175 ms for the top-8 of 64 at 16,384 rows on an H100: uncoalesced loads,
// 128 blocks; a whole warp per row then took 0.023 ms at the 8 experts of moe-8x-top2, twice the old kernel.)
constexpr int kRowWarps = 4, kRowThreads = 32 * kRowWarps;
int seg_width(int64_t E) {
  int w = 1;
  while (w < 32 && w < E) w *= 2;
  return w;
}
unsigned row_grid(int64_t N, int W) { return unsigned(ceil_div(N, int64_t{kRowWarps} * (32 / W))); }
struct RowLane {
  int64_t n;    // the segment's row (clamped to N - 1 when past it)
  bool active;  // n < N: the row's results are written
  int lane;     // within the segment
  int slot;     // the segment's index in the block (shared memory)
};
__device__ __forceinline__ RowLane row_lane(int64_t N, int W) {
  const int slot = int(threadIdx.x) / W;
  const int64_t n = int64_t(blockIdx.x) * (kRowThreads / W) + slot;
  return {n < N ? n : N - 1, n < N, int(threadIdx.x) % W, slot};
}
__device__ __forceinline__ double seg_sum(double v, int W) {
  for (int o = W / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double seg_max(double v, int W) {
  for (int o = W / 2; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// scores = softmax(logits) (or sigmoid); top-k by score + bias, ties to the lower index; weights = the chosen
// scores, renormalized and scaled. picked (shared): each segment's chosen experts so far, k per segment.
__global__ void __launch_bounds__(kRowThreads) router_forward_kernel(int32_t* indices, float* weights, float* scores,
                                                                     const float* logits, const float* bias, int64_t N,
                                                                     int64_t E, RouterSpec spec, int W) {
  extern __shared__ int32_t picked_all[];
  const RowLane rl = row_lane(N, W);
  const int64_t n = rl.n, k = spec.topk;
  const int lane = rl.lane;
  int32_t* picked = picked_all + int64_t(rl.slot) * k;
  const float* l = logits + n * E;
  float* s = scores + n * E;
  if (spec.sigmoid) {
    for (int64_t e = lane; e < E; e += W)
      if (rl.active) s[e] = float(1.0 / (1.0 + exp(-double(l[e]))));
  } else {
    double mx = -INFINITY, sum = 0;
    for (int64_t e = lane; e < E; e += W) mx = fmax(mx, double(l[e]));
    mx = seg_max(mx, W);
    for (int64_t e = lane; e < E; e += W) sum += exp(double(l[e]) - mx);
    sum = seg_sum(sum, W);
    for (int64_t e = lane; e < E; e += W)
      if (rl.active) s[e] = float(exp(double(l[e]) - mx) / sum);
  }
  __syncwarp();
  double chosen = 0;  // in pick order, as the CPU
  for (int64_t j = 0; j < k; ++j) {  // the best not yet taken: each lane's, then the segment's
    int32_t best = -1;
    double bv = 0;
    for (int64_t e = lane; e < E; e += W) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken |= picked[i] == e;
      if (taken) continue;
      const double v = double(s[e]) + (bias ? double(bias[e]) : 0.0);
      if (best < 0 || v > bv) best = int32_t(e), bv = v;
    }
    for (int o = W / 2; o > 0; o >>= 1) {
      const int32_t ob = __shfl_xor_sync(0xffffffffu, best, o);
      const double ov = __shfl_xor_sync(0xffffffffu, bv, o);
      if (ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best))) best = ob, bv = ov;
    }
    best = __shfl_sync(0xffffffffu, best, 0, W);  // lane 0's pick for the segment (NaN compares false both ways)
    if (lane == 0) picked[j] = best;
    __syncwarp();
    chosen += double(s[best]);
  }
  const bool norm = spec.sigmoid ? spec.topk > 1 : !spec.pre_softmax;
  const double f = (norm ? 1.0 / chosen : 1.0) * spec.scaling;
  if (rl.active)
    for (int64_t j = lane; j < k; j += W) {
      indices[n * k + j] = picked[j];
      weights[n * k + j] = float(double(s[picked[j]]) * f);
    }
}

__global__ void __launch_bounds__(kRowThreads) router_backward_kernel(float* dlogits, const float* dweights,
                                                                      const float* scores, const int32_t* indices,
                                                                      int64_t N, int64_t E, RouterSpec spec, int W) {
  const RowLane rl = row_lane(N, W);
  if (!rl.active) return;  // no shuffles below
  const int64_t n = rl.n, k = spec.topk;
  const float* s = scores + n * E;
  const int32_t* idx = indices + n * k;
  const bool norm = spec.sigmoid ? spec.topk > 1 : !spec.pre_softmax;
  double S = 0, dot = 0;  // every lane, in pick order
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
    for (int64_t e = rl.lane; e < E; e += W) dl[e] = float(ds(e) * double(s[e]) * (1.0 - double(s[e])));
  } else {
    double sd = 0;
    for (int64_t j = 0; j < k; ++j) sd += ds(idx[j]) * double(s[idx[j]]);
    for (int64_t e = rl.lane; e < E; e += W) dl[e] = float(double(s[e]) * (ds(e) - sd));
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

__global__ void __launch_bounds__(kRowThreads) aux_rows_kernel(double* partial, float* dlogits, const float* scores,
                                                               const double* a, int64_t N, int64_t E, int64_t rows,
                                                               bool sigmoid, double dloss, int W) {
  const RowLane rl = row_lane(N, W);
  const int64_t n = rl.n;
  const float* s = scores + n * E;
  const double* ag = a + (n / rows) * E;
  double S = 0;
  for (int64_t e = rl.lane; e < E; e += W) S += double(s[e]);
  S = seg_sum(S, W);
  const double inv = sigmoid ? 1.0 / S : 1.0;
  double ap = 0;
  for (int64_t e = rl.lane; e < E; e += W) ap += ag[e] * double(s[e]) * inv;
  ap = seg_sum(ap, W);
  if (!rl.active) return;
  if (rl.lane == 0) partial[n] = ap;
  if (!dlogits) return;
  for (int64_t e = rl.lane; e < E; e += W) {
    const double se = double(s[e]);
    const double d = sigmoid ? (ag[e] - ap) / S * se * (1.0 - se) : se * (ag[e] - ap);
    dlogits[n * E + e] = float(double(dlogits[n * E + e]) + dloss * d);
  }
}

__global__ void __launch_bounds__(kRowThreads) z_rows_kernel(double* partial, float* dlogits, const float* logits,
                                                             int64_t N, int64_t E, double coeff, double dloss, int W) {
  const RowLane rl = row_lane(N, W);
  const int64_t n = rl.n;
  const float* l = logits + n * E;
  double mx = -INFINITY, sum = 0;
  for (int64_t e = rl.lane; e < E; e += W) mx = fmax(mx, double(l[e]));
  mx = seg_max(mx, W);
  for (int64_t e = rl.lane; e < E; e += W) sum += exp(double(l[e]) - mx);
  sum = seg_sum(sum, W);
  if (!rl.active) return;
  const double lse = mx + log(sum);
  if (rl.lane == 0) partial[n] = lse * lse;
  if (!dlogits) return;
  const double f = dloss * coeff * 2.0 * lse / double(N);
  for (int64_t e = rl.lane; e < E; e += W) dlogits[n * E + e] = float(double(dlogits[n * E + e]) + f * exp(double(l[e]) - lse));
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
  const int W = seg_width(E);
  router_forward_kernel<<<row_grid(N, W), kRowThreads, size_t(kRowThreads / W * spec.topk) * sizeof(int32_t),
                          current_stream()>>>(indices, weights, scores, logits, bias, N, E, spec, W);
  MT_CUDA_CHECK_LAUNCH("moe_router_forward");
}

void moe_router_backward_cuda(float* dlogits, const float* dweights, const float* scores, const int32_t* indices,
                              int64_t N, int64_t E, const RouterSpec& spec) {
  if (N == 0) return;
  const int W = seg_width(E);
  router_backward_kernel<<<row_grid(N, W), kRowThreads, 0, current_stream()>>>(dlogits, dweights, scores, indices, N,
                                                                              E, spec, W);
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
    const int W = seg_width(E);
    aux_rows_kernel<<<row_grid(N, W), kRowThreads, 0, st>>>(partial, dlogits, scores, a, N, E, rows, sigmoid, dloss, W);
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
    const int W = seg_width(E);
    z_rows_kernel<<<row_grid(N, W), kRowThreads, 0, st>>>(partial, dlogits, logits, N, E, coeff, dloss, W);
    MT_CUDA_CHECK_LAUNCH("moe_z_loss (rows)");
  }
  if (loss) {
    sum_kernel<<<1, kSumThreads, 0, st>>>(loss, partial, N, N > 0 ? coeff / double(N) : 0.0);
    MT_CUDA_CHECK_LAUNCH("moe_z_loss (sum)");
  }
}

}  // namespace mt::ops::cuda
