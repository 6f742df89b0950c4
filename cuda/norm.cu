// LayerNorm and RMSNorm on CUDA over the last dim C of (N, C); tensor/cpu/norm.cpp has the math:
//   LayerNorm: xh = (x - mu) r, r = 1/sqrt(var + eps), y = xh w + b; saves mean, rstd (fp32, (N)).
//     dx = r (gh - mean_c(gh) - xh mean_c(gh xh)), gh = dy w;  dw += sum_n dy xh;  db += sum_n dy.
//   RMSNorm: xh = x r, r = 1/sqrt(mean_c x^2 + eps), y = xh w; saves rstd.
//     dx = r (gh - xh mean_c(gh xh));  dw += sum_n dy xh.
// Math in fp32 whatever T is; dw, db are main grads (+=), fp32 or bf16 (G: the fp32 sum rounded once); dx is T
// (= or += by GradMode).
//
// Forward: one warp per row, VEC elements per lane (16-byte loads) when C and the pointers allow; the row is
// held in registers (C <= 16 x 32 x VEC: one read of memory), else re-read per pass (norm_forward_kernel).
// Backward, deterministic (no float atomics): every kernel writes one partial dw/db row per block, and
// sum_partials adds them in block order into dw/db. dx per row after two row sums (sum gh, sum gh xh); each
// element of dout is read before dinp's same element is written, so dinp may alias dout. Three kernels, the first
// that fits (bf16 C: <= 3072, <= 4096 RMSNorm / 2048 LayerNorm, any):
//   1. norm_backward_kernel_warp<kHeld = true>: a warp per row, the row's dout and x in registers, the partials
//      in shared memory.
//   2. norm_backward_kernel_warp<kHeld = false>: a warp per row, the partials in registers, the row re-read.
//   3. norm_backward_kernel_block_rows: a block walks a contiguous range of rows with all its threads, each
//      thread owning fixed columns (partials in shared memory); one block barrier per row.
// Measured (1 H200, bf16, dx +=; benchmarks/kernels/cuda_kernels.md): 16384 x 2048 0.109 ms (1.) vs 0.120 (2.),
// 16384 x 3072 0.178 vs 0.279.
#include <algorithm>
#include <initializer_list>

#include "cuda/cuda_ops.h"
#include "cuda/kernel_utils.cuh"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace {

constexpr int kFwdWarps = 8;         // rows per forward block
constexpr int kBwdThreads = 256;
constexpr int kBwdBlocksPerSM = 2;  // block-per-rows kernel

// Forward, one warp per row. NC > 0: the row is held in registers (C <= NC * 32 * VEC), every load of it issued
// at once and the row read from memory once; NC = 0: any C, the row re-read per pass (from L1/L2). Lane l adds
// its chunks j = 0, 1, ... (columns (j * 32 + l) * VEC ...) in order either way: the same bits.
template <bool kLayerNorm, int VEC, int NC, typename D>
__global__ void norm_forward_kernel(D* __restrict__ out, float* mean, float* rstd, const D* __restrict__ inp,
                                    const D* __restrict__ weight, const D* __restrict__ bias, int64_t N, int64_t C,
                                    float eps) {
  constexpr int kChunks = NC > 0 ? NC : (1 << 30), kUnroll = NC > 0 ? NC : 1;
  const int lane = threadIdx.x % 32;
  const int64_t n = int64_t(blockIdx.x) * kFwdWarps + threadIdx.x / 32;
  if (n >= N) return;
  const D* x = inp + n * C;
  D held[NC > 0 ? NC : 1][VEC];
  if constexpr (NC > 0) {
#pragma unroll
    for (int j = 0; j < NC; ++j) {
      const int64_t c = (int64_t(j) * 32 + lane) * VEC;
      if (c < C) load_vec<VEC>(held[j], x + c);
    }
  }
  auto chunk = [&](int j, int64_t c, D (&v)[VEC]) {  // chunk j of the row, at column c
    if constexpr (NC > 0) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[k] = held[j][k];
    } else {
      load_vec<VEC>(v, x + c);
    }
  };
  float mu = 0.f;
  if constexpr (kLayerNorm) {
    float s = 0.f;
#pragma unroll kUnroll
    for (int j = 0; j < kChunks; ++j) {
      const int64_t c = (int64_t(j) * 32 + lane) * VEC;
      if (c >= C) break;
      D v[VEC];
      chunk(j, c, v);
#pragma unroll
      for (int k = 0; k < VEC; ++k) s += to_float(v[k]);
    }
    mu = warp_sum(s) / static_cast<float>(C);
  }
  float ss = 0.f;
