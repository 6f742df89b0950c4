// `megatrain plan` estimates: parameter counts per rank add up to the single-rank model, the
// activation bytes per layer equal what a real forward keeps, the distributed optimizer divides
// optimizer state over data-parallel ranks, the schedule gives the micro-batches in flight, and
// the plan of configs/llama-3b.yaml on 8 ranks (TP2 PP2 DP2) is printed.
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>

#include "config/config_loader.h"
#include "core/attention_chunks.h"
#include "core/check.h"
#include "model/gpt_model.h"
#include "model/kept_tensors.h"
#include "test/catch.h"
#include "train/plan.h"

using namespace mt;

namespace {

// If one of these fails, a layer keeps a new tensor per micro-batch: count it in plan.cpp's
// layer_activation_bytes / chunk_extra_activation_bytes and in saved_bytes() below.
static_assert(sizeof(Norm::Saved) == 2 * sizeof(Tensor));
// (FP8 layers' kept input copies, Fp8Saved: plan.cpp fp8_layer_extra_bytes.)
static_assert(sizeof(SelfAttention::Saved) == 7 * sizeof(Tensor) + 2 * sizeof(Norm::Saved) + 2 * sizeof(Fp8Saved));
static_assert(sizeof(DenseMLP::Saved) == 2 * sizeof(Tensor) + sizeof(MLPState) + 2 * sizeof(Fp8Saved));
static_assert(sizeof(OutputLayer::Saved) == 2 * sizeof(Tensor));
static_assert(sizeof(TransformerLayer::Saved) == 4 * sizeof(Tensor) + 2 * sizeof(Norm::Saved) +
                                                    sizeof(SelfAttention::Saved) + sizeof(std::shared_ptr<MLPState>) +
                                                    alignof(Tensor));  // + bool complete

Config tiny(const std::string& arch, int layers = 4) {
  Config c;
  c.model.arch = arch;
  c.model.num_layers = layers;
  c.model.hidden_size = 32;
  c.model.num_attention_heads = 4;
  c.model.num_query_groups = arch == "llama" ? 2 : 0;
  c.model.ffn_hidden_size = arch == "llama" ? 48 : 0;
  c.model.vocab_size = 61;
  c.model.make_vocab_size_divisible_by = 8;
  c.model.seq_length = 8;
  c.training.micro_batch_size = 2;
  c.training.global_batch_size = 8;
  c.training.train_iters = 1;
  return c;
}

int64_t nb(const Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }
int64_t saved_bytes(const Norm::Saved& s) { return nb(s.mean) + nb(s.rstd); }
int64_t saved_bytes(const TransformerLayer::Saved& s) {
  return nb(s.x_in) + nb(s.x_mid) + nb(s.ln1_out) + nb(s.ln2_out) + saved_bytes(s.n1) + saved_bytes(s.n2) +
         nb(s.attn.q) + nb(s.attn.k) + nb(s.attn.v) + nb(s.attn.out) + nb(s.attn.lse) + nb(s.attn.q_pre) +
         nb(s.attn.k_pre) + saved_bytes(s.attn.q_norm) + saved_bytes(s.attn.k_norm) + s.attn.qkv_x.nbytes() +
         s.attn.proj_x.nbytes() + (s.mlp ? s.mlp->nbytes() : 0);
}

// The tensors a layer keeps, by the names model/kept_tensors.h gives them.
std::map<std::string, const Tensor*> kept_by_name(const TransformerLayer::Saved& s) {
  std::map<std::string, const Tensor*> m = {
      {"x_in", &s.x_in}, {"x_mid", &s.x_mid}, {"ln1_out", &s.ln1_out}, {"ln2_out", &s.ln2_out},
      {"n1.mean", &s.n1.mean}, {"n1.rstd", &s.n1.rstd}, {"n2.mean", &s.n2.mean}, {"n2.rstd", &s.n2.rstd},
      {"self_attention.q", &s.attn.q}, {"self_attention.k", &s.attn.k}, {"self_attention.v", &s.attn.v},
      {"self_attention.out", &s.attn.out}, {"self_attention.lse", &s.attn.lse},
      {"self_attention.q_pre", &s.attn.q_pre}, {"self_attention.k_pre", &s.attn.k_pre},
      {"self_attention.q_norm.mean", &s.attn.q_norm.mean}, {"self_attention.q_norm.rstd", &s.attn.q_norm.rstd},
      {"self_attention.k_norm.mean", &s.attn.k_norm.mean}, {"self_attention.k_norm.rstd", &s.attn.k_norm.rstd}};
  if (const auto* mlp = dynamic_cast<const DenseMLP::Saved*>(s.mlp.get())) {
    m["mlp.h"] = &mlp->h;
    m["mlp.a"] = &mlp->a;
  }
  return m;
}

// A whole model on one rank, CPU, in `dtype`, initialized: the real thing the estimate models.
struct RealModel {
  Config cfg;
  DerivedConfig d;
  ParallelState ps;
  ModelContext ctx;
  std::unique_ptr<ParamStore> store;
  std::unique_ptr<GPTModel> model;
  RealModel(const Config& c, DType dtype, const RecomputePolicy& recompute) : cfg(c) {
    d = derive_config(cfg, 1);
    ctx.model = &cfg.model;
    ctx.derived = &d;
    ctx.ps = &ps;
    ctx.dtype = dtype;
    ctx.recompute = recompute;
    store = std::make_unique<ParamStore>(0, 1);
    model = std::make_unique<GPTModel>(ctx, *store, ModelChunkSpec{0, cfg.model.num_layers, true, true});
    store->allocate(dtype, Device::CPU);
    store->initialize(5, 0.02, cfg.model.num_layers);
  }
  void forward(GPTModel::MicroState& st, int64_t B, int64_t T) {
    std::mt19937 g(3);
    std::vector<int32_t> tokens(B * T), labels(B * T);
    for (auto& t : tokens) t = static_cast<int32_t>(g() % cfg.model.vocab_size);
    for (auto& t : labels) t = static_cast<int32_t>(g() % cfg.model.vocab_size);
    double loss = 0;
    model->forward(st, tokens.data(), labels.data(), B, T, Tensor(), StepContext{}, &loss);
  }
};

}  // namespace

