#include "train/plan_moe.h"

#include <algorithm>
#include <cmath>
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
  d.ep = ep;
  d.recv_tokens = ep > 1 ? std::llround(static_cast<double>(routed_rows) * moe_ranks_per_token(m, ep)) : 0;
  return d;
}

double moe_ranks_per_token(const ModelConfig& m, int ep) {
  const int64_t E = m.num_experts, k = m.moe_router_topk, El = E / std::max(ep, 1);
  // P(none of a token's k distinct experts on a given rank) = C(E - El, k) / C(E, k)
  double none = 1.0;
  for (int64_t i = 0; i < k; ++i) none *= static_cast<double>(std::max<int64_t>(E - El - i, 0)) / static_cast<double>(E - i);
  return static_cast<double>(ep) * (1.0 - none);
}

MoEA2ABytes moe_a2a_bytes(const ModelConfig& m, int ep, int64_t routed_rows, int64_t act_bytes, bool full_recompute) {
  MoEA2ABytes b;
  if (ep <= 1) return b;
  const int64_t forwards = full_recompute ? 2 : 1;  // the recomputed forward exchanges again
  const int64_t k = m.moe_router_topk, El = m.num_experts / ep;
  const int64_t tokens = std::llround(static_cast<double>(routed_rows) * moe_ranks_per_token(m, ep));
  const int64_t rows = tokens * m.hidden_size * act_bytes;  // one exchange of token rows
  const int64_t choices = tokens * k * (4 + 4);             // int32 local choices + fp32 weights, forward
  const int64_t dweights = tokens * k * 4;                  // fp32 routing-weight gradients, backward
  const int64_t counts = int64_t{ep} * (El + 1) * 8;        // int64 counts, each forward
  b.total = (2 * forwards + 2) * rows + forwards * (choices + counts) + dweights;
  b.leaving = b.total * (ep - 1) / ep;
  return b;
}

}  // namespace mt