#pragma unroll kUnroll
  for (int j = 0; j < kChunks; ++j) {
    const int64_t c = (int64_t(j) * 32 + lane) * VEC;
    if (c >= C) break;
    D v[VEC];
    chunk(j, c, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float d = to_float(v[k]) - mu;
      ss += d * d;
    }
  }
  const float r = 1.f / sqrtf(warp_sum(ss) / static_cast<float>(C) + eps);
  D* y = out + n * C;
#pragma unroll kUnroll
  for (int j = 0; j < kChunks; ++j) {
    const int64_t c = (int64_t(j) * 32 + lane) * VEC;
    if (c >= C) break;
    D v[VEC], w[VEC], b[VEC], o[VEC];
    chunk(j, c, v);
    load_vec<VEC>(w, weight + c);
    if constexpr (kLayerNorm) load_vec<VEC>(b, bias + c);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      float t = (to_float(v[k]) - mu) * r * to_float(w[k]);
      if constexpr (kLayerNorm) t += to_float(b[k]);
      o[k] = from_float<D>(t);
    }
    store_vec<VEC>(y + c, o);
  }
  if (lane == 0) {
    if constexpr (kLayerNorm) mean[n] = mu;
    rstd[n] = r;
  }
}

// The backward's two row sums over a vector of columns: s_gh += sum(gh), s_ghxh += sum(gh xhat), gh = dout * weight,
// xhat = (x - mu) * rstd (both backward kernels, the same operations in the same order)
template <int VEC, typename D>
__device__ __forceinline__ void add_row_sums(float& s_gh, float& s_ghxh, const D (&gv)[VEC], const D (&xv)[VEC],
                                             const D (&wv)[VEC], float mu, float r) {
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    const float gh = to_float(gv[k]) * to_float(wv[k]);
    s_gh += gh;
    s_ghxh += gh * (to_float(xv[k]) - mu) * r;
  }
}

