// `megatrain plan` for mixture-of-experts models: total and active parameters against the reference's own count
// (../shared/reference/torch_moe.py), the MoE layer's parameters against an MoELayer built on Device::Meta, its
// activation bytes against what a real forward keeps, memory under expert / expert-data sharding, FLOPs and
// all-to-all bytes against hand computation, and the MoE configs of configs/.
#include <string>
#include <vector>

#include "test/catch.h"  // before moe_fixture.h (it uses REQUIRE)

#include "config/config_loader.h"
#include "config/config_schema.h"
#include "config/config_validate_moe.h"
#include "core/check.h"
#include "moe/moe_fixture.h"
#include "train/metrics.h"
#include "train/plan.h"

using namespace mt;

namespace {

// If one of these fails, the MoE layer keeps a new tensor per micro-batch: describe it in model/kept_tensors.cpp
// moe_kept and count it in the "activation bytes of an MoE layer" test below.
static_assert(sizeof(Router::Saved) == 7 * sizeof(Tensor) + sizeof(ops::AuxLossGroup));  // aux_group: host-side sums
static_assert(sizeof(Experts::Saved) == sizeof(std::vector<int64_t>) + 2 * sizeof(Tensor));
static_assert(sizeof(MoELayer::Saved) == sizeof(Router::Saved) + sizeof(std::vector<int64_t>) + 2 * sizeof(Tensor) +
                                             sizeof(TokenDispatcher::Plan) + 4 * sizeof(Tensor) +
                                             sizeof(int64_t) +  // the padded flag (aligned)
                                             sizeof(Experts::Saved) + 4 * sizeof(Tensor));

Config tiny_moe();

// A config file of the repository, loaded as `megatrain plan` loads it.
Config load_repo_config(const std::string& rel) { return load_config(std::string(MT_SOURCE_DIR) + "/" + rel); }

PlanReport plan_of(const Config& cfg, int world) { return make_plan(cfg, derive_config(cfg, world), world); }

// torch_moe.py's CONFIGS and its parameter count: MoEGPT's modules summed by hand (Linear without biases, RMSNorm
// one weight, untied embedding and head), n_active = N - experts + experts * topk / E.
struct Ref {
  int layers, hidden, heads, kv_heads, experts, topk, moe_ffn, vocab, seq, mbs;
};
const Ref kRef8x2{12, 1024, 16, 4, 8, 2, 3584, 32000, 2048, 8};
const Ref kRef64x8{12, 1024, 16, 4, 64, 8, 512, 32000, 2048, 8};

struct RefCount {
  int64_t n = 0, active = 0, flops_per_token = 0;
};
RefCount reference_count(const Ref& c) {
  const int64_t h = c.hidden, hd = h / c.heads, f = c.moe_ffn, E = c.experts;
  const int64_t block = 2 * h + h * (c.heads + 2 * c.kv_heads) * hd + h * h + h * E + E * h * 2 * f + E * f * h;
  RefCount r;
  r.n = int64_t{c.vocab} * h + c.layers * block + h + int64_t{c.vocab} * h;
  const int64_t expert = c.layers * (E * h * 2 * f + E * f * h);
  r.active = r.n - expert + expert * c.topk / E;
  r.flops_per_token = 6 * r.active + int64_t{12} * c.layers * h * c.seq;
  return r;
}

// The same model as a megatrain config.
Config megatrain_config(const Ref& c) {
  Config cfg;
  ModelConfig& m = cfg.model;
  m.arch = "llama";
  m.num_layers = c.layers;
  m.hidden_size = c.hidden;
  m.num_attention_heads = c.heads;
  m.num_query_groups = c.kv_heads;
  m.ffn_hidden_size = c.moe_ffn;
  m.num_experts = c.experts;
  m.moe_router_topk = c.topk;
  m.moe_ffn_hidden_size = c.moe_ffn;
  m.moe_aux_loss_coeff = 1e-2;
  m.vocab_size = c.vocab;
  m.make_vocab_size_divisible_by = 128;
  m.seq_length = c.seq;
  cfg.training.micro_batch_size = c.mbs;
  cfg.training.global_batch_size = c.mbs;
  cfg.training.train_iters = 1;
  cfg.training.precision = "bf16";
  return cfg;
}

// A tiny MoE llama: 3 layers, the first dense, a shared expert, 4 experts top-2.
Config tiny_moe() {
  Config cfg;
  ModelConfig& m = cfg.model;
  m.arch = "llama";
  m.num_layers = 3;
  m.hidden_size = 32;
  m.num_attention_heads = 4;
  m.num_query_groups = 2;
  m.ffn_hidden_size = 48;
  m.num_experts = 4;
  m.moe_router_topk = 2;
  m.moe_ffn_hidden_size = 24;
  m.moe_shared_expert_intermediate_size = 16;
  m.moe_layer_freq = {0, 1, 1};
  m.moe_aux_loss_coeff = 1e-2;
  m.vocab_size = 64;
  m.make_vocab_size_divisible_by = 8;
  m.seq_length = 8;
  cfg.training.micro_batch_size = 2;
  cfg.training.global_batch_size = 8;
  cfg.training.train_iters = 1;
  return cfg;
}

int64_t nb(const Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }

}  // namespace

