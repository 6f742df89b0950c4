// Causal grouped-query attention on CUDA: the entry points, and the bf16 forward (flash attention).
// Shapes: q, out (B, T, H, D); k, v (B, T, G, D); lse (B, H, T) fp32; query head h reads kv head
// h / (H / G); scale c = 1/sqrt(D) (tensor/cpu/attention.cpp has the math and the backward).
//   s_ij = c q_i . k_j (j <= i),  lse_i = log sum_j exp(s_ij),  o_i = sum_j exp(s_ij - lse_i) v_j.
// The T x T matrix is never materialized: one block owns (b, h, a tile of kBr = 4 * 16 * MT queries);
// each of its 4 warps owns MT m-tiles of 16 query rows, so every K/V fragment read from shared memory
// feeds MT tensor-core products (shared-memory bandwidth, not the tensor cores, bounds MT = 1).
// Key/value tiles of kBc rows stream through shared memory with cp.async, double-buffered (the next
// tile loads while the current one is used). Per key tile:
//   S = Q K^T on tensor cores (mma.sync bf16 -> fp32), the causal mask on the diagonal tiles,
//   online softmax in base 2 (m = running max, l = running sum, O rescaled by exp2(m_old - m_new)),
//   O += P V with P rounded to bf16 straight from the S registers.
// At the end O /= l and lse = c m + ln l. Query tiles are scheduled heaviest (last) first.
// fp32 inputs take the CUDA-core path of attention_f32.cu; the backward is in attention_backward.cu.
// bf16 runs on cuDNN's fused flash attention where it can (attention_cudnn.cu: T % 128 == 0; 2x the
// forward and ~3x the backward rate of these kernels on an H200), else on the kernels below.
// fp16 runs on cuDNN likewise; elsewhere (T % 128 != 0, attention_backend own) on the fp32 kernels over
// fp32 copies of its operands (exact but for the fp16 rounding of the results; slower, and 4 (forward)
// or 8 (backward) fp32 scratch tensors): the tensor-core kernels of this file are bf16-only mma code.
#include <cmath>

#include "cuda/attention_common.cuh"