// Block b handles rows [b * rows_per_block, ...). Dynamic shared memory: dw partials (C floats),
// then db partials (C floats, LayerNorm). partial: (gridDim.x, C) for dw, then the same for db.
template <bool kLayerNorm, int VEC, typename D>
__global__ void norm_backward_kernel_block_rows(D* dinp, float* partial, const D* dout, const D* inp,
                                                const D* weight, const float* mean, const float* rstd, int64_t N,
                                                int64_t C, int64_t rows_per_block, bool accumulate) {
  extern __shared__ float smem[];
  __shared__ float red[2][32];
  float* sw = smem;
  float* sb = smem + C;
  for (int64_t c = threadIdx.x; c < (kLayerNorm ? 2 : 1) * C; c += blockDim.x) smem[c] = 0.f;
  __syncthreads();
  const int64_t n0 = int64_t(blockIdx.x) * rows_per_block, n1 = min(N, n0 + rows_per_block);
  const float inv_c = 1.f / static_cast<float>(C);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int64_t n = n0; n < n1; ++n) {
    const D* g = dout + n * C;
    const D* x = inp + n * C;
    const float mu = kLayerNorm ? mean[n] : 0.f, r = rstd[n];
    float s_gh = 0.f, s_ghxh = 0.f;
    for (int64_t c = threadIdx.x * VEC; c < C; c += blockDim.x * VEC) {
      D gv[VEC], xv[VEC], wv[VEC];
      load_vec<VEC>(gv, g + c);
      load_vec<VEC>(xv, x + c);
      load_vec<VEC>(wv, weight + c);
      add_row_sums<VEC>(s_gh, s_ghxh, gv, xv, wv, mu, r);
    }
    // Block-wide sums of the two values (fixed order), every thread gets both.
    s_gh = warp_sum(s_gh);
    s_ghxh = warp_sum(s_ghxh);
    if (lane == 0) {
      red[0][warp] = s_gh;
      red[1][warp] = s_ghxh;
    }
    __syncthreads();
    s_gh = warp_sum(lane < warps ? red[0][lane] : 0.f);
    s_ghxh = warp_sum(lane < warps ? red[1][lane] : 0.f);
    __syncthreads();
    const float m1 = kLayerNorm ? s_gh * inv_c : 0.f, m2 = s_ghxh * inv_c;
    D* dx = dinp + n * C;
    for (int64_t c = threadIdx.x * VEC; c < C; c += blockDim.x * VEC) {
      D gv[VEC], xv[VEC], wv[VEC], out[VEC];
      float pw[VEC], pb[VEC];
      load_vec<VEC>(gv, g + c);
      load_vec<VEC>(xv, x + c);
      load_vec<VEC>(wv, weight + c);
      load_vec<VEC>(pw, sw + c);
      if constexpr (kLayerNorm) load_vec<VEC>(pb, sb + c);
      if (accumulate) load_vec<VEC>(out, dx + c);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float gf = to_float(gv[k]), xh = (to_float(xv[k]) - mu) * r, gh = gf * to_float(wv[k]);
        pw[k] += gf * xh;
        if constexpr (kLayerNorm) pb[k] += gf;
        const float v = r * (gh - m1 - xh * m2);
        out[k] = from_float<D>(accumulate ? to_float(out[k]) + v : v);
      }
      store_vec<VEC>(sw + c, pw);
      if constexpr (kLayerNorm) store_vec<VEC>(sb + c, pb);
      store_vec<VEC>(dx + c, out);
    }
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    partial[int64_t(blockIdx.x) * C + c] = sw[c];
    if constexpr (kLayerNorm) partial[(int64_t(gridDim.x) + blockIdx.x) * C + c] = sb[c];
  }
}

