// Whole-model gradients against central finite differences in fp64, for the GPT-2 and the Llama
// (grouped-query) variants, with and without dropout; full recompute gives identical gradients.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "catch.h"
#include "model_fixture.h"
#include "tensor/ops.h"

using namespace mt;
using namespace mt::test;

namespace {

struct Batch {
  std::vector<int32_t> tokens, labels;
  int64_t B, T;
};

Batch make_batch(const TinyModel& m, uint64_t seed) {
  Batch b;
  b.B = m.cfg.training.micro_batch_size;
  b.T = m.cfg.model.seq_length;
  b.tokens = random_tokens(b.B * b.T, m.cfg.model.vocab_size, seed);
  b.labels = random_tokens(b.B * b.T, m.cfg.model.vocab_size, seed + 1);
  return b;
}

double loss_of(TinyModel& m, const Batch& b, const StepContext& step) {
  GPTModel::MicroState st;
  double loss = 0;
  m.model->forward(st, b.tokens.data(), b.labels.data(), b.B, b.T, Tensor(), step, &loss);
  return loss;
}

void backward_of(TinyModel& m, const Batch& b, const StepContext& step) {
  GPTModel::MicroState st;
  double loss = 0;
  m.model->forward(st, b.tokens.data(), b.labels.data(), b.B, b.T, Tensor(), step, &loss);
  m.model->backward(st, Tensor(), 1.0, step);
}

// Checks a few elements of every parameter (dL/dp for L = sum of token losses).
void check_model_gradients(TinyModel& m, const StepContext& step) {
  Batch b = make_batch(m, 99);
  m.store->zero_grads();
  backward_of(m, b, step);
  std::mt19937_64 g(5);
  const double h = 1e-5;
  int checked = 0;
  for (Param* p : m.store->params()) {
    double* v = p->value.data<double>();
    const double* gr = p->grad.data<double>();
    const int64_t n = p->value.numel();
    double num2 = 0, diff2 = 0;
    for (int k = 0; k < 6; ++k) {
      int64_t i = static_cast<int64_t>(g() % static_cast<uint64_t>(n));
      // Padding rows of the vocab tables get no gradient: pick real rows for them.
      if (p->spec.valid_rows >= 0) i %= p->spec.valid_rows * p->local_shape[1];
      const double orig = v[i];
      v[i] = orig + h;
      const double lp = loss_of(m, b, step);
      v[i] = orig - h;
      const double lm = loss_of(m, b, step);
      v[i] = orig;
      const double fd = (lp - lm) / (2 * h);
      num2 += fd * fd;
      diff2 += (fd - gr[i]) * (fd - gr[i]);
      ++checked;
    }
    INFO(p->spec.name << ": |fd| " << std::sqrt(num2) << ", |fd - analytic| " << std::sqrt(diff2));
    CHECK(std::sqrt(diff2) <= 1e-6 * std::max(std::sqrt(num2), 1e-3));
  }
  CHECK(checked > 60);
}

}  // namespace

TEST_CASE("gpt2 model gradients match finite differences (fp64)", "[model][gradcheck]") {
  TinyModel m(tiny_config("gpt2"));
  StepContext step;
  check_model_gradients(m, step);
}

TEST_CASE("llama GQA model gradients match finite differences (fp64)", "[model][gradcheck]") {
  TinyModel m(tiny_config("llama"));
  StepContext step;
  check_model_gradients(m, step);
}

TEST_CASE("model gradients with dropout match finite differences (fp64)", "[model][gradcheck]") {
  for (const char* arch : {"gpt2", "llama"}) {
    Config c = tiny_config(arch);
    c.model.dropout = 0.2;
    TinyModel m(c);
    StepContext step;
    step.dropout_seed = 1234;
    step.first_sample = 3;
    check_model_gradients(m, step);
  }
}

