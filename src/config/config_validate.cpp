// Cross-field checks (validate_config) and the layout / batch arithmetic for a world size
// (derive_config). Every refusal quotes the numbers and says which key to change, before anything
// is allocated; nothing is silently adjusted.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "config/config_loader.h"
#include "config/config_schema.h"
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

// Llama's SwiGLU size: 8/3 x hidden rounded up to a multiple of 256 (a suggestion only).
int64_t llama_ffn_suggestion(int64_t hidden) { return (8 * hidden / 3 + 255) / 256 * 256; }

}  // namespace

void validate_config(const Config& cfg) {
  const std::string& origin = cfg.source_file;
  const std::string pre = config_error_prefix(origin);
  for (const ConfigField& f : config_fields()) check_field_value(f, cfg, origin);

  const ModelConfig& m = cfg.model;
  const ParallelConfig& p = cfg.parallel;
  const TrainingConfig& t = cfg.training;
  const OptimizerConfig& o = cfg.optimizer;

  if (m.arch == "gpt2")
    MT_CHECK(m.num_query_groups == 0 || m.num_query_groups == m.num_attention_heads, pre, "model.num_query_groups (",
             m.num_query_groups, ") must be 0 or model.num_attention_heads (", m.num_attention_heads,
             ") for arch gpt2 (grouped-query attention is a llama feature); set num_query_groups: 0 or arch: llama");
  if (m.arch == "llama")
    MT_CHECK(m.ffn_hidden_size > 0, pre, "model.ffn_hidden_size is required for arch llama (0 means 4 x hidden_size "
             "only for gpt2); Llama uses about 8/3 x hidden_size, e.g. ffn_hidden_size: ",
             llama_ffn_suggestion(m.hidden_size), " for hidden_size ", m.hidden_size);
  MT_CHECK(!(t.device == "cpu" && t.precision != "fp32"), pre, "training.precision is ", t.precision,
           " but training.device is cpu: the CPU backend runs fp32; set training.precision: fp32");

  MT_CHECK(p.expert == 1, pre, "parallel.expert > 1 needs a mixture-of-experts model, which is not supported yet "
           "(parallel.expert is ", p.expert, "); set parallel.expert: 1");
  validate_moe_config(cfg, pre);
  MT_CHECK(p.virtual_pipeline == 1 || p.pipeline > 1, pre, "parallel.virtual_pipeline (", p.virtual_pipeline,
           ") > 1 needs parallel.pipeline > 1 (it interleaves chunks of the pipeline stages); set virtual_pipeline: 1 "
           "or pipeline > 1");
  MT_CHECK(!p.sequence_parallel || p.tensor > 1, pre, "parallel.sequence_parallel needs parallel.tensor > 1 (it splits "
           "activations over the tensor-parallel ranks); set sequence_parallel: false or tensor > 1");
  MT_CHECK((p.decoder_first_pipeline_num_layers == 0 && p.decoder_last_pipeline_num_layers == 0) || p.pipeline > 1, pre,
           "parallel.decoder_first_pipeline_num_layers (", p.decoder_first_pipeline_num_layers,
           ") / decoder_last_pipeline_num_layers (", p.decoder_last_pipeline_num_layers,
           ") need parallel.pipeline > 1; set them to 0");

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

DerivedConfig derive_config(const Config& cfg, int world_size) {
  const std::string pre = config_error_prefix(cfg.source_file);
  MT_CHECK(world_size >= 1, pre, "world size ", world_size, " must be >= 1");
  validate_config(cfg);

  const ModelConfig& m = cfg.model;
  const ParallelConfig& p = cfg.parallel;
  const TrainingConfig& t = cfg.training;
  DerivedConfig d;
  d.world_size = world_size;

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

  // ---- attention heads
  const int64_t heads = m.num_attention_heads;
  const int64_t groups = m.num_query_groups > 0 ? m.num_query_groups : heads;
  d.num_query_groups = static_cast<int>(groups);
  MT_CHECK(heads % groups == 0, pre, "model.num_attention_heads (", heads, ") must be divisible by model.num_query_groups (",
           groups, "): each key/value head serves a whole number of query heads; use one of ", divisors_of(heads));
  MT_CHECK(heads % tp == 0, pre, "model.num_attention_heads (", heads, ") must be divisible by parallel.tensor (", tp,
           "); tensor sizes that fit: ", divisors_of(heads));
  MT_CHECK(groups % tp == 0 || tp % groups == 0, pre, "model.num_query_groups (", groups, ") and parallel.tensor (", tp,
           ") must divide one another (groups are split over the tensor ranks, or each group is replicated on "
           "tensor/groups ranks); tensor sizes that fit: ", divisors_of(groups), " or multiples of ", groups,
           " that divide num_attention_heads");
  MT_CHECK(m.hidden_size % heads == 0, pre, "model.hidden_size (", m.hidden_size,
           ") must be divisible by model.num_attention_heads (", heads, ") (head_dim = hidden_size / heads)");
  d.head_dim = static_cast<int>(m.hidden_size / heads);
  if (m.arch == "llama")
    MT_CHECK(d.head_dim % 2 == 0, pre, "head_dim = model.hidden_size (", m.hidden_size, ") / num_attention_heads (",
             heads, ") = ", d.head_dim, " must be even for RoPE (arch llama)");

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

  d.lr_decay_iters = cfg.optimizer.lr_decay_iters > 0 ? cfg.optimizer.lr_decay_iters : t.train_iters;
  d.tokens_per_iteration = gbs * seq;
  return d;
}

}  // namespace mt
