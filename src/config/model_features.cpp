#include "config/model_features.h"

#include "config/config_schema.h"
#include "config/config_validate_moe.h"
#include "core/check.h"

namespace mt {

namespace {

struct Preset {
  Normalization normalization;
  Activation activation;
  bool add_bias_linear;
  PositionEmbedding position;
  bool untie;
};

Preset preset_for(const std::string& arch) {
  if (arch == "gpt2") return {Normalization::LayerNorm, Activation::GELU, true, PositionEmbedding::LearnedAbsolute, false};
  return {Normalization::RMSNorm, Activation::SwiGLU, false, PositionEmbedding::RoPE, true};  // llama
}

// Llama's SwiGLU size: 8/3 x hidden rounded up to a multiple of 256 (a suggestion only).
int64_t swiglu_ffn_suggestion(int64_t hidden) { return (8 * hidden / 3 + 255) / 256 * 256; }

}  // namespace

const char* normalization_name(Normalization n) { return n == Normalization::LayerNorm ? "layernorm" : "rmsnorm"; }
const char* activation_name(Activation a) { return a == Activation::GELU ? "gelu" : "swiglu"; }
const char* position_embedding_name(PositionEmbedding p) {
  switch (p) {
    case PositionEmbedding::LearnedAbsolute: return "learned_absolute";
    case PositionEmbedding::RoPE: return "rope";
    case PositionEmbedding::None: return "none";
  }
  return "?";
}

ModelFeatures resolve_model_features(const Config& cfg) {
  const std::string pre = config_error_prefix(cfg.source_file);
  const ModelConfig& m = cfg.model;
  const Preset p = preset_for(m.arch);
  ModelFeatures f;
  f.normalization = !m.normalization ? p.normalization
                    : *m.normalization == "layernorm" ? Normalization::LayerNorm : Normalization::RMSNorm;
  f.activation = !m.activation ? p.activation : *m.activation == "gelu" ? Activation::GELU : Activation::SwiGLU;
  f.add_bias_linear = m.add_bias_linear.value_or(p.add_bias_linear);
  f.qkv_bias = f.add_bias_linear || m.add_qkv_bias;
  f.qk_layernorm = m.qk_layernorm;
  if (!m.position_embedding_type)
    f.position_embedding = p.position;
  else if (*m.position_embedding_type == "learned_absolute")
    f.position_embedding = PositionEmbedding::LearnedAbsolute;
  else if (*m.position_embedding_type == "rope")
    f.position_embedding = PositionEmbedding::RoPE;
  else
    f.position_embedding = PositionEmbedding::None;
  f.untie_embeddings_and_output_weights = m.untie_embeddings_and_output_weights.value_or(p.untie);
  f.rope_theta = m.rope_theta;
  f.rope_scaling = {m.rope_scaling, m.rope_scaling_factor, m.rope_scaling_low_freq_factor,
                    m.rope_scaling_high_freq_factor, static_cast<double>(m.rope_scaling_original_max_position_embeddings)};
  // MoE layers (a moe_layer_freq list of the wrong length is refused by validate_moe_config)
  if (m.num_experts > 0 && m.num_layers > 0 &&
      ((m.moe_layer_freq.size() == 1 && m.moe_layer_freq[0] >= 1) || static_cast<int>(m.moe_layer_freq.size()) == m.num_layers))
    for (int l = 0; l < m.num_layers; ++l) f.moe_layers.push_back(is_moe_layer(m, l));

  // ---- head dim
  if (m.kv_channels > 0) {
    f.kv_channels = m.kv_channels;
  } else {
    MT_CHECK(m.num_attention_heads > 0 && m.hidden_size % m.num_attention_heads == 0, pre, "model.hidden_size (",
             m.hidden_size, ") must be divisible by model.num_attention_heads (", m.num_attention_heads,
             ") (head dim = hidden_size / heads), or set model.kv_channels (the head dim) explicitly");
    f.kv_channels = m.hidden_size / m.num_attention_heads;
  }

  // ---- combinations
  if (m.arch == "gpt2")  // the gpt2 preset is multi-head attention
    MT_CHECK(m.num_query_groups == 0 || m.num_query_groups == m.num_attention_heads, pre, "model.num_query_groups (",
             m.num_query_groups, ") must be 0 or model.num_attention_heads (", m.num_attention_heads,
             ") for arch gpt2 (grouped-query attention is a llama feature); set num_query_groups: 0 or arch: llama");
  if (f.position_embedding == PositionEmbedding::RoPE)
    MT_CHECK(f.kv_channels % 2 == 0, pre, "head_dim = ",
             m.kv_channels > 0 ? std::string("model.kv_channels")
                               : str_cat("model.hidden_size (", m.hidden_size, ") / num_attention_heads (",
                                         m.num_attention_heads, ")"),
             " = ", f.kv_channels, " must be even for RoPE (model.position_embedding_type rope",
             m.position_embedding_type ? "" : str_cat(", the ", m.arch, " preset"), "); set an even model.kv_channels");
  MT_CHECK(!m.rope_scaling || f.position_embedding == PositionEmbedding::RoPE, pre,
           "model.rope_scaling: true needs model.position_embedding_type rope (it is ",
           position_embedding_name(f.position_embedding), "); set rope_scaling: false");
  if (m.rope_scaling)
    MT_CHECK(m.rope_scaling_high_freq_factor > m.rope_scaling_low_freq_factor, pre,
             "model.rope_scaling_high_freq_factor (", format_double(m.rope_scaling_high_freq_factor),
             ") must be greater than model.rope_scaling_low_freq_factor (", format_double(m.rope_scaling_low_freq_factor),
             ")");
  if (f.activation == Activation::SwiGLU)
    MT_CHECK(m.ffn_hidden_size > 0, pre, "model.ffn_hidden_size is required for ",
             m.activation ? std::string("model.activation swiglu") : "arch " + m.arch,
             " (0 means 4 x hidden_size only for gelu); SwiGLU uses about 8/3 x hidden_size, e.g. ffn_hidden_size: ",
             swiglu_ffn_suggestion(m.hidden_size), " for hidden_size ", m.hidden_size);
  return f;
}

std::string describe_model_features(const Config& cfg, const ModelFeatures& f) {
  const ModelConfig& m = cfg.model;
  auto origin = [&](bool set) { return set ? std::string() : "  # preset " + m.arch; };
  auto b = [](bool v) { return v ? "true" : "false"; };
  std::string out;
  out += str_cat("normalization: ", normalization_name(f.normalization), origin(m.normalization.has_value()), "\n");
  out += str_cat("activation: ", activation_name(f.activation), origin(m.activation.has_value()), "\n");
  out += str_cat("add_bias_linear: ", b(f.add_bias_linear), origin(m.add_bias_linear.has_value()), "\n");
  out += str_cat("add_qkv_bias: ", b(m.add_qkv_bias), f.qkv_bias ? "  # linear_qkv has a bias" : "", "\n");
  out += str_cat("qk_layernorm: ", b(f.qk_layernorm), "\n");
  out += str_cat("kv_channels: ", f.kv_channels, m.kv_channels > 0 ? "" : "  # hidden_size / num_attention_heads", "\n");
  out += str_cat("position_embedding_type: ", position_embedding_name(f.position_embedding),
                 origin(m.position_embedding_type.has_value()), "\n");
  out += str_cat("untie_embeddings_and_output_weights: ", b(f.untie_embeddings_and_output_weights),
                 origin(m.untie_embeddings_and_output_weights.has_value()), "\n");
  out += str_cat("rope_scaling: ", b(f.rope_scaling.enabled), "\n");
  return out;
}

}  // namespace mt
