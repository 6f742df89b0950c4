// What every layer needs to know, passed explicitly: the model shape, the derived sizes, this
// rank's place in the parallel layout, and the dtype/device activations live in.
#pragma once

#include <cstdint>

#include "config/config.h"
#include "params/param_sync_hooks.h"
#include "runtime/parallel_state.h"
#include "tensor/tensor.h"

namespace mt {

class Fp8Context;  // tensor/fp8/fp8_recipe.h

// Activation recompute (training.recompute*): what forward drops and backward recomputes.
//   selective: each layer's attention core output (recomputed from q, k, v);
//   full/uniform: the layers in groups of `num_layers`, keeping only each group's input;
//   full/block: the first `num_layers` layers of each model chunk, each keeping only its input.
// Independent of the mode, norm_act (training.recompute_norm_act): each layer's two norm outputs and the
// SwiGLU output (an MoE layer: its experts' permuted input rows) are not kept but recomputed in backward from the
// norm inputs / the fc1 output / the layer's input (the same kernels on the same inputs: the same bits); false keeps
// them.
struct RecomputePolicy {
  enum class Mode { None, Selective, Full } mode = Mode::None;
  bool block = false;  // full: block (else uniform)
  int num_layers = 1;
  bool norm_act = true;
};

struct ModelContext {
  const ModelConfig* model = nullptr;
  const DerivedConfig* derived = nullptr;
  const ParallelState* ps = nullptr;
  DType dtype = DType::F32;  // activations and compute parameters
  Device device = Device::CPU;
  RecomputePolicy recompute;
  ParamSyncHooks* hooks = nullptr;  // null: nobody listens (single rank, inference)
  bool tp_comm_overlap = false;     // parallel.tp_comm_overlap (column-parallel backward)
  Fp8Context* fp8 = nullptr;        // training.fp8: the recipe's state (null: no FP8)
  // The trainer's promise that a layer's gradients hold nothing anyone reads from the optimizer's update of its
  // parameters until its backward writes them: one micro-batch a step and no pipeline (each backward follows its own
  // forward, nothing accumulates across micro-batches), every update done before the forward that reads its
  // parameters. Then a layer may keep a forward activation in an EARLIER layer's gradient storage (its backward
  // comes after this layer's): the MoE experts' SwiGLU output (Experts::keep_activation_in). False: nothing does.
  bool gradients_free_until_backward = false;
  // The model's features, resolved once (config/model_features.h): the only thing model code asks.
  const ModelFeatures& features() const { return derived->features; }
  Tensor empty(const Shape& s) const { return Tensor::empty(s, dtype, device); }
  Tensor zeros(const Shape& s) const { return Tensor::zeros(s, dtype, device); }
};

// Per micro-batch forward settings.
struct StepContext {
  bool training = true;
  uint64_t dropout_seed = 0;  // seed mixed with the iteration (dropout masks, forced routing); 0 in evaluation
  int64_t first_sample = 0;   // global index of the micro-batch's first sample (dropout offsets, RowKey)
};

// The key of the random numbers a module draws per row of its input (model.moe_router_force_load_balancing's router
// logits), which the decoder layer derives from the StepContext: `seed` from the step's seed and the layer number,
// `first_row` the global index of this rank's first row, first_sample x seq_length (+ tp_rank x rows under sequence
// parallelism): the numbering of the dropout offsets, per row. Row r then draws the same numbers in every layout,
// and a recomputed forward the same as the first.
struct RowKey {
  uint64_t seed = 0;
  int64_t first_row = 0;
};

}  // namespace mt
