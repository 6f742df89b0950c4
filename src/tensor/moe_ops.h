// The ops of a mixture-of-experts layer (issue #16): router, balancing losses, capacity, permute /
// unpermute, grouped expert GEMMs. Conventions as tensor/ops.h (checks, dispatch on device and dtype,
// gradient convention). CPU references in src/tensor/cpu/moe_*.cpp (fp32 and fp64).
//
// Legend: N tokens (rows), C hidden, E experts (all of them), El this rank's experts, k = top-k,
// M routed rows (token slots kept after capacity), OC/IC out/in features of one expert's projection.
// A "slot" is one (token n, choice j) pair, numbered s = n * k + j.
// Router tensors (logits, scores, weights, losses) have the router dtype: fp32, or fp64 for fp64
// activations ("the router runs in fp32"). indices, slot maps and counts are int32.
#pragma once

#include <cstdint>
#include <vector>

#include "core/moe_router_spec.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace mt::ops {

// ---------------------------------------------------------------- router
// scores (N, E) = softmax(logits) or sigmoid(logits). The choice is the top k of scores + bias (bias (E) or
// null: the expert bias enters the choice only), ties toward the lower expert index; indices (N, k) int32 in
// the order chosen (descending choice value). weights (N, k) = scores[indices] (/ their sum when normalize())
// * scaling.
void moe_router_forward(Tensor& indices, Tensor& weights, Tensor& scores, const Tensor& logits, const Tensor* bias,
                        const RouterSpec& spec);
// dlogits (N, E) (=) = (d weights / d logits)^T dweights (the choice is piecewise constant).
void moe_router_backward(Tensor& dlogits, const Tensor& dweights, const Tensor& scores, const Tensor& indices,
                         const RouterSpec& spec);

// ---------------------------------------------------------------- balancing losses
// Load-balancing loss over `groups` equal consecutive blocks of rows (1: aux_loss over all N rows; B: seq_aux_loss,
// one block per sequence of a batch laid out (B, T)), averaged over the blocks:
//   L = coeff / groups * sum_g E * sum_e f_ge * P_ge,  f_ge = (slots of block g routed to e) / (rows_g * k) (no
//   gradient), P_ge = mean over the block's rows of p_ne, p = the scores (softmax) or the sigmoid scores divided
//   by their row sum (sigmoid). Counted from indices before any capacity drop. loss: (1) router dtype (=).
// With `group` (groups 1 only): the rows are this rank's share of a larger set split over ranks (sequence
// parallelism): f_e from group->counts (E) (slots of the whole set per expert) and P_e = sum over this rank's rows
// / group->rows (rows of the whole set), so that the ranks' losses (and gradients) sum to the whole set's.
struct AuxLossGroup {
  std::vector<int64_t> counts;
  int64_t rows = 0;
};
void moe_aux_loss_forward(Tensor& loss, const Tensor& scores, const Tensor& indices, int64_t groups, double coeff,
                          bool sigmoid, const AuxLossGroup* group = nullptr);
// dlogits (N, E) += dloss * dL/dlogits.
void moe_aux_loss_backward(Tensor& dlogits, const Tensor& scores, const Tensor& indices, int64_t groups, double coeff,
                           bool sigmoid, double dloss = 1.0, const AuxLossGroup* group = nullptr);
// z-loss: L = coeff * mean_n logsumexp(logits_n)^2; loss (1) (=); dlogits += dloss * dL/dlogits.
void moe_z_loss_forward(Tensor& loss, const Tensor& logits, double coeff);
void moe_z_loss_backward(Tensor& dlogits, const Tensor& logits, double coeff, double dloss = 1.0);

// Slots routed to each expert: counts (E) int32 (=); dropped slots (index -1) are not counted.
void moe_expert_counts(Tensor& counts, const Tensor& indices, int64_t E);
// DeepSeek-V3's auxiliary-loss-free balancing, after a step: bias_e += rate * sign(mean(load) - load_e).
// bias (E) fp32 (or fp64), load (E) int32/int64/fp32/fp64 (tokens routed to each expert over the step).
void moe_expert_bias_update(Tensor& bias, const Tensor& load, double rate);