RecomputePolicy policy(RecomputePolicy::Mode mode, bool block = false, int num_layers = 1, bool norm_act = true) {
  RecomputePolicy p;
  p.mode = mode;
  p.block = block;
  p.num_layers = num_layers;
  p.norm_act = norm_act;
  return p;
}

TEST_CASE("plan: activation bytes follow the model features", "[plan][features]") {
  using Mode = RecomputePolicy::Mode;
  // qk_layernorm (q, k before the norms and their statistics kept), kv_channels != hidden/heads, and the
  // llama preset with layernorm + gelu (two statistics per norm, the GELU output kept).
  Config qwen = tiny("llama");
  qwen.model.qk_layernorm = true;
  qwen.model.kv_channels = 12;
  qwen.model.add_qkv_bias = true;
  Config mixed = tiny("llama");
  mixed.model.normalization = "layernorm";
  mixed.model.activation = "gelu";
  mixed.model.kv_channels = 6;
  for (const Config& cfg : {qwen, mixed})
    for (const RecomputePolicy& rp : {policy(Mode::None), policy(Mode::Selective), policy(Mode::None, false, 1, false)}) {
      INFO("normalization " << cfg.model.normalization.value_or("preset") << " recompute "
                            << recompute_mode_name(rp.mode) << " norm_act " << rp.norm_act);
      RealModel m(cfg, DType::F64, rp);
      const int64_t B = 3, T = 8;
      GPTModel::MicroState st;
      m.forward(st, B, T);
      LayerDims ld;
      ld.B = B;
      ld.T = T;
      ld.rows = B * T;
      ld.hidden = cfg.model.hidden_size;
      ld.heads = cfg.model.num_attention_heads;
      ld.groups = m.d.num_query_groups;
      ld.head_dim = m.d.head_dim;
      ld.ffn = m.d.ffn_hidden_size;
      for (const auto& layer : st.layers) {
        CHECK(saved_bytes(layer) == layer_activation_bytes(m.cfg.model, m.d, 1, false, B, T, DType::F64, rp.mode,
                                                           !rp.norm_act));
        // The description names exactly the tensors the layer keeps, with their sizes.
        std::map<std::string, const Tensor*> real = kept_by_name(layer);
        const auto described =
            layer_kept(layer_spec(m.d.features, 0), m.d.features.activation, ld, rp.mode, !rp.norm_act);
        std::set<std::string> names;
        for (const KeptTensor& t : described) {
          INFO(t.name);
          names.insert(t.name);
          REQUIRE(real.count(t.name) == 1);
          REQUIRE(real[t.name]->defined());
          CHECK(real[t.name]->numel() == t.numel);
        }
        for (const auto& [name, t] : real)
          if (t->defined()) CHECK(names.count(name) == 1);
      }
      const int64_t extra = nb(st.tokens) + nb(st.labels) + nb(st.final_in) + nb(st.final_out) +
                            saved_bytes(st.final_norm) + nb(st.head.lse);
      CHECK(extra == chunk_extra_activation_bytes(m.cfg.model, 1, false, B, T, DType::F64, true, true));
    }
}

