// The op set of the model: each op has a CPU reference (src/tensor/cpu/<op>.cpp, fp32 and fp64,
// plain loops or CBLAS) and, with the CUDA backend, a CUDA version with the same signature.
// These functions check shapes/dtypes and dispatch on device and dtype; an unsupported pair is an
// error that names the op (never a silent fallback).
//
// Legend: N rows (= B*T tokens), C channels (hidden), OC/IC out/in features, B batch, T sequence,
// H query heads, G key/value heads (query groups), D head dim, V vocab (Vl: this rank's vocab slice).
// Gradient convention (every backward): parameter gradients accumulate (+=), except a linear's weight gradient
// given GradMode::Overwrite (the first write of a step: ParamStore::zero_grads); activation gradients overwrite
// (=) unless the op takes a GradMode and is given Accumulate (the residual stream). Parameter gradients have the op's
// dtype on the CPU; on CUDA they are fp32 main grads, or bf16 ones for 16-bit activations (the fp32 sum rounded).
// Statistics saved for backward (mean, rstd, lse, CE partials) are fp32, or fp64 for fp64 inputs.
#pragma once

#include <cstdint>
#include <vector>

#include "core/rope_params.h"
#include "core/op_policy.h"
#include "tensor/tensor.h"

namespace mt::ops {

enum class GradMode { Overwrite, Accumulate };

// ---------------------------------------------------------------- elementwise
void fill_(Tensor& x, double value);
void add_(Tensor& a, const Tensor& b);                    // a += b
void add(Tensor& out, const Tensor& a, const Tensor& b);  // out = a + b (out may alias a or b)
void scale_(Tensor& x, double s);                          // x *= s
void cast(Tensor& out, const Tensor& in);                  // dtype conversion, same numel
double sum_squares(const Tensor& x);                       // sum of x^2, accumulated in fp64 (a host value)
void sum_squares_into(Tensor& out, const Tensor& x);       // out (one F64 on x's device) = sum_squares(x), no wait
void gather_scalars(Tensor& out, const std::vector<Tensor>& in);  // out[i] = in[i] (one element each; F32 | F64)
// out[i] (F64) = the sum of in[i]'s F64 elements (any count, 0 too), all on out's device, in a fixed order (the same
// bits every run); one launch on a GPU for up to 64 inputs.
void sum_each(Tensor& out, const std::vector<Tensor>& in);

// ---------------------------------------------------------------- linear (GEMM)
// out(N, OC) = inp(N, IC) @ weight(OC, IC)^T + bias(OC) [+ residual(N, OC)]   (bias, residual may be null)
// CUDA adds the residual in the GEMM (read as its C operand: one rounding, no separate add pass).
void linear_forward(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor* bias,
                    const Tensor* residual = nullptr);
// out(N, OC) = inp @ weight^T in out's wider dtype (fp32; fp64 for fp64 operands): bf16 / fp16 operands are
// multiplied exactly and summed in fp32 by the GEMM itself (CUDA), fp32 / fp64 ones as linear_forward. The MoE
// router's logits: the same math as an fp32 GEMM of upcast copies, without the copies.
void linear_forward_wide(Tensor& out, const Tensor& inp, const Tensor& weight);
// dinp(N, IC) (=, or += with Accumulate) = dout(N, OC) @ weight(OC, IC)
// dweight(OC, IC) += (= with Overwrite) dout^T @ inp;  dbias(OC) += sum_n dout.   Null outputs are skipped; with
// only dbias, inp and weight may be undefined.
void linear_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                     const Tensor& weight, GradMode dinp_mode = GradMode::Overwrite,
                     GradMode dweight_mode = GradMode::Accumulate);