// ---------------------------------------------------------------- capacity (moe_expert_capacity_factor)
// capacity = ceil(N * k / E * factor). Per expert, the `capacity` slots of highest weight are kept (ties: the
// lower slot), the others dropped: their index becomes -1 (in place on indices (N, k)).
int64_t moe_capacity(int64_t N, int64_t k, int64_t E, double factor);
void moe_apply_capacity(Tensor& indices, const Tensor& weights, int64_t E, int64_t capacity);

// ---------------------------------------------------------------- permute / unpermute
// The routing map: rows grouped by expert (expert-major, tokens ascending inside an expert). slot_of_row (N*k)
// int32: the slot of permuted row r for r < M = sum(counts), -1 after; row_of_slot (N*k) int32: the permuted row of
// each slot, -1 for dropped slots. counts (E) int32 as moe_expert_counts.
void moe_routing_map(Tensor& slot_of_row, Tensor& row_of_slot, Tensor& counts, const Tensor& indices, int64_t E);
// out (M, C) (=): out[r] = x[slot_of_row[r] / k], 0 where slot_of_row[r] < 0 (a padding row). slot_of_row is 1-d
// with at least M entries: (N*k) from moe_routing_map, or (E*Mp) from moe_pad_routing_map.
void moe_permute_forward(Tensor& out, const Tensor& x, const Tensor& slot_of_row, int64_t k);
// The padded layout of a routing map for padded batched experts (all E experts on this rank): expert e's rows
// become the first counts[e] rows of its region of regions[e] >= counts[e] rows (regions laid out in expert
// order), the rest of the region padding. slot_of_row_pad (sum of regions) int32 (=): the slot of each padded row,
// -1 for padding (moe_permute_forward writes those rows 0); row_of_slot (N*k) in place: each kept slot's row in the
// padded layout (-1 stays). counts (E, host) as moe_routing_map gave them. The unpermute ops then work unchanged
// on the padded rows; the padding rows of a gradient that flows into the expert GEMMs must be 0
// (moe_zero_unrouted_rows), so they add nothing to the weight gradients. slot_of_row_pad may be longer than the
// regions (allocated for moe_alloc_rows of them): its rows past them get -1 (padding too). CUDA: E <= 256.
void moe_pad_routing_map(Tensor& slot_of_row_pad, Tensor& row_of_slot, const Tensor& slot_of_row,
                         const std::vector<int64_t>& counts, const std::vector<int64_t>& regions);
// The rows to allocate for `rows` padded rows: rounded up to a step of 1/32 of their power of two (at most 3% more),
// so that the padded layer's buffers, whose row count changes with the routing every layer and step, come in a
// few sizes the caching allocator can reuse (its free lists are by exact size: new sizes meant new cudaMalloc calls
// and, once the device was full of cached blocks, a release of the whole cache every few steps).
int64_t moe_alloc_rows(int64_t rows);
// An uninitialized (rows, ...) tensor: the first rows of an allocation of moe_alloc_rows(rows) rows. For the buffers
// of expert parallelism's exchanges, whose row counts (tokens sent and received) change with the routing every layer
// and step: in a few sizes, the caching allocator reuses them instead of calling cudaMalloc for each new one.
Tensor moe_rows_empty(const Shape& s, DType dtype, Device device);
// x (M, C): rows r with slot_of_row[r] < 0 (padding) = 0, the others untouched; slot_of_row (M) int32.
void moe_zero_unrouted_rows(Tensor& x, const Tensor& slot_of_row);
// dx (N, C) (=): dx[n] = sum_j dout[row_of_slot[n*k+j]] over the kept slots (0 when none); with dlogits (N, E),
// in the router dtype, and router_weight (E, C), plus the router's input gradient sum_e dlogits[n, e]
// router_weight[e] (in the same pass: no second read and write of dx); with residual (N, C), plus residual[n]; all
// summed in fp32 (fp64 on the CPU) and rounded once. The router's term reads its weight once per row: for few experts
// (E <= kRouterTermMaxE, core/moe_router_spec.h; more are a GEMM's work).
void moe_permute_backward(Tensor& dx, const Tensor& dout, const Tensor& row_of_slot, int64_t k,
                          const Tensor* dlogits = nullptr, const Tensor* router_weight = nullptr,
                          const Tensor* residual = nullptr);