TEST_CASE("plan: activation bytes per layer equal what a real forward keeps", "[plan]") {
  using Mode = RecomputePolicy::Mode;
  const RecomputePolicy policies[] = {policy(Mode::None),          policy(Mode::Selective),
                                      policy(Mode::Full),          policy(Mode::Full, false, 3),
                                      policy(Mode::Full, true, 1), policy(Mode::Full, true, 6),
                                      // training.recompute_norm_act false: the norm and SwiGLU outputs kept
                                      policy(Mode::None, false, 1, false), policy(Mode::Selective, false, 1, false),
                                      policy(Mode::Full, true, 1, false)};
  for (const std::string arch : {"llama", "gpt2"})
    for (DType dtype : {DType::F32, DType::F64})
      for (const RecomputePolicy& rp : policies) {
        INFO(arch << " " << dtype_name(dtype) << " recompute " << recompute_mode_name(rp.mode)
                  << (rp.block ? " block " : " uniform ") << rp.num_layers << " norm_act " << rp.norm_act);
        RealModel m(tiny(arch), dtype, rp);
        const int64_t B = 3, T = 8;
        GPTModel::MicroState st;
        m.forward(st, B, T);
        REQUIRE(st.layers.size() == 4);
        int64_t layers = 0;
        for (const auto& layer : st.layers) {
          layers += saved_bytes(layer);
          if (rp.mode != Mode::Full)  // every layer keeps the same
            CHECK(saved_bytes(layer) ==
                  layer_activation_bytes(m.cfg.model, m.d, 1, false, B, T, dtype, rp.mode, !rp.norm_act));
        }
        CHECK(layers == chunk_layers_activation_bytes(m.cfg.model, m.d, 1, false, B, T, dtype, rp, 4));
        // Outside the layers: tokens, labels, final norm in/out/statistics, loss lse; then the logits.
        const int64_t extra = nb(st.tokens) + nb(st.labels) + nb(st.final_in) + nb(st.final_out) +
                              saved_bytes(st.final_norm) + nb(st.head.lse);
        CHECK(extra == chunk_extra_activation_bytes(m.cfg.model, 1, false, B, T, dtype, true, true));
        CHECK(nb(st.head.logits) == logits_bytes(m.d, 1, B, T, dtype));
      }
  // full recompute keeps exactly the layer inputs: one (B*T, C) tensor per kept input
  const Config c = tiny("llama");
  const DerivedConfig d = derive_config(c, 1);
  const int64_t input = 3 * 8 * 32 * 4;
  CHECK(layer_activation_bytes(c.model, d, 1, false, 3, 8, DType::F32, Mode::Full) == input);
  CHECK(chunk_layers_activation_bytes(c.model, d, 1, false, 3, 8, DType::F32, policy(Mode::Full, false, 3), 4) == 2 * input);
  CHECK(chunk_extra_activation_bytes(c.model, 1, false, 3, 8, DType::F32, false, false) == 0);
}

