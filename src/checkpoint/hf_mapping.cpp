#include "checkpoint/hf_mapping.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "config/config_validate_moe.h"
#include "config/model_features.h"
#include "core/check.h"

namespace mt::hf {

using json = nlohmann::json;

namespace {

// Reads config.json keys, remembering which ones were looked at.
class Keys {
 public:
  Keys(const json& j, const std::string& path, const std::string& arch) : j_(j), path_(path), arch_(arch) {}
  bool has(const std::string& k) const { return j_.contains(k) && !j_.at(k).is_null(); }
  const json* peek(const std::string& k) const { return has(k) ? &j_.at(k) : nullptr; }
  template <typename T>
  T get(const std::string& k) {
    used_.insert(k);
    MT_CHECK(has(k), path_, ": config.json key '", k, "' is missing (", arch_, " needs it)");
    return as<T>(k, j_.at(k));
  }
  template <typename T>
  T get_or(const std::string& k, T def) {
    used_.insert(k);
    return has(k) ? as<T>(k, j_.at(k)) : def;
  }
  // The key, when present and not null, must equal one of `allowed`.
  void require(const std::string& k, const std::vector<json>& allowed, const std::string& why) {
    used_.insert(k);
    if (!has(k)) return;
    for (const json& a : allowed)
      if (j_.at(k) == a) return;
    MT_CHECK(false, path_, ": config.json key '", k, "' = ", j_.at(k).dump(), " is not supported by megatrain (", why, ")");
  }
  void use(const std::string& k) { used_.insert(k); }
  // Keys ignored on purpose: a note for the ones that hold something that would matter elsewhere.
  void ignore(const std::string& k, std::vector<std::string>* notes, const std::string& note = "") {
    used_.insert(k);
    if (notes && has(k) && !note.empty()) notes->push_back("config.json '" + k + "' = " + j_.at(k).dump() + ": " + note);
  }
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      MT_CHECK(used_.count(it.key()), path_, ": config.json key '", it.key(), "' (", it.value().dump(),
               ") is not supported by megatrain's import of ", arch_,
               ": megatrain does not know what it changes, so it cannot reproduce the model");
  }

 private:
  template <typename T>
  T as(const std::string& k, const json& v) const {
    try {
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        MT_CHECK(v.is_number_integer(), path_, ": config.json key '", k, "' = ", v.dump(), " must be an integer");
      }
      return v.get<T>();
    } catch (const json::exception&) {
      MT_CHECK(false, path_, ": config.json key '", k, "' = ", v.dump(), " has the wrong type");
    }
    return T{};
  }
  const json& j_;
  std::string path_, arch_;
  std::set<std::string> used_;
};

// Keys of every architecture that do not change the weights or the forward pass.
void ignore_common(Keys& k, std::vector<std::string>* notes) {
  for (const char* key : {"architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "use_cache",
                          "_name_or_path", "bos_token_id", "eos_token_id", "pad_token_id", "output_attentions",
                          "output_hidden_states", "return_dict", "tokenizer_class", "task_specific_params"})
    k.ignore(key, nullptr);
  (void)notes;
}

// RoPE: transformers 4 (rope_theta + rope_scaling) or 5 (rope_parameters).
void parse_rope(Keys& k, ArchSpec& a, const std::string& path) {
  json rp;
  if (k.has("rope_parameters")) {
    k.use("rope_parameters");
    rp = *k.peek("rope_parameters");
    MT_CHECK(rp.is_object(), path, ": config.json key 'rope_parameters' must be an object");
    k.use("rope_theta");
    k.use("rope_scaling");
  } else {
    a.rope_theta = k.get_or<double>("rope_theta", 10000.0);
    k.use("rope_scaling");
    if (k.has("rope_scaling")) rp = *k.peek("rope_scaling");
    if (!rp.is_null()) MT_CHECK(rp.is_object(), path, ": config.json key 'rope_scaling' must be an object or null");
  }
  if (rp.is_null()) return;
  const char* key = k.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  std::string type = rp.value("rope_type", rp.value("type", std::string("default")));
  std::set<std::string> known = {"rope_type", "type", "rope_theta"};
  if (rp.contains("rope_theta")) a.rope_theta = rp["rope_theta"].get<double>();
  if (type == "llama3") {
    a.rope_scaling = true;
    for (const char* f : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      MT_CHECK(rp.contains(f), path, ": config.json key '", key, "' of rope_type llama3 needs '", f, "'");
      known.insert(f);
    }
    a.rope_factor = rp["factor"].get<double>();
    a.rope_low_freq_factor = rp["low_freq_factor"].get<double>();
    a.rope_high_freq_factor = rp["high_freq_factor"].get<double>();
    a.rope_original_max_positions = rp["original_max_position_embeddings"].get<int>();
  } else {
    MT_CHECK(type == "default", path, ": config.json key '", key, "' has rope_type '", type,
             "': megatrain supports default and llama3 RoPE only");
  }
  for (auto it = rp.begin(); it != rp.end(); ++it)
    MT_CHECK(known.count(it.key()), path, ": config.json key '", key, ".", it.key(), "' is not supported by megatrain");
}