TEST_CASE("plan moe: total and active parameters and FLOPs are torch_moe.py's for its configs", "[plan][moe]") {
  for (const auto& [ref, n_m, active_m] : {std::tuple{kRef8x2, 1154, 361}, std::tuple{kRef64x8, 1306, 249}}) {
    const RefCount rc = reference_count(ref);
    CHECK(std::llround(rc.n / 1e6) == n_m);  // the reference's printed numbers
    CHECK(std::llround(rc.active / 1e6) == active_m);
    const PlanReport r = plan_of(megatrain_config(ref), 1);
    CHECK(r.total_params == rc.n);
    CHECK(r.active_params == rc.active);
    CHECK(r.flops_per_token == rc.flops_per_token);
    CHECK(r.moe_layers == ref.layers);
    const std::string text = format_plan(r);
    CHECK(text.find("active per token") != std::string::npos);
    CHECK(text.find("Mixture of experts: " + std::to_string(ref.experts) + " experts, top-" +
                    std::to_string(ref.topk)) != std::string::npos);
  }
}

TEST_CASE("plan moe: configs/moe-8x-top2.yaml and moe-64x-top8.yaml have the reference's shapes", "[plan][moe]") {
  for (const auto& [file, ref] : {std::pair{"configs/moe-8x-top2.yaml", kRef8x2},
                                  std::pair{"configs/moe-64x-top8.yaml", kRef64x8}}) {
    const Config c = load_repo_config(file);
    CHECK(c.model.num_layers == ref.layers);
    CHECK(c.model.hidden_size == ref.hidden);
    CHECK(c.model.num_attention_heads == ref.heads);
    CHECK(c.model.num_query_groups == ref.kv_heads);
    CHECK(c.model.num_experts == ref.experts);
    CHECK(c.model.moe_router_topk == ref.topk);
    CHECK(c.model.moe_ffn_hidden_size == ref.moe_ffn);
    CHECK(c.model.vocab_size == ref.vocab);
    CHECK(c.model.seq_length == ref.seq);
    CHECK(c.training.micro_batch_size == ref.mbs);
    CHECK(c.training.global_batch_size == ref.mbs);
    CHECK(c.model.moe_aux_loss_coeff == 1e-2);
    CHECK(c.model.moe_router_score_function == "softmax");
    CHECK(c.model.moe_expert_capacity_factor == 0.0);  // dropless
    CHECK(c.training.precision == "bf16");
    // bf16 main grads: with one micro-batch on one rank each gradient is one GEMM's sum rounded once to bf16, as the
    // reference's autocast gives every weight matrix (benchmarks/RESULTS.md session 40)
    CHECK_FALSE(c.parallel.grad_reduce_in_fp32);
    CHECK(c.training.device == "auto");  // cuda where there is one; plan runs anywhere
    const PlanReport r = plan_of(c, 1);
    const RefCount rc = reference_count(ref);
    CHECK(r.total_params == rc.n);
    CHECK(r.active_params == rc.active);
    CHECK(r.flops_per_token == rc.flops_per_token);
  }
}