TEST_CASE("plan: parameters per rank sum over the model-parallel group to the single-rank count", "[plan]") {
  // Split parameters add up exactly over tensor ranks and stages; replicated ones (norms,
  // row-parallel biases, position embeddings) are held, and counted, once on every tensor rank;
  // gpt2's last stage holds a copy of the tied word embeddings (counted on that rank too).
  struct Layout {
    std::string arch;
    int tp, pp, vp;
  };
  for (const Layout& l : {Layout{"llama", 2, 2, 1}, Layout{"llama", 2, 2, 2}, Layout{"llama", 1, 4, 1},
                          Layout{"gpt2", 2, 2, 1}, Layout{"gpt2", 4, 1, 1}, Layout{"gpt2", 1, 2, 2}}) {
    INFO(l.arch << " tp " << l.tp << " pp " << l.pp << " vp " << l.vp);
    const Config one = tiny(l.arch);
    const DerivedConfig d1 = derive_config(one, 1);
    const int64_t single = count_rank_params(one, d1, 0, 0).total;
    Config cfg = tiny(l.arch);
    cfg.parallel.tensor = l.tp;
    cfg.parallel.pipeline = l.pp;
    cfg.parallel.virtual_pipeline = l.vp;
    cfg.model.make_vocab_size_divisible_by = 8 / l.tp;  // same padded vocabulary as the single rank
    const DerivedConfig d = derive_config(cfg, l.tp * l.pp);
    REQUIRE(d.padded_vocab_size == d1.padded_vocab_size);
    int64_t split = 0, replicated = 0, copies = 0;
    for (int s = 0; s < l.pp; ++s) {
      const RankParams r0 = count_rank_params(cfg, d, s, 0);
      for (int r = 0; r < l.tp; ++r) {
        const RankParams rp = count_rank_params(cfg, d, s, r);
        CHECK(rp.total == r0.total);  // every tensor rank holds the same count
        CHECK(rp.replicated == r0.replicated);
        split += rp.total - rp.replicated - rp.tied_copies;
      }
      replicated += r0.replicated;
      copies += r0.tied_copies;
      int64_t chunks = 0;
      for (int64_t n : r0.per_chunk) chunks += n;
      CHECK(chunks == r0.total);
    }
    CHECK(split + replicated == single);
    CHECK(copies == (l.arch == "gpt2" && l.pp > 1 ? d.padded_vocab_size / l.tp * one.model.hidden_size : 0));
    // make_plan counts the same per stage, and the whole model once
    const PlanReport plan = make_plan(cfg, l.tp * l.pp);
    CHECK(plan.total_params == single);
    for (int s = 0; s < l.pp; ++s) CHECK(plan.stages[s].params == count_rank_params(cfg, d, s, 0).total);
  }
}

TEST_CASE("plan: memory per rank, distributed optimizer divides optimizer state over data parallel", "[plan]") {
  Config cfg = tiny("llama");
  cfg.training.precision = "bf16";
  const PlanReport plain = make_plan(cfg, 4);  // data parallel 4
  cfg.parallel.distributed_optimizer = true;
  const PlanReport dist = make_plan(cfg, 4);
  REQUIRE(plain.dp == 4);
  const PlanStage &a = plain.stages[0], &b = dist.stages[0];
  CHECK(a.weight_bytes == a.params * 2);  // bf16 compute copy
  CHECK(a.grad_bytes == a.params * 4);    // fp32 main gradients
  CHECK(a.optimizer_bytes == a.params * 10);  // Adam m, v and the master weights' low halves (bf16)
  CHECK(b.weight_bytes == a.weight_bytes);
  CHECK(b.grad_bytes == a.grad_bytes);
  CHECK(b.optimizer_bytes == (a.params + 3) / 4 * 10);
  CHECK(b.activation[0] == a.activation[0]);
  cfg.parallel.grad_reduce_in_fp32 = false;  // bf16 main gradients: 2 bytes a parameter, nothing else changes
  const PlanReport g16 = make_plan(cfg, 4);
  CHECK(g16.stages[0].grad_bytes == a.params * 2);
  CHECK(g16.stages[0].optimizer_bytes == b.optimizer_bytes);
  CHECK(g16.stages[0].total(0) == b.total(0) - b.grad_bytes + a.params * 2);
  cfg.parallel.grad_reduce_in_fp32 = true;

  cfg.training.precision = "fp16";  // a separate fp32 master
  CHECK(make_plan(cfg, 4).stages[0].optimizer_bytes == (a.params + 3) / 4 * 12);
  cfg.training.precision = "fp32";
  cfg.parallel.distributed_optimizer = false;
  const PlanReport f32 = make_plan(cfg, 1);
  CHECK(f32.stages[0].weight_bytes == f32.stages[0].params * 4);
  CHECK(f32.stages[0].optimizer_bytes == f32.stages[0].params * 8);
  // single stage: one micro-batch in flight; full recompute keeps only the layer inputs
  const PlanStage& s = f32.stages[0];
  CHECK(s.chunks[0].max_in_flight == 1);
  const int64_t B = 2, T = 8;
  const DerivedConfig d = derive_config(cfg, 1);
  const int64_t extra = chunk_extra_activation_bytes(cfg.model, 1, false, B, T, DType::F32, true, true);
  for (int i = 0; i < kNumRecomputeModes; ++i) {
    CHECK(s.activation[i] ==
          4 * layer_activation_bytes(cfg.model, d, 1, false, B, T, DType::F32, kRecomputeModes[i]) + extra);
    CHECK(s.total(i) == s.weight_bytes + s.grad_bytes + s.optimizer_bytes + s.activation[i] + s.logits_bytes);
  }
  CHECK(s.activation[2] == 4 * B * T * 32 * 4 + extra);  // full: the 4 layer inputs
  CHECK(s.logits_bytes == logits_bytes(d, 1, B, T, DType::F32));
}

