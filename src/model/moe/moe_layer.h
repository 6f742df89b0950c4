// A mixture-of-experts MLP (Megatron-Core moe_layer.py): the only file that knows the router, the token
// dispatcher and the experts. Same calling convention as the dense MLP (model/attention.h), so a decoder
// layer's MLP slot can hold either.
//
//   x (N, C) -> router: top-k experts and weights per token (router.h)
//   EP 1:  the experts' routing is the router's: local routing (below) on x itself
//   EP > 1 (parallel/token_dispatcher.h): each token goes once to every EP rank holding one of its experts, with
//          its choices on that rank as local expert indices and their weights (ops::moe_dest_ranks: the send
//          order; ops::moe_local_choices), after an exchange of the counts. The shared expert's fc1 runs while the
//          rows are in flight, and its backward while the output gradients' rows are.
//   local routing, on the rows of this rank's experts (T tokens, k choices each, some -1: elsewhere or dropped):
//            -> permute: rows grouped by local expert (ops::moe_routing_map, moe_permute_forward)
//               [padded layout when ops::moe_padded_regions estimates it faster: each expert's rows start a
//               region (a few distinct sizes for cuBLAS's batched calls; on a Hopper GPU in bf16 each count
//               rounded up to 64 for our own grouped kernels, cuda/sm90/grouped_gemm.h), padding rows 0, and
//               their output gradients zeroed, so they add nothing to the weight gradients]
//            -> experts: grouped GEMMs of this rank's experts (experts.h)
//            -> unpermute: out[t] = sum_j w[t, j] * expert_{i[t, j]}(x[t]) over the token's local choices
//   EP > 1: the partial outputs go back to the tokens' ranks and add up there (ops::moe_permute_backward over
//          the (token, rank) map): y[n] = sum over ranks of their partial sums
//   [+ shared expert: a dense MLP of moe_shared_expert_intermediate_size on every token] [+ residual]
//
// N is this rank's rows: with tensor parallelism the layer needs sequence parallelism (each TP rank routes its
// own rows; the shared expert is tensor-parallel like the dense MLP). Parameter names (prefix e.g.
// "layers.3.mlp"): <prefix>.router.weight, <prefix>.experts.<global e>.linear_fc{1,2}.weight,
// <prefix>.shared_experts.linear_fc{1,2}.{weight,bias}.
#pragma once

#include <functional>
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
    std::vector<int64_t> counts;      // (E) slots this rank routes to each global expert
    // expert parallelism: the send map, (token, rank) <-> send row (ops::moe_dest_ranks), and the exchanges' counts
    Tensor send_slot, row_of_send;    // (N * EP) int32
    TokenDispatcher::Plan plan;
    // the local routing (of the layer's input with EP 1, of the received tokens with expert parallelism)
    Tensor tokens;                    // EP > 1: the received tokens (T, C) unless xp is kept (EP 1: the layer's input,
                                      // not kept here)
    Tensor local_weights;             // EP > 1: their weights (T, k), router dtype, 0 off this rank
    Tensor slot_of_row, row_of_slot;  // the routing map over this rank's experts; padded: slot_of_row padded
    bool padded = false;              // the experts' rows in the padded layout (ops::moe_padded_regions)
    Experts::Saved experts;
    Tensor yp;                        // the experts' outputs (M, C) in their rows' order
    Tensor xp;                        // their inputs (M, C), kept unless training.recompute_norm_act (then permuted
                                      // again in backward: the same bits)
    Tensor shared_h, shared_a;        // shared expert: fc1 output, activation output
  };
  // x (N, C) -> y (N, C) [+ *residual]. key: the rows' random logits under force_load_balancing (router.h).
  Tensor forward(Saved& s, const Tensor& x, const Tensor* residual = nullptr, const RowKey& key = {}) const;
  // dy (N, C) -> dL/dx (N, C). Parameter gradients accumulate; the router's balancing losses' gradients (times
  // Router::set_loss_grad_scale) are added here. Consumes s.
  Tensor backward(const Tensor& dy, Saved& s, const Tensor& x) const;

  Router& router() { return router_; }
  const Router& router() const { return router_; }
  const TokenDispatcher& dispatcher() const { return dispatcher_; }
  Experts& experts() { return experts_; }
  // Metrics of the last forward: the balancing losses' values (0 when off; reads the device) and the slots this
  // rank routed to each global expert.
  // A balancing loss's value (s.router.aux_loss / z_loss; 0 when off). Reads the device: call once per step.
  static double loss_value(const Tensor& loss);
  const std::vector<int64_t>& tokens_per_expert(const Saved& s) const { return s.counts; }

 private:
  // The local routing's forward: tokens (T, C) with their local choices (T, k) int32 over this rank's experts (-1:
  // none) and weights (T, k) -> (T, C) the weighted sums of their local experts' outputs. known_counts (El, host):
  // the slots of each local expert (expert parallelism: from the count exchange), or null: read from the routing
  // map into s.counts (EP 1; while_counts_read, if set, queues device work while they are in flight). residual
  // (T, C) or null: added to the sums in the combine. Fills s.slot_of_row, s.row_of_slot, s.padded, s.experts, s.yp.
  Tensor local_forward(Saved& s, const Tensor& tokens, const Tensor& choices, const Tensor& weights,
                       const std::vector<int64_t>* known_counts, const Tensor* residual,
                       const std::function<void()>& while_counts_read) const;
  // Its backward: dout (T, C) -> dL/dtokens (T, C), dweights (T, k) (=) (0 where no local choice). tokens: read only
  // when s.xp was not kept (may be undefined otherwise). The tokens' last pass (the permute's backward) also adds
  // `extra`'s terms (InputGrads): without expert parallelism, the tokens are the layer's input.
  struct InputGrads;
  Tensor local_backward(Saved& s, const Tensor& dout, const Tensor& tokens, const Tensor& weights, Tensor& dweights,
                        InputGrads* extra = nullptr) const;
  // The layer input's gradient terms the permute's backward adds in its pass (ops::moe_permute_backward): the
  // router's (dlogits W, for few experts: ops::kRouterTermMaxE) and the shared expert's dx (when defined). dlogits
  // is taken (Router::logits_grad) as soon as dweights are complete.
  struct InputGrads {
    bool router = false;
    Tensor dlogits, shared;
  };
  // The permute's backward of the layer input's gradient: dx (=) from the rows and `extra`'s terms.
  void permute_backward_into(Tensor& dx, const Tensor& rows, const Tensor& row_of_slot, int64_t k,
                             const InputGrads& extra) const;
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
