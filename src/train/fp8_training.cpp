#include "train/fp8_training.h"

#include "core/check.h"
#include "core/log.h"
#include "parallel/fp8_amax_reduce.h"

namespace mt {

std::unique_ptr<Fp8Context> make_fp8_context(const Config& cfg, const DerivedConfig& d, ModelContext& ctx, bool log) {
  const Fp8Options o = Fp8Options::from_config(cfg.training, d);
  if (!o.enabled()) return nullptr;
  auto fp8 = std::make_unique<Fp8Context>(o, ctx.device);
  ctx.fp8 = fp8.get();
  if (log)
    log::info("{} in the transformer layers' linears ({}); TFLOP/s and MFU are counted against the bf16 dense peak "
              "(989.4 TFLOP/s), not FP8's",
              fp8_describe(o), ctx.device == Device::CPU ? "emulated on the CPU" : "cuBLASLt FP8 GEMMs");
  return fp8;
}

void fp8_begin_step(Fp8Context* fp8) {
  if (!fp8) return;
  fp8->bump_weight_version();  // copies made by evaluation in between are rebuilt (and their amax recorded)
  if (fp8->options().recipe == Fp8Recipe::Delayed) fp8->begin_step();
}

void fp8_end_step(Fp8Context* fp8, const ParallelState& ps) {
  if (!fp8) return;
  fp8->bump_weight_version();  // the optimizer is about to change the weights
  if (fp8->options().recipe != Fp8Recipe::Delayed || fp8->num_linears() == 0) return;
  reduce_amax_over_stage(fp8->pending_amax(), ps);
  fp8->end_step();
}

void fp8_save_state(const Fp8Context* fp8, nlohmann::json& state) {
  if (!fp8 || fp8->options().recipe != Fp8Recipe::Delayed) return;
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, v] : fp8->state()) j[name] = v;
  state["fp8"] = j;
}

void fp8_load_state(Fp8Context* fp8, const nlohmann::json& state) {
  if (!fp8 || fp8->options().recipe != Fp8Recipe::Delayed) return;
  if (!state.is_object() || !state.contains("fp8")) {
    log::info("fp8 delayed: the checkpoint has no FP8 state (saved without delayed scaling): amax histories start "
              "empty");
    return;
  }
  std::vector<std::pair<std::string, std::vector<float>>> entries;
  for (const auto& [name, v] : state["fp8"].items()) {
    MT_CHECK(v.is_array(), "checkpoint state.fp8.", name, " is not a list of numbers");
    entries.emplace_back(name, v.get<std::vector<float>>());
  }
  fp8->set_state(entries);
}

}  // namespace mt