TEST_CASE("plan moe: an MoE layer's parameters per rank are those of an MoELayer built on Meta", "[plan][moe]") {
  for (const bool swiglu : {true, false})
    for (const int tp : {1, 2})
      for (const int64_t shared : {0, 12}) {
        ModelConfig mc;
        mc.arch = swiglu ? "llama" : "gpt2";
        mc.hidden_size = 16;
        mc.num_layers = 1;
        mc.num_experts = 6;
        mc.moe_router_topk = 2;
        mc.moe_ffn_hidden_size = 10;
        mc.moe_shared_expert_intermediate_size = static_cast<int>(shared);
        DerivedConfig dc;
        ParallelState ps;
        ps.tp_size = tp;
        ps.sequence_parallel = tp > 1;
        ModelContext ctx;
        ctx.model = &mc;
        ctx.derived = &dc;
        ctx.ps = &ps;
        ctx.dtype = DType::BF16;
        ctx.device = Device::Meta;
        ParamStore store(0, tp);
        MoELayer layer("decoder.layers.0.mlp", moe_options(mc), ctx, store);
        store.allocate(ctx.dtype, Device::Meta);
        const MoELayerParams p = moe_layer_params(mc, tp);
        CHECK(store.local_numel() == p.router + mc.num_experts * p.expert + p.shared_local);
        int64_t experts = 0, replicated = 0, other = 0;
        for (const Param* prm : store.params()) {
          const int64_t n = shape_numel(prm->local_shape);
          CHECK(mlp_slot_layer(prm->spec.name) == 0);
          if (is_expert_param(prm->spec.name)) experts += n;
          else other += n;
          if (prm->spec.partition_dim < 0 && !is_expert_param(prm->spec.name)) replicated += n;
        }
        CHECK(experts == mc.num_experts * expert_params(mc));
        CHECK(other == p.router + p.shared_local);
        CHECK(replicated == p.router + p.shared_replicated);
        if (tp == 1) CHECK(p.shared == p.shared_local);
      }
  CHECK(mlp_slot_layer("decoder.layers.12.mlp.linear_fc1.weight") == 12);
  CHECK(mlp_slot_layer("decoder.layers.12.self_attention.linear_qkv.weight") == -1);
  CHECK(mlp_slot_layer("embedding.word_embeddings.weight") == -1);
  CHECK(!is_expert_param("decoder.layers.3.mlp.shared_experts.linear_fc1.weight"));
}

TEST_CASE("plan moe: activation bytes of an MoE layer equal what a real forward keeps", "[plan][moe]") {
  for (const bool swiglu : {true, false})
    for (const bool extras : {false, true}) {
      MoEOptions o;
      o.num_experts = 4;
      o.topk = 2;
      o.ffn_hidden_size = 6;
      o.swiglu = swiglu;
      o.seq_length = 5;
      o.aux_loss_coeff = extras ? 1e-2 : 0.0;
      o.z_loss_coeff = extras ? 1e-3 : 0.0;
      o.shared_ffn_hidden_size = extras ? 7 : 0;
      const int64_t C = 8, N = 10;
      test::MoEFixture fx(o, C);
      Tensor x = Tensor::empty({N, C}, DType::F64);
      for (int64_t i = 0; i < N * C; ++i) x.data<double>()[i] = std::sin(0.37 * static_cast<double>(i));
      MoELayer::Saved s;
      fx.layer->forward(s, x);
      const int64_t kept = nb(s.router.logits) + nb(s.router.scores) + nb(s.router.choice) +
                           (s.router.indices.raw() == s.router.choice.raw() ? 0 : nb(s.router.indices)) +
                           nb(s.router.weights) + nb(s.router.aux_loss) + nb(s.router.z_loss) + nb(s.send_slot) +
                           nb(s.row_of_send) + nb(s.tokens) + nb(s.local_weights) + nb(s.slot_of_row) +
                           nb(s.row_of_slot) + nb(s.experts.h) + nb(s.experts.a) + nb(s.yp) + nb(s.xp) + nb(s.shared_h) +
                           nb(s.shared_a);
      // the plan's description: one rank, single sequence of N rows (B = 1, T = N)
      LayerDims d;
      d.B = 1;
      d.T = N;
      d.rows = N;
      d.hidden = C;
      MoEDims m;
      m.experts = o.num_experts;
      m.topk = o.topk;
      m.ffn = o.ffn_hidden_size;
      m.shared_ffn = o.shared_ffn_hidden_size;
      m.recv_rows = N * o.topk;  // one expert-parallel rank: every routed row
      m.swiglu = swiglu;
      m.aux_loss = extras;
      m.z_loss = extras;
      int64_t described = 0;
      for (const KeptTensor& t : moe_kept(m, d)) described += t.numel * (t.index ? 4 : 8);
      CHECK(described == kept);
    }
}

