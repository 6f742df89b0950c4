#include "config/config_validate_moe.h"

#include <cmath>

#include "config/config_schema.h"
#include "core/check.h"

namespace mt {

bool is_moe_layer(const ModelConfig& m, int layer) {
  if (m.num_experts == 0) return false;
  if (m.moe_layer_freq.size() == 1) return layer % static_cast<int>(m.moe_layer_freq[0]) == 0;
  return m.moe_layer_freq[static_cast<size_t>(layer)] != 0.0;
}

void validate_moe_config(const Config& cfg, const std::string& pre) {
  const ModelConfig& m = cfg.model;
  const ParallelConfig& p = cfg.parallel;
  if (m.num_experts == 0) {
    // nothing the user wrote is ignored: MoE keys need experts
    const ModelConfig d;
    auto unset = [&](bool same, const char* key) {
      MT_CHECK(same, pre, "model.", key, " is set but model.num_experts is 0 (a dense model); set model.num_experts "
               "or remove model.", key);
    };
    unset(m.moe_router_topk == d.moe_router_topk, "moe_router_topk");
    unset(m.moe_ffn_hidden_size == d.moe_ffn_hidden_size, "moe_ffn_hidden_size");
    unset(m.moe_layer_freq == d.moe_layer_freq, "moe_layer_freq");
    unset(m.moe_shared_expert_intermediate_size == d.moe_shared_expert_intermediate_size,
          "moe_shared_expert_intermediate_size");
    unset(m.moe_router_score_function == d.moe_router_score_function, "moe_router_score_function");
    unset(m.moe_router_pre_softmax == d.moe_router_pre_softmax, "moe_router_pre_softmax");
    unset(m.moe_router_topk_scaling_factor == d.moe_router_topk_scaling_factor, "moe_router_topk_scaling_factor");
    unset(m.moe_router_load_balancing_type == d.moe_router_load_balancing_type, "moe_router_load_balancing_type");
    unset(m.moe_aux_loss_coeff == d.moe_aux_loss_coeff, "moe_aux_loss_coeff");
    unset(m.moe_z_loss_coeff == d.moe_z_loss_coeff, "moe_z_loss_coeff");
    unset(m.moe_router_enable_expert_bias == d.moe_router_enable_expert_bias, "moe_router_enable_expert_bias");
    unset(m.moe_router_bias_update_rate == d.moe_router_bias_update_rate, "moe_router_bias_update_rate");
    unset(m.moe_expert_capacity_factor == d.moe_expert_capacity_factor, "moe_expert_capacity_factor");
    unset(m.moe_router_force_load_balancing == d.moe_router_force_load_balancing, "moe_router_force_load_balancing");
    MT_CHECK(p.expert == 1, pre, "parallel.expert (", p.expert, ") > 1 needs experts; set model.num_experts or "
             "parallel.expert: 1");
    return;
  }
  MT_CHECK(m.moe_router_topk <= m.num_experts, pre, "model.moe_router_topk (", m.moe_router_topk,
           ") must be at most model.num_experts (", m.num_experts, ")");
  MT_CHECK(m.moe_ffn_hidden_size > 0, pre, "model.moe_ffn_hidden_size is required with model.num_experts > 0 (the "
           "hidden size of each expert's MLP), e.g. moe_ffn_hidden_size: ", m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * m.hidden_size);
  if (m.moe_layer_freq.size() == 1) {
    const double k = m.moe_layer_freq[0];
    MT_CHECK(k >= 1 && k == std::floor(k), pre, "model.moe_layer_freq [", format_double(k),
             "] must be a whole number >= 1 (every k-th layer is an MoE layer)");
  } else {
    MT_CHECK(static_cast<int>(m.moe_layer_freq.size()) == m.num_layers, pre, "model.moe_layer_freq lists ",
             m.moe_layer_freq.size(), " layers but model.num_layers is ", m.num_layers,
             "; give one 0/1 per layer, or one number k (every k-th layer)");
    for (double v : m.moe_layer_freq)
      MT_CHECK(v == 0.0 || v == 1.0, pre, "model.moe_layer_freq entries must be 0 (dense) or 1 (MoE), got ",
               format_double(v));
  }
  MT_CHECK(!(m.moe_router_pre_softmax && m.moe_router_score_function == "sigmoid"), pre,
           "model.moe_router_pre_softmax applies to moe_router_score_function softmax only; remove it or use softmax");
  MT_CHECK(m.num_experts % p.expert == 0, pre, "model.num_experts (", m.num_experts,
           ") must be divisible by parallel.expert (", p.expert, ")");
  MT_CHECK(p.tensor == 1 || p.sequence_parallel, pre, "experts with parallel.tensor > 1 need "
           "parallel.sequence_parallel: true (as Megatron-Core)");
  MT_CHECK(m.moe_router_load_balancing_type == "none" || m.moe_aux_loss_coeff > 0 || m.moe_router_load_balancing_type == "aux_loss",
           pre, "model.moe_router_load_balancing_type ", m.moe_router_load_balancing_type,
           " needs model.moe_aux_loss_coeff > 0");
  MT_CHECK(m.moe_router_load_balancing_type != "seq_aux_loss" || p.tensor == 1, pre,
           "model.moe_router_load_balancing_type seq_aux_loss with parallel.tensor > 1 is not supported (the sequences "
           "are split over the tensor-parallel ranks); use aux_loss or parallel.tensor: 1");
}

}  // namespace mt