namespace mt::ops::cuda {

using namespace ::mt::cuda;

namespace attn {
namespace {

constexpr int kWarps = 4, kThreads = kWarps * 32;

// Tiling per head dim: MT m-tiles (of 16 rows) per warp, kBc keys per K/V tile.
template <int D> struct FwdTiles;
template <> struct FwdTiles<64> { static constexpr int MT = 2, kBc = 64; };
// D = 128 at kBc = 64 needs all 255 registers and spills 72 bytes, yet ran 11% faster on an H200 than
// kBc = 32 (no spill): 0.313 vs 0.351 ms at B 4, T 2048, H 16 (benchmarks/kernels/cuda_kernels.md).
template <> struct FwdTiles<128> { static constexpr int MT = 2, kBc = 64; };
template <int D> constexpr int fwd_rows() { return kWarps * 16 * FwdTiles<D>::MT; }

template <int D>
constexpr size_t forward_smem() {  // Q, then K and V double-buffered
  return sizeof(bf16_t) * kTileLD<D> * (fwd_rows<D>() + 4 * FwdTiles<D>::kBc);
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel_mma(bf16_t* out, float* lse, const bf16_t* q, const bf16_t* k, const bf16_t* v, int T,
                                 int H, int G, float scale, float scale_log2) {
  constexpr int MT = FwdTiles<D>::MT, kBc = FwdTiles<D>::kBc, kBr = fwd_rows<D>();
  constexpr int LD = kTileLD<D>, kDT = D / 8, kNT = kBc / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16_t* sQ = reinterpret_cast<bf16_t*>(smem_raw);
  bf16_t* sK = sQ + kBr * LD;      // 2 buffers of kBc * LD
  bf16_t* sV = sK + 2 * kBc * LD;  // 2 buffers of kBc * LD
  const int tile = gridDim.x - 1 - blockIdx.x;
  const int b = blockIdx.y / H, h = blockIdx.y % H, g = h / (H / G);
  const int i0 = tile * kBr, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t q_stride = int64_t(H) * D, kv_stride = int64_t(G) * D;
  const bf16_t* qh = q + (int64_t(b) * T * H + h) * D;
  const bf16_t* kh = k + (int64_t(b) * T * G + g) * D;
  const bf16_t* vh = v + (int64_t(b) * T * G + g) * D;
  const int n_tiles = (min(T, i0 + kBr) + kBc - 1) / kBc;

  load_tile_async<kBr, D, kThreads>(sQ, qh, q_stride, i0, T);
  load_tile_async<kBc, D, kThreads>(sK, kh, kv_stride, 0, T);
  load_tile_async<kBc, D, kThreads>(sV, vh, kv_stride, 0, T);
  cp_async_commit();

  float o[MT][kDT][4] = {};
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      m[mt][rr] = -INFINITY;
      l[mt][rr] = 0.f;
    }
  const int wrow = warp * 16 * MT;             // the warp's first row in the tile
  const int row0 = i0 + wrow + lane / 4;       // m-tile mt: rows row0 + 16 mt and row0 + 16 mt + 8

  for (int j = 0; j < n_tiles; ++j) {
    const int buf = j % 2;
    next_kv_tile_async<kBc, D, kThreads>(sK, sV, buf, kh, vh, kv_stride, j, n_tiles, T);
    __syncthreads();
    const bf16_t* tK = sK + buf * kBc * LD;
    const bf16_t* tV = sV + buf * kBc * LD;

    // S = Q K^T (16 MT x kBc per warp).
    float s[MT][kNT][4] = {};
    mma_rows_x_cols<MT, kNT, D, LD>(s, sQ, wrow, tK);
    // Causal mask where this tile reaches past the warp's first row.
    const int j0 = j * kBc;
    if (j0 + kBc - 1 > i0 + wrow) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = j0 + nt * 8 + (lane % 4) * 2 + (e % 2), row = row0 + mt * 16 + (e / 2) * 8;
            if (key > row) s[mt][nt][e] = -INFINITY;
          }
    }
    // Online softmax; rows row0 + 16 mt (e = 0, 1) and + 8 (e = 2, 3), each spread over a lane quad.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * rr], s[mt][nt][2 * rr + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[mt][rr], mx);  // finite: key 0 <= row is in tile 0
        const float alpha = exp2f((m[mt][rr] - m_new) * scale_log2), base = m_new * scale_log2;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 2 * rr; e < 2 * rr + 2; ++e) {
            s[mt][nt][e] = exp2f(fmaf(s[mt][nt][e], scale_log2, -base));
            sum += s[mt][nt][e];
          }
        l[mt][rr] = l[mt][rr] * alpha + sum;  // per-lane partial; the quad is summed at the end
        m[mt][rr] = m_new;
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt) {
          o[mt][dt][2 * rr] *= alpha;
          o[mt][dt][2 * rr + 1] *= alpha;
        }
      }
    mma_cfrags_x_tile<MT, kDT, kBc, LD>(o, s, tV);  // O += P V
    __syncthreads();  // the next iteration's loads overwrite this buffer
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float sum = l[mt][rr];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int row = row0 + mt * 16 + rr * 8;
      if (row >= T) continue;
      const float inv = 1.f / sum;
      bf16_t* orow = out + (int64_t(b) * T + row) * q_stride + int64_t(h) * D;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(o[mt][dt][2 * rr] * inv, o[mt][dt][2 * rr + 1] * inv);
        *reinterpret_cast<__nv_bfloat162*>(orow + dt * 8 + (lane % 4) * 2) = pair;
      }
      if (lane % 4 == 0) lse[(int64_t(b) * H + h) * T + row] = m[mt][rr] * scale + logf(sum);
    }
}

template <int D>
void forward_launch(bf16_t* out, float* lse, const bf16_t* q, const bf16_t* k, const bf16_t* v, const AttnShape& s) {
  constexpr size_t smem = forward_smem<D>();
  auto kernel = attention_forward_kernel_mma<D>;
  ensure_dynamic_smem(kernel, smem);
  const dim3 grid(static_cast<unsigned>(ceil_div(s.T, fwd_rows<D>())), static_cast<unsigned>(s.B * s.H));
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  kernel<<<grid, kThreads, smem, current_stream()>>>(out, lse, q, k, v, static_cast<int>(s.T), static_cast<int>(s.H),
                                                     static_cast<int>(s.G), scale, scale * kLog2e);
  MT_CUDA_CHECK_LAUNCH("attention_forward_kernel_mma");
}

}  // namespace

void attention_forward_bf16(bf16_t* out, float* lse, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                            const AttnShape& s) {
  if (s.D == 64) forward_launch<64>(out, lse, q, k, v, s);
  else forward_launch<128>(out, lse, q, k, v, s);
}

}  // namespace attn