TEST_CASE("plan moe: active parameters, FLOPs, memory under expert-data sharding and all-to-all bytes by hand",
          "[plan][moe]") {
  Config cfg = tiny_moe();
  cfg.training.precision = "bf16";
  cfg.parallel.expert = 2;
  cfg.parallel.distributed_optimizer = true;
  const int world = 4;  // data 4 = expert 2 x expert-data 2
  const PlanReport r = plan_of(cfg, world);
  REQUIRE(r.dp == 4);
  CHECK(r.ep == 2);
  CHECK(r.expert_dp == 2);
  CHECK(r.moe_layers == 2);
  const int64_t C = 32, F = 24, Fs = 16, E = 4, k = 2, V = 64;
  const int64_t expert = 3 * C * F, router = E * C, shared = 3 * C * Fs;
  CHECK(expert_params(cfg.model) == expert);
  const int64_t attn = C * (4 + 2 * 2) * 8 + C * C, norms = 2 * C, dense_mlp = 3 * C * 48;
  const int64_t total = 2 * V * C + C + 3 * (attn + norms) + dense_mlp + 2 * (router + E * expert + shared);
  CHECK(r.total_params == total);
  CHECK(r.active_params == total - 2 * E * expert + 2 * k * expert);
  CHECK(r.flop_params == total - 2 * E * expert);
  CHECK(r.flops_per_token == 6 * (total - 2 * E * expert + 2 * k * expert) + 12 * 3 * C * 8);
  // one rank: everything but the experts, and its 2 of the 4 experts of each MoE layer
  REQUIRE(r.stages.size() == 1);
  const PlanStage& st = r.stages[0];
  CHECK(st.expert_params == 2 * 2 * expert);
  CHECK(st.params == total - 2 * E * expert + st.expert_params);
  CHECK(st.weight_bytes == st.params * 2);
  CHECK(st.grad_bytes == st.params * 4);
  const int64_t other = st.params - st.expert_params;
  CHECK(st.optimizer_bytes == ((other + 3) / 4 + (st.expert_params + 1) / 2) * 10);  // bf16: m, v, low halves
  // all-to-all, token-level: each token goes to 2 x (1 - C(2, 2) / C(4, 2)) = 5/3 of the 2 ranks on average, so
  // 16 x 5/3 = 27 token rows (rounded) of C bf16 elements in each of the 4 exchanges (to the experts and back,
  // forward and backward); the forward's local choices and weights (k int32 + k fp32 a row) and its counts (2 ranks
  // x (2 experts + 1) int64), the backward's weight gradients (k fp32 a row); half leaves the rank
  const int64_t rows = 2 * 8, tok = 27;
  CHECK(moe_ranks_per_token(cfg.model, 2) == Approx(5.0 / 3.0).epsilon(1e-14));
  CHECK(r.moe_a2a.total == 4 * tok * C * 2 + tok * k * 8 + 2 * 3 * 8 + tok * k * 4);
  CHECK(r.moe_a2a.leaving == r.moe_a2a.total / 2);
  CHECK(r.num_microbatches == 1);  // global 8 = micro-batch 2 x data 4
  CHECK(st.a2a_bytes == 2 * r.moe_a2a.total);
  CHECK(st.a2a_leaving_bytes == 2 * r.moe_a2a.leaving);
  // activations: the dense layer + the two MoE layers, the extra bytes of an MoE layer by hand (bf16, fp32 router)
  const DerivedConfig d = derive_config(cfg, world);
  const int64_t dense_layer = layer_activation_bytes(cfg.model, d, 1, false, 2, 8, DType::BF16,
                                                     RecomputePolicy::Mode::None);
  const int64_t dense_mlp_kept = rows * 48 * 2 * 2;  // SwiGLU fc1 output (the activation recomputed)
  const int64_t moe_kept_bytes = rows * E * 4 * 2 + rows * k * 4 * 2 +  // logits, scores; choice, weights
                                 rows * 2 * 4 * 2 +                      // the send map (rows x 2 ranks, 2 ways)
                                 tok * C * 2 + tok * k * 4 * 3 +         // received tokens; their weights, 2 maps
                                 rows * k * F * 2 * 2 + rows * k * C * 2 +  // h (SwiGLU's a recomputed), yp
                                 rows * Fs * 2 * 2 + rows * Fs * 2 + 4;     // shared h, a; aux
  CHECK(r.moe_layer_act[0] == dense_layer - dense_mlp_kept + moe_kept_bytes);
  const int64_t extra = chunk_extra_activation_bytes(cfg.model, 1, false, 2, 8, DType::BF16, true, true);
  CHECK(st.activation[0] == 3 * dense_layer + 2 * (moe_kept_bytes - dense_mlp_kept) + extra);
  CHECK(st.activation[2] == 3 * rows * C * 2 + extra);  // full recompute: the layer inputs only

  // full recompute repeats the forward's exchanges
  cfg.training.recompute = "full";
  const PlanReport rf = plan_of(cfg, world);
  CHECK(rf.moe_a2a.total == 6 * tok * C * 2 + 2 * (tok * k * 8 + 2 * 3 * 8) + tok * k * 4);
  // no expert parallelism: no all-to-all
  cfg.parallel.expert = 1;
  CHECK(plan_of(cfg, world).moe_a2a.total == 0);
  // an expert group that does not divide data x context is refused, naming the fix
  cfg.parallel.expert = 4;
  cfg.model.num_experts = 4;
  CHECK_THROWS_WITH(plan_of(cfg, 2), Catch::Contains("parallel.expert (4) must divide data-parallel"));
}

