// CPU reference implementations of the ops of tensor/ops.h, on raw contiguous pointers.
// Shapes and semantics are those of ops.h (legend there); ops.cpp checks shapes and dtypes and
// calls these. Every template is instantiated for float and double (in its own .cpp); statistics
// (mean, rstd, lse, CE partials) have the element type T. Parallel loops use static OpenMP
// schedules and every reduction has a fixed order, so results do not depend on the thread count
// (BLAS aside).
#pragma once

#include <cstdint>

#include "core/rope_params.h"

namespace mt::ops::cpu {

// ---------------------------------------------------------------- elementwise.cpp
template <typename T> void fill_cpu(T* x, int64_t n, double value);
template <typename T> void add_inplace_cpu(T* a, const T* b, int64_t n);           // a += b
template <typename T> void add_cpu(T* out, const T* a, const T* b, int64_t n);     // may alias
template <typename T> void scale_cpu(T* x, int64_t n, double s);
template <typename To, typename From> void cast_cpu(To* out, const From* in, int64_t n);
template <typename T> double sum_squares_cpu(const T* x, int64_t n);

// ---------------------------------------------------------------- linear.cpp
// Row-major C(M, N) = alpha * op(A) @ op(B) + beta * C through CBLAS (op = transpose when asked).
template <typename T>
void gemm_cpu(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
              const T* B, int64_t ldb, T beta, T* C, int64_t ldc);
// While alive (and `active`), pins a pthreads build of OpenBLAS to one thread: such a build does not
// notice that it runs inside an OpenMP region, and every OpenMP thread handing its small GEMMs to the
// one BLAS thread pool at once was measured 15-30x slower (attention on 2 cores). An OpenMP build of
// OpenBLAS already runs single-threaded inside parallel regions and is left alone.
// Called once at start-up: all CPU parallelism is OpenMP (GEMMs are split into row blocks), so a
// pthreads OpenBLAS is pinned to one thread for good; its idle pool otherwise spins against the
// OpenMP threads (measured: ~60% of a 2-core training step spent spinning).
void init_cpu_threads();

class SerialBlasScope {
 public:
  explicit SerialBlasScope(bool active);
  ~SerialBlasScope();
  SerialBlasScope(const SerialBlasScope&) = delete;
  SerialBlasScope& operator=(const SerialBlasScope&) = delete;