TEST_CASE("plan: micro-batches in flight follow the pipeline schedule", "[plan]") {
  Config cfg = tiny("llama", 8);
  cfg.parallel.pipeline = 4;
  cfg.training.global_batch_size = 16;  // 8 micro-batches of 2
  const PlanReport r = make_plan(cfg, 4);
  REQUIRE(r.num_microbatches == 8);
  for (int s = 0; s < 4; ++s) CHECK(r.stages[s].chunks[0].max_in_flight == 4 - s);  // 1F1B: warm-up + 1
  CHECK(r.stages[0].activation[0] == 4 * r.stages[0].chunks[0].act[0]);
  CHECK(r.stages[3].logits_bytes == r.stages[3].chunks[0].logits);
  CHECK(r.bubble_fraction == Approx(3.0 / 11.0));
  CHECK(r.schedule.find("stage 3: F0.0 B0.0 F1.0 B1.0") != std::string::npos);
  // interleaved: chunk peaks are taken from the list, the stage peak is the largest sum at one time
  cfg.parallel.virtual_pipeline = 2;
  const PlanReport v = make_plan(cfg, 4);
  for (const PlanStage& st : v.stages) {
    int64_t upper = 0;
    for (const PlanChunk& ch : st.chunks) {
      CHECK(ch.max_in_flight >= 1);
      upper += ch.max_in_flight * ch.act[0];
    }
    CHECK(st.activation[0] <= upper);
    CHECK(st.activation[0] >= st.chunks[0].act[0]);
  }
}

TEST_CASE("plan: an impossible layout is refused before anything is built", "[plan]") {
  Config cfg = tiny("llama");
  cfg.parallel.tensor = 2;
  std::string msg;
  try {
    make_plan(cfg, 3);
  } catch (const Error& e) {
    msg = e.what();
  }
  CHECK(msg.find("world size 3 is not divisible by parallel.tensor (2)") != std::string::npos);
}

TEST_CASE("plan: configs/llama-3b.yaml on 8 ranks, tensor 2 x pipeline 2 x data 2", "[plan]") {
  const Config cfg = load_config(std::string(MT_SOURCE_DIR) + "/configs/llama-3b.yaml",
                                 {"parallel.tensor=2", "parallel.pipeline=2"});
  const PlanReport r = make_plan(cfg, 8);
  CHECK(r.dp == 2);
  CHECK(r.num_microbatches == 32);
  REQUIRE(r.stages.size() == 2);
  // 3.02 B parameters; each rank holds a quarter of the split ones
  CHECK(r.total_params == 3015355392);
  const int64_t per_rank_sum = r.stages[0].params + r.stages[1].params;
  CHECK(per_rank_sum * 2 - r.stages[0].replicated_params - r.stages[1].replicated_params == r.total_params);
  CHECK(r.stages[0].chunks[0].max_in_flight == 2);
  CHECK(r.stages[1].chunks[0].max_in_flight == 1);
  CHECK(r.stages[1].logits_bytes == int64_t{4} * 2048 * 16000 * 2);
  CHECK(r.flops_per_token == 6 * r.flop_params + int64_t{12} * 28 * 3072 * 2048);
  const std::string text = format_plan(r);
  for (const char* part : {"tensor 2 x pipeline 2 (virtual 1) x context 1 x data 2 = 8 ranks", "Memory per rank",
                           "Tensor-parallel slices", "[5120, 3072]", "[2560, 3072]", "FLOPs", "bubble fraction 3.0%",
                           "stage 1: F0.0 B0.0"})
    CHECK(text.find(part) != std::string::npos);
}