// y (N, C) (=): y[n] = sum_j weights[n, j] * yp[row_of_slot[n*k+j]] over the kept slots (the combine), plus
// residual[n] (the layer's residual stream, rounded once with the sum) when given.
// weights (N, k) in the router dtype; yp, y, residual in the activation dtype.
void moe_unpermute_forward(Tensor& y, const Tensor& yp, const Tensor& weights, const Tensor& row_of_slot,
                           const Tensor* residual = nullptr);
// dyp (M, C) (=): dyp[r] = weights[s] * dy[s / k] for s = slot_of_row... (from row_of_slot); dweights (N, k) (=):
// dot(dy[n], yp[row]) for kept slots, 0 for dropped ones.
void moe_unpermute_backward(Tensor& dyp, Tensor& dweights, const Tensor& dy, const Tensor& yp, const Tensor& weights,
                            const Tensor& row_of_slot);

// ---------------------------------------------------------------- token-level dispatch (expert parallelism)
// Under expert parallelism a token goes once to each EP rank holding one of its experts (not once per expert):
// EP rank d holds the experts [d El, (d + 1) El). dest (N, P) int32 (=): dest[n, d] = d when one of token n's kept
// choices (indices (N, k) >= 0) is on rank d, else -1. moe_routing_map(send_slot, row_of_send, rank_counts, dest,
// P) then gives the send order, rows grouped by destination rank and tokens ascending: send row r carries token
// send_slot[r] / P to rank send_slot[r] % P, and row_of_send (N * P) is each (token, rank)'s send row or -1.
void moe_dest_ranks(Tensor& dest, const Tensor& indices, int64_t El);
// local (S, k) int32 (=): for each of the first S send rows (token n, rank d as above) the choices of n on rank d
// as local expert indices (indices[n, j] - d El), -1 for choices on other ranks or dropped. Received by rank d, it
// is that rank's routing of the token (moe_routing_map over its El experts).
void moe_local_choices(Tensor& local, const Tensor& indices, const Tensor& send_slot, int64_t P, int64_t El);

// ---------------------------------------------------------------- grouped expert GEMMs
// x (M, IC) holds the rows of El groups in order, counts[e] rows each (host, sum <= M: rows past the groups are
// neither read nor written, in out and dx alike); weight (El, OC, IC) stacks
// one (OC, IC) matrix per group. out (M, OC) (=): out[rows of e] = x[rows of e] @ weight[e]^T. On the GPU one
// grouped GEMM (every group in one cublasGemmGroupedBatchedEx call) when the groups are small; when a group
// averages at least kGroupGemmMaxFlops (moe_gemm_per_group), one cublasGemmEx per group, which on an H100 ran the
// 8-expert top-2 shapes at 390-614 TFLOP/s where the grouped call ran them at 305-339
// (test/cuda/test_cuda_moe_bench.cpp, benchmarks/RESULTS.md); the 64-expert top-8 shapes (4 GFLOP per expert)
// stay grouped.
inline constexpr double kGroupGemmMaxFlops = 17179869184.0;  // 2^34: 2 x rows x IC x OC per group, on average
bool moe_gemm_per_group(int64_t M, int64_t groups, int64_t IC, int64_t OC);
// Equal groups (every count the same, the padded layout) run on the GPU as ONE cublasGemmStridedBatchedEx per
// product, fp32 weight gradients included.
//
// Padded batched experts (moe_padded_regions): the MoE layer lays its rows out in regions of a few distinct sizes
// (moe_pad_routing_map), each region an expert's rows and zero padding, so that each projection runs as at most
// kPadBuckets batched GEMMs (one per distinct size; the GPU runs groups of at most that many distinct sizes that
// way, tensor/../cuda/moe_gemm.cu), near the dense rate, instead of one grouped call at about 40% of it. The
// region sizes: the experts sorted by count and cut into at most kPadBuckets runs, each padded to its largest count
// rounded up to kPadRows (fewer distinct GEMM shapes from step to step: cuBLAS's choices are cached by shape), the
// cut minimizing the estimated time (padded rows at kBatchedTflops plus kBatchedCallUs per call). The layout is
// taken when that estimate beats the exact groups' (kGroupedTflops, or kPerGroupTflops where moe_gemm_per_group),
// e.g. for collapsed routing (one expert taking every token: max / mean = E / k) the largest experts get their own
// region sizes. Rates: H100 measurements of these calls at the benchmark configs' shapes (benchmarks/RESULTS.md,
// "MoE speed (session 9)"). A data-driven choice per layer and step; only on the GPU (the CPU runs the exact
// groups), for E <= 256.
inline constexpr double kGroupedTflops = 260, kPerGroupTflops = 500, kBatchedTflops = 600, kBatchedCallUs = 8;
// kPadBuckets 16: with 4, skewed routings (moe-64x-top8's trained routers: one expert at 8x the mean, the rest
// spread over two orders of magnitude) padded 131,072 rows to 147-193K (e2e op profile, session 10); the cut into
// up to 16 runs pads a simulated such routing by 8-13% instead of 40-63% (the estimate picks 9-12 runs).
inline constexpr int64_t kPadBuckets = 16, kPadRows = 128;
// Where our own Hopper kernels run the experts, each count rounded up to this: whole 64-row slices of K for the
// weight gradients, and an expert's last 128-row output tile either full or of 64 rows, whose second consumer
// warpgroup skips its MMAs (cuda/sm90/grouped_gemm.cu): 32 padding rows an expert on average instead of 64.
inline constexpr int64_t kSm90PadRows = 64;
// The region sizes (E) of the padded layout for these counts, or empty when the exact groups are estimated faster.
// Where our own grouped GEMMs run the experts' forward and dx (bf16 on a Hopper GPU, IC a multiple of 256, OC of
// 256: cuda/sm90/grouped_gemm.h), one kernel per product takes any sizes: each expert gets its own region, its
// count rounded up to kSm90PadRows.
std::vector<int64_t> moe_padded_regions(Device device, DType dtype, const std::vector<int64_t>& counts, int64_t IC,
                                        int64_t OC);
