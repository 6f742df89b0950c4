// CUDA implementations of the ops of tensor/ops.h, on raw contiguous device pointers: the same
// signatures as the CPU references of tensor/cpu/cpu_ops.h, with element type T = float (parity mode)
// or mt::bf16 / mt::f16 (training). Declarations only (plain header: ops.cpp includes it); one
// cuda/<family>.cu per family holds the kernels and these launchers. Every launcher runs on the backend's current
// stream (cuda_context.h), checks its own launch, and returns without synchronizing.
//
// Mixed precision (Megatron style): statistics (mean, rstd, lse, cross-entropy partials) are fp32;
// parameter gradients (dweight, dbias, dtable) are "main grads" of type G, accumulated (+=) whatever T
// is: G = float, or mt::bf16 for 16-bit T (grad_reduce_in_fp32 false): each write is the fp32 result
// (bf16 g + the fp32 sum for +=) rounded once to nearest even, except a bf16 dweight from cuBLASLt (bf16 T),
// whose product is rounded to bf16 before the += (gemm.cu). Activation gradients have type T (= unless
// a GradMode asks for +=).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/rope_params.h"

namespace mt::ops::cuda {

// X(T, G) for every pair of activation type T and parameter-gradient type G the backward launchers are
// instantiated for (bf16 gradients with 16-bit activations only).
#define MT_CUDA_GRAD_TYPES(X) \
  X(float, float)             \
  X(mt::bf16, float)          \
  X(mt::f16, float)           \
  X(mt::bf16, mt::bf16)       \
  X(mt::f16, mt::bf16)

// ---------------------------------------------------------------- elementwise.cu
template <typename T> void fill_cuda(T* x, int64_t n, double value);
template <typename T> void add_inplace_cuda(T* a, const T* b, int64_t n);        // a += b
template <typename T> void add_cuda(T* out, const T* a, const T* b, int64_t n);  // may alias
template <typename T> void scale_cuda(T* x, int64_t n, double s);
// To/From in {float, bf16} or {float, f16} (To != From); same-type copies go through copy_cuda.
template <typename To, typename From> void cast_cuda(To* out, const From* in, int64_t n);
void copy_cuda(void* out, const void* in, size_t bytes);
// *out (device) = sum of x^2 in fp64, deterministic (fixed grid and reduction order).
template <typename T> void sum_squares_into_cuda(double* out, const T* x, int64_t n);
// out[i] = *in[i] for i < n (in: device pointers to one element each; T float or double).
template <typename T> void gather_scalars_cuda(T* out, const T* const* in, int64_t n);
void sum_each_cuda(double* out, const double* const* in, const int64_t* n, int64_t count);  // ops::sum_each

// ---------------------------------------------------------------- gemm.cu (cuBLASLt)
// out(N, OC) = inp(N, IC) @ weight(OC, IC)^T + bias(OC) [+ residual(N, OC), the GEMM's C operand]
// (bias, residual may be null)
template <typename T>
void linear_forward_cuda(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t IC, int64_t OC,
                         const T* residual = nullptr);
// out(N, OC) fp32 = inp(N, IC) @ weight(OC, IC)^T from 16-bit operands: exact products, fp32 accumulation (the
// MoE router's logits without an fp32 copy of the activations)
template <typename T>
void linear_forward_f32out_cuda(float* out, const T* inp, const T* weight, int64_t N, int64_t IC, int64_t OC);
// dinp (N, IC) bf16 (=) = dout @ weight and dweight (OC, IC) G (+=, = unless accumulate_dweight) = dout^T @ inp
// for an fp32 dout (N, OC): dout split exactly into three bf16 parts (hi + mid + lo), the GEMMs run on the parts
// (K = 3 OC for dinp; three stacked gradients summed in fp32 for dweight): fp32 sums of exact products, as an fp32
// GEMM of upcast copies. The MoE router's backward. Null outputs are skipped. G: float or mt::bf16.
template <typename G>
void linear_backward_wide_cuda(mt::bf16* dinp, G* dweight, const float* dout, const mt::bf16* inp,
                               const mt::bf16* weight, int64_t N, int64_t IC, int64_t OC, bool accumulate_dweight,
                               bool accumulate_dinp = false);
// dinp (=, or += when accumulate_dinp) = dout @ weight; dweight (G) += (= unless accumulate_dweight)
// dout^T @ inp; dbias (G) += column sums of dout. Null outputs are skipped. G: float; or mt::bf16 for 16-bit T.
template <typename T, typename G>
void linear_backward_cuda(T* dinp, G* dweight, G* dbias, const T* dout, const T* inp, const T* weight, int64_t N,
                          int64_t IC, int64_t OC, bool accumulate_dinp, bool accumulate_dweight = true);

// pre = inp @ W^T + b, out = gelu(pre) (bf16/fp16: GELU in the GEMM's epilogue where cuBLASLt has one,
// else linear_forward + gelu_forward). dpre (=) = gelu'(pre) * (dout @ W) (bf16/fp16: GELU gradient in the dinp
// GEMM's epilogue), dweight/dbias as linear_backward_cuda.
template <typename T>
void linear_gelu_forward_cuda(T* out, T* pre, const T* inp, const T* weight, const T* bias, int64_t N, int64_t IC,
                              int64_t OC);
template <typename T, typename G>
void linear_backward_gelu_cuda(T* dpre, G* dweight, G* dbias, const T* dout, const T* inp, const T* weight,
                               const T* pre, int64_t N, int64_t IC, int64_t OC, bool accumulate_dweight);

// ---------------------------------------------------------------- embedding.cu
template <typename T>
void embedding_forward_cuda(T* out, const int32_t* tokens, const T* table, int64_t N, int64_t Vl, int64_t C,
                            int64_t vocab_start);
// dtable (G) += scatter of dout rows; deterministic (tokens sorted stably, one owner per row).
template <typename T, typename G>
void embedding_backward_cuda(G* dtable, const T* dout, const int32_t* tokens, int64_t N, int64_t Vl, int64_t C,
                             int64_t vocab_start);

// ---------------------------------------------------------------- norm.cu
template <typename T>
void layernorm_forward_cuda(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int64_t N,
                            int64_t C, double eps);
// dweight, dbias (G) += (rmsnorm: dweight); dinp =, or += when accumulate_dinp
template <typename T, typename G>
void layernorm_backward_cuda(T* dinp, G* dweight, G* dbias, const T* dout, const T* inp, const T* weight,
                             const float* mean, const float* rstd, int64_t N, int64_t C, bool accumulate_dinp);
template <typename T>
void rmsnorm_forward_cuda(T* out, float* rstd, const T* inp, const T* weight, int64_t N, int64_t C, double eps);
template <typename T, typename G>
void rmsnorm_backward_cuda(T* dinp, G* dweight, const T* dout, const T* inp, const T* weight, const float* rstd,
                           int64_t N, int64_t C, bool accumulate_dinp);

// ---------------------------------------------------------------- activation.cu
template <typename T> void gelu_forward_cuda(T* out, const T* inp, int64_t n);
template <typename T> void gelu_backward_cuda(T* dinp, const T* dout, const T* inp, int64_t n);
// amax (if set): = max |x| over the output written (out, dinp), fused into the pass (FP8 tensorwise scaling).
template <typename T> void swiglu_forward_cuda(T* out, const T* inp, int64_t N, int64_t F, float* out_amax = nullptr);
template <typename T>
void swiglu_backward_cuda(T* dinp, const T* dout, const T* inp, int64_t N, int64_t F, float* dinp_amax = nullptr);
// swiglu_backward_cuda that also writes out (N, F) = swiglu(inp) in the same pass (the forward's expression, same
// bits), so the forward need not keep it. dinp may alias inp.
template <typename T>
void swiglu_backward_recompute_cuda(T* dinp, T* out, const T* dout, const T* inp, int64_t N, int64_t F);
// dh (=) = swiglu'(h) . (dout @ weight), dweight (G) += (= unless accumulate_dweight) dout^T @ swiglu(h), dbias
// (G) += column sums of dout;
// swiglu(h) is recomputed in the SwiGLU backward's pass (one extra write), never kept. dh may alias h.
// h, dh (N, 2F); dout (N, OC); weight (OC, F).
template <typename T, typename G>
void linear_backward_swiglu_cuda(T* dh, G* dweight, G* dbias, const T* dout, const T* weight, const T* h, int64_t N,
                                 int64_t F, int64_t OC, bool accumulate_dweight);

// ---------------------------------------------------------------- rope.cu
template <typename T>
void rope_forward_cuda(T* x, int64_t B, int64_t T_, int64_t heads, int64_t D, const RopeParams& rope,
                       RopePositions positions);
template <typename T>
void rope_backward_cuda(T* dx, int64_t B, int64_t T_, int64_t heads, int64_t D, const RopeParams& rope,
                        RopePositions positions);

// ---------------------------------------------------------------- qkv_split.cu, attention*.cu
// Query length T; key/value length Tk; causal: query i sees keys j <= i (Tk == T), else all Tk keys.
struct AttnShape {
  int64_t B, T, H, G, D;
  int64_t Tk = -1;  // -1: T
  bool causal = true;
  int64_t keys() const { return Tk < 0 ? T : Tk; }
};
template <typename T> void qkv_split_forward_cuda(T* q, T* k, T* v, const T* qkv, const AttnShape& s);
template <typename T>
void qkv_split_backward_cuda(T* dqkv, const T* dq, const T* dk, const T* dv, const AttnShape& s);
// The same with rope_forward on q and k (backward: rope_backward on dq and dk) in the same pass (qkv_split.cu).
template <typename T>
void qkv_split_rope_forward_cuda(T* q, T* k, T* v, const T* qkv, const AttnShape& s, const RopeParams& rope,
                                 RopePositions positions);
template <typename T>
void qkv_split_rope_backward_cuda(T* dqkv, const T* dq, const T* dk, const T* dv, const AttnShape& s,
                                  const RopeParams& rope,
                                  RopePositions positions);
// Head dims this backend's attention supports (others: an error naming them).
bool attention_head_dim_supported(int64_t D);
template <typename T>
void attention_forward_cuda(T* out, float* lse, const T* q, const T* k, const T* v, const AttnShape& s);
template <typename T>
void attention_backward_cuda(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                             const float* lse, const AttnShape& s);

// The same on the fused projection qkv (B, T, G*(R+2)*D) (qkv_split.cu's layout): forward = split +
// attention, backward = attention backward + split backward (dqkv overwritten); multi-head bf16 reads
// and writes the heads in place through cuDNN, anything else splits into temporaries first.
template <typename T>
void attention_forward_qkv_cuda(T* out, float* lse, const T* qkv, const AttnShape& s);
template <typename T>
void attention_backward_qkv_cuda(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                                 const AttnShape& s);

// ---------------------------------------------------------------- context_attention.cu (ops.h attention_merge, seq_copy)
template <typename T>
void attention_merge_cuda(T* out, float* lse, const T* part_out, const float* part_lse, int64_t B, int64_t T_,
                          int64_t Tb, int64_t H, int64_t D, int64_t t0);
template <typename T>
void seq_copy_cuda(T* dst, int64_t Td, int64_t dst_t, const T* src, int64_t Ts, int64_t src_t, int64_t B, int64_t len,
                   int64_t row, bool accumulate);

// ---------------------------------------------------------------- cross_entropy.cu
template <typename T>
void cross_entropy_stats_cuda(float* max, float* sumexp, float* target_logit, const T* logits, const int32_t* targets,
                              int64_t N, int64_t Vl, int64_t vocab_start, int64_t n_valid);
void cross_entropy_rescale_cuda(float* sumexp, const float* max, const float* gmax, int64_t N);
void cross_entropy_finish_cuda(float* lse, double* loss, const float* gmax, const float* sumexp,
                               const float* target_logit, int64_t N);
void sum_accumulate_cuda(double* acc, const double* x, int64_t n);  // acc[0] += sum(x), fixed order
template <typename T>
void cross_entropy_backward_cuda(T* dlogits, const T* logits, const int32_t* targets, const float* lse,
                                 const float* dloss, int64_t N, int64_t Vl, int64_t vocab_start, int64_t n_valid);

// ---------------------------------------------------------------- dropout.cu
template <typename T>
void dropout_forward_cuda(T* out, const T* inp, int64_t n, double p, uint64_t seed, uint64_t offset);
template <typename T>
void dropout_backward_cuda(T* dinp, const T* dout, int64_t n, double p, uint64_t seed, uint64_t offset);

// ---------------------------------------------------------------- fill_normal.cu
template <typename T>
void fill_normal_cuda(T* out, int64_t n, uint64_t seed, uint64_t stream, uint64_t offset);

// ---------------------------------------------------------------- attention_cudnn.cu (benchmarks only)
// Every engine configuration cuDNN offers for bf16 attention of shape s (separate q, k, v): heuristics modes A and B,
// and every value of each knob of their engines; each that finalizes runs `iters` times on the operands given, and
// one line per configuration goes to stdout ("CUDNN-SWEEP": finalize time, workspace, median ms, max |difference|
// of out (forward) or dq, dk (backward) from the first). Stops starting new ones after budget_s seconds.
void cudnn_attention_sweep(const AttnShape& s, bool backward, bool deterministic, const mt::bf16* q,
                           const mt::bf16* k, const mt::bf16* v, mt::bf16* out, float* lse, const mt::bf16* dout,
                           mt::bf16* dq, mt::bf16* dk, mt::bf16* dv, int iters, double budget_s);

// ---------------------------------------------------------------- op_profile.cpp (MT_OP_PROFILE)
// True when MT_OP_PROFILE is set (1: report to stderr at exit; else the file to append the report to).
bool op_profile_enabled();
// Times one op: events on the current stream around the object's lifetime, keyed by the op name and
// up to three sizes (-1: unused). Does nothing unless profiling is on.
class OpTimer {
 public:
  explicit OpTimer(const char* op, int64_t a, int64_t b = -1, int64_t c = -1);
  ~OpTimer();
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  int64_t index_ = -1;
};

// ---------------------------------------------------------------- adamw.cu (fp32 master weights)
// copy (null, or n bf16 elements, fp16 with copy_f16): = the updated param rounded to nearest even, as cast_cuda,
// written in the same pass (the compute copy of the master weights, without re-reading them).
// runs > 0: element i decays (weight_decay, else 0) iff run_decay[r] for the run r holding it, run r = [run_starts[r],
// run_starts[r + 1]) (the last to n), run_starts[0] = 0, ascending (host arrays).
// grad: n fp32 values, or bf16 with grad_bf16 (main grads in bf16: parallel.grad_reduce_in_fp32 false).
void adamw_step_cuda(float* param, float* m, float* v, const void* grad, bool grad_bf16, int64_t n, double lr,
                     double beta1, double beta2, double eps, double weight_decay, int64_t step, double grad_scale,
                     void* copy = nullptr, bool copy_f16 = false, const int64_t* run_starts = nullptr,
                     const uint8_t* run_decay = nullptr, int64_t runs = 0);
// The same update of master weights held as halves (core/master_halves.h): hi = the bf16 values' bits, lo = the low
// halves, both updated in place (no fp32 copy, no separate compute copy).
void adamw_step_halves_cuda(uint16_t* hi, uint16_t* lo, float* m, float* v, const void* grad, bool grad_bf16,
                            int64_t n, double lr, double beta1, double beta2, double eps, double weight_decay,
                            int64_t step, double grad_scale, const int64_t* run_starts, const uint8_t* run_decay,
                            int64_t runs);
// master (fp32) -> halves: hi = the bf16 values' bits, lo (optional) the low halves; and back (core/master_halves.h).
void split_master_cuda(uint16_t* hi, uint16_t* lo, const float* master, int64_t n);
void join_master_cuda(float* master, const uint16_t* hi, const uint16_t* lo, int64_t n);

}  // namespace mt::ops::cuda
