// The settings of one MoE layer (the model.moe_* config keys, Megatron-Core names in the comments), kept apart
// from the config structs so that the router / experts / layer can be built and tested alone.
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"

namespace mt {

struct MoEOptions {
  int64_t num_experts = 0;             // num_experts
  int64_t topk = 1;                    // moe_router_topk
  int64_t ffn_hidden_size = 0;         // moe_ffn_hidden_size (per expert)
  int64_t shared_ffn_hidden_size = 0;  // moe_shared_expert_intermediate_size (0: no shared expert)
  bool swiglu = true;                  // expert activation: SwiGLU (llama) or GELU (gpt2)
  bool sigmoid = false;                // moe_router_score_function: sigmoid (else softmax)
  bool pre_softmax = false;            // moe_router_pre_softmax
  double topk_scaling = 1.0;           // moe_router_topk_scaling_factor
  std::string load_balancing = "aux_loss";  // moe_router_load_balancing_type: aux_loss | seq_aux_loss | none
  double aux_loss_coeff = 0.0;         // moe_aux_loss_coeff
  double z_loss_coeff = 0.0;           // moe_z_loss_coeff (0: none)
  bool expert_bias = false;            // moe_router_enable_expert_bias
  double bias_update_rate = 1e-3;      // moe_router_bias_update_rate
  double capacity_factor = 0.0;        // moe_expert_capacity_factor (0: dropless)
  bool force_load_balancing = false;   // moe_router_force_load_balancing (benchmark only: random logits)
  int64_t seq_length = 0;              // rows per sequence (seq_aux_loss groups the rows by it)
};

// The options of the model's MoE layers from its config (model.num_experts > 0; activation from model.arch).
MoEOptions moe_options(const ModelConfig& m);

}  // namespace mt