TEST_CASE("every recompute mode gives bit-identical gradients", "[model][recompute]") {
  using M = RecomputePolicy::Mode;
  // the last three: training.recompute_norm_act false (norm and SwiGLU outputs kept, not recomputed)
  const RecomputePolicy policies[] = {{M::Selective, false, 1}, {M::Full, false, 1},         {M::Full, false, 2},
                                      {M::Full, false, 3},      {M::Full, true, 1},          {M::Full, true, 2},
                                      {M::None, false, 1, false}, {M::Selective, false, 1, false},
                                      {M::Full, true, 1, false}};
  for (const char* arch : {"gpt2", "llama"}) {
    Config c = tiny_config(arch);
    c.model.num_layers = 3;
    c.model.dropout = 0.1;
    TinyModel a(c);
    StepContext step;
    step.dropout_seed = 77;
    Batch b = make_batch(a, 3);
    a.store->zero_grads();
    backward_of(a, b, step);
    const Tensor& ga = a.store->flat_grads();
    for (const RecomputePolicy& p : policies) {
      TinyModel r(c, p);
      r.store->zero_grads();
      backward_of(r, b, step);
      const Tensor& gr = r.store->flat_grads();
      INFO(arch << " mode " << static_cast<int>(p.mode) << " block " << p.block << " layers " << p.num_layers
                << " norm_act " << p.norm_act);
      REQUIRE(ga.numel() == gr.numel());
      CHECK(std::memcmp(ga.raw(), gr.raw(), ga.nbytes()) == 0);
    }
  }
}

// ParamStore::zero_grads leaves the old values in place and the first write of each gradient overwrites them (the
// weight-gradient GEMMs with beta 0, the rest zeroed first): over two micro-batches the gradients equal those
// accumulated from zero, bit for bit, even when the buffer held NaNs (which any missed gradient would keep).
TEST_CASE("the first gradient write of a step overwrites the previous step's values", "[model][grads]") {
  for (const char* arch : {"gpt2", "llama"}) {
    Config c = tiny_config(arch);
    c.model.num_layers = 2;
    TinyModel ref(c), m(c);
    StepContext step;
    const Batch b1 = make_batch(ref, 21), b2 = make_batch(ref, 23);
    ref.store->flat_grads().zero_();  // accumulate from zeros (no zero_grads: every gradient counts as written)
    backward_of(ref, b1, step);
    backward_of(ref, b2, step);
    ops::fill_(m.store->flat_grads(), std::nan(""));
    // The padding of the flat buffer is never written: it keeps what allocate() put there.
    const int64_t n = m.store->local_numel();
    m.store->flat_grads().slice(n, m.store->padded_numel() - n).zero_();
    m.store->zero_grads();
    backward_of(m, b1, step);
    backward_of(m, b2, step);
    INFO(arch);
    REQUIRE(ref.store->flat_grads().nbytes() == m.store->flat_grads().nbytes());
    CHECK(std::memcmp(ref.store->flat_grads().raw(), m.store->flat_grads().raw(), m.store->flat_grads().nbytes()) ==
          0);
  }
}

// Under ModelContext::gradients_free_until_backward (one micro-batch a step, no pipeline: the trainer's case) each MoE
// layer after the first keeps its experts' SwiGLU output in the earlier MoE layers' expert gradients (one arena through
// them, Experts::keep_activation_in) instead of recomputing it in backward. Steps of forward, backward and an update
// that reads every gradient give the same losses, gradients and weights, bit for bit, as without; the forward does
// write into the gradients at each of `heads` (the first elements of those parameters' gradients: so the path ran).
// Fails when a layer keeps its a in a LATER layer's gradients (written before its last read), or when two outputs
// alive together overlap (the arena not moving on).
void check_kept_swiglu_steps(const Config& c, RecomputePolicy recompute, const std::vector<std::string>& heads) {
  TinyModel ref(c, recompute), m(c, recompute, 7, true);
  StepContext step;
  std::vector<int64_t> at;
  for (const std::string& name : heads) {
    const Param* p = m.store->find(name);
    REQUIRE(p != nullptr);
    at.push_back(static_cast<int64_t>(p->flat_offset));
  }
  for (int it = 0; it < 3; ++it) {
    const Batch b = make_batch(ref, 40 + it);
    double loss_ref = 0, loss = 0;
    for (TinyModel* t : {&ref, &m}) {
      t->store->zero_grads();
      for (int64_t a : at) {  // a sentinel the forward must overwrite in m (a starts within the first 256 bytes)
        double* head = t->store->flat_grads().data<double>() + a;
        std::fill(head, head + 64, -7.0);
      }
      GPTModel::MicroState st;
      double& l = t == &ref ? loss_ref : loss;
      t->model->forward(st, b.tokens.data(), b.labels.data(), b.B, b.T, Tensor(), step, &l);
      for (size_t h = 0; h < at.size(); ++h) {
        const double* head = t->store->flat_grads().data<double>() + at[h];
        const auto overwritten = std::count_if(head, head + 64, [](double v) { return v != -7.0; });
        INFO("iteration " << it << (t == &ref ? ", reference" : ", kept") << ", " << heads[h]);
        CHECK((overwritten == 0) == (t == &ref));
      }
      t->model->backward(st, Tensor(), 1.0, step);
    }
    INFO("iteration " << it);
    CHECK(loss == loss_ref);
    const Tensor &gr = ref.store->flat_grads(), &gm = m.store->flat_grads();
    REQUIRE(gr.nbytes() == gm.nbytes());
    CHECK(std::memcmp(gr.raw(), gm.raw(), gr.nbytes()) == 0);
    for (TinyModel* t : {&ref, &m}) {  // an SGD step: reads every gradient before the next forward
      double* v = t->store->flat_values().data<double>();
      const double* g = t->store->flat_grads().data<double>();
      for (int64_t i = 0; i < t->store->padded_numel(); ++i) v[i] -= 0.05 * g[i];
    }
  }
  CHECK(std::memcmp(ref.store->flat_values().raw(), m.store->flat_values().raw(), m.store->flat_values().nbytes()) ==
        0);
}