// Backward with one warp per row (C <= NC * 32 * VEC): warp w of the grid takes rows w, w + W, ... (W = warps in
// the grid), lane l owns the columns (j * 32 + l) * VEC + k (j < NC, k < VEC). Per row: one pass for the two row
// sums (warp shuffles only, no block barrier), one for dx and the dw/db partials. kHeld: the row's dout and x are
// kept in registers between the passes (read from memory once) and the partials live in shared memory; else the
// row is re-read from L1/L2 and the partials live in registers (fewer registers for the row: larger C fits).
// Each warp's partials end in its own shared-memory area, kParts x C floats laid out lane-major,
// [part][j * VEC + k][lane], so no lane's update conflicts with another's; at the end the block adds its warps'
// partials in warp order into its row of `partial` (sum_partials adds the rows in block order): deterministic for
// a given grid, no atomics.
constexpr int kBwdWarps = 4;
constexpr int kBwdHeldMaxNC = 12;  // kHeld at 16 chunks spills (255 registers)
template <bool kLayerNorm, bool kHeld, int VEC, int NC, typename D>
__global__ void __launch_bounds__(kBwdWarps * 32)
    norm_backward_kernel_warp(D* dinp, const D* dout, const D* inp, const D* __restrict__ weight, const float* mean,
                              const float* rstd, bool accumulate, float* partial, int64_t N, int64_t C) {
  constexpr int kParts = kLayerNorm ? 2 : 1, kCols = NC * VEC;  // partial floats per lane and part
  constexpr int kRegs = kHeld ? 1 : NC;
  extern __shared__ float smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* ps = smem + int64_t(warp) * kParts * kCols * 32;  // this warp's partials; db at ps + kCols * 32
  float pr[kRegs][VEC], pbr[kRegs][VEC];                   // or in registers
  if constexpr (kHeld) {
    for (int i = lane; i < kParts * kCols * 32; i += 32) ps[i] = 0.f;
  } else {
#pragma unroll
    for (int j = 0; j < NC; ++j)
#pragma unroll
      for (int k = 0; k < VEC; ++k) pr[j][k] = pbr[j][k] = 0.f;
  }
  const float inv_c = 1.f / static_cast<float>(C);
  const int64_t total_warps = int64_t(gridDim.x) * kBwdWarps;
  for (int64_t n = int64_t(blockIdx.x) * kBwdWarps + warp; n < N; n += total_warps) {
    const D* g = dout + n * C;
    const D* x = inp + n * C;
    D gh_[kHeld ? NC : 1][VEC], xh_[kHeld ? NC : 1][VEC];
    if constexpr (kHeld) {
#pragma unroll
      for (int j = 0; j < NC; ++j) {
        const int64_t c = (int64_t(j) * 32 + lane) * VEC;
        if (c < C) {
          load_vec<VEC>(gh_[j], g + c);
          load_vec<VEC>(xh_[j], x + c);
        }
      }
    }
    auto chunk = [&](int j, int64_t c, D (&gv)[VEC], D (&xv)[VEC]) {  // dout and x of chunk j, at column c
      if constexpr (kHeld) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          gv[k] = gh_[j][k];
          xv[k] = xh_[j][k];
        }
      } else {
        load_vec<VEC>(gv, g + c);
        load_vec<VEC>(xv, x + c);
      }
    };
    const float mu = kLayerNorm ? mean[n] : 0.f, r = rstd[n];
    float s_gh = 0.f, s_ghxh = 0.f;
#pragma unroll
    for (int j = 0; j < NC; ++j) {
      const int64_t c = (int64_t(j) * 32 + lane) * VEC;
      if (c < C) {
        D gv[VEC], xv[VEC], wv[VEC];
        chunk(j, c, gv, xv);
        load_vec<VEC>(wv, weight + c);
        add_row_sums<VEC>(s_gh, s_ghxh, gv, xv, wv, mu, r);
      }
    }
    s_gh = warp_sum(s_gh);
    s_ghxh = warp_sum(s_ghxh);
    const float m1 = kLayerNorm ? s_gh * inv_c : 0.f, m2 = s_ghxh * inv_c;
    D* dx = dinp + n * C;
#pragma unroll
    for (int j = 0; j < NC; ++j) {
      const int64_t c = (int64_t(j) * 32 + lane) * VEC;
      if (c < C) {
        D gv[VEC], xv[VEC], wv[VEC], o[VEC];
        chunk(j, c, gv, xv);
        load_vec<VEC>(wv, weight + c);
        if (accumulate) load_vec<VEC>(o, dx + c);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float gf = to_float(gv[k]), xh = (to_float(xv[k]) - mu) * r, gh = gf * to_float(wv[k]);
          if constexpr (kHeld) {
            ps[(j * VEC + k) * 32 + lane] += gf * xh;
            if constexpr (kLayerNorm) ps[(kCols + j * VEC + k) * 32 + lane] += gf;
          } else {
            pr[j][k] += gf * xh;
            if constexpr (kLayerNorm) pbr[j][k] += gf;
          }
          const float v = r * (gh - m1 - xh * m2);
          o[k] = from_float<D>(accumulate ? to_float(o[k]) + v : v);
        }
        store_vec<VEC>(dx + c, o);
      }
    }
  }
  if constexpr (!kHeld) {
#pragma unroll
    for (int j = 0; j < NC; ++j)
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        ps[(j * VEC + k) * 32 + lane] = pr[j][k];
        if constexpr (kLayerNorm) ps[(kCols + j * VEC + k) * 32 + lane] = pbr[j][k];
      }
  }
  __syncthreads();
  // The block's partial row: column c = (j * 32 + l) * VEC + k sits at [j * VEC + k][l] of every warp.
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const int64_t j = c / (32 * VEC), l = (c / VEC) % 32, k = c % VEC, at = (j * VEC + k) * 32 + l;
    for (int p = 0; p < kParts; ++p) {
      float acc = 0.f;
      for (int w = 0; w < kBwdWarps; ++w) acc += smem[(int64_t(w) * kParts + p) * kCols * 32 + at];
      partial[(int64_t(p) * gridDim.x + blockIdx.x) * C + c] = acc;
    }
  }
}

