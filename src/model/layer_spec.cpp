#include "model/layer_spec.h"

#include "model/moe/moe_mlp.h"

namespace mt {

MLPKind mlp_kind_for_layer(const ModelFeatures& f, int layer_number) {
  const bool moe = layer_number >= 0 && static_cast<size_t>(layer_number) < f.moe_layers.size() &&
                   f.moe_layers[static_cast<size_t>(layer_number)];
  return moe ? MLPKind::MoE : MLPKind::Dense;
}

TransformerLayerSpec layer_spec(const ModelFeatures& f, int layer_number) {
  TransformerLayerSpec s;
  s.norm = f.normalization;
  s.self_attention.qkv_bias = f.qkv_bias;
  s.self_attention.proj_bias = f.add_bias_linear;
  s.self_attention.qk_layernorm = f.qk_layernorm;
  s.self_attention.rope = f.position_embedding == PositionEmbedding::RoPE;
  s.mlp = mlp_kind_for_layer(f, layer_number);
  return s;
}

std::unique_ptr<MLPModule> build_mlp(MLPKind kind, int layer_number, const std::string& prefix,
                                     const ModelContext& ctx, ParamStore& store) {
  switch (kind) {
    case MLPKind::Dense: return std::make_unique<DenseMLP>(prefix, ctx, store);
    case MLPKind::MoE: {
      MoEOptions opt = moe_options(*ctx.model);
      opt.swiglu = ctx.features().activation == Activation::SwiGLU;  // the experts' activation is model.activation
      return std::make_unique<MoEMLP>(layer_number, prefix, opt, ctx, store);
    }
  }
  MT_INTERNAL_ASSERT(false, "unknown MLP kind");
  return nullptr;
}

}  // namespace mt