Config kept_swiglu_config(int layers, int experts, int seq_length) {
  Config c = tiny_config("llama");
  c.model.num_layers = layers;
  c.model.num_experts = experts;
  c.model.moe_router_topk = 2;
  c.model.moe_ffn_hidden_size = 10;
  c.model.moe_aux_loss_coeff = 0.01;
  c.model.seq_length = seq_length;
  return c;
}

TEST_CASE("MoE: the SwiGLU output kept in an earlier layer's gradients changes no step", "[model][moe]") {
  // 24 rows of a (1,920 bytes) a layer against 15,360 bytes of gradients: layers 1 and 2 both in layer 0's
  check_kept_swiglu_steps(kept_swiglu_config(3, 4, 6), {}, {"decoder.layers.0.mlp.experts.0.linear_fc1.weight"});
}

TEST_CASE("MoE: kept SwiGLU outputs larger than a layer's gradients run through several layers", "[model][moe]") {
  // 2 experts, 160 rows of a (12,800 bytes) a layer against 7,680 bytes of gradients: layer 1 recomputes, layer 2's a
  // runs from layer 0's gradients into layer 1's, layer 3 recomputes (it would end past its own), layer 4's a runs
  // from layer 1's into layer 3's
  const Config c = kept_swiglu_config(5, 2, 40);
  const std::vector<std::string> heads = {"decoder.layers.0.mlp.experts.0.linear_fc1.weight",
                                          "decoder.layers.1.mlp.experts.0.linear_fc1.weight",
                                          "decoder.layers.3.mlp.experts.0.linear_fc1.weight"};
  SECTION("kept in full") { check_kept_swiglu_steps(c, {}, heads); }
  // groups of two recomputed in backward: the recomputed forwards find the arena past their own gradients (the last
  // group's first layer starts it again, with no earlier layer to keep a in) and recompute a in the SwiGLU backward
  SECTION("full recompute") {
    check_kept_swiglu_steps(c, RecomputePolicy{RecomputePolicy::Mode::Full, false, 2}, heads);
  }
}

TEST_CASE("full recompute keeps only the group inputs", "[model][recompute]") {
  Config c = tiny_config("llama");
  c.model.num_layers = 4;
  TinyModel m(c, RecomputePolicy{RecomputePolicy::Mode::Full, false, 2});
  Batch b = make_batch(m, 3);
  GPTModel::MicroState st;
  double loss = 0;
  m.model->forward(st, b.tokens.data(), b.labels.data(), b.B, b.T, Tensor(), StepContext{}, &loss);
  REQUIRE(st.layers.size() == 4);
  CHECK(st.layers[0].x_in.defined());
  CHECK_FALSE(st.layers[0].x_mid.defined());
  CHECK_FALSE(st.layers[1].x_in.defined());
  CHECK(st.layers[2].x_in.defined());
  CHECK_FALSE(st.layers[3].x_in.defined());
}