// dw[c] += sum_b partial[b, c], db[c] += sum_b partial[blocks + b, c] (fixed order: kernel_utils.cuh).
template <typename G>
void sum_partials(G* dw, G* db, const float* partial, int blocks, int64_t C) {
  sum_rows_accumulate(dw, partial, blocks, C, current_stream());
  if (db) sum_rows_accumulate(db, partial + int64_t(blocks) * C, blocks, C, current_stream());
}

template <typename D>
bool norm_vec_ok(int64_t C, std::initializer_list<const void*> ptrs) {
  if (C % (16 / sizeof(D)) != 0) return false;
  for (const void* p : ptrs)
    if (p && !aligned(p, 16)) return false;
  return true;
}

// Returns f.template operator()<NC>() (true: launched) for the smallest instantiated NC >= nc (1, 2, 3, 4, 6, 8,
// 12, 16); false when nc > kMaxNC.
template <int kMaxNC, typename F>
bool with_nc(int64_t nc, F&& f) {
  if (nc > kMaxNC) return false;
  auto call = [&]<int NC>() -> bool { return f.template operator()<NC>(); };
  if (nc <= 1) return call.template operator()<1>();
  if (nc <= 2) return call.template operator()<2>();
  if (nc <= 3) return call.template operator()<3>();
  if (nc <= 4) return call.template operator()<4>();
  if (nc <= 6) return call.template operator()<6>();
  if (nc <= 8) return call.template operator()<8>();
  if constexpr (kMaxNC >= 12)
    if (nc <= 12) return call.template operator()<12>();
  if constexpr (kMaxNC >= 16)
    if (nc <= 16) return call.template operator()<16>();
  return false;
}

template <bool kLayerNorm, typename T>
void norm_forward(const char* what, T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias,
                  int64_t N, int64_t C, double eps) {
  using D = dev_t<T>;
  if (N == 0) return;
  constexpr int kVec = 16 / sizeof(D);
  const unsigned blocks = static_cast<unsigned>(ceil_div(N, kFwdWarps));
  cudaStream_t s = current_stream();
  const float e = static_cast<float>(eps);
  const bool vec = norm_vec_ok<D>(C, {out, inp, weight, bias});
  const bool held = vec && with_nc<16>(ceil_div(C, 32 * kVec), [&]<int NC>() {
    norm_forward_kernel<kLayerNorm, kVec, NC><<<blocks, kFwdWarps * 32, 0, s>>>(
        dev(out), mean, rstd, dev(inp), dev(weight), dev(bias), N, C, e);
    return true;
  });
  if (!held && vec)
    norm_forward_kernel<kLayerNorm, kVec, 0><<<blocks, kFwdWarps * 32, 0, s>>>(dev(out), mean, rstd, dev(inp),
                                                                             dev(weight), dev(bias), N, C, e);
  else if (!held)
    norm_forward_kernel<kLayerNorm, 1, 0><<<blocks, kFwdWarps * 32, 0, s>>>(dev(out), mean, rstd, dev(inp),
                                                                          dev(weight), dev(bias), N, C, e);
  MT_CUDA_CHECK_LAUNCH(what);
}