// ---------------------------------------------------------------- entry points

bool attention_head_dim_supported(int64_t D) { return D == 64 || D == 128; }

namespace {
// fp16 without cuDNN (and bf16 blocks of context-parallel attention our bf16 kernels do not run: non-causal or
// Tk != T): the fp32 kernels on fp32 copies (see the file comment).
template <typename E>
struct F32Copy {
  F32Copy(const E* x, int64_t n) : buf(sizeof(float) * static_cast<size_t>(n)) {
    if (x) cast_cuda(buf.as<float>(), x, n);
  }
  float* get() const { return buf.as<float>(); }
  Scratch buf;
};

template <typename E>
void attention_forward_via_f32(E* out, float* lse, const E* q, const E* k, const E* v, const AttnShape& s) {
  const int64_t qn = s.B * s.T * s.H * s.D, kn = s.B * s.keys() * s.G * s.D;
  const F32Copy<E> q32(q, qn), k32(k, kn), v32(v, kn), o32(nullptr, qn);
  attn::attention_forward_f32(o32.get(), lse, q32.get(), k32.get(), v32.get(), s);
  cast_cuda(out, static_cast<const float*>(o32.get()), qn);
}

template <typename E>
void attention_backward_via_f32(E* dq, E* dk, E* dv, const E* dout, const E* q, const E* k, const E* v, const E* out,
                                const float* lse, const AttnShape& s) {
  const int64_t qn = s.B * s.T * s.H * s.D, kn = s.B * s.keys() * s.G * s.D;
  const F32Copy<E> q32(q, qn), k32(k, kn), v32(v, kn), o32(out, qn), do32(dout, qn);
  const F32Copy<E> dq32(nullptr, qn), dk32(nullptr, kn), dv32(nullptr, kn);
  attn::attention_backward_f32(dq32.get(), dk32.get(), dv32.get(), do32.get(), q32.get(), k32.get(), v32.get(),
                               o32.get(), lse, s);
  cast_cuda(dq, static_cast<const float*>(dq32.get()), qn);
  cast_cuda(dk, static_cast<const float*>(dk32.get()), kn);
  cast_cuda(dv, static_cast<const float*>(dv32.get()), kn);
}

void check_attention(const char* op, const AttnShape& s, std::initializer_list<const void*> ptrs) {
  MT_CHECK(attention_head_dim_supported(s.D), op, " on cuda supports head dims 64 and 128, got D = ", s.D,
           " (hidden_size / num_attention_heads)");
  MT_CHECK(s.T < (int64_t(1) << 31) && s.keys() < (int64_t(1) << 31) && s.B * s.H < (int64_t(1) << 31), op,
           ": B*H = ", s.B * s.H, " or T = ", s.T, " or Tk = ", s.keys(), " too large");
  for (const void* p : ptrs)
    MT_CHECK(aligned(p, 16), op, " on cuda needs 16-byte aligned tensors (a view at an odd offset?)");
}
}  // namespace

template <typename T>
void attention_forward_cuda(T* out, float* lse, const T* q, const T* k, const T* v, const AttnShape& s) {
  if (s.B * s.T * s.H == 0) return;
  check_attention("attention_forward", s, {out, q, k, v});
  if constexpr (!std::is_same_v<T, float>)
    if (attn::cudnn_attention_forward(dev(out), lse, dev(q), dev(k), dev(v), s, attn::CudnnLayout::separate(s)))
      return;
  attn::check_own_kernels_allowed("attention_forward", s, std::is_same_v<T, float>);
  const bool square_causal = s.causal && s.keys() == s.T;  // what our bf16 kernels run
  if constexpr (std::is_same_v<T, float>) attn::attention_forward_f32(out, lse, q, k, v, s);
  else if constexpr (std::is_same_v<T, mt::bf16>) {
    if (square_causal) attn::attention_forward_bf16(dev(out), lse, dev(q), dev(k), dev(v), s);
    else attention_forward_via_f32(out, lse, q, k, v, s);
  } else
    attention_forward_via_f32(out, lse, q, k, v, s);
}

