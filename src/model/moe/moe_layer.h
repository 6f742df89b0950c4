// A mixture-of-experts MLP (Megatron-Core moe_layer.py): the only file that knows the router, the token
// dispatcher and the experts. Same calling convention as the dense MLP (model/attention.h), so a decoder
// layer's MLP slot can hold either.
//
//   x (N, C) -> router: top-k experts and weights per token (router.h)
//            -> permute: rows grouped by global expert (ops::moe_permute_forward)
//            -> dispatch: all-to-all-v over the expert-parallel group (parallel/token_dispatcher.h; with expert
//               parallelism the shared expert's fc1 runs while the rows are in flight, and its backward while the
//               output gradients' rows are)
//            -> experts: grouped GEMMs of this rank's experts (experts.h)
//               [padded batched experts, one rank holding every expert, when ops::moe_padded_regions estimates
//               it faster for this step's counts: the permute writes each expert's rows at the start of its
//               region (a few distinct region sizes), padding rows 0, and each projection runs as one batched GEMM
//               per region size; the padding rows' output gradients are zeroed, so they add nothing to the weight
//               gradients. On a Hopper GPU in bf16 each expert gets its own region (its count rounded up to 128)
//               and one kernel of our own runs each projection over all of them: cuda/sm90/grouped_gemm.h.
//               With expert parallelism the same regions, for the rows that arrived, are laid out by the
//               dispatcher's reorder on arrival (TokenDispatcher::pad); the output gradients' rows arrive padded
//               with zeros the same way]
//            -> combine: all-to-all-v back -> unpermute: y[n] = sum_j w[n, j] * expert_{i[n, j]}(x[n])
//            [+ shared expert: a dense MLP of moe_shared_expert_intermediate_size on every token] [+ residual]
//
// N is this rank's rows: with tensor parallelism the layer needs sequence parallelism (each TP rank routes its
// own rows; the shared expert is tensor-parallel like the dense MLP). Parameter names (prefix e.g.
// "layers.3.mlp"): <prefix>.router.weight, <prefix>.experts.<global e>.linear_fc{1,2}.weight,
// <prefix>.shared_experts.linear_fc{1,2}.{weight,bias}.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/linear.h"
#include "model/moe/experts.h"
#include "model/moe/moe_options.h"
#include "model/moe/router.h"
#include "parallel/token_dispatcher.h"

namespace mt {

class MoELayer {
 public:
  MoELayer(const std::string& prefix, const MoEOptions& opt, const ModelContext& ctx, ParamStore& store);
  struct Saved {
    Router::Saved router;
    Tensor slot_of_row, row_of_slot;  // the routing map (N*k) int32; padded: slot_of_row (padded rows), rows padded
    bool padded = false;              // EP 1: the routed rows in the padded layout (ops::moe_padded_regions);
                                      // with expert parallelism the dispatcher pads on arrival (plan.regions)
    std::vector<int64_t> counts;      // (E) rows this rank routes to each global expert
    TokenDispatcher::Plan plan;
    Tensor xl;                        // the rows of this rank's experts (dispatched; EP 1: not kept, permuted
                                      // again from the layer's input in backward)
    Experts::Saved experts;
    Tensor yp;                        // the experts' outputs back in routed order (M, C)
    Tensor shared_h, shared_a;        // shared expert: fc1 output, activation output
  };
  // x (N, C) -> y (N, C) [+ *residual].
  Tensor forward(Saved& s, const Tensor& x, const Tensor* residual = nullptr) const;
  // dy (N, C) -> dL/dx (N, C). Parameter gradients accumulate; the router's balancing losses' gradients (times
  // Router::set_loss_grad_scale) are added here. Consumes s.
  Tensor backward(const Tensor& dy, Saved& s, const Tensor& x) const;

  Router& router() { return router_; }
  const Router& router() const { return router_; }
  const TokenDispatcher& dispatcher() const { return dispatcher_; }
  // Metrics of the last forward: the balancing losses' values (0 when off; reads the device) and the slots this
  // rank routed to each global expert.
  // A balancing loss's value (s.router.aux_loss / z_loss; 0 when off). Reads the device: call once per step.
  static double loss_value(const Tensor& loss);
  const std::vector<int64_t>& tokens_per_expert(const Saved& s) const { return s.counts; }

 private:
  // The shared expert's fc1 and activation (into s.shared_h, s.shared_a), and its whole backward (dL/dx).
  void shared_forward_fc1(Saved& s, const Tensor& x) const;
  Tensor shared_backward(const Tensor& dy, const Saved& s, const Tensor& x) const;

  const ModelContext* ctx_;
  MoEOptions opt_;
  Router router_;
  TokenDispatcher dispatcher_;
  Experts experts_;
  std::unique_ptr<ColumnParallelLinear> shared_fc1_;
  std::unique_ptr<RowParallelLinear> shared_fc2_;
};

}  // namespace mt
