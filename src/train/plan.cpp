// `megatrain plan` estimates (see plan.h): parameters from the model built on Device::Meta,
// activation bytes from the shapes the layers keep, micro-batches in flight from the schedule.
#include "train/plan.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

#include "config/config_loader.h"
#include "config/config_validate_moe.h"
#include "config/model_features.h"
#include "core/check.h"
#include "model/gpt_model.h"
#include "model/kept_tensors.h"
#include "model/moe/moe_options.h"
#include "parallel/pipeline_schedule.h"
#include "runtime/rank_generator.h"
#include "tensor/fp8/fp8_recipe.h"
#include "train/metrics.h"

namespace mt {

namespace {

DType activation_dtype(Precision precision) {
  switch (precision) {
    case Precision::BF16: return DType::BF16;
    case Precision::FP16: return DType::F16;
    case Precision::FP32: break;
  }
  return DType::F32;
}

int64_t stat_size(DType act) { return act == DType::F64 ? 8 : 4; }  // Norm / attention / loss statistics
// Statistics a norm keeps per row (model/kept_tensors.h): RMSNorm rstd; LayerNorm mean, rstd.
int64_t norm_stats(const ModelConfig& m) {
  Config c;
  c.model = m;
  return static_cast<int64_t>(norm_kept("", resolve_model_features(c).normalization, 1).size());
}

std::string layer_pattern(const std::string& name) {
  static const std::regex layer_re("decoder\\.layers\\.[0-9]+\\.");
  return std::regex_replace(name, layer_re, "decoder.layers.*.");
}

}  // namespace

// ---------------------------------------------------------------- counting

RankParams count_rank_params(const Config& cfg, const DerivedConfig& d, int stage, int tp_rank) {
  const ParallelConfig& par = cfg.parallel;
  ParallelState ps;
  ps.tp_rank = tp_rank;
  ps.tp_size = par.tensor;
  ps.pp_rank = stage;
  ps.pp_size = par.pipeline;
  ps.cp_size = par.context;
  ps.dp_size = d.data_parallel_size;
  ps.sequence_parallel = par.sequence_parallel;
  ModelContext ctx;
  ctx.model = &cfg.model;
  ctx.derived = &d;
  ctx.ps = &ps;
  ctx.dtype = activation_dtype(d.precision);
  ctx.device = Device::Meta;
  Fp8Context fp8(Fp8Options::from_config(cfg.training, d), Device::Meta);  // the linears that run in FP8 register
  if (fp8.options().enabled()) ctx.fp8 = &fp8;

  RankParams out;
  ParamStore store(tp_rank, par.tensor);
  std::vector<std::unique_ptr<GPTModel>> chunks;
  const int v = par.virtual_pipeline, p = par.pipeline;
  for (int c = 0; c < v; ++c) {
    const LayerRange lr = stage_layers(cfg.model, par, stage, c);
    const ModelChunkSpec spec{lr.begin, lr.end, stage == 0 && c == 0, stage == p - 1 && c == v - 1};
    const int64_t before = store.local_numel();
    chunks.push_back(std::make_unique<GPTModel>(ctx, store, spec));
    out.per_chunk.push_back(store.local_numel() - before);
  }
  store.allocate(ctx.dtype, Device::Meta);  // shapes only: no memory
  out.total = store.local_numel();
  for (const Param* prm : store.params()) {
    if (prm->spec.partition_dim < 0) out.replicated += shape_numel(prm->local_shape);
    if (prm->spec.tied_copy) out.tied_copies += shape_numel(prm->local_shape);
    out.params.push_back({prm->spec.name, prm->spec.global_shape, prm->local_shape, prm->spec.partition_dim});
  }
  const std::set<std::string> fp8_linears(fp8.linear_names().begin(), fp8.linear_names().end());
  for (const Param* prm : store.params())
    if (fp8_linears.count(prm->spec.name.substr(0, prm->spec.name.rfind('.'))) && prm->spec.name.ends_with(".weight"))
      out.fp8_weight += shape_numel(prm->local_shape);
  return out;
}

const char* recompute_mode_name(RecomputePolicy::Mode m) {
  switch (m) {
    case RecomputePolicy::Mode::None: return "none";
    case RecomputePolicy::Mode::Selective: return "selective";
    case RecomputePolicy::Mode::Full: return "full";
  }
  return "?";
}

namespace {
// One decoder layer's sizes on one rank (model/kept_tensors.h LayerDims).
LayerDims layer_dims(const ModelConfig& m, const DerivedConfig& d, int tp, bool sequence_parallel, int64_t B, int64_t T) {
  LayerDims ld;
  ld.B = B;
  ld.T = T;
  ld.rows = sequence_parallel ? B * T / tp : B * T;  // residual-stream rows this rank holds
  ld.hidden = m.hidden_size;
  ld.heads = m.num_attention_heads / tp;
  ld.groups = d.num_query_groups % tp == 0 ? d.num_query_groups / tp : 1;
  ld.head_dim = d.head_dim;
  ld.ffn = d.ffn_hidden_size / tp;
  return ld;
}
int64_t kept_bytes(const std::vector<KeptTensor>& kept, DType act) {
  const int64_t e = static_cast<int64_t>(dtype_size(act)), s = stat_size(act);
  int64_t bytes = 0;
  for (const KeptTensor& t : kept) bytes += t.numel * (t.index ? 4 : t.statistic ? s : e);
  return bytes;
}
}  // namespace

int64_t layer_activation_bytes(const ModelConfig& m, const DerivedConfig& d, int tp, bool sequence_parallel, int64_t B,
                               int64_t T, DType act, RecomputePolicy::Mode mode, bool keep_norm_act) {
  // What the layer keeps, as the model describes it (model/kept_tensors.h); layer 0's spec.
  const LayerDims ld = layer_dims(m, d, tp, sequence_parallel, B, T);
  return kept_bytes(layer_kept(layer_spec(d.features, 0), d.features.activation, ld, mode, keep_norm_act), act);
}

int64_t moe_layer_activation_bytes(const ModelConfig& m, const DerivedConfig& d, int tp, bool sequence_parallel,
                                   int64_t B, int64_t T, DType act, RecomputePolicy::Mode mode, bool keep_norm_act,
                                   int ep) {
  const LayerDims ld = layer_dims(m, d, tp, sequence_parallel, B, T);
  return kept_bytes(moe_layer_kept(layer_spec(d.features, 0), d.features.activation, ld, moe_dims(m, tp, ld.rows, ep),
                                   mode, keep_norm_act),
                    act);
}

int64_t chunk_layers_activation_bytes(const ModelConfig& m, const DerivedConfig& d, int tp, bool sequence_parallel,
                                      int64_t B, int64_t T, DType act, const RecomputePolicy& policy, int num_layers) {
  auto layer = [&](RecomputePolicy::Mode mode) {
    return layer_activation_bytes(m, d, tp, sequence_parallel, B, T, act, mode, !policy.norm_act);
  };
  if (policy.mode != RecomputePolicy::Mode::Full) return num_layers * layer(policy.mode);
  const int k = std::max(1, policy.num_layers);
  if (policy.block) {  // the first k layers keep their input only, the others everything
    const int dropped = std::min(k, num_layers);
    return dropped * layer(RecomputePolicy::Mode::Full) + (num_layers - dropped) * layer(RecomputePolicy::Mode::None);
  }
  const int groups = (num_layers + k - 1) / k;  // uniform: each group of k keeps its first layer's input
  return groups * layer(RecomputePolicy::Mode::Full);
}

int64_t chunk_extra_activation_bytes(const ModelConfig& m, int tp, bool sequence_parallel, int64_t B, int64_t T,
                                     DType act, bool pre_process, bool post_process) {
  const int64_t N = B * T, C = m.hidden_size, e = static_cast<int64_t>(dtype_size(act)), s = stat_size(act);
  const int64_t rows = sequence_parallel ? N / tp : N;
  int64_t bytes = 0;
  if (pre_process) bytes += N * 4;  // token ids (int32)
  if (post_process) {
    bytes += N * 4;                     // labels (int32)
    bytes += 2 * rows * C * e;          // final norm input and output
    bytes += norm_stats(m) * rows * s;  // final norm statistics
    bytes += N * s;                     // loss log-sum-exp
  }
  return bytes;
}

int64_t logits_bytes(const DerivedConfig& d, int tp, int64_t B, int64_t T, DType act) {
  return B * T * (d.padded_vocab_size / tp) * static_cast<int64_t>(dtype_size(act));
}

int64_t attention_backward_scratch_bytes(const Config& cfg, const DerivedConfig& d, int heads, int groups, int64_t B,
                                         int64_t T, AttnBwdChunks* chunks) {
  const int64_t D = d.head_dim;
  const bool cudnn = d.precision != Precision::FP32 && cfg.training.attention_backend != "own" && T % 128 == 0 &&
                     (D == 64 || D == 128);
  if (chunks) *chunks = AttnBwdChunks{};
  if (!cudnn || heads <= 0 || B <= 0) return 0;
  groups = std::max(1, std::min(groups, heads));
  auto round256 = [](int64_t b) { return (b + 255) / 256 * 256; };
  if (!cfg.training.deterministic) return round256(4 * B * heads * T) + round256(4 * B * heads * T * D);
  const AttnBwdChunks c =
      attention_bwd_chunks(B, heads, groups, T, T, cfg.training.attention_bwd_workspace_mib * 1048576);
  if (chunks) *chunks = c;
  // delta, the partial dK and dV of a group's query heads (single heads only), dS
  const int64_t partials = c.single_heads ? 2 * round256(2 * (heads / groups) * T * D) : 0;
  return round256(4 * c.samples * c.heads * T) + partials + c.workspace;
}

namespace {
// Query heads, KV groups and sequence length of one rank's largest attention call.
void attention_rank_shape(const Config& cfg, const DerivedConfig& d, int tp, int cp, int64_t seq_length, int& heads,
                          int& groups, int64_t& T) {
  heads = cfg.model.num_attention_heads / tp;
  groups = std::max(1, static_cast<int>(d.num_query_groups / tp));
  T = seq_length / cp;  // p2p: the largest block is the causal diagonal one of the rank's own tokens
  if (cp > 1 && d.cp_comm_type == CpCommType::A2A) {  // all-to-all over heads: the whole sequence, heads / cp
    heads /= cp;
    groups = std::max(1, groups / cp);
    T = seq_length;
  }
}
}  // namespace

void context_parallel_bytes(const ModelConfig& m, const DerivedConfig& d, int tp, int cp, CpCommType type, int64_t B,
                            int64_t T, DType act, int64_t& forward, int64_t& backward) {
  forward = backward = 0;
  if (cp <= 1) return;
  const int64_t e = static_cast<int64_t>(dtype_size(act)), Tl = T / cp;
  const int64_t q = B * Tl * (m.num_attention_heads / tp) * d.head_dim * e;
  const int64_t kv = B * Tl * (d.num_query_groups / tp) * d.head_dim * e;
  if (type == CpCommType::P2P) {
    forward = (cp - 1) * 2 * kv;
    backward = forward + cp * 2 * kv;
  } else {
    forward = (2 * q + 2 * kv) * (cp - 1) / cp;
    backward = (4 * q + 4 * kv) * (cp - 1) / cp;
  }
}

// ---------------------------------------------------------------- the plan

namespace {

// Peak activation bytes over the stage's schedule: at each step, sum over chunks of
// (forwards done - backwards done) x bytes per micro-batch.
void schedule_peaks(const PlanReport& r, PlanStage& st) {
  const int v = r.vp;
  std::vector<int> live(v, 0);
  for (const pp::Action& a : pp::pipeline_schedule(r.pp, st.stage, r.num_microbatches, v)) {
    if (a.kind == pp::ActionKind::Forward) ++live[a.chunk];
    else if (a.kind == pp::ActionKind::Backward) --live[a.chunk];
    else continue;
    MT_INTERNAL_ASSERT(live[a.chunk] >= 0, "schedule runs a backward before its forward on stage ", st.stage);
    int64_t act[kNumRecomputeModes] = {}, logits = 0;
    for (int c = 0; c < v; ++c) {
      PlanChunk& ch = st.chunks[c];
      ch.max_in_flight = std::max(ch.max_in_flight, live[c]);
      for (int i = 0; i < kNumRecomputeModes; ++i) act[i] += live[c] * ch.act[i];
      logits += live[c] * ch.logits;
    }
    for (int i = 0; i < kNumRecomputeModes; ++i) st.activation[i] = std::max(st.activation[i], act[i]);
    st.logits_bytes = std::max(st.logits_bytes, logits);
  }
}

// One stage's chunks, memory and schedule peaks (one rank; rp: its parameters).
// What a dense FP8 layer keeps beyond a bf16 one, per micro-batch (model/fp8_linear.h Fp8Saved): its linears'
// inputs as transposed FP8 copies, 1 B an element over all N rows (gathered under SP) - linear_qkv, linear_proj,
// and with SwiGLU linear_fc1 and linear_fc2 - less the SwiGLU output that fc2's copy replaces when it was kept.
int64_t fp8_layer_extra_bytes(const ModelConfig& m, const DerivedConfig& d, int tp, int64_t N, DType act,
                              bool keep_norm_act) {
  const int64_t C = m.hidden_size, ffn = d.ffn_hidden_size / tp, attn = m.num_attention_heads / tp * d.head_dim;
  int64_t bytes = N * (C + attn);
  if (d.features.activation == Activation::SwiGLU)
    bytes += N * (C + ffn) - (keep_norm_act ? N * ffn * static_cast<int64_t>(dtype_size(act)) : 0);
  return bytes;
}

// Optimizer bytes a parameter (before the distributed optimizer's sharding): Adam's fp32 m and v, and the master
// weights where they are separate from the values: bf16's low halves (2 B, optim/adamw.h take_master), fp16's fp32
// copy (4 B).
int64_t optimizer_bytes_per_param(DType values) {
  return values == DType::BF16 ? 10 : values == DType::F16 ? 12 : 8;
}
const char* optimizer_bytes_text(DType values) {
  return values == DType::BF16   ? "Adam m+v 8 + master low halves 2 = 10"
         : values == DType::F16 ? "Adam m+v 8 + fp32 master 4 = 12"
                                : "Adam m+v 8";
}

PlanStage plan_stage(const Config& cfg, const DerivedConfig& d, const PlanReport& r, int s, const RankParams& rp) {
  const bool fp32 = r.activation_dtype == DType::F32, sp = r.sequence_parallel;
  const int64_t B = r.micro_batch_size, T = r.seq_length / r.cp;  // tokens of one micro-batch on one rank
  const int64_t opt_shards = r.distributed_optimizer ? int64_t{r.dp} * r.cp : 1;
  const int64_t expert_shards = r.distributed_optimizer ? int64_t{r.expert_dp} : 1;
  // An MoE layer's bytes beyond a dense layer's, per recompute mode (0 under full: both keep only the input).
  int64_t moe_extra[kNumRecomputeModes] = {};
  if (r.moe_layers > 0)
    for (int i = 0; i < kNumRecomputeModes; ++i)
      moe_extra[i] = r.moe_layer_act[i] - layer_activation_bytes(cfg.model, d, r.tp, sp, B, T, r.activation_dtype,
                                                                 kRecomputeModes[i], !r.full_policy.norm_act);
  PlanStage st;
  st.stage = s;
  st.params = rp.total;
  st.replicated_params = rp.replicated;
  for (int c = 0; c < r.vp; ++c) {
    PlanChunk ch;
    ch.chunk = c;
    ch.layers = stage_layers(cfg.model, cfg.parallel, s, c);
    ch.pre_process = s == 0 && c == 0;
    ch.post_process = s == r.pp - 1 && c == r.vp - 1;
    ch.params = rp.per_chunk[c];
    const int L = ch.layers.end - ch.layers.begin;
    const int64_t extra =
        chunk_extra_activation_bytes(cfg.model, r.tp, sp, B, T, r.activation_dtype, ch.pre_process, ch.post_process);
    for (int i = 0; i < kNumRecomputeModes; ++i) {
      RecomputePolicy policy = r.full_policy;
      policy.mode = kRecomputeModes[i];
      ch.act[i] = chunk_layers_activation_bytes(cfg.model, d, r.tp, sp, B, T, r.activation_dtype, policy, L) + extra;
    }
    // Dense FP8 layers' kept input copies (not under full recompute: its layers keep their input only).
    const Fp8Options fp8 = Fp8Options::from_config(cfg.training, d);
    for (int l = ch.layers.begin; l < ch.layers.end; ++l)
      if (!is_moe_layer(cfg.model, l) && fp8.layer_in_fp8(l, cfg.model.num_layers))
        for (int i = 0; i < kNumRecomputeModes; ++i)
          if (kRecomputeModes[i] != RecomputePolicy::Mode::Full)
            ch.act[i] += fp8_layer_extra_bytes(cfg.model, d, r.tp, B * T, r.activation_dtype, !r.full_policy.norm_act);
    // MoE layers keeping everything: all of them, except under full recompute (block: those past the first k)
    for (int l = ch.layers.begin; l < ch.layers.end; ++l) {
      if (!is_moe_layer(cfg.model, l)) continue;
      ++st.moe_layers;
      for (int i = 0; i < kNumRecomputeModes; ++i)
        if (kRecomputeModes[i] != RecomputePolicy::Mode::Full) ch.act[i] += moe_extra[i];
        else if (r.full_policy.block && l - ch.layers.begin >= std::max(1, r.full_policy.num_layers))
          ch.act[i] += moe_extra[0];
    }
    ch.logits = ch.post_process ? logits_bytes(d, r.tp, B, T, r.activation_dtype) : 0;
    st.chunks.push_back(ch);
  }
  st.expert_params = st.moe_layers * (r.num_experts / r.ep) * r.moe_layer.expert;
  const int64_t other = st.params - st.expert_params;  // reduced and sharded over data x context
  st.weight_bytes = st.params * (fp32 ? 4 : 2);
  st.grad_bytes = st.params * r.grad_bytes_per_param;
  st.optimizer_bytes = ((other + opt_shards - 1) / opt_shards +
                        (st.expert_params + expert_shards - 1) / expert_shards) *
                       optimizer_bytes_per_param(r.activation_dtype);
  st.a2a_bytes = st.moe_layers * r.num_microbatches * r.moe_a2a.total;
  st.a2a_leaving_bytes = st.moe_layers * r.num_microbatches * r.moe_a2a.leaving;
  const bool has_layers = std::any_of(st.chunks.begin(), st.chunks.end(),
                                      [](const PlanChunk& c) { return c.layers.end > c.layers.begin; });
  if (has_layers) {
    int heads = 0, groups = 0;
    int64_t Ta = 0;
    attention_rank_shape(cfg, d, r.tp, r.cp, r.seq_length, heads, groups, Ta);
    st.attention_scratch = attention_backward_scratch_bytes(cfg, d, heads, groups, B, Ta);
  }
  st.fp8_copy_bytes = 2 * rp.fp8_weight;  // 1 B per element, row-wise and transposed
  schedule_peaks(r, st);
  return st;
}

// An MoE layer's MLP slot: whatever the Meta model built there (a dense MLP until the decoder layer builds
// MoELayer; then all E experts, as if parallel.expert were 1) is replaced by what one rank of the layout holds:
// the router, its E / ep experts (one row per projection: (E/ep, out, in) of (E, out, in)), the shared expert.
void replace_moe_mlp_slots(const Config& cfg, const PlanReport& r, int stage, RankParams& rp) {
  std::vector<PlanParam> kept;
  for (PlanParam& p : rp.params) {
    const int layer = mlp_slot_layer(p.name);
    if (layer < 0 || !is_moe_layer(cfg.model, layer)) {
      kept.push_back(std::move(p));
      continue;
    }
    const int64_t n = shape_numel(p.local_shape);
    rp.total -= n;
    if (p.partition_dim < 0) rp.replicated -= n;
    for (int c = 0; c < r.vp; ++c) {
      const LayerRange lr = stage_layers(cfg.model, cfg.parallel, stage, c);
      if (layer >= lr.begin && layer < lr.end) rp.per_chunk[static_cast<size_t>(c)] -= n;
    }
  }
  rp.params = std::move(kept);
  const MoEOptions o = moe_options(cfg.model);
  const int64_t C = cfg.model.hidden_size, E = o.num_experts, El = E / r.ep, F = o.ffn_hidden_size;
  const int64_t F1 = F * (o.swiglu ? 2 : 1), Fs = o.shared_ffn_hidden_size, Fs1 = Fs * (o.swiglu ? 2 : 1);
  const MoELayerParams& mp = r.moe_layer;
  for (int c = 0; c < r.vp; ++c) {
    const LayerRange lr = stage_layers(cfg.model, cfg.parallel, stage, c);
    for (int l = lr.begin; l < lr.end; ++l) {
      if (!is_moe_layer(cfg.model, l)) continue;
      const std::string pre = str_cat("decoder.layers.", l, ".mlp.");
      rp.params.push_back({pre + "router.weight", {E, C}, {E, C}, -1});
      rp.params.push_back({pre + "experts.*.linear_fc1.weight", {E, F1, C}, {El, F1, C}, -1});
      rp.params.push_back({pre + "experts.*.linear_fc2.weight", {E, C, F}, {El, C, F}, -1});
      if (Fs > 0) {
        const int tp = r.tp;
        rp.params.push_back({pre + "shared_experts.linear_fc1.weight", {Fs1, C}, {Fs1 / tp, C}, 0});
        if (!o.swiglu) rp.params.push_back({pre + "shared_experts.linear_fc1.bias", {Fs1}, {Fs1 / tp}, 0});
        rp.params.push_back({pre + "shared_experts.linear_fc2.weight", {C, Fs}, {C, Fs / tp}, 1});
        if (!o.swiglu) rp.params.push_back({pre + "shared_experts.linear_fc2.bias", {C}, {C}, -1});
      }
      const int64_t n = mp.router + El * mp.expert + mp.shared_local;
      rp.total += n;
      rp.replicated += mp.router + El * mp.expert + mp.shared_replicated;
      rp.per_chunk[static_cast<size_t>(c)] += n;
    }
  }
}

}  // namespace

PlanReport make_plan(const Config& cfg, int world_size) { return make_plan(cfg, derive_config(cfg, world_size), world_size); }

PlanReport make_plan(const Config& cfg, const DerivedConfig& d, int world_size) {
  const ParallelConfig& par = cfg.parallel;
  PlanReport r;
  r.config_file = cfg.source_file;
  r.world_size = world_size;
  r.tp = par.tensor;
  r.pp = par.pipeline;
  r.vp = par.virtual_pipeline;
  r.cp = par.context;
  r.dp = d.data_parallel_size;
  r.ep = par.expert;
  r.micro_batch_size = cfg.training.micro_batch_size;
  r.global_batch_size = d.global_batch_size;
  r.num_microbatches = d.num_microbatches;
  r.seq_length = cfg.model.seq_length;
  r.num_layers = cfg.model.num_layers;
  r.padded_vocab_size = d.padded_vocab_size;
  r.sequence_parallel = par.sequence_parallel;
  r.distributed_optimizer = par.distributed_optimizer;
  r.precision = cfg.training.precision;
  r.recompute = cfg.training.recompute;
  r.full_policy.mode = RecomputePolicy::Mode::Full;
  r.full_policy.block = d.recompute_method == RecomputeMethod::Block;
  r.full_policy.num_layers = cfg.training.recompute_num_layers;
  r.full_policy.norm_act = cfg.training.recompute_norm_act;
  r.activation_dtype = activation_dtype(d.precision);
  r.grad_bytes_per_param = cfg.parallel.grad_reduce_in_fp32 ? 4 : 2;
  r.recompute_mode = kRecomputeModes[static_cast<int>(d.recompute)];
  r.tokens_per_iteration = d.tokens_per_iteration;

  const bool sp = r.sequence_parallel;
  const int64_t B = r.micro_batch_size, T = r.seq_length / r.cp;  // tokens of one micro-batch on one rank
  if (cfg.model.num_experts > 0) {
    const ModelConfig& m = cfg.model;
    MT_CHECK((r.dp * r.cp) % r.ep == 0, cfg.source_file, ": parallel.expert (", r.ep, ") must divide data x context (",
             r.dp, " x ", r.cp, " = ", r.dp * r.cp, " ranks: expert layers regroup them into expert x expert-data); "
             "choose parallel.expert among the divisors of ", r.dp * r.cp, " or change the world size");
    r.num_experts = m.num_experts;
    r.topk = m.moe_router_topk;
    r.expert_dp = r.dp * r.cp / r.ep;
    for (int l = 0; l < m.num_layers; ++l) r.moe_layers += is_moe_layer(m, l) ? 1 : 0;
    r.moe_layer = moe_layer_params(m, r.tp);
    for (int i = 0; i < kNumRecomputeModes; ++i)
      r.moe_layer_act[i] = moe_layer_activation_bytes(m, d, r.tp, sp, B, T, r.activation_dtype, kRecomputeModes[i],
                                                      !cfg.training.recompute_norm_act, r.ep);
    const int64_t rows = sp ? B * T / r.tp : B * T;
    r.moe_a2a = moe_a2a_bytes(m, r.ep, rows, static_cast<int64_t>(dtype_size(r.activation_dtype)),
                              r.recompute_mode == RecomputePolicy::Mode::Full);
  }
  std::map<std::string, int64_t> global_numel;  // every distinct parameter of the model, once
  std::set<std::string> table_rows;
  for (int s = 0; s < r.pp; ++s) {
    RankParams rp = count_rank_params(cfg, d, s, 0);
    if (r.moe_layers > 0) replace_moe_mlp_slots(cfg, r, s, rp);
    r.stages.push_back(plan_stage(cfg, d, r, s, rp));
    for (const PlanParam& p : rp.params) {
      global_numel[p.name] = shape_numel(p.global_shape);
      const std::string pattern = layer_pattern(p.name);
      if (!table_rows.insert(pattern).second) continue;
      r.param_table.push_back(p);
      r.param_table.back().name = pattern;
    }
  }
  for (const auto& [name, n] : global_numel) {
    r.total_params += n;
    if (name != "embedding.position_embeddings.weight" && !is_expert_param(name)) r.flop_params += n;
  }
  r.active_params = r.total_params - r.moe_layers * r.num_experts * r.moe_layer.expert + active_expert_params(cfg.model);
  for (int i = 0; i < kNumRecomputeModes; ++i)
    r.layer_act[i] = layer_activation_bytes(cfg.model, d, r.tp, sp, B, T, r.activation_dtype, kRecomputeModes[i],
                                            !cfg.training.recompute_norm_act);
  r.logits_per_microbatch = logits_bytes(d, r.tp, B, T, r.activation_dtype);
  r.deterministic = cfg.training.deterministic;
  {
    int heads = 0, groups = 0;
    int64_t Ta = 0;
    attention_rank_shape(cfg, d, r.tp, r.cp, r.seq_length, heads, groups, Ta);
    r.attention_scratch = attention_backward_scratch_bytes(cfg, d, heads, groups, B, Ta, &r.attention_chunks);
    Config other = cfg;
    other.training.deterministic = !cfg.training.deterministic;
    r.attention_scratch_other = attention_backward_scratch_bytes(other, d, heads, groups, B, Ta,
                                                                 r.deterministic ? nullptr : &r.attention_chunks);
    r.attention_heads = heads;
    r.attention_batch = B;
  }
  r.cp_comm_type = par.cp_comm_type;
  context_parallel_bytes(cfg.model, d, r.tp, r.cp, d.cp_comm_type, B, r.seq_length, r.activation_dtype,
                         r.cp_bytes_forward, r.cp_bytes_backward);
  r.flops_per_token = model_flops_per_token(r.flop_params, cfg.model, d);
  r.flops_per_iteration = static_cast<double>(r.flops_per_token) * static_cast<double>(r.tokens_per_iteration);
  r.flops_per_rank = r.flops_per_iteration / world_size;
  if (r.pp > 1) {
    r.schedule = pp::format_schedule(r.pp, r.num_microbatches, r.vp);
    r.bubble_fraction = pp::bubble_fraction(r.pp, r.num_microbatches, r.vp);
  }
  return r;
}

// ---------------------------------------------------------------- formatting

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string gib(int64_t bytes) { return fmt("%.2f", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0)); }
std::string mib(int64_t bytes) { return fmt("%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0)); }
std::string kib_or_mib(int64_t bytes) {
  return bytes < 1024 * 1024 ? fmt("%.1f KiB", static_cast<double>(bytes) / 1024.0) : mib(bytes);
}
std::string count(int64_t n) {
  const double x = static_cast<double>(n);
  if (n >= 1000000000) return fmt("%.2f B", x / 1e9);
  if (n >= 1000000) return fmt("%.1f M", x / 1e6);
  if (n >= 1000) return fmt("%.1f K", x / 1e3);
  return std::to_string(n);
}
std::string onoff(bool b) { return b ? "on" : "off"; }

// Columns padded to their widest cell: the first left-aligned, the others right-aligned.
std::string table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w;
  for (const auto& row : rows)
    for (size_t i = 0; i < row.size(); ++i) {
      if (w.size() <= i) w.push_back(0);
      w[i] = std::max(w[i], row[i].size());
    }
  std::ostringstream os;
  for (const auto& row : rows) {
    os << " ";
    for (size_t i = 0; i < row.size(); ++i) {
      const std::string pad(w[i] - row[i].size(), ' ');
      os << "  " << (i == 0 ? row[i] + pad : pad + row[i]);
    }
    os << "\n";
  }
  return os.str();
}

std::string layers_str(const LayerRange& l) {
  if (l.end == l.begin) return "none";
  return l.end - l.begin == 1 ? std::to_string(l.begin) : str_cat(l.begin, "-", l.end - 1);
}

// The mixture-of-experts section: one MoE layer, expert memory and all-to-all bytes per rank of each stage.
void format_moe(std::ostream& os, const PlanReport& r) {
  const MoELayerParams& mp = r.moe_layer;
  const int64_t El = r.num_experts / r.ep;
  const bool fp32 = r.activation_dtype == DType::F32;
  os << "Mixture of experts: " << r.num_experts << " experts, top-" << r.topk << ", in " << r.moe_layers << " of "
     << r.num_layers << " layers; expert " << r.ep << " ("
     << El << (El == 1 ? " expert" : " experts") << " per rank) x expert-data " << r.expert_dp << "\n"
     << "  one MoE layer: router " << count(mp.router) << ", one expert " << count(mp.expert) << " (all "
     << count(r.num_experts * mp.expert) << ", top-" << r.topk << " active " << count(r.topk * mp.expert) << ")"
     << (mp.shared > 0 ? str_cat(", shared expert ", count(mp.shared)) : "") << "\n";
  std::vector<std::vector<std::string>> rows{{"stage", "MoE layers", "expert params/rank", "expert weights",
                                              "expert grads", "expert optimizer", "a2a/iter", "leaving rank"}};
  const int64_t shards = r.distributed_optimizer ? r.expert_dp : 1;
  for (const PlanStage& st : r.stages)
    rows.push_back({std::to_string(st.stage), std::to_string(st.moe_layers), count(st.expert_params),
                    gib(st.expert_params * (fp32 ? 4 : 2)), gib(st.expert_params * r.grad_bytes_per_param),
                    gib((st.expert_params + shards - 1) / shards * optimizer_bytes_per_param(r.activation_dtype)), gib(st.a2a_bytes),
                    gib(st.a2a_leaving_bytes)});
  os << table(rows)
     << "  GiB per rank, part of the memory table's weights / grads / optimizer"
     << (r.distributed_optimizer ? str_cat(" (expert optimizer state distributed over expert-data ", r.expert_dp, ")")
                                 : "")
     << "; all-to-all bytes per iteration\n";
  if (r.ep > 1)
    os << "  one MoE layer, one micro-batch: all-to-all " << mib(r.moe_a2a.total) << " (" << mib(r.moe_a2a.leaving)
       << " leaving the rank: (EP-1)/EP of the token rows to the experts' ranks and back, forward and backward"
       << (r.recompute_mode == RecomputePolicy::Mode::Full ? ", and the recomputed forward" : "") << ")\n";
  else
    os << "  no all-to-all: parallel.expert 1 (every rank holds every expert)\n";
  os
     << "  one MoE decoder layer, one micro-batch: " << mib(r.moe_layer_act[0]) << " (none), "
     << mib(r.moe_layer_act[1]) << " (selective), " << mib(r.moe_layer_act[2]) << " (input only)\n"
     << "  assumes balanced routing: each rank's experts receive the rows it routes x top-k\n\n";
}

}  // namespace

