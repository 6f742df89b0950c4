#include "train/train_checkpoint.h"

#include <algorithm>

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
// Loads box b of parameter p's tensor `name` into dst (a host tensor of the box's shape). The padded
// vocabulary rows are padding: a checkpoint saved with another padding (another parallel.tensor or
// make_vocab_size_divisible_by) gives its first valid_rows rows, the padding rows here are zero.
void load_param_box(const ckpt::LoadedCheckpoint& ck, const std::string& name, const Param& p, const ParamBox& b,
                    Tensor& dst) {
  const Shape& want = p.spec.global_shape;
  const auto& tensors = ck.manifest.at("tensors");
  Shape saved = want;
  if (tensors.contains(name)) saved = tensors.at(name).at("global_shape").get<Shape>();
  const int64_t valid = p.spec.valid_rows;
  bool rows_only = saved != want && valid >= 0 && saved.size() == want.size() && saved[0] >= valid;
  for (size_t d = 1; rows_only && d < want.size(); ++d) rows_only = saved[d] == want[d];
  if (!rows_only) {
    ckpt::load_tensor(ck, name, want, b.global_offset, dst);
    return;
  }
  const int64_t row0 = b.global_offset[0];
  const int64_t n = std::clamp<int64_t>(valid - row0, 0, b.shape[0]);
  if (n > 0) {
    Tensor head = dst.slice(0, n);
    ckpt::load_tensor(ck, name, saved, b.global_offset, head);
  }
  if (n < b.shape[0]) {
    Tensor tail = dst.slice(n, b.shape[0] - n);
    tail.zero_();
  }
}

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
      load_param_box(ck, p->spec.name, *p, b, h);
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
          load_param_box(ck, p->spec.name + kSuffix[k], *p, b, dst);
        } else {
          Tensor h = Tensor::empty(b.shape, dst.dtype());
          load_param_box(ck, p->spec.name + kSuffix[k], *p, b, h);
          dst.copy_from(h);
        }
      }
    }
  }
  opt.set_full_moments(m, v);
  store.sync_values_from_master(0, store.padded_numel());
}

}  // namespace mt
