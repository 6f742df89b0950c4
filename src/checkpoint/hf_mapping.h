// Hugging Face <-> megatrain: config.json <-> the model section, and one mapping table per
// architecture (HF tensor names -> our parameter name + transform), used by import and export alike
// (STYLE.md "Conversion is a table"). Every transform is a pure rearrangement of elements, so an
// import followed by an export returns the original bytes.
//
// Transforms (ours = concatenation of row blocks of the HF tensors, after an optional transpose):
//   identity   one tensor as is (vocabulary tables: the first vocab_size rows of our padded table)
//   transpose  GPT-2's Conv1D weights are stored [in, out]; ours are [out, in]
//   qkv        q [nh*d, H], k [g*d, H], v [g*d, H] -> our fused rows, per query group
//              [the group's nh/g q heads; its k head; its v head] (biases the same, 1-D)
//   fused_qkv  GPT-2's c_attn (after the transpose) is [Q | K | V] rows -> the same per-head layout
//   concat     gate [F, H], up [F, H] -> fc1 [gate; up]   (dense MLPs and each expert alike)
//   expert     one expert's slice e of a fused [E, rows, W] tensor (transformers 5's experts.gate_up_proj
//              [E, 2F, H] = per expert [gate; up], experts.down_proj [E, H, F]); import only
//
// Mixtures of experts (MixtralForCausalLM, Qwen3MoeForCausalLM), per MoE layer: the router
// (block_sparse_moe.gate / mlp.gate, [E, H]) is <prefix>.router.weight; expert e's gate and up (w1 and w3 /
// gate_proj and up_proj) are <prefix>.experts.<e>.linear_fc1.weight [gate; up], its down (w2 / down_proj)
// <prefix>.experts.<e>.linear_fc2.weight. The per-expert names are what save_pretrained writes in
// transformers 4.x and 5.x alike; 5.x's fused layout (its in-memory names, written by
// save_pretrained(save_original_format=False): mlp.gate.weight, mlp.experts.gate_up_proj / down_proj) is
// read too (fused_experts); export writes the per-expert names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"

namespace mt::hf {

// What a config.json describes, in megatrain's terms, with every feature spelled out.
struct ArchSpec {
  std::string architecture;   // LlamaForCausalLM | MistralForCausalLM | Qwen2ForCausalLM | Qwen3ForCausalLM |
                              // MixtralForCausalLM | Qwen3MoeForCausalLM | GPT2LMHeadModel
  std::string model_type;     // llama | mistral | qwen2 | qwen3 | mixtral | qwen3_moe | gpt2
  bool gpt2 = false;          // GPT-2 family: layernorm with biases, gelu (tanh), learned positions, biases everywhere
  int num_layers = 0, hidden_size = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0, ffn_hidden_size = 0;
  int vocab_size = 0, max_positions = 0;
  double rope_theta = 10000.0, norm_epsilon = 1e-5, init_std = 0.02;
  bool tied = false;          // output layer = word embeddings
  bool qkv_bias = false;      // Qwen2
  bool qk_norm = false;       // Qwen3: RMSNorm over head_dim of each q and k head
  bool rope_scaling = false;  // Llama 3.x
  double rope_factor = 8.0, rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;
  int rope_original_max_positions = 8192;
  // Mixture of experts (num_experts > 0): every layer whose moe_layer[l] is set has a router and experts.
  int num_experts = 0, topk = 0, moe_ffn_hidden_size = 0;
  std::vector<bool> moe_layer;  // per layer (empty: dense model)
  bool norm_topk_prob = true;   // routing weights renormalized over the k chosen (Mixtral always; Qwen3-MoE's key)
  double aux_loss_coef = 0.0;   // router_aux_loss_coef
  bool fused_experts = false;   // the HF file holds transformers 5's fused expert tensors (import)
  bool moe() const { return num_experts > 0; }
};

// Parses a config.json (text of `path`, for messages). Every key is used, checked against the one
// value megatrain supports, or listed as ignored on purpose (ids of special tokens, dtype, cache
// settings, training-only dropout: reported in *notes); anything else is an error naming the key.
ArchSpec parse_config(const nlohmann::json& j, const std::string& path, std::vector<std::string>* notes);

// The model section that reproduces `a`: model.arch as the preset, the feature keys that differ
// from it stated (add_qkv_bias, qk_layernorm, kv_channels, untie_embeddings_and_output_weights,
// rope_scaling*).
ModelConfig to_model_config(const ArchSpec& a, const std::string& path);
// The reverse for export: the architecture megatrain's model is (`architecture` picks one of several
// that share the same tensors, e.g. Mistral; "" = the plainest that fits).
// Throws mt::Error when no supported architecture has the model's features.
ArchSpec from_model_config(const Config& cfg, const std::string& architecture);

// config.json for `a`. When `base` (the config.json the model was imported from) is an object, the
// result is `base` with the keys it has rewritten from `a` (so unmapped keys such as token ids stay),
// in base's style (rope_parameters vs rope_theta/rope_scaling); else a complete config.json.
nlohmann::ordered_json make_config(const ArchSpec& a, const std::string& dtype, const nlohmann::ordered_json& base);

enum class Transform { Identity, Transpose, Qkv, FusedQkv, Concat, Expert };

struct Rule {
  std::vector<std::string> hf;  // HF tensor names
  std::string ours;             // our parameter name
  Transform transform = Transform::Identity;
  bool transpose = false;       // each HF tensor is the transpose of its block (Conv1D)
  bool vocab_rows = false;      // ours has padded vocabulary rows beyond the HF rows
  std::vector<int64_t> shape;   // our tensor's shape (unpadded: vocab_size rows where vocab_rows)
  int expert = -1, experts = 0; // Expert: the slice of the fused tensor, and its leading dimension
};

// The table of `a`, expanded over layers (and experts). `skip` gets the HF names that exist in some checkpoints
// but carry no weights of ours (GPT-2's attn.bias masks, a tied lm_head.weight).
std::vector<Rule> mapping(const ArchSpec& a, std::vector<std::string>* skip);

// Row blocks: our tensor's rows are the concatenation of blocks (src tensor, first row, rows).
struct Block {
  int src = 0;
  int64_t row = 0, rows = 0;
};
struct RowLayout {
  std::vector<int64_t> src_rows;  // rows of each HF tensor (after the transpose)
  std::vector<Block> blocks;      // in our row order
};
// The layout of a rule whose tensor has `our_rows` rows (unpadded).
RowLayout row_layout(const Rule& r, const ArchSpec& a, int64_t our_rows);

// The HF tensors' shapes for our (unpadded) shape.
std::vector<std::vector<int64_t>> hf_shapes(const Rule& r, const ArchSpec& a, const std::vector<int64_t>& our_shape);

// The two directions of a rule on fp32 host data: srcs[i] holds HF tensor i (its own shape, HF's
// layout); ours holds our unpadded tensor (our_shape, row-major).
void merge(const Rule& r, const ArchSpec& a, const std::vector<int64_t>& our_shape,
           const std::vector<const float*>& srcs, float* ours);
void split(const Rule& r, const ArchSpec& a, const std::vector<int64_t>& our_shape, const float* ours,
           const std::vector<float*>& srcs);

}  // namespace mt::hf
