#include "config/config_dependent_keys.h"

#include "core/check.h"

namespace mt {

namespace {
// `key` is set but acts only when `master` is `wanted` (it is `now`).
struct Dependent {
  bool set;
  const char* key;
  bool active;
  const char* master;
  std::string now;
  const char* wanted;
};
}  // namespace

void check_dependent_keys(const Config& cfg, const std::string& pre) {
  const Config d;  // the defaults
  const TrainingConfig &t = cfg.training, &td = d.training;
  const OptimizerConfig &o = cfg.optimizer, &od = d.optimizer;
  const bool fp8 = t.fp8 != "none";
  const Dependent keys[] = {
      {t.recompute_method != td.recompute_method, "training.recompute_method", t.recompute == "full",
       "training.recompute", t.recompute, "full"},
      {t.recompute_num_layers != td.recompute_num_layers, "training.recompute_num_layers", t.recompute == "full",
       "training.recompute", t.recompute, "full"},
      {t.attention_bwd_workspace_mib != td.attention_bwd_workspace_mib, "training.attention_bwd_workspace_mib",
       t.deterministic, "training.deterministic", "false", "true"},
      {t.nan_max_skips != td.nan_max_skips, "training.nan_max_skips", t.nan_policy == "skip", "training.nan_policy",
       t.nan_policy, "skip"},
      {t.fp8_format != td.fp8_format, "training.fp8_format", fp8, "training.fp8", t.fp8,
       "tensorwise, delayed or blockwise"},
      {t.fp8_margin != td.fp8_margin, "training.fp8_margin", t.fp8 == "tensorwise" || t.fp8 == "delayed",
       "training.fp8", t.fp8, "tensorwise or delayed (blockwise scales have no margin)"},
      {t.fp8_amax_history_len != td.fp8_amax_history_len, "training.fp8_amax_history_len", t.fp8 == "delayed",
       "training.fp8", t.fp8, "delayed"},
      {t.fp8_amax_compute_algo != td.fp8_amax_compute_algo, "training.fp8_amax_compute_algo", t.fp8 == "delayed",
       "training.fp8", t.fp8, "delayed"},
      {t.fp8_first_last_layers_bf16 != td.fp8_first_last_layers_bf16, "training.fp8_first_last_layers_bf16", fp8,
       "training.fp8", t.fp8, "tensorwise, delayed or blockwise"},
      {t.num_layers_at_start_in_bf16 != td.num_layers_at_start_in_bf16, "training.num_layers_at_start_in_bf16",
       t.fp8_first_last_layers_bf16, "training.fp8_first_last_layers_bf16", "false", "true"},
      {t.num_layers_at_end_in_bf16 != td.num_layers_at_end_in_bf16, "training.num_layers_at_end_in_bf16",
       t.fp8_first_last_layers_bf16, "training.fp8_first_last_layers_bf16", "false", "true"},
      {o.initial_loss_scale != od.initial_loss_scale, "optimizer.initial_loss_scale", t.precision == "fp16",
       "training.precision", t.precision, "fp16 (bf16 and fp32 need no loss scale)"},
      {o.min_loss_scale != od.min_loss_scale, "optimizer.min_loss_scale", t.precision == "fp16", "training.precision",
       t.precision, "fp16 (bf16 and fp32 need no loss scale)"},
      {o.loss_scale_window != od.loss_scale_window, "optimizer.loss_scale_window", t.precision == "fp16",
       "training.precision", t.precision, "fp16 (bf16 and fp32 need no loss scale)"},
      {o.hysteresis != od.hysteresis, "optimizer.hysteresis", t.precision == "fp16", "training.precision",
       t.precision, "fp16 (bf16 and fp32 need no loss scale)"},
  };
  for (const Dependent& k : keys)
    MT_CHECK(!k.set || k.active, pre, k.key, " is set but ", k.master, " is ", k.now, ": it acts only with ", k.master,
             " ", k.wanted, "; remove ", k.key, " or change ", k.master);
}

}  // namespace mt
