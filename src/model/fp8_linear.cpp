#include "model/fp8_linear.h"

#include <cstdlib>

#include "core/check.h"
#include "parallel/fp8_amax_reduce.h"
#include "tensor/fp8/fp8_ops.h"

namespace mt {

namespace {
// The layer number of a transformer layer's parameter name ("decoder.layers.<n>...."), or -1.
int layer_of(const std::string& name) {
  static const std::string kPrefix = "decoder.layers.";
  if (name.rfind(kPrefix, 0) != 0) return -1;
  return std::atoi(name.c_str() + kPrefix.size());
}
}  // namespace

struct Fp8Linear::Quantized {
  ops::Fp8Tensor row, col;  // (R, C) and (C, R)
};

Fp8Linear::Fp8Linear(Fp8Context& fp8, const std::string& name, Split split)
    : fp8_(&fp8), index_(fp8.add_linear(name)), split_(split) {}
Fp8Linear::~Fp8Linear() = default;

const ops::Fp8Tensor& Fp8Linear::weight_copy(const Tensor& w, bool transposed, const ParallelState& ps) const {
  if (!w_cache_ || w_version_ != fp8_->weight_version()) {
    w_cache_ = std::make_unique<Quantized>();
    quantize(*w_cache_, w, Fp8Role::Weight, true, true, split_.weight, ps);
    w_version_ = fp8_->weight_version();
  }
  return transposed ? w_cache_->col : w_cache_->row;
}

std::shared_ptr<Fp8Linear> Fp8Linear::make(const ModelContext& ctx, const std::string& name, Split split) {
  if (!ctx.fp8 || !ctx.fp8->options().enabled()) return nullptr;
  const int layer = layer_of(name);
  if (layer < 0 || !ctx.fp8->options().layer_in_fp8(layer, ctx.model->num_layers)) return nullptr;
  return std::make_shared<Fp8Linear>(*ctx.fp8, name, split);
}

bool Fp8Linear::current_scaling() const { return fp8_->options().recipe == Fp8Recipe::Tensorwise; }

void Fp8Linear::quantize(Quantized& q, const Tensor& t, Fp8Role r, bool rowwise, bool transposed, bool split,
                         const ParallelState& ps, Tensor* given_amax) const {
  const Fp8Options& o = fp8_->options();
  const fp8::Fp8Dtype dt = o.dtype(r);
  const int64_t R = t.size(0), C = t.size(1);
  const Device dev = t.device();
  if (o.recipe == Fp8Recipe::Blockwise) {
    if (r == Fp8Role::Weight) {
      if (rowwise) q.row = ops::Fp8Tensor::empty(R, C, dt, ops::Fp8Scaling::Block128x128, dev);
      if (transposed) q.col = ops::Fp8Tensor::empty(C, R, dt, ops::Fp8Scaling::Block128x128, dev);
      ops::fp8_quantize_blocks(rowwise ? &q.row : nullptr, transposed ? &q.col : nullptr, t);
      return;
    }
    if (rowwise) q.row = ops::Fp8Tensor::empty(R, C, dt, ops::Fp8Scaling::Tile1x128, dev);
    if (transposed) q.col = ops::Fp8Tensor::empty(C, R, dt, ops::Fp8Scaling::Tile1x128, dev);
    if (rowwise && transposed)
      ops::fp8_quantize_tiles(q.row, q.col, t);  // one read of t
    else if (rowwise)
      ops::fp8_quantize_tiles(q.row, t, false);
    else
      ops::fp8_quantize_tiles(q.col, t, true);
    return;
  }
  if (rowwise) q.row = ops::Fp8Tensor::empty(R, C, dt, ops::Fp8Scaling::Tensor, dev);
  if (transposed) q.col = ops::Fp8Tensor::empty(C, R, dt, ops::Fp8Scaling::Tensor, dev);
  ops::Fp8Tensor* row = rowwise ? &q.row : nullptr;
  ops::Fp8Tensor* col = transposed ? &q.col : nullptr;
  if (o.recipe == Fp8Recipe::Delayed) {
    Tensor scale = fp8_->scale(index_, r), amax = fp8_->amax(index_, r);
    ops::fp8_quantize_tensor(row, col, t, nullptr, &scale, &amax, o.margin);
    return;
  }
  // tensorwise: the current amax of the whole tensor (taken by its producer, or a pass here), then the cast with
  // the scale made from it.
  Tensor amax = given_amax ? *given_amax : Tensor::empty({1}, DType::F32, dev);
  if (!given_amax) ops::fp8_amax(amax, t);
  if (split) reduce_amax_over_tp(amax, ps);
  ops::fp8_quantize_tensor(row, col, t, &amax, nullptr, nullptr, o.margin);
}

void Fp8Linear::forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias, const ParallelState& ps,
                        Fp8Saved* keep, Tensor* x_amax, const Tensor* residual) const {
  Quantized qx;
  quantize(qx, x, Fp8Role::Input, true, keep != nullptr, split_.input, ps, x_amax);
  // The residual in the GEMM's epilogue with tensor scaling; blockwise adds it after (its cuBLASLt kernels are only
  // known to run with C = D).
  const bool fuse_residual = fp8_->options().recipe != Fp8Recipe::Blockwise;
  ops::fp8_gemm(y, qx.row, weight_copy(w, false, ps), bias, false, /*fast_accum=*/true,
                fuse_residual ? residual : nullptr);
  if (residual && !fuse_residual) ops::add(y, y, *residual);
  if (keep) keep->xt = std::move(qx.col);
}

void Fp8Linear::backward(Tensor* dx, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& w,
                         ops::GradMode dw_mode, const ParallelState& ps, const Fp8Saved* kept,
                         Tensor* dy_amax) const {
  const bool have_kept = kept && kept->defined();
  MT_INTERNAL_ASSERT(have_kept || x.defined(), "Fp8Linear::backward: neither x nor its kept FP8 copy");
  Quantized qdy;
  quantize(qdy, dy, Fp8Role::Grad, dx != nullptr, dw != nullptr, split_.grad, ps, dy_amax);
  if (dx) ops::fp8_gemm(*dx, qdy.row, weight_copy(w, true, ps), nullptr, false);
  if (dw) {
    Quantized qx;
    if (!have_kept) quantize(qx, x, Fp8Role::Input, false, true, split_.input, ps);
    ops::fp8_gemm(*dw, qdy.col, have_kept ? kept->xt : qx.col, nullptr, dw_mode == ops::GradMode::Accumulate);
  }
  if (db) ops::linear_backward(nullptr, nullptr, db, dy, Tensor(), Tensor());  // the column sums of dy
}

}  // namespace mt
