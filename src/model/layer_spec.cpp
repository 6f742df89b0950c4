#include "model/layer_spec.h"

namespace mt {

MLPKind mlp_kind_for_layer(const ModelFeatures& /*features*/, int /*layer_number*/) { return MLPKind::Dense; }

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

std::unique_ptr<MLPModule> build_mlp(MLPKind kind, const std::string& prefix, const ModelContext& ctx,
                                     ParamStore& store) {
  switch (kind) {
    case MLPKind::Dense: return std::make_unique<DenseMLP>(prefix, ctx, store);
  }
  MT_INTERNAL_ASSERT(false, "unknown MLP kind");
  return nullptr;
}

}  // namespace mt