// The backward of linear_forward_wide: dout (N, OC) in the wider dtype (fp32 for 16-bit inp and weight);
// dinp (N, IC) (=, or += with Accumulate) in inp's dtype = dout @ weight, rounded once; dweight (OC, IC) fp32 +=
// (= with Overwrite) dout^T @ inp. The same math as fp32 GEMMs of upcast copies (fp32 sums of exact products; CUDA
// bf16: without the copies, on an exact three-way bf16 split of dout), fp32 / fp64 operands as linear_backward.
// The MoE router.
void linear_backward_wide(Tensor* dinp, Tensor* dweight, const Tensor& dout, const Tensor& inp, const Tensor& weight,
                          GradMode dweight_mode = GradMode::Accumulate, GradMode dinp_mode = GradMode::Overwrite);

// Linear + GELU (the MLP of GPT-2): pre(N, OC) = inp @ weight^T + bias, out(N, OC) = gelu(pre): the same as
// linear_forward then gelu_forward, with the GELU in the GEMM's epilogue where the backend has one.
void linear_gelu_forward(Tensor& out, Tensor& pre, const Tensor& inp, const Tensor& weight, const Tensor* bias);
// Backward of the linear that follows the GELU, through the GELU: dpre(N, IC) (=) = gelu'(pre) * (dout @ weight)
// (linear_backward's dinp then gelu_backward, fused where possible); dweight, dbias as linear_backward (+=, and
// dweight = with Overwrite).
void linear_backward_gelu(Tensor& dpre, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                          const Tensor& weight, const Tensor& pre, GradMode dweight_mode = GradMode::Accumulate);
// Backward of the linear that follows a SwiGLU (llama's fc2), through the SwiGLU, without the linear's input:
// inp = swiglu(h) (N, F) is recomputed here (in the SwiGLU backward's pass over h), so the forward need not keep
// it. dh (N, 2F) (=) = swiglu'(h) . (dout @ weight); dweight (OC, F) += (= with Overwrite) dout^T @ swiglu(h);
// dbias (OC) += column sums of dout. dh may alias h (h is then overwritten by its gradient).
void linear_backward_swiglu(Tensor& dh, Tensor* dweight, Tensor* dbias, const Tensor& dout, const Tensor& weight,
                            const Tensor& h, GradMode dweight_mode = GradMode::Accumulate);

// ---------------------------------------------------------------- embedding (vocab-parallel ready)
// tokens int32 (N); table (Vl, C) holds global rows [vocab_start, vocab_start + Vl).
// out(N, C) = table[tok - vocab_start] if the token is in this slice, else 0.
void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& table, int64_t vocab_start);
// dtable += scatter of dout rows for tokens in this slice.
void embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& tokens, int64_t vocab_start);

// ---------------------------------------------------------------- norms (over the last dim C)
// out = (x - mean) * rstd * weight + bias;  mean, rstd: (N)
void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                       const Tensor& bias, double eps);
void layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout, const Tensor& inp,
                        const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                        GradMode dinp_mode = GradMode::Overwrite);
// out = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps);  rstd: (N)
void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& weight, double eps);
void rmsnorm_backward(Tensor& dinp, Tensor& dweight, const Tensor& dout, const Tensor& inp, const Tensor& weight,
                      const Tensor& rstd, GradMode dinp_mode = GradMode::Overwrite);

// ---------------------------------------------------------------- activations
// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
void gelu_forward(Tensor& out, const Tensor& inp);
void gelu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp);
// SwiGLU: inp (N, 2F) holds [gate | up] in each row; out (N, F) = silu(gate) * up.
// out_amax / dinp_amax (F32 (1), if given) = max |x| over the output as stored (FP8 tensorwise scaling: the amax
// fp8_amax would take, fused into the pass on CUDA).
void swiglu_forward(Tensor& out, const Tensor& inp, Tensor* out_amax = nullptr);
void swiglu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp, Tensor* dinp_amax = nullptr);

