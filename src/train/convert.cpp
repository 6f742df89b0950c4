#include "train/convert.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/ckpt_util.h"
#include "checkpoint/hf_mapping.h"
#include "checkpoint/safetensors.h"
#include "config/config_loader.h"
#include "core/check.h"
#include "tensor/cpu/cpu_ops.h"
#include "train/train_checkpoint.h"

namespace mt {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {


// HF element -> fp32 (exact for F16 and BF16).
void to_f32(const uint8_t* src, DType dt, int64_t n, float* dst) {
  if (dt == DType::F32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
  } else if (dt == DType::BF16) {
    for (int64_t i = 0; i < n; ++i) {
      bf16 b;
      std::memcpy(&b.bits, src + 2 * i, 2);
      dst[i] = static_cast<float>(b);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      f16 h;
      std::memcpy(&h.bits, src + 2 * i, 2);
      dst[i] = static_cast<float>(h);
    }
  }
}

// fp32 -> the export dtype, as raw little-endian bytes.
std::vector<uint8_t> from_f32(const float* src, int64_t n, DType dt) {
  std::vector<uint8_t> out(static_cast<size_t>(n) * dtype_size(dt));
  if (dt == DType::F32) {
    std::memcpy(out.data(), src, out.size());
  } else if (dt == DType::BF16) {
    for (int64_t i = 0; i < n; ++i) {
      bf16 b(src[i]);
      std::memcpy(out.data() + 2 * i, &b.bits, 2);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      f16 h(src[i]);
      std::memcpy(out.data() + 2 * i, &h.bits, 2);
    }
  }
  return out;
}

// Our tensor without its vocabulary padding rows.
Shape unpadded_shape(const hf::Rule& r, const Param& p, int vocab) {
  Shape s = p.spec.global_shape;
  if (r.vocab_rows) s[0] = vocab;
  return s;
}

// A temporary sibling of `out`, removed unless released (renamed into place).
struct StagingDir {
  std::string tmp, out;
  bool done = false;
  explicit StagingDir(const std::string& output) : out(output) {
    MT_CHECK(!output.empty(), "--output: give the folder to create");
    fs::path o = fs::path(output).lexically_normal();
    if (o.filename().empty()) o = o.parent_path();  // "dir/" -> "dir"
    out = o.string();
    std::error_code ec;
    MT_CHECK(!fs::exists(out, ec), output, " already exists: give a new folder (megatrain never writes over one)");
    fs::path parent = fs::absolute(o).parent_path();
    MT_CHECK(fs::is_directory(parent, ec), output, ": the parent folder ", parent.string(), " does not exist");
    tmp = (parent / (o.filename().string() + ".tmp-" + std::to_string(::getpid()))).string();
    ckpt::detail::remove_tree_quiet(tmp);
    fs::create_directories(tmp);
  }
  void commit() {
    MT_CHECK(::rename(tmp.c_str(), out.c_str()) == 0, "cannot rename ", tmp, " to ", out, ": ",
             ckpt::detail::errno_text(errno));
    ckpt::detail::fsync_dir(fs::absolute(out).parent_path().string());
    done = true;
  }
  ~StagingDir() {
    if (!done) ckpt::detail::remove_tree_quiet(tmp);
  }
};

void copy_file_into(const std::string& src, const std::string& dst) {
  std::error_code ec;
  fs::copy_file(src, dst, fs::copy_options::overwrite_existing, ec);
  MT_CHECK(!ec, "cannot copy ", src, " to ", dst, ": ", ec.message());
}

// HF files beside the weights that go along with them (tokenizer, generation settings).
const char* const kSideFiles[] = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                  "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model"};

const char* precision_of(DType t) { return t == DType::BF16 ? "bf16" : t == DType::F16 ? "fp16" : "fp32"; }

// Every tensor the mapping names is in the archive with the shape config.json implies, and the archive holds
// nothing else (but the names in skip).
void check_hf_tensors(const st::Archive& ar, const hf::ArchSpec& a, const std::vector<hf::Rule>& rules,
                      const std::vector<std::string>& skip, const std::string& cfg_path, const json& hj) {
  // An expert tensor missing or extra: the expert count of config.json is the likely culprit.
  const std::string experts_key = hj.contains("num_local_experts") ? "num_local_experts" : "num_experts";
  auto hint = [&](const std::string& name) {  // an HF name or ours
    if (!a.moe() || (name.find(".experts.") == std::string::npos && name.find(".mlp.router.") == std::string::npos))
      return std::string();
    return " (" + cfg_path + " '" + experts_key + "' = " + std::to_string(a.num_experts) + ", '" +
           std::string(a.model_type == "mixtral" ? "intermediate_size" : "moe_intermediate_size") + "' = " +
           std::to_string(a.moe_ffn_hidden_size) + ")";
  };
  std::set<std::string> used(skip.begin(), skip.end());
  for (const hf::Rule& r : rules) {
    const auto shapes = hf::hf_shapes(r, a, r.shape);
    for (size_t i = 0; i < r.hf.size(); ++i) {
      const st::Archive::Entry* e = ar.find(r.hf[i]);
      MT_CHECK(e != nullptr, ar.describe(), ": tensor '", r.hf[i], "' is missing (", a.architecture,
               " with this config.json has it)", hint(r.ours));
      MT_CHECK(e->info->shape == shapes[i], e->file->path(), ": tensor '", r.hf[i], "' has shape ",
               shape_str(e->info->shape), " but ", cfg_path, " implies ", shape_str(shapes[i]),
               " (hidden_size, heads, head_dim, intermediate_size, vocab_size)", hint(r.ours));
      used.insert(r.hf[i]);
    }
  }
  for (const auto& [name, e] : ar.entries())
    MT_CHECK(used.count(name), e.file->path(), ": holds tensor '", name, "' that ", a.architecture,
             " with this config.json does not have (a different architecture or config?)", hint(name),
             a.fused_experts ? " (the file holds fused expert tensors, experts.gate_up_proj: per-expert ones too?)" : "");
}

}  // namespace

