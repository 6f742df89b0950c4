// Ops on the master weights of bf16 parameters held as two 16-bit halves (core/master_halves.h): hi = the bf16
// values (BF16), lo = the low halves (U16), the same numel and device. CPU reference and CUDA.
#pragma once

#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace mt::ops {

// hi (and lo when given) = the halves of the fp32 master weights `master`.
void split_master(Tensor& hi, Tensor* lo, const Tensor& master);
// master (fp32) = the weights of halves (hi, lo), exactly.
void join_master(Tensor& master, const Tensor& hi, const Tensor& lo);
// adamw_step (tensor/ops.h) of the master weights join(hi, lo), written back as halves: the same fp32 update bit for
// bit; hi is then the updated bf16 value (rounded with ties away from zero).
void adamw_step_halves(Tensor& hi, Tensor& lo, Tensor& m, Tensor& v, const Tensor& grad, const AdamWArgs& args,
                       const DecayRuns* decay = nullptr);

}  // namespace mt::ops