void parse_llama_family(Keys& k, ArchSpec& a, const std::string& path, std::vector<std::string>* notes) {
  a.vocab_size = k.get<int>("vocab_size");
  a.hidden_size = k.get<int>("hidden_size");
  a.ffn_hidden_size = k.get<int>("intermediate_size");
  a.num_layers = k.get<int>("num_hidden_layers");
  a.num_heads = k.get<int>("num_attention_heads");
  a.num_kv_heads = k.get_or<int>("num_key_value_heads", a.num_heads);
  MT_CHECK(a.num_heads > 0 && a.hidden_size > 0, path, ": config.json num_attention_heads and hidden_size must be positive");
  a.head_dim = k.get_or<int>("head_dim", a.hidden_size / a.num_heads);
  a.max_positions = k.get<int>("max_position_embeddings");
  a.norm_epsilon = k.get_or<double>("rms_norm_eps", 1e-6);
  a.init_std = k.get_or<double>("initializer_range", 0.02);
  a.tied = k.get_or<bool>("tie_word_embeddings", false);
  k.require("hidden_act", {"silu"}, "the MLP is SwiGLU: silu only");
  k.require("attention_dropout", {0, 0.0}, "no attention dropout");
  k.require("mlp_bias", {false}, "no MLP biases");
  k.ignore("pretraining_tp", notes);  // a way to compute the same product in slices
  parse_rope(k, a, path);
  if (a.model_type == "qwen2") {
    a.qkv_bias = true;
  } else {
    k.require("attention_bias", {false}, "no attention biases");
  }
  if (a.model_type == "qwen3" || a.model_type == "qwen3_moe") a.qk_norm = true;
  // Sliding-window attention: refused; the window keys are unused without it.
  if (a.model_type == "mistral" || a.model_type == "mixtral") {
    k.require("sliding_window", {nullptr}, "sliding-window attention is not implemented: set it to null only if the "
                                           "model was trained without it");
  } else if (a.model_type == "qwen2" || a.model_type == "qwen3" || a.model_type == "qwen3_moe") {
    k.require("use_sliding_window", {false}, "sliding-window attention is not implemented");
    k.ignore("sliding_window", notes);    // unused while use_sliding_window is false
    k.ignore("max_window_layers", notes);  // the same
  }
  k.use("layer_types");
  if (const json* lt = k.peek("layer_types")) {
    MT_CHECK(lt->is_array(), path, ": config.json key 'layer_types' must be a list");
    for (const json& t : *lt)
      MT_CHECK(t == "full_attention", path, ": config.json key 'layer_types' holds ", t.dump(),
               ": megatrain supports full_attention layers only");
  }
}

// Mixtral (every layer MoE, weights renormalized over the k) and Qwen3-MoE (decoder_sparse_step,
// mlp_only_layers, norm_topk_prob). Both route by softmax over all experts, top-k, [renormalize]: our
// softmax router without (with) moe_router_pre_softmax.
void parse_moe(Keys& k, ArchSpec& a, const std::string& path, std::vector<std::string>* notes) {
  const bool mixtral = a.model_type == "mixtral";
  MT_CHECK(a.num_layers > 0, path, ": config.json key 'num_hidden_layers' must be positive");
  if (mixtral) {
    a.num_experts = k.get<int>("num_local_experts");
    a.moe_ffn_hidden_size = a.ffn_hidden_size;  // Mixtral's intermediate_size is each expert's
    k.require("router_jitter_noise", {0, 0.0}, "router jitter noise is not implemented");
  } else {
    // transformers 5 writes num_local_experts, Qwen's own configs (and transformers 4) num_experts.
    MT_CHECK(k.has("num_experts") || k.has("num_local_experts"), path,
             ": config.json key 'num_experts' is missing (Qwen3MoeForCausalLM needs it)");
    if (k.has("num_experts") && k.has("num_local_experts"))
      MT_CHECK(*k.peek("num_experts") == *k.peek("num_local_experts"), path, ": config.json keys 'num_experts' (",
               k.peek("num_experts")->dump(), ") and 'num_local_experts' (", k.peek("num_local_experts")->dump(),
               ") disagree");
    a.num_experts = k.has("num_experts") ? k.get<int>("num_experts") : k.get<int>("num_local_experts");
    k.use("num_experts"), k.use("num_local_experts");
    a.moe_ffn_hidden_size = k.get<int>("moe_intermediate_size");
    a.norm_topk_prob = k.get_or<bool>("norm_topk_prob", false);
  }
  a.topk = k.get<int>("num_experts_per_tok");
  MT_CHECK(a.num_experts >= 1, path, ": config.json key '", mixtral ? "num_local_experts" : "num_experts", "' = ",
           a.num_experts, ": megatrain imports mixtures of experts with at least one expert");
  MT_CHECK(a.topk >= 1 && a.topk <= a.num_experts, path, ": config.json key 'num_experts_per_tok' = ", a.topk,
           " must be in [1, ", a.num_experts, "] (the number of experts)");
  MT_CHECK(a.moe_ffn_hidden_size > 0, path, ": config.json key '", mixtral ? "intermediate_size" : "moe_intermediate_size",
           "' must be positive");
  a.aux_loss_coef = k.get_or<double>("router_aux_loss_coef", 0.001);  // transformers' default
  k.ignore("output_router_logits", notes,
           "transformers adds its router loss only when this is true; megatrain's model.moe_aux_loss_coeff = "
           "router_aux_loss_coef adds Megatron's per-layer balancing loss when training (set it to 0 to train without)");
  a.moe_layer.assign(static_cast<size_t>(a.num_layers), true);
  if (mixtral) return;
  // Qwen3-MoE: layer l is sparse when l is not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0.
  const int step = k.get_or<int>("decoder_sparse_step", 1);
  MT_CHECK(step >= 1, path, ": config.json key 'decoder_sparse_step' = ", step, " must be >= 1");
  k.use("mlp_only_layers");
  std::set<int> dense;
  if (const json* mo = k.peek("mlp_only_layers")) {
    MT_CHECK(mo->is_array(), path, ": config.json key 'mlp_only_layers' must be a list of layer indices");
    for (const json& v : *mo) {
      MT_CHECK(v.is_number_integer() && v.get<int>() >= 0 && v.get<int>() < a.num_layers, path,
               ": config.json key 'mlp_only_layers' holds ", v.dump(), ": not a layer index in [0, ", a.num_layers, ")");
      dense.insert(v.get<int>());
    }
  }
  bool any = false;
  for (int l = 0; l < a.num_layers; ++l) {
    a.moe_layer[static_cast<size_t>(l)] = !dense.count(l) && (l + 1) % step == 0;
    any = any || a.moe_layer[static_cast<size_t>(l)];
  }
  MT_CHECK(any, path, ": config.json keys 'decoder_sparse_step' and 'mlp_only_layers' leave no MoE layer: import it as "
           "Qwen3ForCausalLM");
}