std::unique_ptr<HostModel> build_host_model(const Config& cfg_in, int padded_vocab) {
  ops::cpu::init_cpu_threads();
  auto h = std::make_unique<HostModel>();
  h->cfg = cfg_in;
  h->cfg.parallel = ParallelConfig{};
  h->cfg.training.global_batch_size = h->cfg.training.micro_batch_size;
  h->cfg.training.device = "cpu";
  h->cfg.training.precision = "fp32";  // the CPU backend: the weights are fp32 whatever they train in
  h->derived = derive_config(h->cfg, 1);
  if (padded_vocab > 0) h->derived.padded_vocab_size = padded_vocab;
  h->ctx.model = &h->cfg.model;
  h->ctx.derived = &h->derived;
  h->ctx.ps = &h->ps;
  h->store = std::make_unique<ParamStore>(0, 1);
  h->model = std::make_unique<GPTModel>(h->ctx, *h->store, ModelChunkSpec{0, h->cfg.model.num_layers, true, true});
  h->store->allocate(DType::F32, Device::CPU);
  return h;
}

std::string save_host_model(HostModel& host, const std::string& dir, const std::string& config_yaml, Communicator& world) {
  ckpt::SaveRequest req;
  req.dir = dir;
  req.iteration = 0;
  req.config_yaml = config_yaml;
  req.state = {{"iteration", 0}, {"consumed_train_samples", 0}, {"optimizer_step", 0}, {"skipped_iterations", 0},
               {"seed", host.cfg.training.seed}};
  for (Param* p : host.store->params()) {
    if (p->spec.tied_copy) continue;
    Tensor z = Tensor::zeros(p->spec.global_shape, DType::F32);
    for (const char* suffix : {"", "/exp_avg", "/exp_avg_sq"}) {
      ckpt::ShardTensor t;
      t.name = p->spec.name + suffix;
      t.global_shape = p->spec.global_shape;
      t.offset = Shape(p->spec.global_shape.size(), 0);
      t.data = *suffix ? z : host.store->master(*p);
      req.tensors.push_back(std::move(t));
    }
  }
  return ckpt::save_checkpoint(req, world);
}

