// What every layer needs to know, passed explicitly: the model shape, the derived sizes, this
// rank's place in the parallel layout, and the dtype/device activations live in.
#pragma once

#include <cstdint>

#include "config/config.h"
#include "parallel/parallel_state.h"
#include "tensor/tensor.h"

namespace mt {

// Activation recompute (training.recompute*): what forward drops and backward recomputes.
//   selective: each layer's attention core output (recomputed from q, k, v);
//   full/uniform: the layers in groups of `num_layers`, keeping only each group's input;
//   full/block: the first `num_layers` layers of each model chunk, each keeping only its input.
// Independent of the mode, norm_act (training.recompute_norm_act): each layer's two norm outputs and the
// SwiGLU output are not kept but recomputed in backward from the norm inputs / the fc1 output (the same kernels
// on the same inputs: the same bits); false keeps them.
struct RecomputePolicy {
  enum class Mode { None, Selective, Full } mode = Mode::None;
  bool block = false;  // full: block (else uniform)
  int num_layers = 1;
  bool norm_act = true;
};

// What the model reports while it runs, so that communication can overlap it (parallel/grad_sync.h
// implements it). Ranges are element ranges of the parameter store's flat buffers; each layer's
// parameters form one range.
class ParamSyncHooks {
 public:
  virtual ~ParamSyncHooks() = default;
  // The parameters in [begin, end) are about to be read by a forward.
  virtual void params_needed(int64_t begin, int64_t end) = 0;
  // A backward finished accumulating one micro-batch into the gradients of [begin, end).
  virtual void grads_accumulated(int64_t begin, int64_t end) = 0;
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
  // The model's features, resolved once (config/model_features.h): the only thing model code asks.
  const ModelFeatures& features() const { return derived->features; }
  Tensor empty(const Shape& s) const { return Tensor::empty(s, dtype, device); }
  Tensor zeros(const Shape& s) const { return Tensor::zeros(s, dtype, device); }
};

// Per micro-batch forward settings.
struct StepContext {
  bool training = true;
  uint64_t dropout_seed = 0;  // seed mixed with the iteration; 0 dropout rate = no dropout
  int64_t first_sample = 0;   // global index of the micro-batch's first sample (dropout offsets)
};

}  // namespace mt
