// FP8 recipes (training.fp8*): the one place that knows which tensor gets which format and scale, and the delayed
// recipe's state (amax histories, scales) for every FP8 linear of a model. Both backends read it; the scale rule
// itself is fp8::scale_from_amax (fp8_format.h), shared with the kernels.
//
// Per linear layer Y = X W^T + b there are three tensor roles: Input (X), Weight (W) and Grad (dL/dY).
//   tensorwise: each tensor's scale from its own current amax (reduced over the TP group when the tensor is split
//               over it), computed on the tensor's device right before the cast.
//   delayed:    scales fixed during a step, made from an amax history (fp8_amax_history_len steps;
//               fp8_amax_compute_algo max | most_recent); the amaxes seen during the step (every micro-batch, fused
//               into the casts) are reduced over all ranks of the pipeline stage (TP x CP x DP: the same for every
//               layout) at the step's end, pushed into the history, and the new scales made (Fp8Context::end_step).
//               Before the first step the history is empty and the scale 1 (TransformerEngine's start).
//   blockwise:  1x128 tiles (activations, gradients) and 128x128 blocks (weights) along each GEMM's K dimension,
//               each with its power-of-2 scale from its own amax: local, nothing to reduce.
// Formats: e4m3 everywhere, or hybrid = e5m2 for Grad.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/fp8_format.h"
#include "tensor/tensor.h"

namespace mt {

enum class Fp8Role : int { Input = 0, Weight = 1, Grad = 2 };
inline constexpr int kFp8Roles = 3;

struct Fp8Options {
  Fp8Recipe recipe = Fp8Recipe::None;
  Fp8Format format = Fp8Format::E4M3;
  int amax_history_len = 1;
  Fp8AmaxAlgo amax_compute_algo = Fp8AmaxAlgo::MostRecent;
  int margin = 0;
  bool first_last_layers_bf16 = false;
  int num_layers_at_start_in_bf16 = 1, num_layers_at_end_in_bf16 = 1;

  static Fp8Options from_config(const TrainingConfig& t, const DerivedConfig& d);
  bool enabled() const { return recipe != Fp8Recipe::None; }
  fp8::Fp8Dtype dtype(Fp8Role r) const {
    return format == Fp8Format::Hybrid && r == Fp8Role::Grad ? fp8::Fp8Dtype::E5M2 : fp8::Fp8Dtype::E4M3;
  }
  // Whether transformer layer `layer_number` (0-based, global) of num_layers runs its linears in FP8.
  bool layer_in_fp8(int layer_number, int num_layers) const;
};

const char* fp8_recipe_name(Fp8Recipe r);  // "none", "tensorwise", "delayed", "blockwise"
// "fp8 delayed (hybrid: e4m3 forward, e5m2 gradients; amax history 16, max)": the log's header line.
std::string fp8_describe(const Fp8Options& o);

// Delayed scaling of one tensor: history[0] is the most recent step's amax.
struct AmaxHistory {
  std::vector<float> history;
  float scale = 1.0f;
  // Push a step's amax (dropping the oldest beyond len) and make the scale from the history.
  void push(float amax, const Fp8Options& o, fp8::Fp8Dtype t);
};

// The FP8 state of one model (all chunks of one rank): the linears register at construction; their delayed
// scales and pending amaxes live in two device tensors (kFp8Roles per linear) so that a step's end is one
// reduction and one upload.
class Fp8Context {
 public:
  Fp8Context(const Fp8Options& o, Device device) : opts_(o), device_(device) {}
  const Fp8Options& options() const { return opts_; }
  int add_linear(const std::string& name);  // -> index; before the first scales() / amax()
  int num_linears() const { return static_cast<int>(names_.size()); }
  const std::vector<std::string>& linear_names() const { return names_; }
  // delayed: the scale (1 element, F32, on the device) of a role, and its pending amax (max over the step so far).
  Tensor scale(int linear, Fp8Role r);
  Tensor amax(int linear, Fp8Role r);
  // All pending amaxes (num_linears x 3), for the caller's reduction over the stage's ranks.
  Tensor& pending_amax();
  void begin_step();  // zero the pending amaxes (evaluation forwards in between do not count)
  // After the reduction of pending_amax(): histories pushed, new scales uploaded.
  void end_step();
  // Checkpoint form: per linear and role, name + "." + role -> [scale, history...]; set_state restores it (names
  // missing from the map keep their fresh state only when `map` is empty: a checkpoint without FP8 state).
  std::vector<std::pair<std::string, std::vector<float>>> state() const;
  void set_state(const std::vector<std::pair<std::string, std::vector<float>>>& map);
  // Bumped at every step's start and end (train/fp8_training.h; the optimizer changes the weights and the delayed
  // scales change after the end): FP8 copies of the weights made under one version are valid until the next.
  uint64_t weight_version() const { return weight_version_; }
  void bump_weight_version() { ++weight_version_; }
  const AmaxHistory& history(int linear, Fp8Role r) const { return hist_[static_cast<size_t>(linear * kFp8Roles + static_cast<int>(r))]; }

 private:
  void ensure_buffers();
  void upload_scales();
  Fp8Options opts_;
  Device device_;
  std::vector<std::string> names_;
  std::vector<AmaxHistory> hist_;  // num_linears x 3
  Tensor scales_, amax_;           // F32 (num_linears x 3) on device_
  uint64_t weight_version_ = 0;
};

}  // namespace mt