std::vector<std::string> convert_import(const ImportOptions& opt, Communicator& world) {
  MT_CHECK(world.size() == 1, "megatrain convert runs on one rank (started on ", world.size(), ")");
  const std::string cfg_path = opt.hf_dir + "/config.json";
  MT_CHECK(fs::exists(cfg_path), cfg_path, ": not found (--hf names the folder save_pretrained wrote)");
  json hj;
  try {
    hj = json::parse(ckpt::detail::read_text_file(cfg_path));
  } catch (const json::exception& e) {
    MT_CHECK(false, cfg_path, ": not valid JSON: ", e.what());
  }
  std::vector<std::string> notes;
  hf::ArchSpec a = hf::parse_config(hj, cfg_path, &notes);
  st::Archive ar(opt.hf_dir);
  // transformers 5's fused expert tensors (save_pretrained(save_original_format=False)) or the per-expert ones.
  for (const auto& [name, e] : ar.entries()) {
    const std::string fused = "mlp.experts.gate_up_proj";
    if (a.moe() && name.size() >= fused.size() && name.compare(name.size() - fused.size(), fused.size(), fused) == 0)
      a.fused_experts = true;
  }

  // The tensors' names and shapes, before anything else is read or built.
  std::vector<std::string> skip;
  const std::vector<hf::Rule> rules = hf::mapping(a, &skip);
  check_hf_tensors(ar, a, rules, skip, cfg_path, hj);

  // The config: the model section from config.json, the rest defaults that validate.
  Config cfg;
  cfg.model = hf::to_model_config(a, cfg_path);
  const std::string out_abs = fs::absolute(opt.output).lexically_normal().string();
  const bool has_tokenizer = fs::exists(opt.hf_dir + "/tokenizer.json");
  if (has_tokenizer) {
    cfg.data.tokenizer_type = "hf-json";
    cfg.data.tokenizer_file = out_abs + "/hf/tokenizer.json";
  }
  cfg.data.mock = true;
  cfg.training.train_iters = 1000;
  cfg.training.micro_batch_size = 1;
  cfg.checkpoint.load = out_abs;
  cfg.checkpoint.finetune = true;  // the imported weights, a fresh run
  cfg.checkpoint.dir = out_abs + "-finetuned";
  // Precision: the dtype the weights were stored in.
  DType hf_dtype = DType::F32;
  if (const auto* e = ar.find(rules[0].hf[0])) hf_dtype = e->info->dtype;
  cfg.training.precision = precision_of(hf_dtype);
  const std::string yaml = config_to_yaml(cfg);
  (void)load_config_from_string(yaml, opt.output + "/model.yaml");  // validates what we write

  auto host = build_host_model(cfg);
  ParamStore& store = *host->store;
  store.flat_master().zero_();
  std::set<std::string> filled;
  for (const hf::Rule& r : rules) {
    Param* p = store.find(r.ours);
    MT_INTERNAL_ASSERT(p != nullptr, "the mapping of ", a.architecture, " names ", r.ours, ", which the model lacks");
    MT_INTERNAL_ASSERT(unpadded_shape(r, *p, a.vocab_size) == r.shape, "the mapping of ", a.architecture, " gives ",
                       r.ours, " the shape ", shape_str(r.shape), ", the model ", shape_str(p->spec.global_shape));
    if (r.transform == hf::Transform::Expert) {  // expert e's slice of the fused tensor, straight in
      const st::Archive::Entry* e = ar.find(r.hf[0]);
      const int64_t n = shape_numel(r.shape);
      to_f32(e->file->data(*e->info) + r.expert * n * static_cast<int64_t>(dtype_size(e->info->dtype)), e->info->dtype,
             n, store.master(*p).data<float>());
      filled.insert(r.ours);
      continue;
    }
    const auto shapes = hf::hf_shapes(r, a, r.shape);
    std::vector<std::vector<float>> bufs;
    for (size_t i = 0; i < r.hf.size(); ++i) {
      const st::Archive::Entry* e = ar.find(r.hf[i]);
      bufs.emplace_back(static_cast<size_t>(shape_numel(shapes[i])));
      to_f32(e->file->data(*e->info), e->info->dtype, shape_numel(shapes[i]), bufs.back().data());
    }
    std::vector<const float*> srcs;
    for (const auto& b : bufs) srcs.push_back(b.data());
    // TP1: the master view is the whole global tensor; the rows past vocab_size stay zero.
    hf::merge(r, a, r.shape, srcs, store.master(*p).data<float>());
    filled.insert(r.ours);
  }
  for (Param* p : store.params())
    MT_INTERNAL_ASSERT(filled.count(p->spec.name), "the mapping of ", a.architecture, " leaves ", p->spec.name, " unset");
  store.sync_values_from_master(0, store.padded_numel());

  // Write: the checkpoint (weights + zero moments), model.yaml and the HF side files.
  StagingDir stage(opt.output);
  save_host_model(*host, stage.tmp, yaml, world);
  ckpt::detail::write_file_durable(stage.tmp + "/model.yaml",
                                   "# Imported from " + fs::absolute(opt.hf_dir).string() + " (" + a.architecture +
                                       ") by megatrain convert import.\n# Set data.paths and the training section; "
                                       "checkpoint.load reads the imported weights.\n" + yaml);
  fs::create_directories(stage.tmp + "/hf");
  for (const char* f : kSideFiles)
    if (fs::exists(opt.hf_dir + "/" + f)) copy_file_into(opt.hf_dir + "/" + f, stage.tmp + "/hf/" + f);
  stage.commit();
  return notes;
}