void parse_gpt2(Keys& k, ArchSpec& a, const std::string& path, std::vector<std::string>* notes) {
  a.gpt2 = true;
  a.tied = true;
  a.vocab_size = k.get<int>("vocab_size");
  a.hidden_size = k.get<int>("n_embd");
  a.num_layers = k.get<int>("n_layer");
  a.num_heads = k.get<int>("n_head");
  MT_CHECK(a.num_heads > 0 && a.hidden_size % a.num_heads == 0, path, ": config.json n_embd must be a multiple of n_head");
  a.num_kv_heads = a.num_heads;
  a.head_dim = a.hidden_size / a.num_heads;
  a.ffn_hidden_size = k.get_or<int>("n_inner", 4 * a.hidden_size);
  a.max_positions = k.get<int>("n_positions");
  k.ignore("n_ctx", notes);  // old name of n_positions, unused by the model
  a.norm_epsilon = k.get_or<double>("layer_norm_epsilon", 1e-5);
  a.init_std = k.get_or<double>("initializer_range", 0.02);
  k.require("activation_function", {"gelu_new", "gelu_pytorch_tanh"}, "GELU with the tanh approximation only");
  k.require("tie_word_embeddings", {true}, "GPT-2's output layer is its word embeddings");
  k.require("scale_attn_weights", {true}, "attention scores are scaled by 1/sqrt(head_dim)");
  k.require("scale_attn_by_inverse_layer_idx", {false}, "no per-layer attention scaling");
  k.require("reorder_and_upcast_attn", {false}, "attention in the compute dtype");
  k.require("add_cross_attention", {false}, "decoder-only models");
  for (const char* d : {"attn_pdrop", "embd_pdrop", "resid_pdrop"})
    k.ignore(d, notes, "training-time dropout, not part of the model: set model.dropout in model.yaml to train with it");
  // Heads of GPT2DoubleHeadsModel / sequence classification, not of GPT2LMHeadModel.
  for (const char* s : {"summary_activation", "summary_first_dropout", "summary_proj_to_labels", "summary_type",
                        "summary_use_proj"})
    k.ignore(s, nullptr);
  (void)path;
}

}  // namespace

ArchSpec parse_config(const json& j, const std::string& path, std::vector<std::string>* notes) {
  MT_CHECK(j.is_object(), path, ": not a JSON object");
  MT_CHECK(j.contains("architectures") && j["architectures"].is_array() && j["architectures"].size() == 1 &&
               j["architectures"][0].is_string(),
           path, ": config.json key 'architectures' must list one architecture");
  ArchSpec a;
  a.architecture = j["architectures"][0].get<std::string>();
  static const std::vector<std::pair<std::string, std::string>> kArch = {
      {"LlamaForCausalLM", "llama"}, {"MistralForCausalLM", "mistral"}, {"Qwen2ForCausalLM", "qwen2"},
      {"Qwen3ForCausalLM", "qwen3"}, {"MixtralForCausalLM", "mixtral"}, {"Qwen3MoeForCausalLM", "qwen3_moe"},
      {"GPT2LMHeadModel", "gpt2"}};
  for (const auto& [arch, type] : kArch)
    if (arch == a.architecture) a.model_type = type;
  MT_CHECK(!a.model_type.empty(), path, ": config.json key 'architectures' = ", j["architectures"].dump(),
           ": megatrain imports LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
           "MixtralForCausalLM, Qwen3MoeForCausalLM and GPT2LMHeadModel");
  MT_CHECK(!j.contains("model_type") || j["model_type"] == a.model_type, path, ": config.json key 'model_type' = ",
           j["model_type"].dump(), " does not match architectures ", a.architecture, " (expected \"", a.model_type, "\")");
  Keys k(j, path, a.architecture);
  ignore_common(k, notes);
  if (a.model_type == "gpt2")
    parse_gpt2(k, a, path, notes);
  else
    parse_llama_family(k, a, path, notes);
  if (a.model_type == "mixtral" || a.model_type == "qwen3_moe") parse_moe(k, a, path, notes);
  k.finish();
  MT_CHECK(a.num_layers > 0 && a.hidden_size > 0 && a.vocab_size > 0 && a.ffn_hidden_size > 0 && a.max_positions > 0 &&
               a.head_dim > 0,
           path, ": config.json sizes must be positive");
  MT_CHECK(a.num_kv_heads > 0 && a.num_heads % a.num_kv_heads == 0, path, ": config.json num_attention_heads (",
           a.num_heads, ") must be a multiple of num_key_value_heads (", a.num_kv_heads, ")");
  return a;
}