// ---------------------------------------------------------------- attention
// Rotary position embedding, in place on x (B, T, heads, D), rotate-half convention (HF, Megatron
// default): for i < D/2 the pair (x[i], x[i + D/2]) is rotated by angle p * inv_freq_i,
// inv_freq_i = theta^(-2i/D) (Llama-3-rescaled when rope.scaling: tensor/rope_params.h),
// p = positions(t) (position_offset + t with one offset; two chunks' offsets under context parallelism:
// core/rope_params.h RopePositions). Backward applies the inverse rotation to the gradient, in place.
void rope_forward(Tensor& x, const RopeParams& rope, RopePositions positions);
void rope_backward(Tensor& dx, const RopeParams& rope, RopePositions positions);

// qkv (B, T, G*(R+2)*D): for each query group g, R query heads, then one key head, then one value
// head (Megatron's grouped layout; R = H / G). Splits into q (B,T,H,D), k (B,T,G,D), v (B,T,G,D).
void qkv_split_forward(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv);
void qkv_split_backward(Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv);
// The same with rotary embeddings on q and k (llama), in one pass over the projection:
// qkv_split_rope_forward = qkv_split_forward, then rope_forward on q and on k;
// qkv_split_rope_backward = rope_backward on (copies of) dq and dk, then qkv_split_backward (dq, dk unchanged).
void qkv_split_rope_forward(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv, const RopeParams& rope,
                            RopePositions positions);
void qkv_split_rope_backward(Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv, const RopeParams& rope,
                             RopePositions positions);


// Causal attention with grouped queries: query head h reads key/value head h / (H / G).
// out (B, T, H, D); lse (B, H, T): log-sum-exp of the scaled, masked scores (scale = 1/sqrt(D)),
// saved for backward. The T x T probability matrix is never kept.
// causal = false: every query sees every key, and k, v (B, Tk, G, D) may be longer or shorter than q (a block of
// context-parallel attention: parallel/context_parallel.h); causal needs Tk == T.
// Backward reads the probabilities as exp(scores - lse) and D_i = dout_i . out_i, so out and lse may be those of a
// larger attention over more key blocks (the merged result): then dq is this block's share of the query gradient
// and dk, dv the gradient of this block's keys and values (all overwritten).
void attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, bool causal = true);
void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, bool causal = true);
// Merging attention over key blocks by log-sum-exp: rows [t0, t0 + Tb) of out (B, T, H, D) and lse (B, H, T) absorb
// a result over other keys, part_out (B, Tb, H, D) with part_lse (B, H, Tb):
//   l = log(exp(lse) + exp(part_lse));  out = out exp(lse - l) + part_out exp(part_lse - l);  lse = l.
void attention_merge(Tensor& out, Tensor& lse, const Tensor& part_out, const Tensor& part_lse, int64_t t0);
// A range of the sequence dimension of (B, T, ...) tensors with the same trailing dims (any dims after the second):
// dst[:, dst_t + i] = src[:, src_t + i] (+= with Accumulate) for i < len. dst and src must not overlap.
void seq_copy(Tensor& dst, int64_t dst_t, const Tensor& src, int64_t src_t, int64_t len,
              GradMode mode = GradMode::Overwrite);

// The same on the fused projection qkv (B, T, G*(R+2)*D) (qkv_split_forward's layout), out (B, T, H, D):
// forward = qkv_split_forward + attention_forward; backward = attention_backward + qkv_split_backward
// (dqkv (B, T, G*(R+2)*D) overwritten). Backends that can read the heads in place skip the split copies.
void attention_forward_qkv(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t G);
void attention_backward_qkv(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                            const Tensor& lse, int64_t G);

// ---------------------------------------------------------------- cross-entropy (vocab-parallel ready)
// logits (N, Vl): columns are global vocab ids [vocab_start, vocab_start + Vl); only the first
// n_valid columns are real (the rest is vocab padding and never enters the softmax).
// targets int32 (N). Per row, partial statistics over this slice, for combining across TP ranks:
//   max(N): max over the valid columns; sumexp(N): sum of exp(logit - max) over them;
//   target_logit(N): the target's logit if the target is in this slice, else 0.
void cross_entropy_stats(Tensor& max, Tensor& sumexp, Tensor& target_logit, const Tensor& logits,
                         const Tensor& targets, int64_t vocab_start, int64_t n_valid);