template <typename T>
void attention_backward_cuda(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                             const float* lse, const AttnShape& s) {
  if (s.B * s.T * s.H == 0) return;
  check_attention("attention_backward", s, {dq, dk, dv, dout, q, k, v, out});
  if constexpr (!std::is_same_v<T, float>)
    if (attn::cudnn_attention_backward(dev(dq), dev(dk), dev(dv), dev(dout), dev(q), dev(k), dev(v), dev(out), lse,
                                       s, attn::CudnnLayout::separate(s)))
      return;
  attn::check_own_kernels_allowed("attention_backward", s, std::is_same_v<T, float>);
  const bool square_causal = s.causal && s.keys() == s.T;
  if constexpr (std::is_same_v<T, float>)
    attn::attention_backward_f32(dq, dk, dv, dout, q, k, v, out, lse, s);
  else if constexpr (std::is_same_v<T, mt::bf16>) {
    if (square_causal)
      attn::attention_backward_bf16(dev(dq), dev(dk), dev(dv), dev(dout), dev(q), dev(k), dev(v), dev(out), lse, s);
    else
      attention_backward_via_f32(dq, dk, dv, dout, q, k, v, out, lse, s);
  } else
    attention_backward_via_f32(dq, dk, dv, dout, q, k, v, out, lse, s);
}

// ---------------------------------------------------------------- on the fused projection
template <typename T>
void attention_forward_qkv_cuda(T* out, float* lse, const T* qkv, const AttnShape& s) {
  if (s.B * s.T * s.H == 0) return;
  if constexpr (!std::is_same_v<T, float>) {
    // Multi-head attention: cuDNN reads q, k, v in place ([q_h, k_h, v_h] per head and token).
    if (s.G == s.H && aligned(qkv, 16) && aligned(out, 16) &&
        attn::cudnn_attention_forward(dev(out), lse, dev(qkv), dev(qkv) + s.D, dev(qkv) + 2 * s.D, s,
                                      attn::CudnnLayout::fused_mha(s)))
      return;
  }
  const size_t qn = static_cast<size_t>(s.B * s.T * s.H * s.D), kn = static_cast<size_t>(s.B * s.T * s.G * s.D);
  Scratch q(qn * sizeof(T)), k(kn * sizeof(T)), v(kn * sizeof(T));
  qkv_split_forward_cuda(q.as<T>(), k.as<T>(), v.as<T>(), qkv, s);
  attention_forward_cuda(out, lse, q.as<T>(), k.as<T>(), v.as<T>(), s);
}

template <typename T>
void attention_backward_qkv_cuda(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                                 const AttnShape& s) {
  if (s.B * s.T * s.H == 0) return;
  if constexpr (!std::is_same_v<T, float>) {
    // cuDNN writes dq, dk, dv in place too: every element of dqkv is one of them.
    if (s.G == s.H && aligned(qkv, 16) && aligned(dqkv, 16) && aligned(out, 16) &&
        aligned(dout, 16) &&
        attn::cudnn_attention_backward(dev(dqkv), dev(dqkv) + s.D, dev(dqkv) + 2 * s.D, dev(dout), dev(qkv),
                                       dev(qkv) + s.D, dev(qkv) + 2 * s.D, dev(out), lse, s,
                                       attn::CudnnLayout::fused_mha(s)))
      return;
  }
  const size_t qn = static_cast<size_t>(s.B * s.T * s.H * s.D), kn = static_cast<size_t>(s.B * s.T * s.G * s.D);
  Scratch q(qn * sizeof(T)), k(kn * sizeof(T)), v(kn * sizeof(T));
  Scratch dq(qn * sizeof(T)), dk(kn * sizeof(T)), dv(kn * sizeof(T));
  qkv_split_forward_cuda(q.as<T>(), k.as<T>(), v.as<T>(), qkv, s);
  attention_backward_cuda(dq.as<T>(), dk.as<T>(), dv.as<T>(), dout, q.as<T>(), k.as<T>(), v.as<T>(), out, lse, s);
  qkv_split_backward_cuda(dqkv, dq.as<T>(), dk.as<T>(), dv.as<T>(), s);
}

#define MT_INSTANTIATE(T)                                                                                    \
  template void attention_forward_qkv_cuda<T>(T*, float*, const T*, const AttnShape&);                       \
  template void attention_backward_qkv_cuda<T>(T*, const T*, const T*, const T*, const float*, const AttnShape&); \
  template void attention_forward_cuda<T>(T*, float*, const T*, const T*, const T*, const AttnShape&);       \
  template void attention_backward_cuda<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*,     \
                                           const float*, const AttnShape&);
MT_INSTANTIATE(float)
MT_INSTANTIATE(mt::bf16)
MT_INSTANTIATE(mt::f16)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cuda
