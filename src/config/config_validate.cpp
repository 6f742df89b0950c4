// Cross-field checks (validate_config) and the layout / batch arithmetic for a world size
// (derive_config). Every refusal quotes the numbers and says which key to change, before anything
// is allocated; nothing is silently adjusted.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "config/config_dependent_keys.h"
#include "config/config_loader.h"
#include "config/config_schema.h"
#include "config/model_features.h"
#include "config/config_validate_moe.h"
#include "core/check.h"

namespace mt {

namespace {

// "1, 2, 3, 5, 6, 10, 15, 30": divisors of n (at most `limit` of them).
std::string divisors_of(int64_t n, int limit = 12) {
  std::string out;
  int count = 0;
  for (int64_t d = 1; d <= n && count < limit; ++d)
    if (n % d == 0) out += (count++ ? ", " : "") + std::to_string(d);
  return out;
}

// An option string the schema has already checked (one_of) to its enum: `names` in enum order.
template <class E, size_t N>
E resolve_option(const std::string& key, const std::string& value, const char* const (&names)[N]) {
  for (size_t i = 0; i < N; ++i)
    if (value == names[i]) return static_cast<E>(i);
  MT_INTERNAL_ASSERT(false, key, " = '", value, "' passed the schema but has no enum value");
  return E{};
}

// The option strings, once (see the enums in config.h).
void resolve_options(const Config& cfg, DerivedConfig& d) {
  const TrainingConfig& t = cfg.training;
  d.precision = resolve_option<Precision>("training.precision", t.precision, {"fp32", "bf16", "fp16"});
  d.device = resolve_option<DeviceMode>("training.device", t.device, {"auto", "cpu", "cuda"});
  d.recompute = resolve_option<RecomputeGranularity>("training.recompute", t.recompute, {"none", "selective", "full"});
  d.recompute_method = resolve_option<RecomputeMethod>("training.recompute_method", t.recompute_method, {"uniform", "block"});
  d.nan_policy = resolve_option<NanPolicy>("training.nan_policy", t.nan_policy, {"stop", "skip"});
  d.decay_style = resolve_option<DecayStyle>("optimizer.decay_style", cfg.optimizer.decay_style,
                                             {"cosine", "linear", "constant"});
  d.tokenizer_type = resolve_option<TokenizerType>("data.tokenizer_type", cfg.data.tokenizer_type,
                                                   {"none", "gpt2-bpe", "hf-json"});
  d.cp_comm_type = resolve_option<CpCommType>("parallel.cp_comm_type", cfg.parallel.cp_comm_type, {"p2p", "a2a"});
  d.fp8 = resolve_option<Fp8Recipe>("training.fp8", t.fp8, {"none", "tensorwise", "delayed", "blockwise"});
  d.fp8_format = resolve_option<Fp8Format>("training.fp8_format", t.fp8_format, {"e4m3", "hybrid"});
  d.fp8_amax_compute_algo =
      resolve_option<Fp8AmaxAlgo>("training.fp8_amax_compute_algo", t.fp8_amax_compute_algo, {"max", "most_recent"});
}

// What this build can run: training.device: cuda in a build without the CUDA backend is refused
// here, so that `config` and `plan` agree with `train`. training.device: auto resolves when training
// starts (a GPU visible or not): a GPU precision on a machine without one is refused then, as the
// verdict cannot know the nodes the job will run on (and `plan` estimates GPU runs on any machine).
void check_build_supports(const std::string& pre, const DerivedConfig& d) {
#if defined(MEGATRAIN_HAVE_CUDA)
  (void)pre, (void)d;
#else
  MT_CHECK(d.device != DeviceMode::CUDA, pre, "training.device is cuda, but this megatrain was built without the CUDA "
           "backend (no CUDA toolkit found, or MEGATRAIN_CUDA=OFF); set training.device: cpu or auto");
#endif
}

// data.split: the train share must be positive (the train split is what training reads); mock data
// draws tokens from at least two ids.
void check_data(const std::string& pre, const Config& cfg) {
  const DataConfig& dc = cfg.data;
  MT_CHECK(!dc.split.empty() && dc.split[0] > 0, pre, "data.split = ", format_field(*find_config_field("data.split"), cfg),
           ": the train share (first weight) is 0, so there is nothing to train on; give it a positive weight, e.g. "
           "data.split: [98, 1, 1]");
  if (dc.mock)
    MT_CHECK(cfg.model.vocab_size >= 2, pre, "model.vocab_size (", cfg.model.vocab_size,
             ") must be >= 2 with data.mock: true (mock tokens are drawn below it)");
}

// Micro-batches x chunks the pipeline's message tags allow: tags 2 m v - 1 stay <= 32766 (the
// schedule's kMaxTag in src/parallel/pipeline_schedule.cpp; NCCL/MPI guarantee 32767 tags).
constexpr int64_t kMaxPipelineMicrobatchChunks = (32766 + 1) / 2;

// What context parallelism (parallel.context > 1) runs with today; the sequence split itself is checked with the
// other sequence splits. groups_local: key/value heads per tensor-parallel rank.
void check_context_parallel(const std::string& pre, const Config& cfg, int64_t groups_local) {
  const int64_t cp = cfg.parallel.context;
  if (cfg.parallel.cp_comm_type == "a2a")
    MT_CHECK(groups_local % cp == 0, pre, "parallel.cp_comm_type a2a splits each tensor rank's key/value heads over "
             "parallel.context (", cp, "), but model.num_query_groups / parallel.tensor = ", groups_local,
             " is not divisible by it; set parallel.cp_comm_type: p2p or a context size dividing ", groups_local);
  MT_CHECK(cfg.model.dropout == 0, pre, "model.dropout (", format_double(cfg.model.dropout), ") with parallel.context (",
           cp, ") > 1 is not supported yet (dropout masks are keyed by whole-sequence positions); set model.dropout: 0 "
           "or parallel.context: 1");
  MT_CHECK(!cfg.model.moe_router_force_load_balancing, pre, "model.moe_router_force_load_balancing with "
           "parallel.context (", cp, ") > 1 is not supported (the random logits are keyed by each token's position in "
           "its sequence; a context rank's tokens are two chunks); set parallel.context: 1 or remove "
           "model.moe_router_force_load_balancing");
  MT_CHECK(cfg.model.num_experts == 0, pre, "model.num_experts (", cfg.model.num_experts, ") with parallel.context (",
           cp, ") > 1 is not supported yet; set parallel.context: 1 for mixture-of-experts models");
  // The ring's blocks are chunks of seq_length / (2 x context) tokens, what cuDNN sees as T and Tk (a2a attends over
  // the whole sequence: seq_length % 128, checked with the other attention_backend rules).
  const int64_t chunk = cfg.model.seq_length / (2 * cp);
  MT_CHECK(cfg.training.attention_backend != "cudnn" || cfg.parallel.cp_comm_type != "p2p" || chunk % 128 == 0, pre,
           "training.attention_backend is cudnn but the context-parallel chunks (model.seq_length / (2 x "
           "parallel.context) = ", chunk, " tokens) are not a multiple of 128; set training.attention_backend: auto "
           "(cuDNN where it can, else our kernels) or own, or a seq_length that makes them one");
}

}  // namespace

void validate_config(const Config& cfg) {
  const std::string& origin = cfg.source_file;
  const std::string pre = config_error_prefix(origin);
  for (const ConfigField& f : config_fields()) check_field_value(f, cfg, origin);

  const ParallelConfig& p = cfg.parallel;
  const TrainingConfig& t = cfg.training;
  const OptimizerConfig& o = cfg.optimizer;

  const ModelConfig& m = cfg.model;
  const ModelFeatures features = resolve_model_features(cfg);  // the feature keys and their combinations
  MT_CHECK(!(t.device == "cpu" && t.precision != "fp32"), pre, "training.precision is ", t.precision,
           " but training.device is cpu: the CPU backend runs fp32; set training.precision: fp32");
  // FP8 (Megatron: bf16 only): on the GPU the FP8 GEMMs read and write bf16 around them; the CPU emulates the
  // FP8 rounding around its fp32 reference (training.device cpu needs fp32 anyway, checked above).
  MT_CHECK(t.fp8 == "none" || t.precision == "bf16" || t.device == "cpu", pre, "training.fp8 is ", t.fp8,
           " but training.precision is ", t.precision, ": FP8 training on the GPU needs training.precision: bf16 (on "
           "the CPU, training.device: cpu with fp32, it is emulated)");
  MT_CHECK(p.grad_reduce_in_fp32 || t.fp8 == "none", pre, "parallel.grad_reduce_in_fp32 is false but training.fp8 "
           "is ", t.fp8, ": the FP8 weight-gradient GEMMs write fp32 gradients; set parallel.grad_reduce_in_fp32: true "
           "or training.fp8: none");
  MT_CHECK(!(t.fp8 == "delayed" && p.pipeline > 1 && !cfg.checkpoint.dir.empty()), pre, "training.fp8 delayed "
           "with parallel.pipeline > 1 cannot checkpoint its amax histories yet (only the first stage's would be "
           "saved); use training.fp8: tensorwise or blockwise, parallel.pipeline: 1, or no checkpoint.dir");
  if (t.attention_backend == "cudnn") {  // what cuDNN's attention runs (cuda/attention_cudnn.cu shape_ok)
    const std::string fix = "; set training.attention_backend: auto (cuDNN where it can, else our kernels) or own";
    const int64_t head_dim = features.kv_channels;
    MT_CHECK(t.device != "cpu", pre, "training.attention_backend is cudnn but training.device is cpu", fix);
    MT_CHECK(t.precision != "fp32", pre, "training.attention_backend is cudnn but training.precision is fp32 (cuDNN's "
             "attention runs bf16 and fp16)", fix);
    MT_CHECK(m.seq_length % 128 == 0, pre, "training.attention_backend is cudnn but model.seq_length (", m.seq_length,
             ") is not a multiple of 128", fix);
    MT_CHECK(head_dim == 64 || head_dim == 128, pre, "training.attention_backend is cudnn but the head dim "
             "(model.kv_channels, or hidden_size / num_attention_heads: ", head_dim, ") is not 64 or 128", fix);
  }

  validate_moe_config(cfg, pre);
  check_dependent_keys(cfg, features, pre);
  MT_CHECK(p.virtual_pipeline == 1 || p.pipeline > 1, pre, "parallel.virtual_pipeline (", p.virtual_pipeline,
           ") > 1 needs parallel.pipeline > 1 (it interleaves chunks of the pipeline stages); set virtual_pipeline: 1 "
           "or pipeline > 1");
  MT_CHECK(!p.sequence_parallel || p.tensor > 1, pre, "parallel.sequence_parallel needs parallel.tensor > 1 (it splits "
           "activations over the tensor-parallel ranks); set sequence_parallel: false or tensor > 1");
  MT_CHECK((p.decoder_first_pipeline_num_layers == 0 && p.decoder_last_pipeline_num_layers == 0) || p.pipeline > 1, pre,
           "parallel.decoder_first_pipeline_num_layers (", p.decoder_first_pipeline_num_layers,
           ") / decoder_last_pipeline_num_layers (", p.decoder_last_pipeline_num_layers,
           ") need parallel.pipeline > 1; set them to 0");

  MT_CHECK(!t.skip_train || t.eval_iters > 0, pre, "training.skip_train evaluates and trains nothing, but "
           "training.eval_iters is 0; set eval_iters > 0 (the batches to evaluate) or skip_train: false");

  MT_CHECK(o.min_lr <= o.lr, pre, "optimizer.min_lr (", format_double(o.min_lr), ") must be <= optimizer.lr (",
           format_double(o.lr), ")");
  const int64_t decay_iters = o.lr_decay_iters > 0 ? o.lr_decay_iters : t.train_iters;
  MT_CHECK(o.warmup_iters <= decay_iters, pre, "optimizer.warmup_iters (", o.warmup_iters,
           ") must be <= optimizer.lr_decay_iters (", decay_iters,
           o.lr_decay_iters > 0 ? "" : ", i.e. training.train_iters", "); lower warmup_iters or raise lr_decay_iters");
  MT_CHECK(o.min_loss_scale <= o.initial_loss_scale, pre, "optimizer.min_loss_scale (", format_double(o.min_loss_scale),
           ") must be <= optimizer.initial_loss_scale (", format_double(o.initial_loss_scale), ")");

  double split_sum = 0;
  for (double v : cfg.data.split) split_sum += v;
  MT_CHECK(split_sum > 0, pre, "data.split = ", format_field(*find_config_field("data.split"), cfg),
           ": the train/valid/test proportions must have a positive sum (e.g. [98, 1, 1])");
  MT_CHECK(!cfg.checkpoint.load.empty(), pre, "checkpoint.load is empty: use auto, none or a checkpoint path");
}

int smallest_world_size(const Config& cfg) {
  const auto fits = [&](int64_t w) {
    try {
      derive_config(cfg, static_cast<int>(w));
      return true;
    } catch (const Error&) {
      return false;
    }
  };
  if (fits(1)) return 1;
  const int64_t base = int64_t{cfg.parallel.tensor} * cfg.parallel.pipeline * cfg.parallel.context;
  for (int64_t k = 1; base > 0 && k <= 1024 && base * k <= std::numeric_limits<int>::max(); ++k)
    if (fits(base * k)) return static_cast<int>(base * k);
  return 1;
}

DerivedConfig derive_config(const Config& cfg, int world_size) {
  const std::string pre = config_error_prefix(cfg.source_file);
  MT_CHECK(world_size >= 1, pre, "world size ", world_size, " must be >= 1");
  validate_config(cfg);

  const ModelConfig& m = cfg.model;
  const ParallelConfig& p = cfg.parallel;
  const TrainingConfig& t = cfg.training;
  DerivedConfig d;
  d.world_size = world_size;
  resolve_options(cfg, d);
  check_build_supports(pre, d);
  check_data(pre, cfg);

  // ---- ranks: world = tensor x pipeline x context x data
  const int64_t tp = p.tensor, pp = p.pipeline, cp = p.context, vpp = p.virtual_pipeline;
  const int64_t mp = tp * pp * cp;
  if (world_size % mp != 0) {
    std::string fits;
    const int64_t k0 = std::max<int64_t>(1, world_size / mp - 1);
    for (int64_t k = k0; k < k0 + 4; ++k) fits += str_cat(k == k0 ? "" : ", ", k * mp, " (data-parallel ", k, ")");
    MT_CHECK(false, pre, "world size ", world_size, " is not divisible by parallel.tensor (", tp, ") x parallel.pipeline (",
             pp, ") x parallel.context (", cp, ") = ", mp, "; world sizes that fit: ", fits,
             ", ...; or change tensor/pipeline/context so that their product divides ", world_size);
  }
  const int64_t dp = world_size / mp;
  d.data_parallel_size = static_cast<int>(dp);
  // expert layers regroup the data x context ranks into expert x expert-data ranks
  MT_CHECK((dp * cp) % p.expert == 0, pre, "parallel.expert (", p.expert, ") must divide data-parallel (", dp,
           ", = world size ", world_size, " / (tensor x pipeline x context)) x parallel.context (", cp, ") = ", dp * cp,
           "; choose parallel.expert among ", divisors_of(dp * cp), " or start more ranks");

  // ---- attention heads
  const int64_t heads = m.num_attention_heads;
  const int64_t groups = m.num_query_groups > 0 ? m.num_query_groups : heads;
  d.num_query_groups = static_cast<int>(groups);
  MT_CHECK(heads % groups == 0, pre, "model.num_attention_heads (", heads, ") must be divisible by model.num_query_groups (",
           groups, "): each key/value head serves a whole number of query heads; use one of ", divisors_of(heads));
  MT_CHECK(heads % tp == 0, pre, "model.num_attention_heads (", heads, ") must be divisible by parallel.tensor (", tp,
           "); tensor sizes that fit: ", divisors_of(heads));
  MT_CHECK(groups % tp == 0, pre, "model.num_query_groups (", groups, m.num_query_groups > 0 ? "" : ", i.e. num_attention_heads",
           ") must be divisible by parallel.tensor (", tp, "): each tensor-parallel rank holds whole key/value heads "
           "(replicating them over tensor ranks is not supported yet); tensor sizes that fit: ", divisors_of(groups),
           ", or raise num_query_groups");
  d.features = resolve_model_features(cfg);  // also checks hidden_size / heads when kv_channels is unset
  d.head_dim = d.features.kv_channels;

  // ---- MLP and vocabulary
  const int64_t ffn = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * int64_t{m.hidden_size};
  MT_CHECK(ffn <= std::numeric_limits<int>::max(), pre, "model.ffn_hidden_size (4 x hidden_size = ", ffn, ") is too large");
  d.ffn_hidden_size = static_cast<int>(ffn);
  MT_CHECK(ffn % tp == 0, pre, "model.ffn_hidden_size (", m.ffn_hidden_size > 0 ? "" : "4 x hidden_size = ", ffn,
           ") must be divisible by parallel.tensor (", tp, ")");
  const int64_t multiple = int64_t{m.make_vocab_size_divisible_by} * tp;
  const int64_t padded = (int64_t{m.vocab_size} + multiple - 1) / multiple * multiple;
  MT_CHECK(padded <= std::numeric_limits<int>::max(), pre, "model.vocab_size (", m.vocab_size, ") padded to a multiple of ",
           multiple, " is too large");
  d.padded_vocab_size = static_cast<int>(padded);

  // ---- layers over pipeline stages (never dropped, never moved silently)
  const int64_t layers = m.num_layers;
  const int64_t first = p.decoder_first_pipeline_num_layers, last = p.decoder_last_pipeline_num_layers;
  if (first == 0 && last == 0) {
    MT_CHECK(layers % (pp * vpp) == 0, pre, "model.num_layers (", layers, ") cannot be split evenly over parallel.pipeline (",
             pp, ") x parallel.virtual_pipeline (", vpp,
             ") stages; set parallel.decoder_first_pipeline_num_layers / decoder_last_pipeline_num_layers or choose "
             "num_layers divisible by ", pp * vpp);
  } else {
    const int64_t middle = pp - (first > 0) - (last > 0);
    const int64_t rest = layers - first - last;
    MT_CHECK(rest >= 0, pre, "parallel.decoder_first_pipeline_num_layers (", first, ") + decoder_last_pipeline_num_layers (",
             last, ") = ", first + last, " is more than model.num_layers (", layers, ")");
    MT_CHECK(vpp == 1 || (first % vpp == 0 && last % vpp == 0), pre, "parallel.decoder_first_pipeline_num_layers (", first,
             ") and decoder_last_pipeline_num_layers (", last, ") must be divisible by parallel.virtual_pipeline (", vpp,
             "): each stage's layers are split into ", vpp, " chunks");
    if (middle == 0)
      MT_CHECK(rest == 0, pre, "with parallel.pipeline (", pp, ") there are no middle stages: decoder_first_pipeline_num_layers (",
               first, ") + decoder_last_pipeline_num_layers (", last, ") must equal model.num_layers (", layers, ")");
    else
      MT_CHECK(rest >= middle * vpp && rest % (middle * vpp) == 0, pre, "model.num_layers (", layers, ") minus ",
               "decoder_first_pipeline_num_layers (", first, ") and decoder_last_pipeline_num_layers (", last, ") leaves ",
               rest, " layers, which cannot be split evenly over the ", middle, " other pipeline stages x parallel.virtual_pipeline (",
               vpp, "); change the first/last counts so that the rest is a positive multiple of ", middle * vpp);
  }

  // ---- sequence splits
  const int64_t seq = m.seq_length;
  if (cp > 1)
    MT_CHECK(seq % (2 * cp) == 0, pre, "model.seq_length (", seq, ") must be divisible by 2 x parallel.context (", cp,
             ") = ", 2 * cp, " (each context rank holds two chunks, balancing the causal mask)");
  if (p.sequence_parallel)
    MT_CHECK((seq / cp) % tp == 0, pre, "model.seq_length (", seq, cp > 1 ? str_cat(" / parallel.context (", cp, ")") : "",
             ") must be divisible by parallel.tensor (", tp, ") with parallel.sequence_parallel: true; choose seq_length ",
             "divisible by ", tp * cp * (cp > 1 ? 2 : 1), " or set sequence_parallel: false");

  if (cp > 1) check_context_parallel(pre, cfg, groups / tp);

  // ---- batch arithmetic (never adjusted)
  const int64_t per_step = int64_t{t.micro_batch_size} * dp;
  const int64_t gbs = t.global_batch_size > 0 ? t.global_batch_size : per_step;
  if (gbs % per_step != 0) {
    const int64_t below = gbs / per_step * per_step, above = below + per_step;
    MT_CHECK(false, pre, "training.global_batch_size (", gbs, ") must be a multiple of training.micro_batch_size (",
             t.micro_batch_size, ") x data-parallel size (", dp, ") = ", per_step, "; nearest that fit: ",
             below > 0 ? str_cat(below, " or ") : "", above, " (0 means ", per_step,
             "), or change micro_batch_size or the parallel layout");
  }
  MT_CHECK(gbs <= std::numeric_limits<int>::max(), pre, "training.global_batch_size (", gbs, ") is too large");
  d.global_batch_size = static_cast<int>(gbs);
  d.num_microbatches = static_cast<int>(gbs / per_step);

  // ---- the pipeline schedule's needs
  if (pp > 1) {
    const int64_t mb = d.num_microbatches;
    if (vpp > 1)
      MT_CHECK(mb % pp == 0, pre, "the interleaved pipeline schedule (parallel.virtual_pipeline ", vpp, ") needs the "
               "number of micro-batches (", mb, " = training.global_batch_size ", gbs, " / (micro_batch_size ",
               t.micro_batch_size, " x data-parallel ", dp, ")) to be a multiple of parallel.pipeline (", pp,
               "); change training.global_batch_size to a multiple of ", pp * per_step, " or set virtual_pipeline: 1");
    MT_CHECK(mb * vpp <= kMaxPipelineMicrobatchChunks, pre, "the pipeline schedule needs micro-batches (", mb,
             ") x parallel.virtual_pipeline (", vpp, ") = ", mb * vpp, " <= ", kMaxPipelineMicrobatchChunks,
             " (its message tags must stay below 32767); raise training.micro_batch_size or lower global_batch_size");
  }

  d.lr_decay_iters = cfg.optimizer.lr_decay_iters > 0 ? cfg.optimizer.lr_decay_iters : t.train_iters;
  d.tokens_per_iteration = gbs * seq;
  return d;
}

}  // namespace mt
