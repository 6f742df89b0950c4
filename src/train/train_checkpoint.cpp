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

std::string save_training_checkpoint(const std::string& dir, int64_t iteration, int keep_last, ParamStore& store,
                                     const AdamW& opt, const ParallelState& ps, const nlohmann::json& state,
                                     const std::string& config_yaml) {
  ckpt::SaveRequest req;
  req.dir = dir;
  req.iteration = iteration;
  req.keep_last = keep_last;
  req.state = state;
  req.config_yaml = config_yaml;
  for (Param* p : store.params()) {
    // Replicas (replicated over TP, or over DP) are written by one rank.
    const bool owner = ps.dp_rank == 0 && (p->spec.partition_dim >= 0 || ps.tp_rank == 0);
    const Tensor* sources[3] = {&p->value, nullptr, nullptr};
    Tensor m = opt.exp_avg(*p), v = opt.exp_avg_sq(*p);
    sources[1] = &m;
    sources[2] = &v;
    const char* suffix[3] = {"", "/exp_avg", "/exp_avg_sq"};
    for (int k = 0; k < 3; ++k) {
      for (const ParamBox& b : p->boxes) {
        ckpt::ShardTensor st;
        st.name = p->spec.name + suffix[k];
        st.global_shape = p->spec.global_shape;
        st.offset = b.global_offset;
        st.data = box_view(*sources[k], b, true);
        st.owner = owner;
        req.tensors.push_back(std::move(st));
      }
    }
  }
  return ckpt::save_checkpoint(req, *ps.world);
}

void load_training_checkpoint(const ckpt::LoadedCheckpoint& ck, ParamStore& store, AdamW& opt) {
  for (Param* p : store.params()) {
    Tensor m = opt.exp_avg(*p), v = opt.exp_avg_sq(*p);
    const Tensor* targets[3] = {&p->value, &m, &v};
    const char* suffix[3] = {"", "/exp_avg", "/exp_avg_sq"};
    for (int k = 0; k < 3; ++k) {
      for (const ParamBox& b : p->boxes) {
        Tensor dst = targets[k]->slice(b.local_row_begin, b.shape[0]).view(b.shape);
        if (dst.device() == Device::CPU) {
          ckpt::load_tensor(ck, p->spec.name + suffix[k], p->spec.global_shape, b.global_offset, dst);
        } else {
          Tensor h = Tensor::empty(b.shape, dst.dtype());
          ckpt::load_tensor(ck, p->spec.name + suffix[k], p->spec.global_shape, b.global_offset, h);
          dst.copy_from(h);
        }
      }
    }
  }
}

}  // namespace mt
