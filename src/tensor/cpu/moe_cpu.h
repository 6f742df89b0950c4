// CPU references of the MoE ops of tensor/moe_ops.h, on raw contiguous pointers (semantics there).
// Templates instantiated for float and double; router tensors have the element type T. Plain loops in a
// fixed order (deterministic); sums in fp64.
#pragma once

#include <cstdint>

#include "tensor/moe_ops.h"

namespace mt::ops::cpu {

// ---------------------------------------------------------------- moe_router.cpp
template <typename T>
void moe_router_forward_cpu(int32_t* indices, T* weights, T* scores, const T* logits, const T* bias, int64_t N,
                            int64_t E, const RouterSpec& spec);
template <typename T>
void moe_router_backward_cpu(T* dlogits, const T* dweights, const T* scores, const int32_t* indices, int64_t N,
                             int64_t E, const RouterSpec& spec);
template <typename T>
// a_given (E): the coefficients a_e = dL/dp_ne of a group split over ranks (groups 1), else counted from indices.
void moe_aux_loss_cpu(T* loss, T* dlogits, const T* scores, const int32_t* indices, int64_t N, int64_t E, int64_t k,
                      int64_t groups, double coeff, bool sigmoid, double dloss, const double* a_given = nullptr);
template <typename T>
void moe_z_loss_cpu(T* loss, T* dlogits, const T* logits, int64_t N, int64_t E, double coeff, double dloss);
template <typename T>
void moe_expert_bias_update_cpu(T* bias, const double* load, int64_t E, double rate);

// ---------------------------------------------------------------- moe_permute.cpp
void moe_expert_counts_cpu(int32_t* counts, const int32_t* indices, int64_t slots, int64_t E);
template <typename T>
void moe_apply_capacity_cpu(int32_t* indices, const T* weights, int64_t slots, int64_t E, int64_t capacity);
void moe_dest_ranks_cpu(int32_t* dest, const int32_t* indices, int64_t N, int64_t k, int64_t P, int64_t El);
void moe_local_choices_cpu(int32_t* local, const int32_t* indices, const int32_t* send_slot, int64_t S, int64_t k,
                           int64_t P, int64_t El);
void moe_routing_map_cpu(int32_t* slot_of_row, int32_t* row_of_slot, int32_t* counts, const int32_t* indices,
                         int64_t slots, int64_t E);
void moe_pad_routing_map_cpu(int32_t* slot_of_row_pad, int32_t* row_of_slot, const int32_t* slot_of_row,
                             const int64_t* counts, const int64_t* regions, int64_t slots, int64_t E);
template <typename T>
void moe_zero_unrouted_rows_cpu(T* x, const int32_t* slot_of_row, int64_t M, int64_t C);
template <typename T>
void moe_permute_forward_cpu(T* out, const T* x, const int32_t* slot_of_row, int64_t M, int64_t C, int64_t k);
// dlogits (N, E) with router_weight (E, C), and residual (N, C), optional: added to the sum before the one rounding.
template <typename T>
void moe_permute_backward_cpu(T* dx, const T* dout, const int32_t* row_of_slot, int64_t N, int64_t C, int64_t k,
                              const T* dlogits = nullptr, const T* router_weight = nullptr, int64_t E = 0,
                              const T* residual = nullptr);
// weights null: every routed row's weight is 1 (moe_permute_backward_cpu)
template <typename T>
void moe_unpermute_forward_cpu(T* y, const T* yp, const T* weights, const int32_t* row_of_slot, int64_t N, int64_t C,
                               int64_t k, const T* residual);
template <typename T>
void moe_unpermute_backward_cpu(T* dyp, T* dweights, const T* dy, const T* yp, const T* weights,
                                const int32_t* row_of_slot, int64_t N, int64_t C, int64_t k);

}  // namespace mt::ops::cpu