std::string attention_workspace_warning(const PlanReport& r) {
  const AttnBwdChunks& c = r.attention_chunks;
  if (!r.deterministic || !c.over_cap()) return "";
  return str_cat("one query head of the deterministic attention backward needs ", mib(c.workspace),
                 " of workspace, above training.attention_bwd_workspace_mib (", c.cap / 1048576, "); it runs at ",
                 mib(c.workspace), " per call: raise training.attention_bwd_workspace_mib to ",
                 (c.workspace + 1048575) / 1048576, " to plan for it, or set training.deterministic: false (dQ "
                 "accumulated in fp32, no such workspace)");
}

std::string format_plan(const PlanReport& r) {
  std::ostringstream os;
  os << "megatrain plan: " << (r.config_file.empty() ? "config" : r.config_file) << " on " << r.world_size
     << " rank(s)\n\n";

  os << "Layout\n"
     << "  tensor " << r.tp << " x pipeline " << r.pp << " (virtual " << r.vp << ") x context " << r.cp << " x data "
     << r.dp << " = " << r.world_size << " ranks; expert " << r.ep << "\n"
     << "  global batch " << r.global_batch_size << " = micro-batch " << r.micro_batch_size << " x " << r.num_microbatches
     << " micro-batches per iteration x data " << r.dp << "; sequence " << r.seq_length << " tokens ("
     << r.tokens_per_iteration << " tokens per iteration)\n"
     << "  sequence parallel " << onoff(r.sequence_parallel) << ", distributed optimizer "
     << onoff(r.distributed_optimizer) << ", precision " << r.precision << ", recompute " << r.recompute << "\n";
  if (r.cp > 1) {
    const int64_t c = r.seq_length / (2 * r.cp);
    os << "  context " << r.cp << " (" << (r.cp_comm_type == "a2a" ? "a2a: all-to-all over heads" : "p2p: ring of key/value blocks")
       << "): each sequence in " << 2 * r.cp << " chunks of " << c << " tokens, rank r holding chunks r and "
       << 2 * r.cp - 1 << " - r (" << r.seq_length / r.cp << " tokens); per decoder layer and micro-batch each rank sends "
       << kib_or_mib(r.cp_bytes_forward) << " in forward, " << kib_or_mib(r.cp_bytes_backward) << " in backward"
       << (r.recompute != "none" ? " (+ the forward's again for the recompute)" : "") << "\n";
  }
  os << "\n";

  if (r.world_size <= 64) {
    MeshSizes ms;
    ms.tp = r.tp;
    ms.cp = r.cp;
    ms.dp = r.dp;
    ms.pp = r.pp;
    ms.ep = r.ep;
    os << "Ranks (order tp-cp-ep-dp-pp: global rank = tp + " << r.tp << " x (cp + " << r.cp << " x (dp + " << r.dp
       << " x pp)))\n"
       << format_rank_table(ms) << "\n";
  }

  os << "Parameters: " << count(r.total_params) << " (" << r.total_params << ") in the model";
  if (r.moe_layers > 0) os << ", " << count(r.active_params) << " (" << r.active_params << ") active per token";
  os << "; per rank of each stage "
     << "(every tensor-parallel rank holds the same count; replicated parameters count on each rank)\n";
  std::vector<std::vector<std::string>> rows{{"stage", "chunk", "layers", "embedding", "head", "params/rank", "of which replicated"}};
  for (const PlanStage& st : r.stages)
    for (const PlanChunk& ch : st.chunks)
      rows.push_back({std::to_string(st.stage), std::to_string(ch.chunk), layers_str(ch.layers), ch.pre_process ? "yes" : "",
                      ch.post_process ? "yes" : "", str_cat(count(ch.params), " (", ch.params, ")"),
                      ch.chunk == 0 ? count(st.replicated_params) : ""});
  os << table(rows) << "\n";

  os << "Tensor-parallel slices (tensor " << r.tp << "; decoder layers merged as *)\n";
  rows = {{"parameter", "global shape", "split dim", "shape per rank", "params per rank"}};
  for (const PlanParam& p : r.param_table)
    rows.push_back({p.name, shape_str(p.global_shape), p.partition_dim < 0 ? "replicated" : std::to_string(p.partition_dim),
                    shape_str(p.local_shape), std::to_string(shape_numel(p.local_shape))});
  os << table(rows) << "\n";

  const bool fp32 = r.activation_dtype == DType::F32;
  os << "Memory per rank, GiB (weights " << (fp32 ? "4" : "2") << " B/param, "
     << (r.grad_bytes_per_param == 4 ? "fp32 gradients 4" : "bf16 gradients 2") << " B/param, optimizer "
     << optimizer_bytes_text(r.activation_dtype) << " B/param"
     << (r.distributed_optimizer ? str_cat(" / ", r.dp * r.cp, " (distributed over data x context",
                                           r.moe_layers > 0 ? str_cat("; experts' / ", r.expert_dp, " over expert-data") : "",
                                           ")")
                                 : "")
     << "; activations in " << dtype_name(r.activation_dtype) << " for the micro-batches in flight)\n";
  rows = {{"stage", "in flight", "weights", "grads", "optimizer", "logits"}};
  const bool fp8 = !r.stages.empty() && r.stages[0].fp8_copy_bytes + r.stages.back().fp8_copy_bytes > 0;
  if (fp8) rows[0].push_back("fp8 copies");
  for (const char* what : {"act ", "total "})
    for (RecomputePolicy::Mode m : kRecomputeModes)
      rows[0].push_back(str_cat(what, recompute_mode_name(m), r.recompute_mode == m ? "*" : ""));
  for (const PlanStage& st : r.stages) {
    std::string flight;
    for (const PlanChunk& ch : st.chunks) {
      if (!flight.empty()) flight += '+';
      flight += std::to_string(ch.max_in_flight);
    }
    rows.push_back({std::to_string(st.stage), flight, gib(st.weight_bytes), gib(st.grad_bytes), gib(st.optimizer_bytes),
                    gib(st.logits_bytes)});
    if (fp8) rows.back().push_back(gib(st.fp8_copy_bytes));
    for (int i = 0; i < kNumRecomputeModes; ++i) rows.back().push_back(gib(st.activation[i]));
    for (int i = 0; i < kNumRecomputeModes; ++i) rows.back().push_back(gib(st.total(i)));
  }
  os << table(rows);
  const RecomputePolicy& fp = r.full_policy;
  os << "  * training.recompute (" << r.recompute << "); full = "
     << (fp.block ? str_cat("the first ", fp.num_layers, " layer(s) of each chunk keep only their input")
                  : str_cat("each group of ", fp.num_layers, " layer(s) keeps only its input"))
     << " (training.recompute_method / recompute_num_layers); norm and activation outputs "
     << (fp.norm_act ? "recomputed" : "kept") << " (training.recompute_norm_act)\n"
     << "  one decoder layer, one micro-batch of " << r.micro_batch_size << " x " << r.seq_length / r.cp
     << " tokens: " << mib(r.layer_act[0]) << " (none), " << mib(r.layer_act[1]) << " (selective), "
     << mib(r.layer_act[2]) << " (input only); logits " << mib(r.logits_per_microbatch) << "\n";
  if (r.attention_scratch > 0) {
    os << "  attention backward scratch (cuDNN, one layer, transient; the total counts the larger of it and the logits): "
       << mib(r.attention_scratch) << " with training.deterministic " << (r.deterministic ? "true" : "false") << ", "
       << mib(r.attention_scratch_other) << " with " << (r.deterministic ? "false" : "true") << "\n";
    const AttnBwdChunks& c = r.attention_chunks;
    if (c.workspace > 0) {
      const std::string cut =
          c.heads == r.attention_heads
              ? str_cat(c.samples, " of ", r.attention_batch, " sample(s) per call")
              : c.single_heads ? str_cat("one query head per call (", c.calls(r.attention_batch, r.attention_heads),
                                         " calls; a KV group's dK/dV summed over its heads)")
                               : str_cat(c.groups, " KV group(s) (", c.heads, " query heads) of one sample per call (",
                                         c.calls(r.attention_batch, r.attention_heads), " calls)");
      os << "  deterministic attention backward workspace (scores' gradient of one call): " << mib(c.workspace) << ", "
         << cut << (c.over_cap() ? ", above" : ", within") << " training.attention_bwd_workspace_mib ("
         << c.cap / 1048576 << ")" << (r.deterministic ? "" : "; used only with training.deterministic true") << "\n";
      const std::string warning = attention_workspace_warning(r);
      if (!warning.empty()) os << "  warning: " << warning << "\n";
    }
  }
  os << "  in flight: micro-batches whose activations each chunk keeps at the peak of its pipeline schedule\n"
     << (fp8 ? "  fp8 copies: FP8 copies of the FP8 linears' weights (row-wise and transposed, 2 B/param), kept "
               "for a step (training.fp8); the act columns count the FP8 layers' inputs kept as FP8 copies "
               "(1 B/element)\n"
             : "")
     << "  not counted: other transient buffers inside one forward/backward (and the layers being recomputed),\n"
     << "  communication buffers, allocator fragmentation, the CUDA context\n\n";

  if (r.moe_layers > 0) format_moe(os, r);

  os << "FLOPs (6 N + 12 L h s per token, N = "
     << (r.moe_layers > 0 ? str_cat("N_active = ", count(r.flop_params + r.moe_layers * r.topk * r.moe_layer.expert),
                                    " parameters one token uses")
                          : str_cat(count(r.flop_params), " parameters without learned position embeddings"))
     << ")\n"
     << "  per token " << fmt("%.4g", static_cast<double>(r.flops_per_token)) << ", per iteration "
     << fmt("%.4g", r.flops_per_iteration) << " (" << fmt("%.1f", r.flops_per_iteration / 1e15) << " PFLOP), per rank "
     << fmt("%.1f", r.flops_per_rank / 1e12) << " TFLOP\n"
     << "  time per iteration at " << fmt("%.1f", kPeakFlopsPerGpu / 1e12) << " TFLOP/s per GPU: "
     << fmt("%.3f", r.flops_per_rank / kPeakFlopsPerGpu) << " s at 100% MFU, "
     << fmt("%.3f", r.flops_per_rank / (0.4 * kPeakFlopsPerGpu)) << " s at 40% MFU\n";

  if (r.pp > 1) {
    os << "\nPipeline schedule (" << (r.vp > 1 ? "interleaved 1F1B" : "1F1B") << ", " << r.pp << " stages, "
       << r.num_microbatches << " micro-batches" << (r.vp > 1 ? str_cat(", ", r.vp, " chunks per stage") : "")
       << "; F/B micro-batch.chunk): bubble fraction " << fmt("%.1f", 100.0 * r.bubble_fraction) << "%\n"
       << r.schedule;
  }
  return os.str();
}

}  // namespace mt