template <bool kLayerNorm, int VEC, typename D>
void launch_norm_backward(unsigned blocks, size_t smem, D* dinp, float* partial, const D* dout, const D* inp,
                          const D* weight, const float* mean, const float* rstd, int64_t N, int64_t C, int64_t rows,
                          bool acc) {
  auto kernel = norm_backward_kernel_block_rows<kLayerNorm, VEC, D>;
  ensure_dynamic_smem(kernel, smem);
  kernel<<<blocks, kBwdThreads, smem, current_stream()>>>(dinp, partial, dout, inp, weight, mean, rstd, N, C, rows,
                                                          acc);
}

// Launches a backward kernel whose warps each take rows w, w + W, ... and whose blocks each write one partial row
// (kParts of them: dw, then db): as many blocks as fit on the GPU at once (a second wave would only add a tail),
// at most one warp per row; then adds the partials into dw (and db).
template <typename Kernel, typename G, typename... Args>
void launch_resident_rows(Kernel kernel, int warps_per_block, size_t smem, int kParts, G* dweight, G* dbias, int64_t N,
                          int64_t C, Args... args) {
  ensure_dynamic_smem(kernel, smem);
  const int64_t fit = int64_t(blocks_per_sm(kernel, warps_per_block * 32, smem)) * context().sm_count;
  const unsigned grid = static_cast<unsigned>(std::max<int64_t>(1, std::min(ceil_div(N, warps_per_block), fit)));
  Scratch partial(sizeof(float) * static_cast<size_t>(grid) * C * kParts);
  kernel<<<grid, warps_per_block * 32, smem, current_stream()>>>(args..., partial.as<float>(), N, C);
  MT_CUDA_CHECK_LAUNCH("norm backward (rows)");
  sum_partials(dweight, dbias, partial.as<float>(), static_cast<int>(grid), C);
}

template <bool kLayerNorm, typename T, typename G>
void norm_backward(const char* what, T* dinp, G* dweight, G* dbias, const T* dout, const T* inp, const T* weight,
                   const float* mean, const float* rstd, int64_t N, int64_t C, bool acc) {
  using D = dev_t<T>;
  if (N == 0 || C == 0) return;
  const Context& ctx = context();
  const size_t smem = sizeof(float) * static_cast<size_t>(C) * (kLayerNorm ? 2 : 1);
  MT_CHECK(smem + 1024 <= ctx.smem_optin, what, ": C = ", C, " needs ", smem,
           " bytes of shared memory, the device allows ", ctx.smem_optin);
  constexpr int kVec = 16 / sizeof(D), kParts = kLayerNorm ? 2 : 1;
  G* db = kLayerNorm ? dbias : nullptr;
  const bool vec = norm_vec_ok<D>(C, {dinp, dout, inp, weight});
  const int64_t nc = ceil_div(C, 32 * kVec);
  // The warp-per-row kernel with NC chunks per lane, the row held in registers or re-read.
  auto warp_kernel = [&]<bool kHeld, int NC>() {
    launch_resident_rows(norm_backward_kernel_warp<kLayerNorm, kHeld, kVec, NC, D>, kBwdWarps,
                         sizeof(float) * kBwdWarps * kParts * NC * kVec * 32, kParts, dweight, db, N, C, dev(dinp),
                         dev(dout), dev(inp), dev(weight), mean, rstd, acc);
    return true;
  };
  // 1. Rows in registers, partials in shared memory (up to kBwdHeldMaxNC chunks per lane).
  if (vec && with_nc<kBwdHeldMaxNC>(nc, [&]<int NC>() { return warp_kernel.template operator()<true, NC>(); }))
    return;
  // 2. Partials in registers (NC * VEC fp32 per lane and part, at most 128 in all), the row re-read.
  if (vec && with_nc<16>(nc, [&]<int NC>() {
        if constexpr (NC * kVec * kParts <= 128) return warp_kernel.template operator()<false, NC>();
        return false;
      }))
    return;
  // 3. Any C: a block walks a contiguous range of rows.
  const int64_t blocks = std::min<int64_t>(N, int64_t(ctx.sm_count) * kBwdBlocksPerSM);
  const int64_t rows = ceil_div(N, blocks);
  const unsigned grid = static_cast<unsigned>(ceil_div(N, rows));
  Scratch partial(sizeof(float) * static_cast<size_t>(grid) * C * kParts);
  if (vec)
    launch_norm_backward<kLayerNorm, kVec>(grid, smem, dev(dinp), partial.as<float>(), dev(dout), dev(inp),
                                           dev(weight), mean, rstd, N, C, rows, acc);
  else
    launch_norm_backward<kLayerNorm, 1>(grid, smem, dev(dinp), partial.as<float>(), dev(dout), dev(inp),
                                        dev(weight), mean, rstd, N, C, rows, acc);
  MT_CUDA_CHECK_LAUNCH(what);
  sum_partials(dweight, db, partial.as<float>(), static_cast<int>(grid), C);
  MT_CUDA_CHECK_LAUNCH(what);
}

}  // namespace

