#include "train/train_checkpoint.h"

namespace mt {

namespace {
// A host tensor holding box `b` of the local tensor `t` (a view on the CPU, a copy otherwise).
Tensor box_view(const Tensor& t, const ParamBox& b, bool to_host) {
  Tensor v = t.slice(b.local_row_begin, b.shape[0]).view(b.shape);
  if (!to_host || v.device() == Device::CPU) return v;
  Tensor h = Tensor::empty(b.shape, v.dtype());
  h.copy_from(v);
  return h;
}
}  // namespace

namespace {
// Views of one parameter inside full-size flat buffers (the optimizer moments).
Tensor param_view(const Tensor& flat, const Param& p) {
  return flat.slice(static_cast<int64_t>(p.flat_offset), p.value.numel()).view(p.local_shape);
}
const char* kSuffix[3] = {"", "/exp_avg", "/exp_avg_sq"};
}  // namespace

std::string save_training_checkpoint(const std::string& dir, int64_t iteration, int keep_last, ParamStore& store,
                                     const AdamW& opt, const ParallelState& ps, const nlohmann::json& state,
                                     const std::string& config_yaml) {
  ckpt::SaveRequest req;
  req.dir = dir;
  req.iteration = iteration;
  req.keep_last = keep_last;
  req.state = state;
  req.config_yaml = config_yaml;
  Tensor m, v;
  opt.full_moments(m, v);  // gathered over DP under the distributed optimizer
  for (Param* p : store.params()) {
    // Replicas (over TP, over DP, the tied copy on the last stage) are written by one rank.
    const bool owner = ps.dp_rank == 0 && (p->spec.partition_dim >= 0 || ps.tp_rank == 0) && !p->spec.tied_copy;
    const Tensor sources[3] = {store.master(*p), param_view(m, *p), param_view(v, *p)};
    for (int k = 0; k < 3; ++k) {
      for (const ParamBox& b : p->boxes) {
        ckpt::ShardTensor st;
        st.name = p->spec.name + kSuffix[k];
        st.global_shape = p->spec.global_shape;
        st.offset = b.global_offset;
        st.data = box_view(sources[k], b, true);
        st.owner = owner;
        req.tensors.push_back(std::move(st));
      }
    }
  }
  return ckpt::save_checkpoint(req, *ps.world);
}

void load_model_weights(const ckpt::LoadedCheckpoint& ck, ParamStore& store) {
  for (Param* p : store.params())
    for (const ParamBox& b : p->boxes) {
      Tensor dst = store.master(*p).slice(b.local_row_begin, b.shape[0]).view(b.shape);
      Tensor h = dst.device() == Device::CPU ? dst : Tensor::empty(b.shape, dst.dtype());
      ckpt::load_tensor(ck, p->spec.name, p->spec.global_shape, b.global_offset, h);
      if (dst.device() != Device::CPU) dst.copy_from(h);
    }
  store.sync_values_from_master(0, store.padded_numel());
}

void load_training_checkpoint(const ckpt::LoadedCheckpoint& ck, ParamStore& store, AdamW& opt) {
  const Tensor& flat = store.flat_master();
  Tensor m = Tensor::zeros(flat.shape(), flat.dtype(), flat.device());
  Tensor v = Tensor::zeros(flat.shape(), flat.dtype(), flat.device());
  for (Param* p : store.params()) {
    const Tensor targets[3] = {store.master(*p), param_view(m, *p), param_view(v, *p)};
    for (int k = 0; k < 3; ++k) {
      for (const ParamBox& b : p->boxes) {
        Tensor dst = targets[k].slice(b.local_row_begin, b.shape[0]).view(b.shape);
        if (dst.device() == Device::CPU) {
          ckpt::load_tensor(ck, p->spec.name + kSuffix[k], p->spec.global_shape, b.global_offset, dst);
        } else {
          Tensor h = Tensor::empty(b.shape, dst.dtype());
          ckpt::load_tensor(ck, p->spec.name + kSuffix[k], p->spec.global_shape, b.global_offset, h);
          dst.copy_from(h);
        }
      }
    }
  }
  opt.set_full_moments(m, v);
  store.sync_values_from_master(0, store.padded_numel());
}

}  // namespace mt
