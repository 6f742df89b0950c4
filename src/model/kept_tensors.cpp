#include "model/kept_tensors.h"

namespace mt {

std::vector<KeptTensor> norm_kept(const std::string& name, Normalization kind, int64_t rows) {
  std::vector<KeptTensor> out;
  if (kind == Normalization::LayerNorm) out.push_back({name + ".mean", rows, true});
  out.push_back({name + ".rstd", rows, true});
  return out;
}

std::vector<KeptTensor> self_attention_kept(const SelfAttentionSpec& spec, const LayerDims& d,
                                            RecomputePolicy::Mode mode) {
  const int64_t N = d.B * d.T;  // attention sees every row (gathered under SP)
  const int64_t qn = d.heads * d.head_dim * N, kn = d.groups * d.head_dim * N;
  // q, k, v split out; on the GPU's fused path q is the whole projection and k, v are empty: the same total.
  std::vector<KeptTensor> out = {{"self_attention.q", qn}, {"self_attention.k", kn}, {"self_attention.v", kn}};
  if (spec.qk_layernorm) {  // q, k before their per-head RMSNorms, and the norms' statistics
    out.push_back({"self_attention.q_pre", qn});
    out.push_back({"self_attention.k_pre", kn});
    for (auto& t : norm_kept("self_attention.q_norm", Normalization::RMSNorm, d.heads * N)) out.push_back(t);
    for (auto& t : norm_kept("self_attention.k_norm", Normalization::RMSNorm, d.groups * N)) out.push_back(t);
  }
  if (mode == RecomputePolicy::Mode::None) {  // the attention core, dropped by selective recompute
    out.push_back({"self_attention.out", qn});
    out.push_back({"self_attention.lse", d.B * d.heads * d.T, true});
  }
  return out;
}

std::vector<KeptTensor> mlp_kept(MLPKind kind, Activation activation, const LayerDims& d, bool keep_norm_act) {
  switch (kind) {
    case MLPKind::Dense: {
      const int64_t N = d.B * d.T;
      const bool swiglu = activation == Activation::SwiGLU;
      std::vector<KeptTensor> out = {{"mlp.h", N * d.ffn * (swiglu ? 2 : 1)}};  // fc1 output
      if (!swiglu || keep_norm_act) out.push_back({"mlp.a", N * d.ffn});     // GELU's; SwiGLU's unless recomputed
      return out;
    }
    case MLPKind::MoE: {  // moe_kept with LayerDims' MoE fields, dropless and balanced
      MoEDims m;
      m.experts = d.experts;
      m.topk = d.topk;
      m.ffn = d.moe_ffn;
      m.shared_ffn = d.shared_ffn;
      m.recv_rows = d.rows * d.topk;
      m.swiglu = activation == Activation::SwiGLU;
      m.keep_input = keep_norm_act;
      m.capacity = d.capacity;
      return moe_kept(m, d);
    }
  }
  return {};
}

std::vector<KeptTensor> moe_kept(const MoEDims& m, const LayerDims& d) {
  const int64_t N = d.rows, R = m.recv_rows, full = d.B * d.T;
  // the local routing's tokens: this rank's own with EP 1 (the layer's input, kept by the layer), else received
  const int64_t T = m.ep > 1 ? m.recv_tokens : N;
  std::vector<KeptTensor> out = {
      {"mlp.router.logits", N * m.experts, true},    {"mlp.router.scores", N * m.experts, true},
      {"mlp.router.choice", N * m.topk, false, true}, {"mlp.router.weights", N * m.topk, true},
      {"mlp.slot_of_row", T * m.topk, false, true},  {"mlp.row_of_slot", T * m.topk, false, true},
      {"mlp.experts.h", R * m.ffn * (m.swiglu ? 2 : 1)}, {"mlp.yp", R * d.hidden}};
  if (m.keep_input) out.push_back({"mlp.xp", R * d.hidden});
  if (m.ep > 1) {  // the send map; the received tokens (unless the experts' input rows are kept: they are permuted
                   // from them again in backward) and their weights
    out.push_back({"mlp.send_slot", N * m.ep, false, true});
    out.push_back({"mlp.row_of_send", N * m.ep, false, true});
    if (!m.keep_input) out.push_back({"mlp.tokens", T * d.hidden});
    out.push_back({"mlp.local_weights", T * m.topk, true});
  }
  // SwiGLU experts recompute a = swiglu(h) in their backward (experts.h); GELU ones keep it
  if (!m.swiglu) out.push_back({"mlp.experts.a", R * m.ffn});
  if (m.capacity) out.push_back({"mlp.router.indices", N * m.topk, false, true});
  if (m.aux_loss) out.push_back({"mlp.router.aux_loss", 1, true});
  if (m.z_loss) out.push_back({"mlp.router.z_loss", 1, true});
  if (m.shared_ffn > 0) {
    out.push_back({"mlp.shared_h", full * m.shared_ffn * (m.swiglu ? 2 : 1)});
    out.push_back({"mlp.shared_a", full * m.shared_ffn});
  }
  return out;
}

std::vector<KeptTensor> moe_layer_kept(const TransformerLayerSpec& spec, Activation activation, const LayerDims& d,
                                       const MoEDims& m, RecomputePolicy::Mode mode, bool keep_norm_act) {
  std::vector<KeptTensor> out;
  for (KeptTensor& t : layer_kept(spec, activation, d, mode, keep_norm_act))
    if (t.name.rfind("mlp.", 0) != 0) out.push_back(std::move(t));
  if (mode == RecomputePolicy::Mode::Full) return out;
  MoEDims mk = m;
  mk.keep_input = keep_norm_act;
  for (KeptTensor& t : moe_kept(mk, d)) out.push_back(std::move(t));
  return out;
}

std::vector<KeptTensor> layer_kept(const TransformerLayerSpec& spec, Activation activation, const LayerDims& d,
                                   RecomputePolicy::Mode mode, bool keep_norm_act) {
  const int64_t rc = d.rows * d.hidden;
  std::vector<KeptTensor> out = {{"x_in", rc}};
  if (mode == RecomputePolicy::Mode::Full) return out;
  out.push_back({"x_mid", rc});
  if (keep_norm_act) {  // the norm outputs (else recomputed in backward)
    out.push_back({"ln1_out", rc});
    out.push_back({"ln2_out", rc});
  }
  auto append = [&out](std::vector<KeptTensor> v) { out.insert(out.end(), v.begin(), v.end()); };
  append(norm_kept("n1", spec.norm, d.rows));
  append(norm_kept("n2", spec.norm, d.rows));
  append(self_attention_kept(spec.self_attention, d, mode));
  append(mlp_kept(spec.mlp, activation, d, keep_norm_act));
  return out;
}

}  // namespace mt
