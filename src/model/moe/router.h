// The MoE router (Megatron-Core moe/router.py): logits = x W^T in fp32 (fp64 for fp64 models; from bf16 / fp16 x and
// W their exact products summed in fp32 by the GEMM, without fp32 copies; the backward likewise, ops::linear_backward_wide), scores, top-k
// choice (with DeepSeek-V3's expert bias in the choice only), routing weights, optional capacity drop, and the
// balancing losses (aux_loss | seq_aux_loss, z-loss). Nothing about communication.
//
// The losses' gradients are injected by backward (times loss_grad_scale, which the trainer sets to what the
// language-model loss's gradient is scaled by: the loss scale over the micro-batches); their values are kept in
// Saved for metrics. Under sequence parallelism the micro-batch's rows are split over the TP ranks: the losses are
// the whole micro-batch's (the aux loss from its tokens per expert summed over TP, parallel/moe_sync.h; the
// z-loss as the mean of the ranks' means), each rank holding its rows' share, so every layout equals one rank. The expert bias (E, router dtype) is not a parameter: the optimizer never sees it; it moves
// after each step by update_expert_bias from the load the forwards counted.
// Parameter: `<prefix>.weight` (E, C), replicated over TP (a partial gradient per TP rank under SP).
//
// force_load_balancing (model.moe_router_force_load_balancing, Megatron-Core's RandomSTE; benchmark only): after the
// GEMM, which still runs, the logits are overwritten with standard-normal values, logits[n, e] = normal01(key.seed,
// rng::kRouterLogitsStream, (key.first_row + n) x E + e) (ops::fill_normal), so the tokens spread evenly over the
// experts whatever the model; scores, choice, losses, bias and capacity then act on them. Straight-through: backward
// takes dL/dlogits (from the random logits) through the GEMM unchanged, so the weight still gets gradients. The
// RowKey numbers rows globally (model_context.h): every layout draws what one rank draws, unlike Megatron's per-rank
// generator.
#pragma once

#include <string>
#include <vector>

#include "model/model_context.h"
#include "model/moe/moe_options.h"
#include "params/param_store.h"
#include "tensor/moe_ops.h"

namespace mt {

class Router {
 public:
  Router(const std::string& prefix, const MoEOptions& opt, const ModelContext& ctx, ParamStore& store);
  struct Saved {
    Tensor logits, scores;   // (N, E) router dtype
    Tensor choice;           // (N, k) int32: the top-k choice
    Tensor indices;          // (N, k) int32: the choice after the capacity drop (-1: dropped); = choice when dropless
    Tensor weights;          // (N, k) router dtype: the routing weights (a dropped slot's is never read)
    Tensor aux_loss, z_loss; // (1) router dtype, undefined when off
    ops::AuxLossGroup aux_group;  // sequence parallelism: the micro-batch's tokens per expert over all its rows
  };
  // x (N, C) -> s.indices, s.weights, and the enabled losses: choose, then add_losses (which only the backward
  // needs: the MoE layer queues them while the host waits for its expert counts). key: the rows' random logits
  // (force_load_balancing only).
  void forward(Saved& s, const Tensor& x, const RowKey& key = {}) const;
  void choose(Saved& s, const Tensor& x, const RowKey& key = {}) const;
  void add_losses(Saved& s) const;
  // dweights (N, k) router dtype (its entries of dropped slots ignored): dx (N, C, the activation dtype) += dL/dx
  // (in the GEMM's epilogue on the GPU); the router weight's gradient accumulates; the enabled losses' gradients
  // are added. Consumes s.
  void backward(Saved& s, const Tensor& dweights, const Tensor& x, Tensor& dx) const;
  // The same in two parts, for a caller that adds dL/dx = dlogits W itself (ops::moe_permute_backward's router term,
  // in the pass that writes dx anyway): dL/dlogits (N, E, router dtype) from dweights and the enabled losses'
  // gradients (consumes s); then the router weight's gradient from it and x, and dx += dlogits W when dx is given.
  Tensor logits_grad(Saved& s, const Tensor& dweights) const;
  void grads_from(const Tensor& dlogits, const Tensor& x, Tensor* dx) const;

  DType router_dtype() const { return rdt_; }
  const ops::RouterSpec& spec() const { return spec_; }
  void set_loss_grad_scale(double s) { loss_grad_scale_ = s; }
  // Expert bias: (E) router dtype on the device (zeros at start), and the tokens routed to each expert since the
  // last update (host; added by the MoE layer's backward once per micro-batch, model/moe/moe_mlp.h; the trainer
  // sums it over the ranks that routed tokens before updating).
  const Tensor& expert_bias() const { return bias_; }
  Tensor& expert_bias() { return bias_; }
  std::vector<int64_t>& expert_load() const { return load_; }
  // bias += rate * sign(mean(load) - load); clears the load.
  void update_expert_bias(const std::vector<int64_t>& load);
  Param* weight() const { return weight_; }
  // The checkpoint name of the expert bias: <prefix>.expert_bias.
  const std::string& expert_bias_name() const { return bias_name_; }

 private:
  Tensor to_router(const Tensor& t) const;  // t in the router dtype (t itself when it already is)
  int64_t aux_groups(int64_t N) const;      // blocks of rows of the balancing loss (sequences for seq_aux_loss)

  const ModelContext* ctx_;
  MoEOptions opt_;
  ops::RouterSpec spec_;
  DType rdt_;
  Param* weight_;
  Tensor bias_;
  std::string bias_name_;
  double loss_grad_scale_ = 1.0;
  int split_ranks_ = 1;  // ranks that split a micro-batch's rows (TP under sequence parallelism)
  mutable std::vector<int64_t> load_;  // counted by forward (const, like every module's forward)
};

}  // namespace mt
