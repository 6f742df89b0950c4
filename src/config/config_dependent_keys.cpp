#include "config/config_dependent_keys.h"

#include <variant>

#include "config/config_schema.h"
#include "config/model_features.h"
#include "core/check.h"

namespace mt {

namespace {
// `key` acts only when `active`: when `master` is `wanted`. `now`: the master's value as the user sees it, where
// the schema's text is not (null: format_field).
struct Rule {
  const char* key;
  const char* master;
  const char* wanted;
  bool (*active)(const Config&, const ModelFeatures&);
  std::string (*now)(const Config&, const ModelFeatures&) = nullptr;
};

bool full_recompute(const Config& c, const ModelFeatures&) { return c.training.recompute == "full"; }
bool fp16(const Config& c, const ModelFeatures&) { return c.training.precision == "fp16"; }
bool bf16(const Config& c, const ModelFeatures&) { return c.training.precision == "bf16"; }
bool any_fp8(const Config& c, const ModelFeatures&) { return c.training.fp8 != "none"; }
bool delayed_fp8(const Config& c, const ModelFeatures&) { return c.training.fp8 == "delayed"; }
bool first_last_bf16(const Config& c, const ModelFeatures&) { return c.training.fp8_first_last_layers_bf16; }
bool rope_scaling(const Config& c, const ModelFeatures&) { return c.model.rope_scaling; }
constexpr const char* kFp16 = "fp16 (bf16 and fp32 need no loss scale)";
constexpr const char* kAnyFp8 = "tensorwise, delayed or blockwise";

const Rule kRules[] = {
    {"model.rope_theta", "model.position_embedding_type", "rope",
     [](const Config&, const ModelFeatures& f) { return f.position_embedding == PositionEmbedding::RoPE; },
     // an arch preset may fill it (unset in the file): the resolved one
     [](const Config&, const ModelFeatures& f) { return std::string(position_embedding_name(f.position_embedding)); }},
    {"model.rope_scaling_factor", "model.rope_scaling", "true (Llama 3.x frequency scaling)", rope_scaling},
    {"model.rope_scaling_low_freq_factor", "model.rope_scaling", "true (Llama 3.x frequency scaling)", rope_scaling},
    {"model.rope_scaling_high_freq_factor", "model.rope_scaling", "true (Llama 3.x frequency scaling)", rope_scaling},
    {"model.rope_scaling_original_max_position_embeddings", "model.rope_scaling", "true (Llama 3.x frequency scaling)",
     rope_scaling},
    {"model.moe_aux_loss_coeff", "model.moe_router_load_balancing_type", "aux_loss or seq_aux_loss",
     [](const Config& c, const ModelFeatures&) { return c.model.moe_router_load_balancing_type != "none"; }},
    {"model.moe_router_bias_update_rate", "model.moe_router_enable_expert_bias", "true",
     [](const Config& c, const ModelFeatures&) { return c.model.moe_router_enable_expert_bias; }},
    {"parallel.cp_comm_type", "parallel.context", "> 1",
     [](const Config& c, const ModelFeatures&) { return c.parallel.context > 1; }},
    {"parallel.grad_reduce_in_fp32", "training.precision", "bf16 (fp32 and fp16 keep fp32 gradients)", bf16},
    {"parallel.tp_comm_overlap", "parallel.tensor", "> 1",
     [](const Config& c, const ModelFeatures&) { return c.parallel.tensor > 1; }},
    {"training.recompute_method", "training.recompute", "full", full_recompute},
    {"training.recompute_num_layers", "training.recompute", "full", full_recompute},
    {"training.attention_bwd_workspace_mib", "training.deterministic", "true",
     [](const Config& c, const ModelFeatures&) { return c.training.deterministic; }},
    {"training.nan_max_skips", "training.nan_policy", "skip",
     [](const Config& c, const ModelFeatures&) { return c.training.nan_policy == "skip"; }},
    {"training.fp8_format", "training.fp8", kAnyFp8, any_fp8},
    {"training.fp8_margin", "training.fp8", "tensorwise or delayed (blockwise scales have no margin)",
     [](const Config& c, const ModelFeatures&) { return c.training.fp8 == "tensorwise" || c.training.fp8 == "delayed"; }},
    {"training.fp8_amax_history_len", "training.fp8", "delayed", delayed_fp8},
    {"training.fp8_amax_compute_algo", "training.fp8", "delayed", delayed_fp8},
    {"training.fp8_first_last_layers_bf16", "training.fp8", kAnyFp8, any_fp8},
    {"training.num_layers_at_start_in_bf16", "training.fp8_first_last_layers_bf16", "true", first_last_bf16},
    {"training.num_layers_at_end_in_bf16", "training.fp8_first_last_layers_bf16", "true", first_last_bf16},
    {"optimizer.initial_loss_scale", "training.precision", kFp16, fp16},
    {"optimizer.min_loss_scale", "training.precision", kFp16, fp16},
    {"optimizer.loss_scale_window", "training.precision", kFp16, fp16},
    {"optimizer.hysteresis", "training.precision", kFp16, fp16},
};

const ConfigField& field(const char* path) {
  const ConfigField* f = find_config_field(path);
  MT_INTERNAL_ASSERT(f && !f->optional, "config_dependent_keys: no plain schema key ", path);
  return *f;
}

std::string master_value(const Rule& r, const Config& cfg, const ModelFeatures& f) {
  return r.now ? r.now(cfg, f) : format_field(field(r.master), cfg);
}
}  // namespace

void check_dependent_keys(const Config& cfg, const ModelFeatures& f, const std::string& pre) {
  const Config defaults;
  for (const Rule& r : kRules)
    MT_CHECK(field_equal(field(r.key), cfg, defaults) || r.active(cfg, f), pre, r.key, " is set but ", r.master,
             " is ", master_value(r, cfg, f), ": it acts only with ", r.master, " ", r.wanted, "; remove ", r.key,
             " or change ", r.master);
}

void reset_inactive_dependent_keys(Config& cfg) {
  const Config defaults;
  const ModelFeatures f = resolve_model_features(cfg);
  for (const Rule& r : kRules) {
    const ConfigField& k = field(r.key);
    if (field_equal(k, cfg, defaults) || r.active(cfg, f)) continue;
    std::visit([&](auto* dst) { *dst = *std::get<decltype(dst)>(k.at(defaults)); }, k.at(cfg));
  }
}

}  // namespace mt
