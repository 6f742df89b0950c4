#include "train/train_checkpoint.h"

#include <algorithm>
#include <set>

#include <yaml-cpp/yaml.h>

#include "tensor/master_halves_ops.h"

namespace mt {

namespace {
// Box `b` of the local tensor `t` (a view: boxes are runs of whole rows, so contiguous).
Tensor box_view(const Tensor& t, const ParamBox& b) { return t.slice(b.local_row_begin, b.shape[0]).view(b.shape); }

// A host tensor holding `v` (v itself on the CPU, a copy otherwise).
Tensor on_host(const Tensor& v) {
  if (v.device() == Device::CPU) return v;
  Tensor h = Tensor::empty(v.shape(), v.dtype());
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

std::vector<SavedBox> saved_boxes(ParamStore& store, const AdamW& opt, const ParallelState& ps,
                                  std::vector<Tensor>* keep,
                                  const std::vector<StateBuffer>& buffers, bool shapes_only) {
  std::vector<SavedBox> out;
  // The optimizer state and master weights, full-size. Under the distributed optimizer they are sharded over data
  // (experts': expert-data) and gathered here into host memory a bucket at a time; this rank copies the regions it
  // saves (as the owner test below).
  Tensor m, v, master;
  const auto saves = [&](bool expert) { return expert ? ps.expert_dp_rank == 0 : ps.dp_rank == 0; };
  if (shapes_only) {  // fp32 (the values' dtype when they are the master weights), as the branches below give them
    const DType dt = store.has_separate_master() ? DType::F32 : store.flat_values().dtype();
    m = v = master = Tensor::empty({store.padded_numel()}, dt, Device::Meta);
  } else if (opt.distributed()) {
    opt.gather_state_to_host(m, v, master, saves);
    // fp32: the values are the master weights (all-gathered by GradSync before a save)
    if (!store.has_separate_master()) master = store.flat_master();
  } else {
    opt.full_moments(m, v);
    // bf16: the optimizer holds the master weights as halves, joined when saved (SavedBox::lo)
    if (!opt.holds_master()) master = store.flat_master();
  }
  const Tensor lo = shapes_only ? Tensor() : opt.master_low_halves();
  for (Param* p : store.params()) {
    // Replicas (over TP, over DP, the tied copy on the last stage) are written by one rank; an expert's by the
    // first expert-data rank of the expert-parallel rank holding it (saved by its global name: reshards over EP).
    const bool first_replica = p->spec.expert_parallel ? ps.expert_dp_rank == 0 : ps.dp_rank == 0;
    const bool owner = first_replica && (p->spec.partition_dim >= 0 || ps.tp_rank == 0) && !p->spec.tied_copy;
    if (!owner) continue;  // the save writes owned boxes only
    const bool halves = lo.defined();
    const Tensor sources[3] = {param_view(halves ? store.flat_values() : master, *p), param_view(m, *p),
                               param_view(v, *p)};
    for (int k = 0; k < 3; ++k) {
      for (const ParamBox& b : p->boxes)
        out.push_back({p->spec.name + kSuffix[k], p->spec.global_shape, b.global_offset, box_view(sources[k], b),
                       k == 0 && halves ? box_view(param_view(lo, *p), b) : Tensor()});
    }
  }
  if (ps.dp_rank == 0 && ps.tp_rank == 0)
    for (const StateBuffer& sb : buffers)
      out.push_back({sb.name, sb.tensor->shape(), Shape(1, 0), *sb.tensor, Tensor()});
  if (keep) *keep = {m, v, master};
  return out;
}

ckpt::SaveRequest training_save_request(const std::string& dir, int64_t iteration, int keep_last, ParamStore& store,
                                        const AdamW& opt, const ParallelState& ps, const nlohmann::json& state,
                                        const std::string& config_yaml,
                                        const std::vector<StateBuffer>& buffers) {
  ckpt::SaveRequest req{.dir = dir, .iteration = iteration, .keep_last = keep_last, .tensors = {}, .state = state,
                        .config_yaml = config_yaml, .wait_ready = {}};
  for (SavedBox& b : saved_boxes(store, opt, ps, nullptr, buffers)) {
    ckpt::ShardTensor st;
    st.name = std::move(b.name);
    st.global_shape = std::move(b.global_shape);
    st.offset = std::move(b.offset);
    st.owner = true;
    st.data = b.lo.defined() ? joined_to_host(b) : on_host(b.source);
    req.tensors.push_back(std::move(st));
  }
  return req;
}

Tensor joined_to_host(const SavedBox& b) {
  Tensor out = Tensor::empty(b.source.shape(), DType::F32);
  const int64_t n = b.source.numel();
  Tensor flat = out.view({n});
  const Tensor hi = b.source.view({n}), lo = b.lo.view({n});
  if (hi.device() == Device::CPU) {
    ops::join_master(flat, hi, lo);
    return out;
  }
  const Tensor buf = Tensor::empty({std::min(kJoinPiece, n)}, DType::F32, hi.device());
  join_box_pieces(b, buf, [&](int64_t i, const Tensor& piece) { flat.slice(i, piece.numel()).copy_from(piece); });
  return out;
}

void join_box_pieces(const SavedBox& b, const Tensor& buf, const std::function<void(int64_t, const Tensor&)>& out) {
  const int64_t n = b.source.numel();
  const Tensor hi = b.source.view({n}), lo = b.lo.view({n});
  for (int64_t i = 0; i < n; i += kJoinPiece) {
    const int64_t k = std::min(kJoinPiece, n - i);
    Tensor piece = buf.slice(0, k);
    ops::join_master(piece, hi.slice(i, k), lo.slice(i, k));
    out(i, piece);
  }
}

std::string save_training_checkpoint(const std::string& dir, int64_t iteration, int keep_last, ParamStore& store,
                                     const AdamW& opt, const ParallelState& ps, const nlohmann::json& state,
                                     const std::string& config_yaml, const std::vector<StateBuffer>& buffers) {
  return ckpt::save_checkpoint(
      training_save_request(dir, iteration, keep_last, store, opt, ps, state, config_yaml, buffers), *ps.world);
}

TrainingState read_training_state(const ckpt::LoadedCheckpoint& ck) {
  const std::string where = ck.path + "/manifest.json";
  MT_CHECK(ck.state.is_object(), "checkpoint ", where, ": 'state' is missing or not an object");
  auto get = [&](const char* key, bool required) -> int64_t {
    if (!ck.state.contains(key)) {
      MT_CHECK(!required, "checkpoint ", where, ": 'state' has no '", key,
               "' (the manifest was edited or written by another program); load another checkpoint");
      return 0;
    }
    const nlohmann::json& v = ck.state[key];
    MT_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0, "checkpoint ", where, ": 'state.", key, "' is ",
             v.dump(), ", expected a non-negative integer");
    return v.get<int64_t>();
  };
  TrainingState t;
  t.iteration = get("iteration", true);
  t.consumed_train_samples = get("consumed_train_samples", true);
  t.optimizer_step = get("optimizer_step", true);
  t.skipped_iterations = get("skipped_iterations", false);
  return t;
}

void check_checkpoint_matches_model(const ckpt::LoadedCheckpoint& ck, const ParamStore& store, int64_t vocab_size,
                                    bool finetune, Communicator& world, const std::vector<StateBuffer>& buffers) {
  // The parameter names the checkpoint holds (moments are "<name>/exp_avg", "<name>/exp_avg_sq").
  std::set<std::string> saved;
  for (const auto& [name, t] : ck.manifest.at("tensors").items()) saved.insert(name.substr(0, name.find('/')));
  for (Param* p : store.params())
    MT_CHECK(saved.count(p->spec.name), "checkpoint ", ck.path, " has no tensor '", p->spec.name,
             "' that this model has: it was saved by a different model (compare its config_yaml with this config)");
  // Which saved names some rank's model holds (each rank holds its own pipeline stage's).
  const std::vector<std::string> names(saved.begin(), saved.end());
  Tensor held = Tensor::zeros({static_cast<int64_t>(names.size())}, DType::I32);
  auto holds = [&](const std::string& name) {
    if (store.find(name)) return true;
    for (const StateBuffer& b : buffers)
      if (b.name == name) return true;
    return false;
  };
  for (const StateBuffer& b : buffers)
    MT_CHECK(saved.count(b.name), "checkpoint ", ck.path, " has no tensor '", b.name, "' that this model has: it was "
             "saved by a different model (compare its config_yaml with this config)");
  for (size_t i = 0; i < names.size(); ++i) held.data<int32_t>()[i] = holds(names[i]);
  if (world.size() > 1 && !names.empty()) world.all_reduce(held, ReduceOp::Max);
  for (size_t i = 0; i < names.size(); ++i)
    MT_CHECK(held.data<int32_t>()[i], "checkpoint ", ck.path, " holds tensor '", names[i],
             "' that this model does not have: it was saved by a different model (compare its config_yaml, e.g. "
             "model.num_layers, with this config)");
  // vocab_size: the padded tables can match while the vocabularies differ.
  if (finetune || ck.config_yaml.empty()) return;
  int64_t saved_vocab = -1;
  try {
    const YAML::Node m = YAML::Load(ck.config_yaml)["model"];
    if (m && m["vocab_size"]) saved_vocab = m["vocab_size"].as<int64_t>();
  } catch (const YAML::Exception& e) {
    throw Error(str_cat("checkpoint ", ck.path, "/manifest.json: its config_yaml does not parse: ", e.what()));
  }
  MT_CHECK(saved_vocab < 0 || saved_vocab == vocab_size, "checkpoint ", ck.path, " was saved with model.vocab_size ",
           saved_vocab, ", this config has ", vocab_size,
           ": resuming needs the same vocabulary; set checkpoint.finetune: true to start a new run from its weights");
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

void load_state_buffers(const ckpt::LoadedCheckpoint& ck, const std::vector<StateBuffer>& buffers) {
  for (const StateBuffer& b : buffers) {
    Tensor h = Tensor::empty(b.tensor->shape(), b.tensor->dtype());
    ckpt::load_tensor(ck, b.name, b.tensor->shape(), Shape(1, 0), h);
    b.tensor->copy_from(h);
  }
}

void load_training_checkpoint(const ckpt::LoadedCheckpoint& ck, ParamStore& store, AdamW& opt,
                              const std::vector<StateBuffer>& buffers) {
  load_state_buffers(ck, buffers);
  // The moments are read into host memory and the optimizer takes its shard of them from there: full-size device
  // copies would need 8 bytes a parameter of device memory beside the model at every resume.
  const Tensor& flat = store.flat_master();
  Tensor m = Tensor::zeros(flat.shape(), flat.dtype());
  Tensor v = Tensor::zeros(flat.shape(), flat.dtype());
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