TEST_CASE("plan: cuDNN's attention backward scratch counts where it exceeds the logits (long sequences)", "[plan]") {
  // llama-1b's attention shape (32 heads of 64) on a small model, at 32768 tokens of one sample.
  Config cfg = tiny("llama", 2);
  cfg.model.hidden_size = 2048;
  cfg.model.num_attention_heads = 32;
  cfg.model.num_query_groups = 8;
  cfg.model.ffn_hidden_size = 64;
  cfg.model.vocab_size = 32000;
  cfg.model.seq_length = 32768;
  cfg.training.micro_batch_size = 1;
  cfg.training.global_batch_size = 1;
  cfg.training.precision = "bf16";
  const int64_t H = 32, T = 32768, D = 64;
  const PlanReport det = make_plan(cfg, 1);
  // Deterministic: one query head per call (a KV group of 4 heads needs 8 GiB, one head 2 GiB, both above the
  // 1024 MiB cap): the scores' gradient of one head (T^2 bf16) + delta (fp32 T) + the group's 4 partial dK and dV
  // (4 T D bf16 each), and a warning naming the key.
  CHECK(det.stages[0].attention_scratch == T * T * 2 + T * 4 + 2 * 4 * T * D * 2);
  CHECK(det.attention_chunks.single_heads);
  CHECK(det.attention_chunks.over_cap());
  CHECK(det.stages[0].total(0) == det.stages[0].weight_bytes + det.stages[0].grad_bytes + det.stages[0].optimizer_bytes +
                                      det.stages[0].activation[0] + det.stages[0].attention_scratch);
  const std::string text = format_plan(det);
  CHECK(text.find("deterministic attention backward workspace (scores' gradient of one call): 2048.0 MiB, one query "
                  "head per call (32 calls") != std::string::npos);
  CHECK(text.find("warning: one query head of the deterministic attention backward needs 2048.0 MiB of workspace, "
                  "above training.attention_bwd_workspace_mib (1024)") != std::string::npos);
  CHECK(text.find("raise training.attention_bwd_workspace_mib to 2048") != std::string::npos);
  CHECK(attention_workspace_warning(det) != "");
  // A cap of one head's workspace: single heads, no warning; of one KV group's: a group (4 heads) per call.
  cfg.training.attention_bwd_workspace_mib = 2048;
  const PlanReport heads = make_plan(cfg, 1);
  CHECK(heads.stages[0].attention_scratch == T * T * 2 + T * 4 + 2 * 4 * T * D * 2);
  CHECK(attention_workspace_warning(heads).empty());
  CHECK(format_plan(heads).find("warning: one query head") == std::string::npos);
  cfg.training.attention_bwd_workspace_mib = 8192;
  const PlanReport group = make_plan(cfg, 1);
  CHECK(group.stages[0].attention_scratch == 4 * T * T * 2 + 4 * T * 4);
  CHECK(group.attention_chunks.groups == 1);
  CHECK(group.attention_chunks.heads == 4);
  CHECK(format_plan(group).find("8192.0 MiB, 1 KV group(s) (4 query heads) of one sample per call (8 calls), within "
                                "training.attention_bwd_workspace_mib (8192)") != std::string::npos);
  cfg.training.attention_bwd_workspace_mib = 1024;
  cfg.training.deterministic = false;
  const PlanReport fast = make_plan(cfg, 1);
  CHECK(attention_workspace_warning(fast).empty());  // no such workspace: no warning
  CHECK(fast.attention_chunks.single_heads);         // what deterministic true would use, still reported, as such
  CHECK(format_plan(fast).find("one query head per call (32 calls; a KV group's dK/dV summed over its heads), above "
                               "training.attention_bwd_workspace_mib (1024); used only with training.deterministic "
                               "true\n") != std::string::npos);
  CHECK(format_plan(det).find("used only with") == std::string::npos);
  CHECK(fast.stages[0].attention_scratch == H * T * D * 4 + H * T * 4);  // dQ in fp32 + delta
  CHECK(fast.stages[0].attention_scratch < fast.stages[0].logits_bytes);
  CHECK(fast.stages[0].total(0) == fast.stages[0].weight_bytes + fast.stages[0].grad_bytes +
                                       fast.stages[0].optimizer_bytes + fast.stages[0].activation[0] +
                                       fast.stages[0].logits_bytes);
  // Batch chunks: 8 samples of T 2048 need 2 GiB of scores, so the backward runs 4 at a time under the 1024 MiB cap.
  cfg.training.deterministic = true;
  cfg.model.seq_length = 2048;
  cfg.training.micro_batch_size = 8;
  cfg.training.global_batch_size = 8;
  CHECK(make_plan(cfg, 1).stages[0].attention_scratch == 4 * H * 2048 * 2048 * 2 + 4 * H * 2048 * 4);
  // No cuDNN: fp32, or training.attention_backend own.
  cfg.training.attention_backend = "own";
  CHECK(make_plan(cfg, 1).stages[0].attention_scratch == 0);
  cfg.training.attention_backend = "auto";
  cfg.training.precision = "fp32";
  CHECK(make_plan(cfg, 1).stages[0].attention_scratch == 0);
}