// Combining the slices' statistics over the tensor-parallel ranks (the reductions between the two steps are the
// caller's: parallel/mappings.h combine_vocab_parallel_ce). gmax (N): the max over the slices (this rank's max when
// there is one slice). Statistics in the stat dtype (fp32, fp64 for fp64 logits); loss (N) fp64.
//   cross_entropy_rescale: sumexp[n] *= exp(max[n] - gmax[n]) (0 where max[n] is -inf: no valid column in the slice)
//   cross_entropy_finish:  lse[n] = gmax[n] + log(sumexp[n]);  loss[n] = lse[n] - target_logit[n]
void cross_entropy_rescale(Tensor& sumexp, const Tensor& max, const Tensor& gmax);
void cross_entropy_finish(Tensor& lse, Tensor& loss, const Tensor& gmax, const Tensor& sumexp, const Tensor& target_logit);
// acc (1) += sum_n x[n], both fp64 on one device, in a fixed order (the same bits every run).
void sum_accumulate(Tensor& acc, const Tensor& x);
// dlogits(N, Vl) = (exp(logit - lse[n]) - [v == target]) * dloss[n]; padding columns get 0.
// lse (N) is the global log-sum-exp; dloss (N) fp32/fp64. dlogits may alias logits.
void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& dloss, int64_t vocab_start, int64_t n_valid);

// ---------------------------------------------------------------- dropout (counter-based, no saved mask)
// keep[i] = uniform(seed, offset + i) >= p;  out = keep ? inp / (1 - p) : 0. The same (seed, offset)
// regenerates the mask in backward; callers derive offset from global coordinates so that every
// parallel layout drops the same elements.
void dropout_forward(Tensor& out, const Tensor& inp, double p, uint64_t seed, uint64_t offset);
void dropout_backward(Tensor& dinp, const Tensor& dout, double p, uint64_t seed, uint64_t offset);

// ---------------------------------------------------------------- random fill (counter-based)
// out[i] = normal01(seed, stream, offset + i) rounded to out's dtype, i the flat index of any shape
// (core/counter_rng.h: Box-Muller in fp64, the same lines on the CPU and the GPU; cuda/fill_normal.cu says how close
// the two are). Like dropout, callers number the elements globally so that every parallel layout draws the same
// values (model.moe_router_force_load_balancing's router logits: offset = the first row's global index x experts).
void fill_normal(Tensor& out, uint64_t seed, uint64_t stream, uint64_t offset);

// ---------------------------------------------------------------- optimizer
struct AdamWArgs {
  double lr = 0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0;  // decoupled: p -= lr * wd * p
  int64_t step = 1;         // 1-based, for bias correction
  double grad_scale = 1.0;  // the gradient is multiplied by this first (clipping, 1/loss_scale)
};
// g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr * ((m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps) + wd * p). param, m, v, grad same dtype.
// param_copy (optional: bf16 / fp16, param's numel and device) = the updated param as ops::cast gives it (on the GPU
// written by the update's own pass, fp32 param only).
// decay (optional): the weight decay by element range, for one update over parameters with and without it: run r
// = elements [starts[r], starts[r + 1]) (the last to the end; starts[0] = 0, ascending) gets args.weight_decay iff
// decay[r], else 0. The same bits as one update per run (one launch on the GPU for up to 192 runs).
struct DecayRuns {
  std::vector<int64_t> starts;
  std::vector<uint8_t> decay;
};
void adamw_step(Tensor& param, Tensor& m, Tensor& v, const Tensor& grad, const AdamWArgs& args,
                Tensor* param_copy = nullptr, const DecayRuns* decay = nullptr);
// Checks decay (optional) for an update of n elements as above (op names the caller in the error); its run count.
int64_t check_decay_runs(const char* op, const DecayRuns* decay, int64_t n);

}  // namespace mt::ops