namespace {

// The config.json an export starts from: --hf-config, else the one an import left beside the
// tokenizer the config names or beside the checkpoint.
std::string find_base_config(const ExportOptions& opt, const Config& cfg, const std::string& ckpt_path) {
  if (!opt.hf_config.empty()) {
    MT_CHECK(fs::exists(opt.hf_config), "--hf-config ", opt.hf_config, ": not found");
    return opt.hf_config;
  }
  std::vector<fs::path> candidates;
  if (!cfg.data.tokenizer_file.empty()) candidates.push_back(fs::path(cfg.data.tokenizer_file).parent_path() / "config.json");
  const fs::path ck = fs::absolute(ckpt_path);
  candidates.push_back(ck.parent_path() / "hf" / "config.json");
  candidates.push_back(ck / "hf" / "config.json");
  for (const auto& c : candidates)
    if (fs::exists(c)) return c.string();
  return "";
}

}  // namespace

void convert_export(const ExportOptions& opt) {
  const std::string path = ckpt::resolve_load_path(opt.checkpoint, opt.checkpoint);
  MT_CHECK(!path.empty(), "--checkpoint ", opt.checkpoint, ": no checkpoint there (no 'latest' and no manifest.json)");
  ckpt::LoadedCheckpoint ck = ckpt::open_checkpoint(path);
  Config cfg = load_stored_config(ck.config_yaml, path + "/manifest.json");
  const DerivedConfig saved = derive_config(cfg, ck.world_size);
  if (cfg.model.moe_router_force_load_balancing)
    std::fprintf(stderr, "note: %s was trained with model.moe_router_force_load_balancing (a benchmark key: random "
                 "routing); the exported model routes by its router weights, which that run did not route by\n",
                 path.c_str());
  auto host = build_host_model(cfg, saved.padded_vocab_size);
  load_model_weights(ck, *host->store);

  const std::string base_path = find_base_config(opt, cfg, path);
  nlohmann::ordered_json base;
  std::string architecture;
  if (!base_path.empty()) {
    try {
      base = nlohmann::ordered_json::parse(ckpt::detail::read_text_file(base_path));
    } catch (const std::exception& e) {
      MT_CHECK(false, base_path, ": not valid JSON: ", e.what());
    }
    architecture = hf::parse_config(json::parse(base.dump()), base_path, nullptr).architecture;
  }
  hf::ArchSpec a;
  try {
    a = hf::from_model_config(cfg, architecture);
  } catch (const Error& e) {
    // A config.json found beside the tokenizer may be another model's: then it is no base.
    if (!opt.hf_config.empty() || architecture.empty()) throw;
    std::fprintf(stderr, "note: %s is not this checkpoint's architecture (%s): writing a config.json of its own\n",
                 base_path.c_str(), e.what());
    base = nlohmann::ordered_json();
    a = hf::from_model_config(cfg, "");
  }

  // The checkpoint's training.precision unless --dtype says otherwise.
  DType dt = saved.precision == Precision::BF16 ? DType::BF16 : saved.precision == Precision::FP16 ? DType::F16 : DType::F32;
  if (!opt.dtype.empty()) {
    if (opt.dtype == "bf16") dt = DType::BF16;
    else if (opt.dtype == "fp16") dt = DType::F16;
    else if (opt.dtype == "fp32") dt = DType::F32;
    else MT_CHECK(false, "--dtype ", opt.dtype, ": give bf16, fp16 or fp32");
  }
  const char* torch_dtype = dt == DType::BF16 ? "bfloat16" : dt == DType::F16 ? "float16" : "float32";
  const uint64_t max_shard = st::parse_size(opt.max_shard_size);

  std::vector<std::vector<uint8_t>> keep;
  std::vector<st::WriteTensor> out;
  for (const hf::Rule& r : hf::mapping(a, nullptr)) {
    Param* p = host->store->find(r.ours);
    MT_INTERNAL_ASSERT(p != nullptr, "the mapping of ", a.architecture, " names ", r.ours, ", which the model lacks");
    const Shape ours = unpadded_shape(r, *p, a.vocab_size);
    MT_INTERNAL_ASSERT(ours == r.shape, "the mapping of ", a.architecture, " gives ", r.ours, " the shape ",
                       shape_str(r.shape), ", the checkpoint's model ", shape_str(ours));
    const auto shapes = hf::hf_shapes(r, a, ours);
    std::vector<std::vector<float>> bufs;
    std::vector<float*> dsts;
    for (const auto& s : shapes) bufs.emplace_back(static_cast<size_t>(shape_numel(s)));
    for (auto& b : bufs) dsts.push_back(b.data());
    hf::split(r, a, ours, host->store->master(*p).data<float>(), dsts);
    for (size_t i = 0; i < shapes.size(); ++i) {
      keep.push_back(from_f32(bufs[i].data(), shape_numel(shapes[i]), dt));
      out.push_back({r.hf[i], dt, shapes[i], keep.back().data()});
    }
  }

  StagingDir stage(opt.output);
  st::write_model(stage.tmp, out, max_shard);
  ckpt::detail::write_file_durable(stage.tmp + "/config.json", hf::make_config(a, torch_dtype, base).dump(2) + "\n");
  const fs::path base_dir = base_path.empty() ? fs::path() : fs::path(base_path).parent_path();
  auto from_base = [&](const char* f) { return !base_dir.empty() && fs::exists(base_dir / f); };
  if (from_base("generation_config.json")) {
    copy_file_into((base_dir / "generation_config.json").string(), stage.tmp + "/generation_config.json");
  } else {
    json g = {{"_from_model_config", true}};
    if (base.is_object())
      for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
        if (base.contains(k) && !base[k].is_null()) g[k] = base[k];
    ckpt::detail::write_file_durable(stage.tmp + "/generation_config.json", g.dump(2) + "\n");
  }
  // The tokenizer the checkpoint's config names, and its companions from the import.
  if (saved.tokenizer_type == TokenizerType::HfJson) copy_file_into(cfg.data.tokenizer_file, stage.tmp + "/tokenizer.json");
  if (saved.tokenizer_type == TokenizerType::Gpt2Bpe) {
    copy_file_into(cfg.data.vocab_file, stage.tmp + "/vocab.json");
    copy_file_into(cfg.data.merge_file, stage.tmp + "/merges.txt");
  }
  for (const char* f : {"tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"})
    if (from_base(f)) copy_file_into((base_dir / f).string(), stage.tmp + "/" + f);
  stage.commit();
}