 private:
  int saved_threads_ = 0;  // > 0: restore this count on exit
};
template <typename T>
void linear_forward_cpu(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t IC, int64_t OC);
template <typename T>
void linear_backward_cpu(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int64_t N,
                         int64_t IC, int64_t OC, bool accumulate_dinp, bool accumulate_dweight);

// ---------------------------------------------------------------- embedding.cpp
template <typename T>
void embedding_forward_cpu(T* out, const int32_t* tokens, const T* table, int64_t N, int64_t Vl, int64_t C,
                           int64_t vocab_start);
template <typename T>
void embedding_backward_cpu(T* dtable, const T* dout, const int32_t* tokens, int64_t N, int64_t Vl, int64_t C,
                            int64_t vocab_start);

// ---------------------------------------------------------------- norm.cpp
template <typename T>
void layernorm_forward_cpu(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int64_t N,
                           int64_t C, double eps);
template <typename T>
void layernorm_backward_cpu(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                            const T* mean, const T* rstd, int64_t N, int64_t C, bool accumulate_dinp);
template <typename T>
void rmsnorm_forward_cpu(T* out, T* rstd, const T* inp, const T* weight, int64_t N, int64_t C, double eps);
template <typename T>
void rmsnorm_backward_cpu(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd,
                          int64_t N, int64_t C, bool accumulate_dinp);

// ---------------------------------------------------------------- activation.cpp
template <typename T> void gelu_forward_cpu(T* out, const T* inp, int64_t n);
template <typename T> void gelu_backward_cpu(T* dinp, const T* dout, const T* inp, int64_t n);  // may alias
template <typename T> void swiglu_forward_cpu(T* out, const T* inp, int64_t N, int64_t F);
template <typename T> void swiglu_backward_cpu(T* dinp, const T* dout, const T* inp, int64_t N, int64_t F);

// ---------------------------------------------------------------- rope.cpp
// x (B, T, heads, D), in place; the backward rotates by -angle.
template <typename T>
void rope_forward_cpu(T* x, int64_t B, int64_t T_, int64_t heads, int64_t D, const RopeParams& rope,
                      RopePositions positions);
template <typename T>
void rope_backward_cpu(T* dx, int64_t B, int64_t T_, int64_t heads, int64_t D, const RopeParams& rope,
                       RopePositions positions);

// ---------------------------------------------------------------- attention.cpp
// Query length T; key/value length Tk (-1: T). causal: query i sees keys j <= i (needs Tk == T); else all Tk keys.
struct AttnShape {
  int64_t B, T, H, G, D;
  int64_t Tk = -1;
  bool causal = true;
  int64_t keys() const { return Tk < 0 ? T : Tk; }
};
template <typename T> void qkv_split_forward_cpu(T* q, T* k, T* v, const T* qkv, const AttnShape& s);
template <typename T> void qkv_split_backward_cpu(T* dqkv, const T* dq, const T* dk, const T* dv, const AttnShape& s);
template <typename T> void attention_forward_cpu(T* out, T* lse, const T* q, const T* k, const T* v, const AttnShape& s);
template <typename T>
void attention_backward_cpu(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                            const T* lse, const AttnShape& s);
// context_attention.cpp (ops.h attention_merge, seq_copy)
template <typename T>
void attention_merge_cpu(T* out, T* lse, const T* part_out, const T* part_lse, int64_t B, int64_t T_, int64_t Tb,
                         int64_t H, int64_t D, int64_t t0);
template <typename T>
void seq_copy_cpu(T* dst, int64_t Td, int64_t dst_t, const T* src, int64_t Ts, int64_t src_t, int64_t B, int64_t len,
                  int64_t row, bool accumulate);

// ---------------------------------------------------------------- cross_entropy.cpp
template <typename T>
void cross_entropy_stats_cpu(T* max, T* sumexp, T* target_logit, const T* logits, const int32_t* targets, int64_t N,
                             int64_t Vl, int64_t vocab_start, int64_t n_valid);
template <typename T>
void cross_entropy_rescale_cpu(T* sumexp, const T* max, const T* gmax, int64_t N);
template <typename T>
void cross_entropy_finish_cpu(T* lse, double* loss, const T* gmax, const T* sumexp, const T* target_logit, int64_t N);
double sum_cpu(const double* x, int64_t n);  // in index order
// U: the dtype of dloss (fp32 or fp64, independent of T). dlogits may alias logits.
template <typename T, typename U>
void cross_entropy_backward_cpu(T* dlogits, const T* logits, const int32_t* targets, const T* lse, const U* dloss,
                                int64_t N, int64_t Vl, int64_t vocab_start, int64_t n_valid);

// ---------------------------------------------------------------- dropout.cpp
template <typename T>
void dropout_forward_cpu(T* out, const T* inp, int64_t n, double p, uint64_t seed, uint64_t offset);
template <typename T>
void dropout_backward_cpu(T* dinp, const T* dout, int64_t n, double p, uint64_t seed, uint64_t offset);

// ---------------------------------------------------------------- fill_normal.cpp
template <typename T>
void fill_normal_cpu(T* out, int64_t n, uint64_t seed, uint64_t stream, uint64_t offset);

// ---------------------------------------------------------------- adamw.cpp
template <typename T>
void adamw_step_cpu(T* param, T* m, T* v, const T* grad, int64_t n, double lr, double beta1, double beta2, double eps,
                    double weight_decay, int64_t step, double grad_scale);

}  // namespace mt::ops::cpu
