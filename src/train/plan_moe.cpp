#include "train/plan_moe.h"

#include <cstdlib>

#include "model/moe/moe_options.h"
#include "train/metrics.h"

namespace mt {

MoELayerParams moe_layer_params(const ModelConfig& m, int tp) {
  const MoEOptions o = moe_options(m);
  const int64_t C = m.hidden_size, Fs = o.shared_ffn_hidden_size, fc1 = o.swiglu ? 2 : 1;
  MoELayerParams p;
  p.router = o.num_experts * C;
  p.expert = expert_params(m);
  if (Fs > 0) {
    // fc1 column-parallel (C -> fc1 x Fs, bias with GELU), fc2 row-parallel (Fs -> C, bias replicated with GELU)
    const int64_t bias1 = o.swiglu ? 0 : fc1 * Fs, bias2 = o.swiglu ? 0 : C;
    p.shared = C * fc1 * Fs + bias1 + Fs * C + bias2;
    p.shared_local = (C * fc1 * Fs + bias1 + Fs * C) / tp + bias2;
    p.shared_replicated = bias2;
  }
  return p;
}

int mlp_slot_layer(const std::string& name) {
  static const std::string head = "decoder.layers.";
  if (name.rfind(head, 0) != 0) return -1;
  char* end = nullptr;
  const long layer = std::strtol(name.c_str() + head.size(), &end, 10);
  if (end == name.c_str() + head.size() || std::string(end).rfind(".mlp.", 0) != 0) return -1;
  return static_cast<int>(layer);
}

MoEDims moe_dims(const ModelConfig& m, int tp, int64_t routed_rows, int ep) {
  const MoEOptions o = moe_options(m);
  MoEDims d;
  d.experts = o.num_experts;
  d.topk = o.topk;
  d.ffn = o.ffn_hidden_size;
  d.shared_ffn = o.shared_ffn_hidden_size / tp;
  d.recv_rows = routed_rows * o.topk;
  d.swiglu = o.swiglu;
  d.capacity = o.capacity_factor > 0.0;
  d.aux_loss = o.load_balancing != "none" && o.aux_loss_coeff != 0.0;
  d.z_loss = o.z_loss_coeff != 0.0;
  d.expert_parallel = ep > 1;
  return d;
}

MoEA2ABytes moe_a2a_bytes(const ModelConfig& m, int ep, int64_t routed_rows, int64_t act_bytes, bool full_recompute) {
  MoEA2ABytes b;
  if (ep <= 1) return b;
  const int64_t forwards = full_recompute ? 2 : 1;  // the recomputed forward exchanges again
  const int64_t rows = routed_rows * m.moe_router_topk * m.hidden_size * act_bytes;
  const int64_t counts = int64_t{m.num_experts} * 8;  // int64 counts, forward dispatch only
  b.total = (2 * forwards + 2) * rows + forwards * counts;
  b.leaving = b.total * (ep - 1) / ep;
  return b;
}

}  // namespace mt
