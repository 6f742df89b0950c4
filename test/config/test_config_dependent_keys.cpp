// Keys that act only with another key's setting (config/config_dependent_keys.h): one set while that setting is off
// is refused in one line naming both keys, instead of being silently ignored; beside the setting it acts with, it
// loads. The model's such keys (RoPE's, the MoE router's) are tested with their features.
#include <string>
#include <vector>

#include "catch.h"
#include "config/config_loader.h"
#include "config_test_util.h"

using mt::test::contains;
using mt::test::error_of;
using mt::test::kBaseYaml;

namespace {
std::string load_error(const std::vector<std::string>& overrides) {
  return error_of([&] { mt::load_config_from_string(kBaseYaml, "configs/k.yaml", overrides); });
}
}  // namespace

TEST_CASE("dependent keys: refused alone, naming the key that turns them on; accepted beside it", "[config]") {
  struct Case {
    std::vector<std::string> alone;  // the key set while its setting is off (kBaseYaml: CPU, fp32, no FP8)
    std::string message;
    std::vector<std::string> with;  // the same key beside the setting it acts with
  };
  const std::vector<Case> cases = {
      {{"parallel.cp_comm_type=a2a"},
       "parallel.cp_comm_type is set but parallel.context is 1: it acts only with parallel.context > 1",
       {"parallel.context=2", "parallel.cp_comm_type=a2a"}},
      {{"parallel.tp_comm_overlap=true"}, "parallel.tp_comm_overlap is set but parallel.tensor is 1",
       {"parallel.tensor=2", "parallel.tp_comm_overlap=true"}},
      {{"training.recompute_num_layers=2"},
       "training.recompute_num_layers is set but training.recompute is none: it acts only with training.recompute full",
       {"training.recompute=full", "training.recompute_num_layers=2"}},
      {{"training.recompute=selective", "training.recompute_method=block"},
       "training.recompute_method is set but training.recompute is selective",
       {"training.recompute=full", "training.recompute_method=block"}},
      {{"training.deterministic=false", "training.attention_bwd_workspace_mib=2048"},
       "training.attention_bwd_workspace_mib is set but training.deterministic is false",
       {"training.attention_bwd_workspace_mib=2048"}},
      {{"training.nan_max_skips=3"}, "training.nan_max_skips is set but training.nan_policy is stop",
       {"training.nan_policy=skip", "training.nan_max_skips=3"}},
      {{"training.fp8_format=hybrid"}, "training.fp8_format is set but training.fp8 is none",
       {"training.fp8=tensorwise", "training.fp8_format=hybrid"}},
      {{"training.fp8=blockwise", "training.fp8_margin=1"},
       "training.fp8_margin is set but training.fp8 is blockwise: it acts only with training.fp8 tensorwise or delayed",
       {"training.fp8=delayed", "training.fp8_margin=1"}},
      {{"training.fp8=tensorwise", "training.fp8_amax_history_len=16"},
       "training.fp8_amax_history_len is set but training.fp8 is tensorwise",
       {"training.fp8=delayed", "training.fp8_amax_history_len=16"}},
      {{"training.fp8=tensorwise", "training.fp8_amax_compute_algo=max"},
       "training.fp8_amax_compute_algo is set but training.fp8 is tensorwise",
       {"training.fp8=delayed", "training.fp8_amax_compute_algo=max"}},
      {{"training.fp8_first_last_layers_bf16=true"}, "training.fp8_first_last_layers_bf16 is set but training.fp8 is none",
       {"training.fp8=tensorwise", "training.fp8_first_last_layers_bf16=true"}},
      {{"training.fp8=tensorwise", "training.num_layers_at_start_in_bf16=2"},
       "training.num_layers_at_start_in_bf16 is set but training.fp8_first_last_layers_bf16 is false",
       {"training.fp8=tensorwise", "training.fp8_first_last_layers_bf16=true", "training.num_layers_at_start_in_bf16=2"}},
      {{"training.fp8=tensorwise", "training.num_layers_at_end_in_bf16=0"},
       "training.num_layers_at_end_in_bf16 is set but training.fp8_first_last_layers_bf16 is false",
       {"training.fp8=tensorwise", "training.fp8_first_last_layers_bf16=true", "training.num_layers_at_end_in_bf16=0"}},
      {{"optimizer.initial_loss_scale=4096"},
       "optimizer.initial_loss_scale is set but training.precision is fp32: it acts only with training.precision fp16",
       {"training.device=cuda", "training.precision=fp16", "optimizer.initial_loss_scale=4096"}},
      {{"optimizer.min_loss_scale=2"}, "optimizer.min_loss_scale is set but training.precision is fp32",
       {"training.device=cuda", "training.precision=fp16", "optimizer.min_loss_scale=2"}},
      {{"optimizer.loss_scale_window=500"}, "optimizer.loss_scale_window is set but training.precision is fp32",
       {"training.device=cuda", "training.precision=fp16", "optimizer.loss_scale_window=500"}},
      {{"training.device=cuda", "training.precision=bf16", "optimizer.hysteresis=4"},
       "optimizer.hysteresis is set but training.precision is bf16",
       {"training.device=cuda", "training.precision=fp16", "optimizer.hysteresis=4"}},
  };
  for (const Case& c : cases) {
    INFO(c.message);
    const std::string m = load_error(c.alone);
    CHECK(contains(m, "configs/k.yaml"));
    CHECK(contains(m, c.message));
    CHECK(contains(m, "remove " + c.alone.back().substr(0, c.alone.back().find('='))));
    CHECK(mt::test::one_line(m));
    CHECK(load_error(c.with) == "<no mt::Error thrown>");
  }
  // a key written at its default value changes nothing and is accepted anywhere
  CHECK(load_error({"training.recompute_num_layers=1", "optimizer.hysteresis=2"}) == "<no mt::Error thrown>");
}

TEST_CASE("dependent keys: a checkpoint's stored config has them reset, not refused", "[config]") {
  // as a version that accepted them saved it: each acted on nothing in that run
  std::string stored = kBaseYaml;
  const auto add = [&](const std::string& after, const std::string& lines) {
    stored.insert(stored.find(after) + after.size(), lines);
  };
  add("model:\n", "  rope_scaling_factor: 4.0\n");
  add("training:\n", "  recompute_num_layers: 2\n  fp8_margin: 1\n  nan_max_skips: 3\n");
  add("data:\n  mock: true\n", "optimizer:\n  hysteresis: 4\n");
  CHECK(contains(error_of([&] { mt::load_config_from_string(stored, "m.json"); }),
                 "model.rope_scaling_factor is set but model.rope_scaling is false"));
  const mt::Config c = mt::load_stored_config(stored, "m.json");
  const mt::Config d;
  CHECK(c.model.rope_scaling_factor == d.model.rope_scaling_factor);
  CHECK(c.training.recompute_num_layers == d.training.recompute_num_layers);
  CHECK(c.training.fp8_margin == d.training.fp8_margin);
  CHECK(c.training.nan_max_skips == d.training.nan_max_skips);
  CHECK(c.optimizer.hysteresis == d.optimizer.hysteresis);
  CHECK(c.model.hidden_size == 64);  // the rest as stored
  // keys that acted are kept
  add("model:\n", "  rope_scaling: true\n");
  const mt::Config kept = mt::load_stored_config(stored, "m.json");
  CHECK(kept.model.rope_scaling_factor == 4.0);
}