// ---------------------------------------------------------------- launchers

template <typename T>
void layernorm_forward_cuda(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int64_t N,
                            int64_t C, double eps) {
  norm_forward<true>("layernorm_forward_cuda", out, mean, rstd, inp, weight, bias, N, C, eps);
}

template <typename T, typename G>
void layernorm_backward_cuda(T* dinp, G* dweight, G* dbias, const T* dout, const T* inp, const T* weight,
                             const float* mean, const float* rstd, int64_t N, int64_t C, bool accumulate_dinp) {
  norm_backward<true>("layernorm_backward_cuda", dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
                      accumulate_dinp);
}

template <typename T>
void rmsnorm_forward_cuda(T* out, float* rstd, const T* inp, const T* weight, int64_t N, int64_t C, double eps) {
  norm_forward<false>("rmsnorm_forward_cuda", out, nullptr, rstd, inp, weight, static_cast<const T*>(nullptr), N, C,
                      eps);
}

template <typename T, typename G>
void rmsnorm_backward_cuda(T* dinp, G* dweight, const T* dout, const T* inp, const T* weight, const float* rstd,
                           int64_t N, int64_t C, bool accumulate_dinp) {
  norm_backward<false>("rmsnorm_backward_cuda", dinp, dweight, static_cast<G*>(nullptr), dout, inp, weight, nullptr,
                       rstd, N, C, accumulate_dinp);
}

#define MT_INSTANTIATE(T)                                                                                         \
  template void layernorm_forward_cuda<T>(T*, float*, float*, const T*, const T*, const T*, int64_t, int64_t,    \
                                          double);                                                               \
  template void rmsnorm_forward_cuda<T>(T*, float*, const T*, const T*, int64_t, int64_t, double);
#define MT_INSTANTIATE_GRAD(T, G)                                                                                 \
  template void layernorm_backward_cuda<T, G>(T*, G*, G*, const T*, const T*, const T*, const float*,            \
                                              const float*, int64_t, int64_t, bool);                             \
  template void rmsnorm_backward_cuda<T, G>(T*, G*, const T*, const T*, const T*, const float*, int64_t, int64_t, \
                                            bool);
MT_INSTANTIATE(float)
MT_INSTANTIATE(mt::bf16)
MT_INSTANTIATE(mt::f16)
MT_CUDA_GRAD_TYPES(MT_INSTANTIATE_GRAD)
#undef MT_INSTANTIATE
#undef MT_INSTANTIATE_GRAD

}  // namespace mt::ops::cuda
