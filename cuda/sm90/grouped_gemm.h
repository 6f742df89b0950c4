// Grouped expert GEMMs of our own for Hopper (compute capability 9.0): one persistent, warp-specialized kernel per
// product over every local expert (TMA loads into a shared-memory ring of 4 stages, 5 for the SwiGLU backward, wgmma
// m64n256k16 on two consumer warpgroups, a 128 x 256 tile per CTA taken from a device counter, bf16 tiles stored
// through TMA while the next tile's main loop runs). Launches on one stream run one at a time (they share that stream's
// tile counter).
// The three products of tensor/moe_ops.h's grouped linear, row-major, bf16 operands, fp32 accumulation; expert e
// owns rows [row0_e, row0_e + counts[e]) of x / dout (row0 the prefix sum of counts):
//   forward   out_e (counts[e], OC)  = x_e (counts[e], IC) W_e^T          W (El, OC, IC)
//   dx        dx_e  (counts[e], IC)  = dout_e (counts[e], OC) W_e
//   dweight   dW_e  (OC, IC) fp32    = dout_e^T x_e                        experts with no rows untouched
// Each returns false, running nothing, when this path does not take the call (no Hopper GPU, a shape or an
// alignment it lacks: the caller falls back to cuBLAS); the conditions are the *_takes functions. Built for sm_90a
// only (wgmma, setmaxnreg): cuda/sm90/ is its own CMake target.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace mt::ops::cuda::sm90 {

inline constexpr int kMaxExperts = 256;

// This build's kernels run on the current device (compute capability exactly 9.0).
bool grouped_gemm_supported();
// Kernel launches so far in this process (tests check that a product took this path).
int64_t grouped_gemm_launches();

// IC % 64 == 0, OC % 256 == 0, El <= kMaxExperts, a supported device
bool grouped_forward_takes(int64_t El, int64_t IC, int64_t OC);
// OC % 64 == 0, IC % 256 == 0
bool grouped_dx_takes(int64_t El, int64_t IC, int64_t OC);
// every count % 64 == 0, OC % 128 == 0, IC % 256 == 0, and the first write (not accumulating)
bool grouped_dweight_takes(const int64_t* counts, int64_t El, int64_t IC, int64_t OC, bool accumulate);

bool grouped_forward(mt::bf16* out, const mt::bf16* x, const mt::bf16* weight, const int64_t* counts, int64_t El,
                     int64_t IC, int64_t OC);
bool grouped_dx(mt::bf16* dx, const mt::bf16* dout, const mt::bf16* weight, const int64_t* counts, int64_t El,
                int64_t IC, int64_t OC);
// fc1's forward of SwiGLU experts with the SwiGLU forward in its epilogue: h (rows, 2F) = [g | u] = x_e W_e^T for
// W (El, 2F, IC) = [gate rows; up rows] per expert, and act (rows, F) = swiglu(g, u) from h's bf16 values (the
// separate pass's bits). A tile is 128 rows x (128 gate + the same 128 up columns). IC % 64 == 0, F % 128 == 0
bool grouped_forward_swiglu_takes(int64_t El, int64_t IC, int64_t F);
bool grouped_forward_swiglu(mt::bf16* h, mt::bf16* act, const mt::bf16* x, const mt::bf16* weight,
                            const int64_t* counts, int64_t El, int64_t IC, int64_t F);
// The fc2 dx of SwiGLU experts with the SwiGLU backward in its epilogue, in place: h (rows, 2F) = [g | u] per row
// becomes dh = [dgate | dup] for da = dout_e W_e (never stored; rounded to bf16 as a stored da would be), and
// act (rows, F) = swiglu(g, u), the same bits as cuda/activation.cu's pass (cuda/swiglu_math.cuh). 128 x 128 tiles
// (g and u of a tile in shared memory beside a 5-stage ring); the consumers run the math from their registers and
// store a from them. act null: a is not stored (the caller kept the forward's).
// OC % 64 == 0, F % 128 == 0
bool grouped_dx_swiglu_takes(int64_t El, int64_t F, int64_t OC);
bool grouped_dx_swiglu(mt::bf16* h, mt::bf16* act, const mt::bf16* dout, const mt::bf16* weight,
                       const int64_t* counts, int64_t El, int64_t F, int64_t OC);
// squares (optional): grouped_dweight_square_partials(...) fp64 values, one per (tile, consumer warp) in tile order,
// whose sum in index order is the sum of squares of the dW it wrote (experts with rows; the others' dW is the
// caller's to zero). The gradient norm takes them instead of reading dW again.
int64_t grouped_dweight_square_partials(const int64_t* counts, int64_t El, int64_t IC, int64_t OC);
// dweight: fp32 (stored from registers), or bf16 (dweight_bf16: each fp32 result rounded to nearest even, stored
// through the deferred epilogue as the other bf16 products; the squares are of the rounded values).
bool grouped_dweight(void* dweight, bool dweight_bf16, const mt::bf16* dout, const mt::bf16* x,
                     const int64_t* counts, int64_t El, int64_t IC, int64_t OC, bool accumulate,
                     double* squares = nullptr);

}  // namespace mt::ops::cuda::sm90