ModelConfig to_model_config(const ArchSpec& a, const std::string& path) {
  ModelConfig m;
  m.arch = a.gpt2 ? "gpt2" : "llama";  // the preset; the features that differ from it are stated
  m.num_layers = a.num_layers;
  m.hidden_size = a.hidden_size;
  m.num_attention_heads = a.num_heads;
  m.num_query_groups = a.num_kv_heads;
  m.ffn_hidden_size = a.ffn_hidden_size;
  m.vocab_size = a.vocab_size;
  m.seq_length = a.max_positions;
  m.rope_theta = a.rope_theta;
  m.norm_epsilon = a.norm_epsilon;
  m.init_method_std = a.init_std;
  if (a.gpt2) return m;
  if (a.tied) m.untie_embeddings_and_output_weights = false;
  m.add_qkv_bias = a.qkv_bias;
  m.qk_layernorm = a.qk_norm;
  if (a.head_dim * a.num_heads != a.hidden_size) m.kv_channels = a.head_dim;
  m.rope_scaling = a.rope_scaling;
  if (a.rope_scaling) {
    m.rope_scaling_factor = a.rope_factor;
    m.rope_scaling_low_freq_factor = a.rope_low_freq_factor;
    m.rope_scaling_high_freq_factor = a.rope_high_freq_factor;
    m.rope_scaling_original_max_position_embeddings = a.rope_original_max_positions;
  }
  if (a.moe()) {
    m.num_experts = a.num_experts;
    m.moe_router_topk = a.topk;
    m.moe_ffn_hidden_size = a.moe_ffn_hidden_size;
    if (std::find(a.moe_layer.begin(), a.moe_layer.end(), false) != a.moe_layer.end())
      m.moe_layer_freq.assign(a.moe_layer.begin(), a.moe_layer.end());  // one 0/1 per layer
    m.moe_router_pre_softmax = !a.norm_topk_prob;  // softmax over all E, not renormalized over the k
    m.moe_aux_loss_coeff = a.aux_loss_coef;
  }
  (void)path;
  return m;
}

namespace {
// The MoE part of from_model_config: Mixtral (every layer MoE, renormalized top-k weights) or, with q/k norms,
// Qwen3-MoE; what neither has (shared experts, sigmoid scores, expert bias, top-k scaling, q/k/v biases) is refused.
ArchSpec moe_from_model_config(const Config& cfg, ArchSpec a, const std::string& architecture) {
  const ModelConfig& m = cfg.model;
  auto no = [](bool ok, const std::string& what) {
    MT_CHECK(ok, "the checkpoint's mixture of experts has ", what,
             ": neither MixtralForCausalLM nor Qwen3MoeForCausalLM (the MoE architectures megatrain exports) has it");
  };
  no(!a.qkv_bias, "q/k/v biases (model.add_qkv_bias)");
  no(m.moe_shared_expert_intermediate_size == 0, "shared experts (model.moe_shared_expert_intermediate_size)");
  no(m.moe_router_score_function == "softmax", "sigmoid router scores (model.moe_router_score_function)");
  no(!m.moe_router_enable_expert_bias, "an expert bias (model.moe_router_enable_expert_bias)");
  no(m.moe_router_topk_scaling_factor == 1.0, "a top-k scaling factor (model.moe_router_topk_scaling_factor)");
  a.num_experts = m.num_experts;
  a.topk = m.moe_router_topk;
  a.moe_ffn_hidden_size = m.moe_ffn_hidden_size;
  for (int l = 0; l < m.num_layers; ++l) a.moe_layer.push_back(is_moe_layer(m, l));
  a.norm_topk_prob = !m.moe_router_pre_softmax;
  a.aux_loss_coef = m.moe_router_load_balancing_type == "none" ? 0.0 : m.moe_aux_loss_coeff;
  const bool all_moe = std::find(a.moe_layer.begin(), a.moe_layer.end(), false) == a.moe_layer.end();
  const std::string want = a.qk_norm ? "Qwen3MoeForCausalLM" : "MixtralForCausalLM";
  MT_CHECK(architecture.empty() || architecture == want, "the checkpoint's model has the tensors of ", want,
           ", not of ", architecture, " (the config.json it was imported from)");
  if (want == "MixtralForCausalLM") {
    MT_CHECK(all_moe, "the checkpoint's mixture of experts has dense layers (model.moe_layer_freq) and no q/k norms: "
             "MixtralForCausalLM has experts in every layer (Qwen3MoeForCausalLM, which has dense layers, has q/k norms)");
    MT_CHECK(a.norm_topk_prob, "the checkpoint's router does not renormalize the top-k weights "
             "(model.moe_router_pre_softmax: true): MixtralForCausalLM always does (Qwen3MoeForCausalLM has "
             "norm_topk_prob, but q/k norms)");
    a.ffn_hidden_size = a.moe_ffn_hidden_size;
  }
  a.architecture = want;
  a.model_type = want == "MixtralForCausalLM" ? "mixtral" : "qwen3_moe";
  return a;
}
}  // namespace