TEST_CASE("loss at initialization is close to ln(vocab) and padding rows stay unused", "[model]") {
  Config c = tiny_config("llama");
  c.model.init_method_std = 0.02;
  TinyModel m(c);
  Batch b = make_batch(m, 11);
  StepContext step;
  const double mean = loss_of(m, b, step) / static_cast<double>(b.B * b.T);
  CHECK(std::abs(mean - std::log(27.0)) < 0.05);
  // The padded rows (27..31) of the embedding were initialized to zero and get no gradient.
  m.store->zero_grads();
  backward_of(m, b, step);
  Param* w = m.store->find("embedding.word_embeddings.weight");
  REQUIRE(w != nullptr);
  const int64_t C = c.model.hidden_size;
  for (int64_t r = 27; r < 32; ++r)
    for (int64_t j = 0; j < C; ++j) {
      CHECK(w->value.data<double>()[r * C + j] == 0.0);
      CHECK(w->grad.data<double>()[r * C + j] == 0.0);
    }
}

TEST_CASE("initialization depends only on the seed and the parameter name", "[model][init]") {
  TinyModel a(tiny_config("gpt2"), {}, 42), b(tiny_config("gpt2"), {}, 42), c(tiny_config("gpt2"), {}, 43);
  CHECK(std::memcmp(a.store->flat_values().raw(), b.store->flat_values().raw(), a.store->flat_values().nbytes()) == 0);
  CHECK(std::memcmp(a.store->flat_values().raw(), c.store->flat_values().raw(), a.store->flat_values().nbytes()) != 0);
  // Same name, same values, whatever else the model holds: a 3-layer model's layer 1 equals the 2-layer one's.
  Config deeper = tiny_config("gpt2");
  deeper.model.num_layers = 3;
  TinyModel d(deeper, {}, 42);
  Param* pa = a.store->find("decoder.layers.1.mlp.linear_fc1.weight");
  Param* pd = d.store->find("decoder.layers.1.mlp.linear_fc1.weight");
  REQUIRE((pa && pd));
  CHECK(std::memcmp(pa->value.raw(), pd->value.raw(), pa->value.nbytes()) == 0);
}

// ---------------------------------------------------------------- model features (model_features.h)

namespace {
// The llama preset (rmsnorm, swiglu, no biases, rope, untied) with features changed by `edit`.
Config llama_with(void (*edit)(Config&)) {
  Config c = tiny_config("llama");
  edit(c);
  return c;
}

std::vector<std::string> param_names(const TinyModel& m) {
  std::vector<std::string> out;
  for (const Param* p : m.store->params()) out.push_back(p->spec.name + shape_str(p->spec.global_shape));
  return out;
}
}  // namespace

TEST_CASE("gpt2 features on the llama preset: the gpt2 model exactly, gradients match finite differences",
          "[model][gradcheck][features]") {
  Config c = tiny_config("gpt2");
  c.model.arch = "llama";
  c.model.normalization = "layernorm";
  c.model.activation = "gelu";
  c.model.add_bias_linear = true;
  c.model.position_embedding_type = "learned_absolute";
  c.model.untie_embeddings_and_output_weights = false;
  TinyModel m(c), g(tiny_config("gpt2"));
  // The same parameters (names, shapes, order), the same initial values, the same loss bit for bit.
  CHECK(param_names(m) == param_names(g));
  REQUIRE(m.store->flat_values().nbytes() == g.store->flat_values().nbytes());
  CHECK(std::memcmp(m.store->flat_values().raw(), g.store->flat_values().raw(), m.store->flat_values().nbytes()) == 0);
  const Batch b = make_batch(m, 4);
  CHECK(loss_of(m, b, StepContext{}) == loss_of(g, b, StepContext{}));
  check_model_gradients(m, StepContext{});
}

TEST_CASE("add_qkv_bias: a bias on linear_qkv only; gradients match finite differences", "[model][gradcheck][features]") {
  TinyModel m(llama_with([](Config& c) { c.model.add_qkv_bias = true; }));
  CHECK(m.store->find("decoder.layers.0.self_attention.linear_qkv.bias") != nullptr);
  CHECK(m.store->find("decoder.layers.0.self_attention.linear_proj.bias") == nullptr);
  CHECK(m.store->find("decoder.layers.0.mlp.linear_fc1.bias") == nullptr);
  // init zero: perturb the biases so that their gradient paths are exercised away from 0
  Param* bias = m.store->find("decoder.layers.1.self_attention.linear_qkv.bias");
  REQUIRE(bias != nullptr);
  for (int64_t i = 0; i < bias->value.numel(); ++i) bias->value.data<double>()[i] = 0.05 * static_cast<double>(i % 7 - 3);
  check_model_gradients(m, StepContext{});
}