TEST_CASE("plan moe: the plan-only configs plan on their layouts", "[plan][moe]") {
  struct Case {
    const char* file;
    int world;
    double total_b, active_b;  // billions, rounded as the model cards give them
  };
  for (const Case& c : {Case{"configs/plan/mixtral-8x7b.yaml", 64, 46.7, 12.9},
                        Case{"configs/plan/qwen3-30b-a3b.yaml", 16, 30.5, 3.3},
                        Case{"configs/plan/deepseek-v3-like.yaml", 512, 0, 0}}) {
    INFO(c.file);
    const PlanReport r = plan_of(load_repo_config(c.file), c.world);
    if (c.total_b > 0) {
      CHECK(static_cast<double>(r.total_params) / 1e9 == Approx(c.total_b).margin(0.06));
      CHECK(static_cast<double>(r.active_params) / 1e9 == Approx(c.active_b).margin(0.06));
    }
    CHECK(r.expert_dp * r.ep == r.dp * r.cp);
    int64_t moe_layers = 0;
    for (const PlanStage& st : r.stages) moe_layers += st.moe_layers;
    CHECK(moe_layers == r.moe_layers);
    const std::string text = format_plan(r);
    CHECK(text.find("active per token") != std::string::npos);
    if (std::string(c.file).find("deepseek") != std::string::npos) {
      CHECK(r.moe_layers == 58);
      CHECK(r.moe_layer.shared == 3 * 7168 * 2048);
      CHECK(r.stages.front().moe_layers == 0);  // the 3 dense layers
    }
  }
}