void checkpoint_inspect(const std::string& checkpoint, std::ostream& os) {
  const std::string path = ckpt::resolve_load_path(checkpoint, checkpoint);
  MT_CHECK(!path.empty(), checkpoint, ": no checkpoint there (no 'latest' and no manifest.json)");
  ckpt::LoadedCheckpoint ck = ckpt::open_checkpoint(path);
  Config cfg = load_stored_config(ck.config_yaml, path + "/manifest.json");
  const ParallelConfig& p = cfg.parallel;
  const int dp = ck.world_size / std::max(1, p.tensor * p.pipeline * p.context);
  os << "checkpoint " << path << "\n";
  os << "iteration " << ck.iteration << "\n";
  os << "saved by " << ck.world_size << " rank(s): tensor " << p.tensor << " x pipeline " << p.pipeline << " (virtual "
     << p.virtual_pipeline << ") x context " << p.context << " x data " << dp << ", expert " << p.expert
     << (p.distributed_optimizer ? ", distributed optimizer" : "") << "\n";
  os << "state " << ck.state.dump() << "\n";
  os << "tensors:\n";
  const json& tensors = ck.manifest.at("tensors");
  size_t w = 0;
  for (auto it = tensors.begin(); it != tensors.end(); ++it) w = std::max(w, it.key().size());
  int64_t params = 0;
  for (auto it = tensors.begin(); it != tensors.end(); ++it) {
    const Shape s = it.value().at("global_shape").get<Shape>();
    os << "  " << it.key() << std::string(w - it.key().size() + 2, ' ') << it.value().at("dtype").get<std::string>()
       << " " << shape_str(s) << "  (" << it.value().at("shards").size() << " shard(s))\n";
    if (it.key().find('/') == std::string::npos) params += shape_numel(s);
  }
  os << "parameters (with vocabulary padding): " << params << "\n";
  os << "config:\n" << ck.config_yaml;
}

}  // namespace mt