TEST_CASE("qk_layernorm with kv_channels != hidden/heads (GQA, rope): gradients match finite differences",
          "[model][gradcheck][features]") {
  Config c = llama_with([](Config& x) {
    x.model.qk_layernorm = true;
    x.model.kv_channels = 6;  // hidden 16 / 4 heads = 4
  });
  TinyModel m(c);
  Param* qn = m.store->find("decoder.layers.0.self_attention.q_layernorm.weight");
  Param* kn = m.store->find("decoder.layers.1.self_attention.k_layernorm.weight");
  REQUIRE((qn && kn));
  CHECK(qn->spec.global_shape == Shape{6});
  CHECK(qn->spec.kind == ParamKind::Norm);  // no weight decay, like the other norms
  CHECK(m.store->find("decoder.layers.0.self_attention.linear_qkv.weight")->spec.global_shape == Shape{2 * 4 * 6, 16});
  CHECK(m.store->find("decoder.layers.0.self_attention.linear_proj.weight")->spec.global_shape == Shape{16, 4 * 6});
  // the norm weights start at 1: move them so that their gradients are not a special case
  for (Param* p : {qn, kn})
    for (int64_t i = 0; i < p->value.numel(); ++i) p->value.data<double>()[i] = 1.0 + 0.1 * static_cast<double>(i % 4);
  check_model_gradients(m, StepContext{});
  // selective and full recompute reproduce the gradients bit for bit
  Batch b = make_batch(m, 8);
  m.store->zero_grads();
  backward_of(m, b, StepContext{});
  for (RecomputePolicy p : {RecomputePolicy{RecomputePolicy::Mode::Selective, false, 1},
                            RecomputePolicy{RecomputePolicy::Mode::Full, false, 2}}) {
    TinyModel r(c, p);
    r.store->flat_values().copy_from(m.store->flat_values());
    r.store->zero_grads();
    backward_of(r, b, StepContext{});
    CHECK(std::memcmp(m.store->flat_grads().raw(), r.store->flat_grads().raw(), m.store->flat_grads().nbytes()) == 0);
  }
}

TEST_CASE("kv_channels != hidden/heads with gelu, biases and no position embedding: gradients match",
          "[model][gradcheck][features]") {
  Config c = tiny_config("gpt2");
  c.model.kv_channels = 3;  // odd: fine without rope
  c.model.position_embedding_type = "none";
  TinyModel m(c);
  CHECK(m.store->find("embedding.position_embeddings.weight") == nullptr);
  check_model_gradients(m, StepContext{});
}

TEST_CASE("rope_scaling (llama3): gradients match finite differences and the scaling changes the loss",
          "[model][gradcheck][features]") {
  // head dim 8, theta 10000: wavelengths 6.3, 63, 628, 6283; original max positions 64 with factors 1 / 4 put
  // them in all three regimes (kept, smoothed, divided by the factor).
  auto scaled = [](bool on) {
    Config c = tiny_config("llama");
    c.model.kv_channels = 8;
    c.model.rope_scaling = on;
    if (on) {  // the scaling's keys without rope_scaling are refused (they would be ignored)
      c.model.rope_scaling_factor = 4.0;
      c.model.rope_scaling_original_max_position_embeddings = 64;
    }
    return c;
  };
  TinyModel m(scaled(true)), plain(scaled(false));
  const Batch b = make_batch(m, 6);
  CHECK(std::abs(loss_of(m, b, StepContext{}) - loss_of(plain, b, StepContext{})) > 1e-9);
  check_model_gradients(m, StepContext{});
}

TEST_CASE("tied llama and untied gpt2: output layer parameters and gradients", "[model][gradcheck][features]") {
  TinyModel tied(llama_with([](Config& c) { c.model.untie_embeddings_and_output_weights = false; }));
  CHECK(tied.store->find("output_layer.weight") == nullptr);
  check_model_gradients(tied, StepContext{});
  Config u = tiny_config("gpt2");
  u.model.untie_embeddings_and_output_weights = true;
  TinyModel untied(u);
  CHECK(untied.store->find("output_layer.weight") != nullptr);
  check_model_gradients(untied, StepContext{});
}