ArchSpec from_model_config(const Config& cfg, const std::string& architecture) {
  const ModelConfig& m = cfg.model;
  const ModelFeatures f = resolve_model_features(cfg);
  ArchSpec a;
  a.num_layers = m.num_layers;
  a.hidden_size = m.hidden_size;
  a.num_heads = m.num_attention_heads;
  a.num_kv_heads = m.num_query_groups > 0 ? m.num_query_groups : m.num_attention_heads;
  a.head_dim = f.kv_channels;
  a.ffn_hidden_size = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * m.hidden_size;
  a.vocab_size = m.vocab_size;
  a.max_positions = m.seq_length;
  a.rope_theta = m.rope_theta;
  a.norm_epsilon = m.norm_epsilon;
  a.init_std = m.init_method_std;
  a.tied = !f.untie_embeddings_and_output_weights;
  a.rope_scaling = f.rope_scaling.enabled;
  a.rope_factor = f.rope_scaling.factor;
  a.rope_low_freq_factor = f.rope_scaling.low_freq_factor;
  a.rope_high_freq_factor = f.rope_scaling.high_freq_factor;
  a.rope_original_max_positions = static_cast<int>(f.rope_scaling.original_max_position_embeddings);
  const bool gpt2_like = f.normalization == Normalization::LayerNorm && f.activation == Activation::GELU &&
                         f.add_bias_linear && f.position_embedding == PositionEmbedding::LearnedAbsolute && a.tied &&
                         !f.qk_layernorm && a.head_dim * a.num_heads == a.hidden_size && a.num_kv_heads == a.num_heads;
  const bool llama_like = f.normalization == Normalization::RMSNorm && f.activation == Activation::SwiGLU &&
                          !f.add_bias_linear && f.position_embedding == PositionEmbedding::RoPE;
  MT_CHECK(gpt2_like || llama_like, "the checkpoint's model (", describe_model_features(cfg, f),
           ") is neither GPT-2 (layernorm, gelu, biases, learned positions, tied) nor Llama-like (rmsnorm, swiglu, no "
           "linear biases, rope): no Hugging Face architecture megatrain exports holds it");
  if (gpt2_like) {
    a.gpt2 = true;
    a.architecture = "GPT2LMHeadModel", a.model_type = "gpt2";
    MT_CHECK(architecture.empty() || architecture == a.architecture, "the checkpoint is a GPT-2 model, not ", architecture);
    return a;
  }
  a.qkv_bias = f.qkv_bias;
  a.qk_norm = f.qk_layernorm;
  if (m.num_experts > 0) return moe_from_model_config(cfg, a, architecture);
  MT_CHECK(architecture != "MixtralForCausalLM" && architecture != "Qwen3MoeForCausalLM", "the checkpoint's model "
           "has no experts (model.num_experts 0), not the tensors of ", architecture, " (the config.json it was imported from)");
  MT_CHECK(!(a.qkv_bias && a.qk_norm), "the checkpoint's model has both q/k/v biases (Qwen2) and q/k norms (Qwen3): "
                                       "no Hugging Face architecture megatrain exports has both");
  std::string want = a.qk_norm ? "Qwen3ForCausalLM" : a.qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
  if (want == "LlamaForCausalLM" && architecture == "MistralForCausalLM") want = architecture;
  MT_CHECK(architecture.empty() || architecture == want, "the checkpoint's model has the tensors of ", want,
           ", not of ", architecture, " (the config.json it was imported from)");
  a.architecture = want;
  a.model_type = want == "Qwen3ForCausalLM" ? "qwen3" : want == "Qwen2ForCausalLM" ? "qwen2"
                 : want == "MistralForCausalLM" ? "mistral" : "llama";
  return a;
}

namespace {
// The MoE keys of make_config. Qwen3-MoE's sparse layers: base's decoder_sparse_step and mlp_only_layers when
// they give ours, else step 1 and the dense layers listed.
void moe_config(nlohmann::ordered_json& c, const ArchSpec& a, const nlohmann::ordered_json& base) {
  using oj = nlohmann::ordered_json;
  c["num_experts_per_tok"] = a.topk;
  c["router_aux_loss_coef"] = a.aux_loss_coef;
  if (!base.is_object()) c["output_router_logits"] = false;
  if (a.model_type == "mixtral") {
    c["num_local_experts"] = a.num_experts;
    c["router_jitter_noise"] = 0.0;
    return;
  }
  // Qwen's configs name the count num_experts, transformers 5 num_local_experts: base's name(s), else num_experts.
  c["num_experts"] = a.num_experts;
  if (base.is_object() && base.contains("num_local_experts")) c["num_local_experts"] = a.num_experts;
  c["moe_intermediate_size"] = a.moe_ffn_hidden_size;
  c["norm_topk_prob"] = a.norm_topk_prob;
  auto pattern = [&](int step, const std::set<int>& dense) {
    for (int l = 0; l < a.num_layers; ++l)
      if (a.moe_layer[static_cast<size_t>(l)] != (!dense.count(l) && (l + 1) % step == 0)) return false;
    return true;
  };
  if (base.is_object()) {
    const oj step = base.value("decoder_sparse_step", oj(1)), only = base.value("mlp_only_layers", oj::array());
    std::set<int> dense;
    bool ok = step.is_number_integer() && step.get<int>() >= 1 && (only.is_array() || only.is_null());
    if (ok && only.is_array())
      for (const oj& v : only) {
        ok = ok && v.is_number_integer();
        if (ok) dense.insert(v.get<int>());
      }
    if (ok && pattern(step.get<int>(), dense)) {
      c["decoder_sparse_step"] = step;
      c["mlp_only_layers"] = only;
      return;
    }
  }
  std::vector<int> dense;
  for (int l = 0; l < a.num_layers; ++l)
    if (!a.moe_layer[static_cast<size_t>(l)]) dense.push_back(l);
  c["decoder_sparse_step"] = 1;
  c["mlp_only_layers"] = dense;
}
}  // namespace