void moe_grouped_linear_forward(Tensor& out, const Tensor& x, const Tensor& weight, const std::vector<int64_t>& counts);
// The experts' fc1 followed by their SwiGLU: h (M, 2F) = x @ weight[e]^T per group (weight (El, 2F, IC), gate rows
// then up rows) and a (M, F) = swiglu(h). On a Hopper GPU in bf16 one kernel does both (the SwiGLU in the GEMM's
// epilogue, the same bits as the two ops).
void moe_grouped_linear_forward_swiglu(Tensor& h, Tensor& a, const Tensor& x, const Tensor& weight,
                                       const std::vector<int64_t>& counts);
// dx (M, IC) (=) = dout @ weight[e] per group (skipped when null); dweight (El, OC, IC) += (= with Overwrite, also
// for groups without rows: 0) dout^T x per group.
// dweight_squares (optional): set to F64 values on dweight's device whose sum (ops::sum_each) is the sum of squares
// of dweight as this call leaves it (the gradient norm's share of these weights, without another pass over them:
// Hopper's grouped kernel takes them from its fp32 tiles in registers), or left undefined when the path taken
// makes none (cuBLAS, accumulation on a GPU).
void moe_grouped_linear_backward(Tensor* dx, Tensor* dweight, const Tensor& dout, const Tensor& x,
                                 const Tensor& weight, const std::vector<int64_t>& counts,
                                 GradMode dweight_mode = GradMode::Accumulate, Tensor* dweight_squares = nullptr);
// The backward of the grouped linear that follows a SwiGLU (the experts' fc2), through the SwiGLU, without its
// input (as linear_backward_swiglu for the dense MLP): a = swiglu(h) (M, F) is recomputed in the SwiGLU
// backward's pass, so the forward need not keep it. dh (M, 2F) (=) = swiglu'(h) . (dout @ weight[e]) per group;
// dweight (El, OC, F) += (= with Overwrite) dout^T a per group. dh may alias h. kept_a (optional): the forward's a
// (M, F), kept: the weight gradient reads it and nothing recomputes a (the same bits either way).
void moe_grouped_linear_backward_swiglu(Tensor& dh, Tensor* dweight, const Tensor& dout, const Tensor& weight,
                                        const Tensor& h, const std::vector<int64_t>& counts,
                                        GradMode dweight_mode = GradMode::Accumulate, Tensor* dweight_squares = nullptr,
                                        const Tensor* kept_a = nullptr);

}  // namespace mt::ops
