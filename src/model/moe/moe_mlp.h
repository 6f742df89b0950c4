// A decoder layer's MLP slot holding a mixture of experts (MLPModule around MoELayer), plus what the trainer reads
// of it once per step: the routing statistics of the step's micro-batches (counted in backward, which runs once
// per micro-batch; under full recompute the forward runs twice) and the router (loss-gradient scale, expert bias).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/mlp.h"
#include "model/moe/moe_layer.h"

namespace mt {

// One MoE layer's routing over the micro-batches of a step on this rank (sums; the trainer reduces them).
struct MoEStepStats {
  std::vector<int64_t> tokens_per_expert;  // (E) routed slots per global expert, after any capacity drop
  int64_t dropped = 0;                     // slots dropped by the capacity
  int64_t slots = 0;                       // routed slots before the drop (rows x topk)
  double aux_loss = 0, z_loss = 0;         // sums of the micro-batches' loss values
  int64_t microbatches = 0;
};

class MoEMLP final : public MLPModule {
 public:
  MoEMLP(int layer_number, const std::string& prefix, const MoEOptions& opt, const ModelContext& ctx,
         ParamStore& store);
  struct State final : MLPState {
    MoELayer::Saved s;
    int64_t nbytes() const override;
  };
  Tensor forward(std::shared_ptr<MLPState>& state, const Tensor& x, const RowKey& key,
                 const Tensor* residual = nullptr) const override;
  Tensor backward(const Tensor& dy, std::shared_ptr<MLPState>& state, const Tensor& x) const override;

  int layer_number() const { return layer_; }
  const MoEOptions& options() const { return opt_; }
  MoELayer& layer() { return layer_impl_; }
  Router& router() { return layer_impl_.router(); }
  // The micro-batches' loss values not yet taken (aux, then z; device scalars), appended to `out`: the trainer
  // reads every layer's at once (one synchronization per step), then passes them to take_stats in that order.
  void pending_losses(std::vector<Tensor>& out) const;
  // The statistics since the last take (then cleared); `values`: pending_losses' values, this layer's consumed
  // from the front.
  MoEStepStats take_stats(std::span<const double>& values);

 private:
  int layer_;
  MoEOptions opt_;
  MoELayer layer_impl_;
  mutable MoEStepStats stats_;
  // counted by backward (const, like every module's backward)
  mutable std::vector<Tensor> pending_aux_, pending_z_;  // the micro-batches' loss values (1 element each)
};

}  // namespace mt