nlohmann::ordered_json make_config(const ArchSpec& a, const std::string& dtype, const nlohmann::ordered_json& base) {
  using oj = nlohmann::ordered_json;
  oj c;
  c["architectures"] = {a.architecture};
  c["model_type"] = a.model_type;
  if (a.gpt2) {
    c["activation_function"] = "gelu_new";
    c["n_embd"] = a.hidden_size;
    c["n_head"] = a.num_heads;
    c["n_inner"] = a.ffn_hidden_size == 4 * a.hidden_size ? oj(nullptr) : oj(a.ffn_hidden_size);
    c["n_layer"] = a.num_layers;
    c["n_positions"] = a.max_positions;
    c["layer_norm_epsilon"] = a.norm_epsilon;
    c["initializer_range"] = a.init_std;
    c["vocab_size"] = a.vocab_size;
    c["tie_word_embeddings"] = true;
    c["scale_attn_weights"] = true;
    c["scale_attn_by_inverse_layer_idx"] = false;
    c["reorder_and_upcast_attn"] = false;
    // Dropout is a training setting (never imported): an original's values stay, else none.
    if (!base.is_object())
      for (const char* d : {"attn_pdrop", "embd_pdrop", "resid_pdrop"}) c[d] = 0.0;
  } else {
    c["vocab_size"] = a.vocab_size;
    c["hidden_size"] = a.hidden_size;
    c["intermediate_size"] = a.ffn_hidden_size;
    c["num_hidden_layers"] = a.num_layers;
    c["num_attention_heads"] = a.num_heads;
    c["num_key_value_heads"] = a.num_kv_heads;
    c["head_dim"] = a.head_dim;
    c["hidden_act"] = "silu";
    c["max_position_embeddings"] = a.max_positions;
    c["initializer_range"] = a.init_std;
    c["rms_norm_eps"] = a.norm_epsilon;
    c["tie_word_embeddings"] = a.tied;
    if (!base.is_object()) c["attention_dropout"] = 0.0;
    if (a.model_type != "qwen2" && a.model_type != "mixtral") c["attention_bias"] = false;
    if (a.model_type == "llama") c["mlp_bias"] = false;
    if (a.model_type == "mistral" || a.model_type == "mixtral") c["sliding_window"] = nullptr;
    if (a.model_type == "qwen2" || a.model_type == "qwen3" || a.model_type == "qwen3_moe") c["use_sliding_window"] = false;
    if (a.moe()) moe_config(c, a, base);
    oj scaling = nullptr;
    if (a.rope_scaling)
      scaling = {{"rope_type", "llama3"},
                 {"factor", a.rope_factor},
                 {"low_freq_factor", a.rope_low_freq_factor},
                 {"high_freq_factor", a.rope_high_freq_factor},
                 {"original_max_position_embeddings", a.rope_original_max_positions}};
    const bool v5 = base.is_object() && base.contains("rope_parameters");
    if (v5) {
      oj rp = scaling.is_null() ? oj{{"rope_type", "default"}} : scaling;
      rp["rope_theta"] = a.rope_theta;
      // Keep base's key order where the keys agree.
      oj out = base["rope_parameters"].is_object() ? base["rope_parameters"] : oj::object();
      for (auto it = out.begin(); it != out.end();)
        it = rp.contains(it.key()) ? std::next(it) : (out.erase(it.key()), out.begin());
      for (auto it = rp.begin(); it != rp.end(); ++it) out[it.key()] = it.value();
      c["rope_parameters"] = out;
    } else {
      c["rope_theta"] = a.rope_theta;
      c["rope_scaling"] = scaling;
    }
  }
  if (!dtype.empty()) c["dtype"] = dtype;
  if (!base.is_object()) {
    if (!a.gpt2) c["torch_dtype"] = dtype;
    return c;
  }
  // base's keys in base's order, the ones we state rewritten.
  if (!a.gpt2) {
    c["layer_types"] = oj(std::vector<std::string>(static_cast<size_t>(a.num_layers), "full_attention"));
    // The context length of a RoPE model is no property of its weights: a shorter training
    // seq_length keeps the original's.
    if (base.contains("max_position_embeddings") && base["max_position_embeddings"].is_number_integer() &&
        base["max_position_embeddings"].get<int64_t>() > a.max_positions)
      c["max_position_embeddings"] = base["max_position_embeddings"];
  }
  oj out = base;
  for (auto it = out.begin(); it != out.end(); ++it) {
    if (it.key() == "torch_dtype" && !dtype.empty()) it.value() = dtype;
    else if (c.contains(it.key())) it.value() = c[it.key()];
  }
  return out;
}

