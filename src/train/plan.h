// `megatrain plan`: checks a layout and estimates per-rank memory, FLOPs and the pipeline schedule
// before anything is allocated. Parameters are counted from the model's own parameter table: the
// GPTModel of each pipeline stage's chunks is built on Device::Meta (shapes only, no data).
//
// Memory per rank (one rank of each pipeline stage; every tensor-parallel rank holds equal slices):
//   weights     fp32: 4 B/param; bf16/fp16: 2 B compute copy
//   gradients   4 B/param (fp32 main gradients)
//   optimizer   Adam m and v (8 B/param) + fp32 master weights with bf16/fp16 (4 B/param); with
//               parallel.distributed_optimizer divided over data x context parallel ranks (the
//               ranks holding the same parameters), as Megatron's distributed optimizer
//   activations what TransformerLayer / SelfAttention / MLP / Norm / GPTModel keep per micro-batch
//               (their Saved structs: activation dtype, fp32 statistics), times the micro-batches in
//               flight: the peak over the stage's pipeline_schedule() of the sum over chunks of
//               (forwards done - backwards done) x that chunk's bytes. For each recompute mode:
//               none; selective (drops the attention core output); full (keeps only the input of
//               each group of training.recompute_num_layers layers, or with recompute_method block
//               only the input of each of the first recompute_num_layers layers of a chunk)
//   logits      the last stage keeps (tokens, vocab / tp) logits per micro-batch in flight
//   attention backward scratch (bf16/fp16 on cuDNN): transient in each layer's backward, counted at the
//               last layer's (the logits are freed by then): the peak adds the larger of the two. It
//               decides long sequences: cuDNN's deterministic backward materializes B H T^2 scores
//               (64 GiB for one llama-1b sample at T 32768), cut into samples, KV groups or single query
//               heads to fit training.attention_bwd_workspace_mib (2 GiB per head there); the
//               non-deterministic one B H T D floats
// Mixture of experts (train/plan_moe.h): an MoE layer's router, local experts (E / parallel.expert) and shared
// expert replace what the Meta model holds in its MLP slot; expert optimizer state is divided over the
// expert-data-parallel ranks (data x context / expert); its activations replace the dense MLP's; the all-to-all
// bytes per iteration are reported per stage.
// Not counted: other transient buffers inside one forward/backward (gradients of activations, the layers
// being recomputed), communication buffers, the allocator's fragmentation, the CUDA context.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/attention_chunks.h"
#include "model/model_context.h"
#include "train/plan_moe.h"
#include "parallel/layer_split.h"
#include "tensor/tensor.h"

