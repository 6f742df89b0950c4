#include "model/moe/moe_options.h"

namespace mt {

MoEOptions moe_options(const ModelConfig& m) {
  MoEOptions o;
  o.num_experts = m.num_experts;
  o.topk = m.moe_router_topk;
  o.ffn_hidden_size = m.moe_ffn_hidden_size;
  o.shared_ffn_hidden_size = m.moe_shared_expert_intermediate_size;
  o.swiglu = m.arch == "llama";
  o.sigmoid = m.moe_router_score_function == "sigmoid";
  o.pre_softmax = m.moe_router_pre_softmax;
  o.topk_scaling = m.moe_router_topk_scaling_factor;
  o.load_balancing = m.moe_router_load_balancing_type;
  o.aux_loss_coeff = m.moe_aux_loss_coeff;
  o.z_loss_coeff = m.moe_z_loss_coeff;
  o.expert_bias = m.moe_router_enable_expert_bias;
  o.bias_update_rate = m.moe_router_bias_update_rate;
  o.capacity_factor = m.moe_expert_capacity_factor;
  o.force_load_balancing = m.moe_router_force_load_balancing;
  o.seq_length = m.seq_length;
  return o;
}

}  // namespace mt