std::vector<Rule> mapping(const ArchSpec& a, std::vector<std::string>* skip) {
  using T = Transform;
  using S = std::vector<int64_t>;
  std::vector<Rule> r;
  auto add = [&r](std::vector<std::string> hf, std::string ours, S shape, Transform t, bool transpose = false,
                  bool vocab = false) {
    r.push_back(Rule{std::move(hf), std::move(ours), t, transpose, vocab, std::move(shape), -1, 0});
  };
  const int64_t H = a.hidden_size, V = a.vocab_size, F = a.ffn_hidden_size, d = a.head_dim;
  const int64_t qkv_rows = (static_cast<int64_t>(a.num_heads) + 2 * a.num_kv_heads) * d, attn = a.num_heads * d;
  if (a.gpt2) {
    const std::string p = "transformer.";
    add({p + "wte.weight"}, "embedding.word_embeddings.weight", {V, H}, T::Identity, false, true);
    add({p + "wpe.weight"}, "embedding.position_embeddings.weight", {a.max_positions, H}, T::Identity);
    for (int l = 0; l < a.num_layers; ++l) {
      const std::string h = p + "h." + std::to_string(l) + ".";
      const std::string o = "decoder.layers." + std::to_string(l) + ".";
      for (const char* s : {"weight", "bias"}) add({h + "ln_1." + s}, o + "input_layernorm." + s, {H}, T::Identity);
      add({h + "attn.c_attn.weight"}, o + "self_attention.linear_qkv.weight", {3 * H, H}, T::FusedQkv, true);
      add({h + "attn.c_attn.bias"}, o + "self_attention.linear_qkv.bias", {3 * H}, T::FusedQkv);
      add({h + "attn.c_proj.weight"}, o + "self_attention.linear_proj.weight", {H, H}, T::Transpose, true);
      add({h + "attn.c_proj.bias"}, o + "self_attention.linear_proj.bias", {H}, T::Identity);
      for (const char* s : {"weight", "bias"}) add({h + "ln_2." + s}, o + "pre_mlp_layernorm." + s, {H}, T::Identity);
      add({h + "mlp.c_fc.weight"}, o + "mlp.linear_fc1.weight", {F, H}, T::Transpose, true);
      add({h + "mlp.c_fc.bias"}, o + "mlp.linear_fc1.bias", {F}, T::Identity);
      add({h + "mlp.c_proj.weight"}, o + "mlp.linear_fc2.weight", {H, F}, T::Transpose, true);
      add({h + "mlp.c_proj.bias"}, o + "mlp.linear_fc2.bias", {H}, T::Identity);
      if (skip) skip->insert(skip->end(), {h + "attn.bias", h + "attn.masked_bias"});
    }
    for (const char* s : {"weight", "bias"})
      add({p + "ln_f." + s}, std::string("decoder.final_layernorm.") + s, {H}, T::Identity);
    if (skip) skip->push_back("lm_head.weight");
    return r;
  }
  add({"model.embed_tokens.weight"}, "embedding.word_embeddings.weight", {V, H}, T::Identity, false, true);
  const bool mixtral = a.model_type == "mixtral";
  for (int l = 0; l < a.num_layers; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".";
    const std::string o = "decoder.layers." + std::to_string(l) + ".";
    add({h + "input_layernorm.weight"}, o + "input_layernorm.weight", {H}, T::Identity);
    add({h + "self_attn.q_proj.weight", h + "self_attn.k_proj.weight", h + "self_attn.v_proj.weight"},
        o + "self_attention.linear_qkv.weight", {qkv_rows, H}, T::Qkv);
    if (a.qkv_bias)
      add({h + "self_attn.q_proj.bias", h + "self_attn.k_proj.bias", h + "self_attn.v_proj.bias"},
          o + "self_attention.linear_qkv.bias", {qkv_rows}, T::Qkv);
    if (a.qk_norm) {
      add({h + "self_attn.q_norm.weight"}, o + "self_attention.q_layernorm.weight", {d}, T::Identity);
      add({h + "self_attn.k_norm.weight"}, o + "self_attention.k_layernorm.weight", {d}, T::Identity);
    }
    add({h + "self_attn.o_proj.weight"}, o + "self_attention.linear_proj.weight", {H, attn}, T::Identity);
    add({h + "post_attention_layernorm.weight"}, o + "pre_mlp_layernorm.weight", {H}, T::Identity);
    if (a.moe() && a.moe_layer[static_cast<size_t>(l)] && a.fused_experts) {
      // transformers 5's fused layout, both architectures: mlp.gate, mlp.experts.{gate_up_proj, down_proj}.
      const std::string m = h + "mlp.", x = o + "mlp.";
      const int64_t Fe = a.moe_ffn_hidden_size;
      add({m + "gate.weight"}, x + "router.weight", {a.num_experts, H}, T::Identity);
      for (int e = 0; e < a.num_experts; ++e) {
        const std::string oe = x + "experts." + std::to_string(e) + ".";
        add({m + "experts.gate_up_proj"}, oe + "linear_fc1.weight", {2 * Fe, H}, T::Expert);
        add({m + "experts.down_proj"}, oe + "linear_fc2.weight", {H, Fe}, T::Expert);
        r[r.size() - 2].expert = r.back().expert = e;
        r[r.size() - 2].experts = r.back().experts = a.num_experts;
      }
    } else if (a.moe() && a.moe_layer[static_cast<size_t>(l)]) {
      // Mixtral: block_sparse_moe.{gate, experts.e.w1 (gate) / w3 (up) / w2 (down)}; Qwen3-MoE: mlp.{gate,
      // experts.e.{gate,up,down}_proj}.
      const std::string m = h + (mixtral ? "block_sparse_moe." : "mlp."), x = o + "mlp.";
      const int64_t Fe = a.moe_ffn_hidden_size;
      add({m + "gate.weight"}, x + "router.weight", {a.num_experts, H}, T::Identity);
      for (int e = 0; e < a.num_experts; ++e) {
        const std::string he = m + "experts." + std::to_string(e) + ".", oe = x + "experts." + std::to_string(e) + ".";
        add({he + (mixtral ? "w1" : "gate_proj") + ".weight", he + (mixtral ? "w3" : "up_proj") + ".weight"},
            oe + "linear_fc1.weight", {2 * Fe, H}, T::Concat);
        add({he + (mixtral ? "w2" : "down_proj") + ".weight"}, oe + "linear_fc2.weight", {H, Fe}, T::Identity);
      }
    } else {
      add({h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"}, o + "mlp.linear_fc1.weight", {2 * F, H}, T::Concat);
      add({h + "mlp.down_proj.weight"}, o + "mlp.linear_fc2.weight", {H, F}, T::Identity);
    }
  }
  add({"model.norm.weight"}, "decoder.final_layernorm.weight", {H}, T::Identity);
  if (a.tied) {
    if (skip) skip->push_back("lm_head.weight");
  } else {
    add({"lm_head.weight"}, "output_layer.weight", {V, H}, T::Identity, false, true);
  }
  return r;
}

RowLayout row_layout(const Rule& r, const ArchSpec& a, int64_t our_rows) {
  RowLayout L;
  const int64_t d = a.head_dim, g = a.num_kv_heads, q_per_group = a.num_heads / a.num_kv_heads;
  switch (r.transform) {
    case Transform::Identity:
    case Transform::Transpose:
      L.src_rows = {our_rows};
      L.blocks = {{0, 0, our_rows}};
      break;
    case Transform::Concat: {
      const int64_t n = static_cast<int64_t>(r.hf.size());
      MT_INTERNAL_ASSERT(our_rows % n == 0, r.ours, ": ", our_rows, " rows do not split in ", n);
      for (int64_t i = 0; i < n; ++i) {
        L.src_rows.push_back(our_rows / n);
        L.blocks.push_back({static_cast<int>(i), 0, our_rows / n});
      }
      break;
    }
    case Transform::Qkv:
      MT_INTERNAL_ASSERT(our_rows == g * (q_per_group + 2) * d, r.ours, ": ", our_rows, " rows, not g*(R+2)*d");
      L.src_rows = {a.num_heads * d, g * d, g * d};
      for (int64_t i = 0; i < g; ++i) {
        L.blocks.push_back({0, i * q_per_group * d, q_per_group * d});
        L.blocks.push_back({1, i * d, d});
        L.blocks.push_back({2, i * d, d});
      }
      break;
    case Transform::Expert:  // rows [e * our_rows, (e + 1) * our_rows) of the [E * our_rows, W] view
      MT_INTERNAL_ASSERT(r.expert >= 0 && r.expert < r.experts, r.ours, ": expert ", r.expert, " of ", r.experts);
      L.src_rows = {r.experts * our_rows};
      L.blocks = {{0, r.expert * our_rows, our_rows}};
      break;
    case Transform::FusedQkv: {
      // GPT-2: every head is its own group (q_per_group 1); c_attn rows are [Q | K | V].
      const int64_t hd = a.num_heads * d;
      MT_INTERNAL_ASSERT(our_rows == 3 * hd && g == a.num_heads, r.ours, ": fused qkv needs plain multi-head attention");
      L.src_rows = {3 * hd};
      for (int64_t i = 0; i < a.num_heads; ++i)
        for (int64_t part = 0; part < 3; ++part) L.blocks.push_back({0, part * hd + i * d, d});
      break;
    }
  }
  return L;
}

namespace {
int64_t width_of(const std::vector<int64_t>& our_shape) {
  int64_t w = 1;
  for (size_t i = 1; i < our_shape.size(); ++i) w *= our_shape[i];
  return w;
}
}  // namespace

std::vector<std::vector<int64_t>> hf_shapes(const Rule& r, const ArchSpec& a, const std::vector<int64_t>& our_shape) {
  const RowLayout L = row_layout(r, a, our_shape[0]);
  std::vector<std::vector<int64_t>> out;
  if (r.transform == Transform::Expert) {  // [E, rows, W]
    std::vector<int64_t> s = our_shape;
    s.insert(s.begin(), r.experts);
    return {s};
  }
  for (int64_t rows : L.src_rows) {
    std::vector<int64_t> s = our_shape;
    s[0] = rows;
    if (r.transpose) {
      MT_INTERNAL_ASSERT(s.size() == 2, r.ours, ": transpose of a ", s.size(), "-D tensor");
      std::swap(s[0], s[1]);
    }
    out.push_back(s);
  }
  return out;
}

void merge(const Rule& r, const ArchSpec& a, const std::vector<int64_t>& our_shape,
           const std::vector<const float*>& srcs, float* ours) {
  const RowLayout L = row_layout(r, a, our_shape[0]);
  const int64_t w = width_of(our_shape);
  std::vector<std::vector<float>> transposed;
  std::vector<const float*> s = srcs;
  if (r.transpose)
    for (size_t i = 0; i < s.size(); ++i) {  // HF [w, rows] -> [rows, w]
      std::vector<float> t(static_cast<size_t>(L.src_rows[i] * w));
      for (int64_t x = 0; x < L.src_rows[i]; ++x)
        for (int64_t y = 0; y < w; ++y) t[x * w + y] = srcs[i][y * L.src_rows[i] + x];
      transposed.push_back(std::move(t));
      s[i] = transposed.back().data();
    }
  int64_t row = 0;
  for (const Block& b : L.blocks) {
    std::memcpy(ours + row * w, s[b.src] + b.row * w, static_cast<size_t>(b.rows * w) * sizeof(float));
    row += b.rows;
  }
}

void split(const Rule& r, const ArchSpec& a, const std::vector<int64_t>& our_shape, const float* ours,
           const std::vector<float*>& srcs) {
  const RowLayout L = row_layout(r, a, our_shape[0]);
  const int64_t w = width_of(our_shape);
  std::vector<std::vector<float>> rowmajor;
  std::vector<float*> d = srcs;
  if (r.transpose)
    for (size_t i = 0; i < d.size(); ++i) {
      rowmajor.emplace_back(static_cast<size_t>(L.src_rows[i] * w));
      d[i] = rowmajor.back().data();
    }
  int64_t row = 0;
  for (const Block& b : L.blocks) {
    std::memcpy(d[b.src] + b.row * w, ours + row * w, static_cast<size_t>(b.rows * w) * sizeof(float));
    row += b.rows;
  }
  if (r.transpose)
    for (size_t i = 0; i < d.size(); ++i)  // [rows, w] -> HF [w, rows]
      for (int64_t x = 0; x < L.src_rows[i]; ++x)
        for (int64_t y = 0; y < w; ++y) srcs[i][y * L.src_rows[i] + x] = d[i][x * w + y];
}

}  // namespace mt::hf