namespace mt {

// One row of the parameter table: the tensor-parallel slice one rank holds.
struct PlanParam {
  std::string name;  // decoder layers as "decoder.layers.*." (one row for all layers)
  Shape global_shape, local_shape;
  int partition_dim = -1;  // -1: replicated on every tensor-parallel rank
};

// Parameters one rank of (stage, tp_rank) holds, counted from the model built on Device::Meta.
struct RankParams {
  int64_t total = 0;                // local elements (what the rank stores)
  int64_t replicated = 0;           // of which replicated over tensor-parallel ranks (norms, row-parallel biases, ...)
  int64_t tied_copies = 0;          // of which copies of another stage's parameter (gpt2's word embeddings on the last stage)
  std::vector<int64_t> per_chunk;   // local elements per model chunk
  std::vector<PlanParam> params;    // every parameter (layer names kept)
  int64_t fp8_weight = 0;           // local elements of the weights of linears running in FP8 (training.fp8)
};
RankParams count_rank_params(const Config& cfg, const DerivedConfig& d, int stage, int tp_rank);

// Recompute modes the plan reports, in column order.
inline constexpr int kNumRecomputeModes = 3;
inline constexpr RecomputePolicy::Mode kRecomputeModes[kNumRecomputeModes] = {
    RecomputePolicy::Mode::None, RecomputePolicy::Mode::Selective, RecomputePolicy::Mode::Full};
// Indexed by RecomputeGranularity (config.h): the same order.
static_assert(static_cast<int>(RecomputeGranularity::Full) == kNumRecomputeModes - 1);
const char* recompute_mode_name(RecomputePolicy::Mode m);  // "none", "selective", "full"

// Bytes one decoder layer keeps per micro-batch of B sequences of T tokens on one tensor-parallel
// rank of `tp` (TransformerLayer::Saved; statistics in fp32, fp64 for fp64 activations): all of it
// (None), without the attention core output (Selective), or only its input (Full). Under sequence
// parallelism the residual stream (layer input, norms) holds B*T/tp rows; attention and MLP
// tensors hold all B*T rows of the rank's heads / ffn slice. keep_norm_act (training.recompute_norm_act
// false): the two norm outputs and llama's SwiGLU output are kept too (not under Full).
int64_t layer_activation_bytes(const ModelConfig& m, const DerivedConfig& d, int tp, bool sequence_parallel, int64_t B,
                               int64_t T, DType act, RecomputePolicy::Mode mode, bool keep_norm_act = false);
// The same for a decoder layer whose MLP is an MoE layer (model/kept_tensors.h moe_layer_kept).
int64_t moe_layer_activation_bytes(const ModelConfig& m, const DerivedConfig& d, int tp, bool sequence_parallel,
                                   int64_t B, int64_t T, DType act, RecomputePolicy::Mode mode, bool keep_norm_act = false,
                                   int ep = 1);
// Bytes the `num_layers` decoder layers of one model chunk keep per micro-batch under `policy` (its norm_act too).
int64_t chunk_layers_activation_bytes(const ModelConfig& m, const DerivedConfig& d, int tp, bool sequence_parallel,
                                      int64_t B, int64_t T, DType act, const RecomputePolicy& policy, int num_layers);
// Bytes GPTModel::MicroState keeps besides the layers: token ids (pre_process); labels, final norm
// input, output and statistics, and the logits' log-sum-exp (post_process). Logits themselves apart.
int64_t chunk_extra_activation_bytes(const ModelConfig& m, int tp, bool sequence_parallel, int64_t B, int64_t T,
                                     DType act, bool pre_process, bool post_process);
// Bytes of the logits (B*T, padded_vocab / tp) the output layer keeps per micro-batch.
int64_t logits_bytes(const DerivedConfig& d, int tp, int64_t B, int64_t T, DType act);
// Scratch of one cuDNN attention backward (cuda/attention_cudnn.cu) on a rank with `heads` query heads in `groups`
// KV groups, B sequences of T tokens (causal, T keys): with training.deterministic, delta (fp32 Bc x Hc x T) and the
// scores' gradient of one call (Bc x Hc x T^2 x 2 bytes, cut to fit training.attention_bwd_workspace_mib by
// core/attention_chunks.h: whole samples, KV groups, single query heads; *chunks gets the cut), plus, single heads,
// the group's partial dK and dV; else dQ accumulated in fp32 (B x heads x T x head_dim x 4) and delta.
// 0 where cuDNN does not run the shape (fp32, training.attention_backend own, T % 128 != 0, head dim not 64/128).
int64_t attention_backward_scratch_bytes(const Config& cfg, const DerivedConfig& d, int heads, int groups, int64_t B,
                                         int64_t T, AttnBwdChunks* chunks = nullptr);
// Bytes one context rank sends per decoder layer and micro-batch of B sequences (T tokens each, the whole sequence)
// in the attention's forward and backward (parallel/context_parallel.h); q = B (T/cp) (H/tp) D, kv = B (T/cp) (G/tp) D
// elements of `act`:
//   p2p: forward (cp-1) x (K + V) blocks around the ring; backward the same again plus cp x (dK + dV)
//   a2a: each all-to-all sends (cp-1)/cp of its input: forward q, k, v and out (2 q + 2 kv); backward q, k, v, out,
//        dout gathered and dq, dk, dv scattered (4 q + 4 kv)
// Recompute (selective or full) repeats the forward's transfers in backward. 0 without context parallelism.
void context_parallel_bytes(const ModelConfig& m, const DerivedConfig& d, int tp, int cp, CpCommType type, int64_t B,
                            int64_t T, DType act, int64_t& forward, int64_t& backward);

struct PlanChunk {
  int chunk = 0;
  LayerRange layers;
  bool pre_process = false, post_process = false;
  int64_t params = 0;                        // on one rank
  int max_in_flight = 0;                     // micro-batches whose activations it holds at once
  int64_t act[kNumRecomputeModes] = {};     // bytes per micro-batch per recompute mode (without logits)
  int64_t logits = 0;                        // logits bytes per micro-batch (last chunk of the last stage)
};

struct PlanStage {
  int stage = 0;
  std::vector<PlanChunk> chunks;
  int64_t params = 0, replicated_params = 0;  // per rank
  int64_t weight_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  int64_t fp8_copy_bytes = 0;  // training.fp8: the FP8 weight copies (row-wise and transposed), kept for a step
  int64_t activation[kNumRecomputeModes] = {};  // peak over the schedule per recompute mode, without logits
  int64_t logits_bytes = 0;                      // peak logits kept
  // mixture of experts (0 when dense)
  int moe_layers = 0;               // MoE layers on the stage
  int64_t expert_params = 0;        // per rank, of params: its local experts of those layers
  int64_t a2a_bytes = 0, a2a_leaving_bytes = 0;  // all-to-all bytes per iteration per rank (moe_a2a_bytes)
  int64_t attention_scratch = 0;                 // one layer's attention backward scratch (transient)
  int64_t total(int mode) const {
    return weight_bytes + grad_bytes + optimizer_bytes + fp8_copy_bytes + activation[mode] + std::max(logits_bytes, attention_scratch);
  }
};

struct PlanReport {
  std::string config_file;
  // layout
  int world_size = 1, tp = 1, pp = 1, vp = 1, cp = 1, dp = 1, ep = 1;
  int micro_batch_size = 1, global_batch_size = 1, num_microbatches = 1;
  int seq_length = 0, padded_vocab_size = 0, num_layers = 0;
  bool sequence_parallel = false, distributed_optimizer = false;
  std::string precision, recompute;  // as written (display)
  RecomputePolicy::Mode recompute_mode = RecomputePolicy::Mode::None;  // training.recompute, resolved
  // what the "full" column assumes (training.recompute_method / _num_layers); its norm_act applies to every column
  RecomputePolicy full_policy;
  DType activation_dtype = DType::F32;
  int64_t grad_bytes_per_param = 4;  // fp32 main grads; 2 with parallel.grad_reduce_in_fp32 false
  // model
  int64_t total_params = 0;   // the whole model once (a tied table once)
  int64_t flop_params = 0;    // N of the FLOPs formula: total without learned position embeddings
  int64_t active_params = 0;  // N_active: total without the experts + moe_router_topk experts per MoE layer
  int64_t flops_per_token = 0;
  int64_t tokens_per_iteration = 0;
  double flops_per_iteration = 0, flops_per_rank = 0;
  std::vector<PlanParam> param_table;  // one row per distinct parameter (layers merged), rank 0's slices
  std::vector<PlanStage> stages;
  int64_t layer_act[kNumRecomputeModes] = {};  // one decoder layer, one micro-batch, bytes
  int64_t logits_per_microbatch = 0;
  // one layer's attention backward scratch on one rank (0 without cuDNN): as configured, and with the other
  // training.deterministic setting
  int64_t attention_scratch = 0, attention_scratch_other = 0;
  // how the deterministic backward is cut (workspace 0: cuDNN does not run it), on attention_batch samples of
  // attention_heads query heads (one rank's largest call)
  AttnBwdChunks attention_chunks;
  int64_t attention_batch = 0;
  int attention_heads = 0;
  bool deterministic = true;
  // mixture of experts (model.num_experts > 0)
  int num_experts = 0, topk = 0, moe_layers = 0, expert_dp = 1;
  MoELayerParams moe_layer;                        // one MoE layer's parameters (tensor-parallel rank 0)
  int64_t moe_layer_act[kNumRecomputeModes] = {};  // one MoE decoder layer, one micro-batch, bytes
  MoEA2ABytes moe_a2a;                             // one MoE layer, one micro-batch, the training.recompute mode
  // context parallelism (cp > 1): bytes one rank sends per decoder layer and micro-batch (context_parallel_bytes)
  std::string cp_comm_type;  // p2p | a2a
  int64_t cp_bytes_forward = 0, cp_bytes_backward = 0;
  // pipeline
  std::string schedule;  // format_schedule, pp > 1 only
  double bubble_fraction = 0;
};

// Validates the layout for `world_size` ranks (derive_config: throws mt::Error naming the fix) and
// estimates; allocates no parameter or activation memory.
PlanReport make_plan(const Config& cfg, int world_size);
// The same with the layout already derived (d = derive_config(cfg, world_size)).
PlanReport make_plan(const Config& cfg, const DerivedConfig& d, int world_size);
// Readable tables for stdout.
// One line when the deterministic attention backward (r.deterministic) needs more than
// training.attention_bwd_workspace_mib even at one query head per call (a warning naming the key, without a
// "warning:" prefix: format_plan and train's preflight log add theirs), else "".
std::string attention_workspace_warning(const PlanReport& r);
std::string format_plan(const PlanReport& r);

}  // namespace mt