TEST_CASE("attention_bwd_chunks: samples, then KV groups, then single query heads under the cap", "[plan]") {
  const int64_t MiB = 1048576;
  // B 8, H 32, G 8, T 2048: 8 MiB per head, 256 MiB per sample.
  AttnBwdChunks c = attention_bwd_chunks(8, 32, 8, 2048, 2048, 1024 * MiB);
  CHECK(c.samples == 4);
  CHECK(c.heads == 32);
  CHECK(c.workspace == 1024 * MiB);
  CHECK(c.calls(8, 32) == 2);
  c = attention_bwd_chunks(8, 32, 8, 2048, 2048, 600 * MiB);  // 2 samples (4 does not fit, 3 does not divide 8)
  CHECK(c.samples == 2);
  c = attention_bwd_chunks(6, 32, 8, 2048, 2048, 1024 * MiB);  // 3 samples divide 6, 4 do not
  CHECK(c.samples == 3);
  // One sample does not fit: the most KV groups dividing G (each 4 heads, 32 MiB).
  c = attention_bwd_chunks(8, 32, 8, 2048, 2048, 200 * MiB);
  CHECK(c.samples == 1);
  CHECK(c.groups == 4);  // 128 MiB; 8 groups = 256 MiB do not fit
  CHECK(c.heads == 16);
  CHECK(!c.single_heads);
  CHECK(c.calls(8, 32) == 16);
  c = attention_bwd_chunks(1, 32, 8, 2048, 2048, 100 * MiB);  // 3 groups fit (96 MiB) but do not divide 8: 2
  CHECK(c.groups == 2);
  // One group does not fit: single query heads (8 MiB), within the cap or over it.
  c = attention_bwd_chunks(2, 32, 8, 2048, 2048, 16 * MiB);
  CHECK(c.single_heads);
  CHECK(c.heads == 1);
  CHECK(c.workspace == 8 * MiB);
  CHECK(!c.over_cap());
  CHECK(c.calls(2, 32) == 64);
  c = attention_bwd_chunks(1, 32, 8, 2048, 2048, 4 * MiB);
  CHECK(c.single_heads);
  CHECK(c.over_cap());
  // Multi-head attention: a group is one head, never summed.
  c = attention_bwd_chunks(1, 16, 16, 2048, 2048, 4 * MiB);
  CHECK(!c.single_heads);
  CHECK(c.heads == 1);
  CHECK(c.over_cap());
  // A context-parallel block (T 8192, Tk 16384, 32 heads in 8 groups): 256 MiB per head, 1 GiB per group.
  c = attention_bwd_chunks(1, 32, 8, 8192, 16384, 1024 * MiB);
  CHECK(c.groups == 1);
  CHECK(c.heads == 4);
  CHECK(c.workspace == 1024 * MiB);
}
