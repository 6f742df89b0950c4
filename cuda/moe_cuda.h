// CUDA versions of the MoE ops of tensor/moe_ops.h, on raw contiguous device pointers (semantics there). Router
// tensors are fp32; activations T = float, mt::bf16 or mt::f16; expert weight gradients are fp32 main grads.
// Every launcher runs on the backend's current stream and returns without synchronizing; scratch comes from the
// caching allocator (kernel_utils.cuh Scratch), never cudaMalloc. Plain header.
//
// Not here (the ops run them on the host copies, small and rare): the capacity drop and the expert-bias update.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/moe_router_spec.h"

namespace mt::ops::cuda {

// ---------------------------------------------------------------- moe_router.cu (one thread per row)
void moe_router_forward_cuda(int32_t* indices, float* weights, float* scores, const float* logits, const float* bias,
                             int64_t N, int64_t E, const RouterSpec& spec);
void moe_router_backward_cuda(float* dlogits, const float* dweights, const float* scores, const int32_t* indices,
                              int64_t N, int64_t E, const RouterSpec& spec);
// loss (1) (=) when not null; dlogits (+= dloss * gradient) when not null. Deterministic (fixed-order sums).
void moe_aux_loss_cuda(float* loss, float* dlogits, const float* scores, const int32_t* indices, int64_t N, int64_t E,
                       int64_t k, int64_t groups, double coeff, bool sigmoid, double dloss, const double* a_host = nullptr);
void moe_z_loss_cuda(float* loss, float* dlogits, const float* logits, int64_t N, int64_t E, double coeff,
                     double dloss);

// ---------------------------------------------------------------- moe_permute.cu
void moe_expert_counts_cuda(int32_t* counts, const int32_t* indices, int64_t slots, int64_t E);
void moe_routing_map_cuda(int32_t* slot_of_row, int32_t* row_of_slot, int32_t* counts, const int32_t* indices,
                          int64_t slots, int64_t E);
template <typename T>
void moe_permute_forward_cuda(T* out, const T* x, const int32_t* slot_of_row, int64_t M, int64_t C, int64_t k);
// The padded layout of the routing map (tensor/moe_ops.h moe_pad_routing_map): start (E + 1) the experts' first
// rows in the routing map (prefix sums of counts), pstart (E + 1) the first rows of their regions (prefix sums of
// the region sizes). Passed by value (kernel parameters: 2 x 257 x 4 + 4 bytes).
struct PadPlan {
  static constexpr int kMaxExperts = 256;
  int32_t start[kMaxExperts + 1], pstart[kMaxExperts + 1];
  int32_t E;
};
// tail: entries of slot_of_row_pad past the regions, set to -1.
void moe_pad_routing_map_cuda(int32_t* slot_of_row_pad, int32_t* row_of_slot, const int32_t* slot_of_row,
                              int64_t slots, const PadPlan& plan, int64_t tail);
template <typename T>
void moe_zero_unrouted_rows_cuda(T* x, const int32_t* slot_of_row, int64_t M, int64_t C);
// dlogits (N, E, fp32) with router_weight (E, C): dx[n] also gets sum_e dlogits[n, e] router_weight[e] (the router's
// input gradient), and residual[n] when given, all summed in fp32 and rounded once.
template <typename T>
void moe_permute_backward_cuda(T* dx, const T* dout, const int32_t* row_of_slot, int64_t N, int64_t C, int64_t k,
                               const float* dlogits = nullptr, const T* router_weight = nullptr, int64_t E = 0,
                               const T* residual = nullptr);
template <typename T>
void moe_unpermute_forward_cuda(T* y, const T* yp, const float* weights, const int32_t* row_of_slot, int64_t N,
                                int64_t C, int64_t k, const T* residual);
template <typename T>
void moe_unpermute_backward_cuda(T* dyp, float* dweights, const T* dy, const T* yp, const float* weights,
                                 const int32_t* row_of_slot, int64_t N, int64_t C, int64_t k);

// Token-level dispatch (tensor/moe_ops.h moe_dest_ranks, moe_local_choices): one thread per token / send row.
void moe_dest_ranks_cuda(int32_t* dest, const int32_t* indices, int64_t N, int64_t k, int64_t P, int64_t El);
void moe_local_choices_cuda(int32_t* local, const int32_t* indices, const int32_t* send_slot, int64_t S, int64_t k,
                            int64_t P, int64_t El);

// ---------------------------------------------------------------- moe_gemm.cu (cublasGemmGroupedBatchedEx)
// Groups of at most kMaxShapeBuckets distinct row counts (the padded layout: tensor/moe_ops.h moe_padded_regions)
// run as one batched call per distinct count instead (strided when evenly spaced, else on pointer arrays).
inline constexpr int kMaxShapeBuckets = 16;
// One grouped GEMM over the El experts (groups without rows skipped), or with per_group one cublasGemmEx per
// expert (large experts: tensor/moe_ops.h moe_gemm_per_group). counts on the host.
template <typename T>
void moe_grouped_linear_forward_cuda(T* out, const T* x, const T* weight, const int64_t* counts, int64_t El,
                                     int64_t IC, int64_t OC, bool per_group);
// dx (=, skipped when null) one grouped GEMM; dweight (fp32, or bf16 with dweight_bf16: the fp32 results rounded) +=
// (= unless accumulate) one GEMM per expert (no mixed-type grouped call); with overwrite, groups without rows get 0.
// With n_squares: *n_squares fp64 partials in dw_squares (room for sm90::grouped_dweight_square_partials of every
// expert with rows) sum in index order to the sum of squares of the dweight written, or *n_squares = -1 when this
// call's path does not make them.
template <typename T>
void moe_grouped_linear_backward_cuda(T* dx, void* dweight, bool dweight_bf16, const T* dout, const T* x,
                                      const T* weight,
                                      const int64_t* counts, int64_t El, int64_t IC, int64_t OC, bool accumulate,
                                      bool per_group, double* dw_squares = nullptr, int64_t* n_squares = nullptr);

}  // namespace mt::ops::cuda
