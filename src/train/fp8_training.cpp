#include "train/fp8_training.h"

#include "core/check.h"
#include "core/log.h"
#include "parallel/fp8_amax_reduce.h"

namespace mt {

namespace {
// cuBLASLt's FP8 GEMMs take K and the leading dimensions in multiples of 16 bytes; block scaling whole 128-blocks.
// Every GEMM dimension of the linears: the widths per TP rank and the tokens of a micro-batch (the weight gradient's K).
void check_gpu_shapes(const Config& cfg, const DerivedConfig& d, const Fp8Options& o) {
  const int64_t unit = o.recipe == Fp8Recipe::Blockwise ? 128 : 16;
  const ModelConfig& m = cfg.model;
  const int64_t tp = cfg.parallel.tensor;
  const int64_t heads = static_cast<int64_t>(m.num_attention_heads) * d.head_dim / tp;
  const int64_t kv = static_cast<int64_t>(d.num_query_groups) * d.head_dim / tp;
  const int64_t tokens = static_cast<int64_t>(cfg.training.micro_batch_size) * m.seq_length / cfg.parallel.context;
  const struct {
    const char* what;
    int64_t v;
  } dims[] = {{"model.hidden_size", m.hidden_size},
              {"ffn_hidden_size / parallel.tensor", d.ffn_hidden_size / tp},
              {"num_attention_heads x head dim / parallel.tensor", heads},
              {"num_query_groups x head dim / parallel.tensor", kv},
              {"micro_batch_size x seq_length / parallel.context", tokens}};
  for (const auto& dim : dims)
    MT_CHECK(dim.v % unit == 0, "training.fp8 ", fp8_recipe_name(o.recipe), " on the GPU needs every FP8 GEMM dimension "
             "to be a multiple of ", unit, " (cuBLASLt", unit == 128 ? " block scaling" : "'s FP8 GEMMs", "), but ",
             dim.what, " is ", dim.v, "; change it, or set training.fp8: ",
             unit == 128 ? "tensorwise or delayed" : "none");
}
}  // namespace

std::unique_ptr<Fp8Context> make_fp8_context(const Config& cfg, const DerivedConfig& d, ModelContext& ctx, bool log) {
  const Fp8Options o = Fp8Options::from_config(cfg.training, d);
  if (!o.enabled()) return nullptr;
  if (ctx.device == Device::CUDA) check_gpu_shapes(cfg, d, o);
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
