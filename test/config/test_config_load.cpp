// Loading: defaults, strict errors (unknown keys, types, ranges, enums, required keys), data forms,
// overrides, the schema's coverage of Config, and the config_to_yaml round trip.
#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <variant>
#include <string>

#include "catch.h"
#include "config/config_loader.h"
#include "config/config_schema.h"
#include "config_test_util.h"

using mt::test::contains;
using mt::test::error_of;
using mt::test::kBaseYaml;

namespace {

mt::Config load(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return mt::load_config_from_string(yaml, "configs/x.yaml", overrides);
}

std::string load_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  const std::string msg = error_of([&] { load(yaml, overrides); });
  INFO(msg);
  CHECK(mt::test::one_line(msg));
  CHECK(msg.rfind("config ", 0) == 0);
  return msg;
}

// kBaseYaml with extra lines inserted under SECTION (the section is added when the base lacks it;
// a second "model:" mapping would be a duplicate-section error).
std::string with(const std::string& section, const std::string& lines) {
  std::string yaml = kBaseYaml;
  const std::string header = section + ":\n";
  const std::size_t pos = yaml.find(header);
  if (pos == std::string::npos) return yaml + header + lines;
  yaml.insert(pos + header.size(), lines);
  return yaml;
}

// Every key set to a value other than its default (parallel.expert and the MoE keys excepted: refused for now).
const char* kAllKeysYaml = R"(model:
  arch: gpt2
  num_layers: 8
  hidden_size: 256
  num_attention_heads: 8
  num_query_groups: 8
  ffn_hidden_size: 1000
  vocab_size: 1000
  make_vocab_size_divisible_by: 64
  seq_length: 512
  rope_theta: 500000.0
  norm_epsilon: 1.0e-6
  init_method_std: 0.006
  dropout: 0.1
  normalization: rmsnorm
  activation: swiglu
  add_bias_linear: false
  add_qkv_bias: true
  qk_layernorm: true
  kv_channels: 64
  position_embedding_type: rope
  untie_embeddings_and_output_weights: true
  rope_scaling: true
  rope_scaling_factor: 16.0
  rope_scaling_low_freq_factor: 2.0
  rope_scaling_high_freq_factor: 8.0
  rope_scaling_original_max_position_embeddings: 4096
parallel:
  tensor: 2
  pipeline: 4
  virtual_pipeline: 2
  context: 2
  cp_comm_type: a2a
  expert: 1
  sequence_parallel: true
  distributed_optimizer: true
  overlap_grad_reduce: false
  overlap_param_gather: false
  tp_comm_overlap: true
  grad_bucket_size: 1000000
  decoder_first_pipeline_num_layers: 2
  decoder_last_pipeline_num_layers: 2
training:
  micro_batch_size: 4
  global_batch_size: 64
  train_iters: 100
  eval_interval: 50
  eval_iters: 5
  skip_train: true
  seed: 18446744073709551615
  precision: bf16
  device: cuda
  deterministic: false
  attention_backend: own
  recompute: full
  recompute_method: block
  recompute_num_layers: 2
  recompute_norm_act: false
  nan_policy: skip
  nan_max_skips: 3
  exit_interval: 77
  collective_timeout_s: 45.5
  fp8: tensorwise
  fp8_format: hybrid
  fp8_margin: 1
  fp8_first_last_layers_bf16: true
  num_layers_at_start_in_bf16: 2
  num_layers_at_end_in_bf16: 0
optimizer:
  lr: 6.0e-4
  min_lr: 6.0e-5
  warmup_iters: 10
  lr_decay_iters: 90
  decay_style: linear
  weight_decay: 0.1
  weight_decay_embeddings: true
  weight_decay_norms_and_biases: true
  adam_beta1: 0.8
  adam_beta2: 0.999
  adam_eps: 1.0e-6
  clip_grad: 0.5
data:
  mock: true
  paths: [0.7, data/a b, 0.3, "data/c: \"d\""]
  split: [90, 5, 5]
  cache_dir: /tmp/cache dir
  prefetch: 4
  tokenizer_type: hf-json
  vocab_file: tok/encoder.json
  merge_file: tok/vocab.bpe
  tokenizer_file: tok/tokenizer.json
checkpoint:
  dir: runs/x y
  save_interval: 25
  keep_last: 3
  load: none
  finetune: true
  async_save: true
logging:
  log_interval: 5
  metrics_file: m.jsonl
  tensorboard_dir: tb
  level: debug
)";
// The keys that act only with a setting kAllKeysYaml cannot have at once (check_dependent_keys refuses them
// otherwise): the deterministic attention backward's workspace and fp16's loss scaling, then the delayed FP8
// recipe's amax keys (FP8 needs bf16), and bf16 gradients (not with FP8).
const std::string kSmallModel = R"(model:
  num_layers: 2
  hidden_size: 64
  num_attention_heads: 4
  ffn_hidden_size: 128
  vocab_size: 100
  seq_length: 16
data:
  mock: true
)";
const std::string kDependentKeysYaml[] = {kSmallModel + R"(training:
  train_iters: 1
  precision: fp16
  device: cuda
  attention_bwd_workspace_mib: 2048
optimizer:
  initial_loss_scale: 4096
  min_loss_scale: 2
  loss_scale_window: 500
  hysteresis: 4
)", kSmallModel + R"(training:
  train_iters: 1
  precision: bf16
  device: cuda
  fp8: delayed
  fp8_amax_history_len: 16
  fp8_amax_compute_algo: max
)", kSmallModel + R"(parallel:
  grad_reduce_in_fp32: false
training:
  train_iters: 1
  precision: bf16
  device: cuda
)"};
const char* const kDependentKeys[] = {"training.attention_bwd_workspace_mib", "optimizer.initial_loss_scale",
                                      "optimizer.min_loss_scale", "optimizer.loss_scale_window",
                                      "optimizer.hysteresis", "training.fp8_amax_history_len",
                                      "training.fp8_amax_compute_algo", "parallel.grad_reduce_in_fp32"};

}  // namespace

TEST_CASE("config: defaults fill every key that is not given", "[config]") {
  const mt::Config c = load(kBaseYaml);
  CHECK(c.source_file == "configs/x.yaml");
  CHECK(c.model.arch == "llama");
  CHECK(c.model.num_layers == 2);
  CHECK(c.model.num_query_groups == 0);
  CHECK(c.model.make_vocab_size_divisible_by == 128);
  CHECK(c.model.rope_theta == 10000.0);
  CHECK(c.parallel.tensor == 1);
  CHECK(c.training.micro_batch_size == 1);
  CHECK(c.training.seed == 1234);
  CHECK(c.training.precision == "fp32");
  CHECK(c.training.deterministic);
  CHECK(c.optimizer.lr == 3e-4);
  CHECK(c.optimizer.decay_style == "cosine");
  CHECK(c.data.split == std::vector<double>{98, 1, 1});
  CHECK(c.data.paths.empty());
  CHECK(c.checkpoint.load == "auto");
  CHECK(c.logging.level == "info");
}

TEST_CASE("config: the schema covers every Config field exactly once", "[config]") {
  using mt::test::aggregate_member_count;
  std::map<std::string, std::size_t> rows;
  for (const mt::ConfigField& f : mt::config_fields()) ++rows[f.section];
  CHECK(rows["model"] == aggregate_member_count<mt::ModelConfig>());
  CHECK(rows["parallel"] == aggregate_member_count<mt::ParallelConfig>());
  CHECK(rows["training"] == aggregate_member_count<mt::TrainingConfig>());
  CHECK(rows["optimizer"] == aggregate_member_count<mt::OptimizerConfig>());
  CHECK(rows["data"] == aggregate_member_count<mt::DataConfig>());
  CHECK(rows["checkpoint"] == aggregate_member_count<mt::CheckpointConfig>());
  CHECK(rows["logging"] == aggregate_member_count<mt::LoggingConfig>());
  CHECK(rows.size() == 7);
  // 7 sections + source_file
  CHECK(aggregate_member_count<mt::Config>() == rows.size() + 1);

  // Distinct rows point at distinct fields.
  mt::Config c;
  std::set<const void*> addresses;
  for (const mt::ConfigField& f : mt::config_fields())
    addresses.insert(std::visit([](auto* p) { return static_cast<const void*>(p); }, f.at(c)));
  CHECK(addresses.size() == mt::config_fields().size());
}

TEST_CASE("config: a file setting every key loads each one and round-trips through config_to_yaml", "[config]") {
  const mt::Config c = load(kAllKeysYaml);
  const mt::Config defaults;
  for (const mt::ConfigField& f : mt::config_fields()) {
    INFO(f.path);
    // parallel.expert > 1 and the MoE keys are refused until MoE layers are wired (test/moe/test_moe_config.cpp)
    const bool moe = f.path == "model.num_experts" || f.path.rfind("model.moe_", 0) == 0;
    const bool dependent = std::find(std::begin(kDependentKeys), std::end(kDependentKeys), f.path) != std::end(kDependentKeys);
    if (f.path != "parallel.expert" && !moe && !dependent) CHECK_FALSE(mt::field_equal(f, c, defaults));
  }
  // the dependent keys, each loaded beside the setting it acts with
  std::set<std::string> loaded;
  for (const std::string& yaml : kDependentKeysYaml) {
    const mt::Config dc = load(yaml);
    for (const mt::ConfigField& f : mt::config_fields())
      if (!mt::field_equal(f, dc, defaults)) loaded.insert(f.path);
  }
  for (const char* key : kDependentKeys) {
    INFO(key);
    CHECK(loaded.count(key) == 1);
  }
  CHECK(c.training.seed == 18446744073709551615ull);
  CHECK(c.data.paths.size() == 2);
  CHECK(c.data.paths[0] == std::make_pair(0.7, std::string("data/a b")));
  CHECK(c.data.paths[1] == std::make_pair(0.3, std::string("data/c: \"d\"")));
  CHECK(c.checkpoint.dir == "runs/x y");

  const std::string yaml = mt::config_to_yaml(c);
  INFO(yaml);
  const mt::Config back = mt::load_config_from_string(yaml, "dump");
  CHECK(mt::config_fields_equal(c, back));
  CHECK(mt::config_to_yaml(back) == yaml);
  // Every key appears, section by section, in schema order.
  std::size_t pos = 0;
  for (const std::string& s : mt::config_sections()) {
    const std::size_t at = yaml.find("\n" + s + ":\n");
    REQUIRE(at != std::string::npos);
    CHECK(at >= pos);
    pos = at;
  }
  for (const mt::ConfigField& f : mt::config_fields()) CHECK(contains(yaml, "  " + f.key + ": "));
}

TEST_CASE("config: config_to_yaml of defaults round-trips and prints numbers shortest", "[config]") {
  const mt::Config c = load(kBaseYaml);
  const std::string yaml = mt::config_to_yaml(c);
  CHECK(contains(yaml, "  lr: 0.0003\n"));
  CHECK(contains(yaml, "  adam_eps: 1e-08\n"));
  CHECK(contains(yaml, "  rope_theta: 10000.0\n"));
  CHECK(contains(yaml, "  split: [98.0, 1.0, 1.0]\n"));
  CHECK(contains(yaml, "  cache_dir: \"\"\n"));
  CHECK(contains(yaml, "  arch: llama\n"));
  CHECK(mt::config_fields_equal(c, mt::load_config_from_string(yaml, "dump")));

  CHECK(mt::format_double(3e-4) == "0.0003");
  CHECK(mt::format_double(0.1 + 0.2) == "0.30000000000000004");
  CHECK(mt::format_double(65536) == "65536.0");
  CHECK(mt::format_double(-2.5) == "-2.5");
  CHECK(std::stod(mt::format_double(1.0 / 3)) == 1.0 / 3);
  CHECK(mt::yaml_quote("runs/quickstart") == "runs/quickstart");
  CHECK(mt::yaml_quote("true") == "\"true\"");
  CHECK(mt::yaml_quote("null") == "\"null\"");
  CHECK(mt::yaml_quote("123") == "\"123\"");
  CHECK(mt::yaml_quote("a b") == "\"a b\"");
  CHECK(mt::yaml_quote("") == "\"\"");
  CHECK(mt::yaml_quote("x\"y\\z") == "\"x\\\"y\\\\z\"");
}

TEST_CASE("config: unknown keys and sections name the file, the path and the closest key", "[config]") {
  std::string m = load_error(with("model", "  hiden_size: 64\n"));
  CHECK(contains(m, "config configs/x.yaml: unknown key 'model.hiden_size'; did you mean 'model.hidden_size'?"));
  CHECK(contains(m, "(line 2)"));

  m = load_error(with("training", "  lr: 0.1\n"));  // exists in another section
  CHECK(contains(m, "unknown key 'training.lr'; did you mean 'optimizer.lr'?"));

  m = load_error(with("training", "  warmup_iter: 5\n"));  // close to a key in another section
  CHECK(contains(m, "did you mean 'optimizer.warmup_iters'?"));

  m = load_error(with("parallel", "  tensor_model_parallel_size: 2\n"));  // Megatron's name
  CHECK(contains(m, "unknown key 'parallel.tensor_model_parallel_size'; did you mean 'parallel.tensor'?"));

  m = load_error(with("model", "  layers: 4\n"));  // part of a key
  CHECK(contains(m, "unknown key 'model.layers'; did you mean 'model.num_layers'?"));
  m = load_error(with("model", "  Hidden-Size: 4\n"));  // case and dashes
  CHECK(contains(m, "did you mean 'model.hidden_size'?"));

  m = load_error(with("model", "  zzzzzzzzzz: 1\n"));
  CHECK(contains(m, "unknown key 'model.zzzzzzzzzz'; valid keys in model: arch, num_layers,"));

  m = load_error(std::string(kBaseYaml) + "modle:\n  dropout: 0.1\n");
  CHECK(contains(m, "config configs/x.yaml: unknown section 'modle'; did you mean 'model'?"));
  m = load_error(std::string(kBaseYaml) + "optimiser:\n  lr: 0.1\n");
  CHECK(contains(m, "did you mean 'optimizer'?"));
  m = load_error(std::string(kBaseYaml) + "num_query_groups: 2\n");
  CHECK(contains(m, "unknown section 'num_query_groups'; did you mean 'model.num_query_groups'"));
  m = load_error(std::string(kBaseYaml) + "foo:\n  bar: 1\n");
  CHECK(contains(m, "valid sections: model, parallel, training, optimizer, data, checkpoint, logging"));

  m = load_error(with("model", "  dropout: 0.1\n  dropout: 0.2\n"));
  CHECK(contains(m, "key 'model.dropout' is given twice"));
  m = load_error(std::string(kBaseYaml) + "model:\n  dropout: 0.1\n");
  CHECK(contains(m, "section 'model' appears twice"));
  m = load_error("- model\n- data\n");
  CHECK(contains(m, "the top level must be a mapping of sections"));
  m = load_error(std::string(kBaseYaml) + "parallel: 4\n");
  CHECK(contains(m, "section parallel: expected a mapping of keys, got '4'"));
}

TEST_CASE("config: wrong types, ranges and enum values say what is allowed", "[config]") {
  std::string m = load_error(with("model", "  num_query_groups: twelve\n"));
  CHECK(contains(m, "config configs/x.yaml: model.num_query_groups: expected an integer, got 'twelve'"));
  m = load_error(with("model", "  num_query_groups: 2.5\n"));
  CHECK(contains(m, "model.num_query_groups: expected an integer, got '2.5'"));
  m = load_error(with("model", "  num_query_groups: [1, 2]\n"));
  CHECK(contains(m, "model.num_query_groups: expected an integer, got a list"));
  m = load_error(with("model", "  num_query_groups: 99999999999\n"));
  CHECK(contains(m, "model.num_query_groups = 99999999999: does not fit in a 32-bit integer"));
  m = load_error(with("model", "  dropout: lots\n"));
  CHECK(contains(m, "model.dropout: expected a number, got 'lots'"));
  m = load_error(with("parallel", "  sequence_parallel: maybe\n"));
  CHECK(contains(m, "parallel.sequence_parallel: expected true or false, got 'maybe'"));
  m = load_error(with("training", "  seed: -1\n"));
  CHECK(contains(m, "training.seed: expected a non-negative integer, got '-1'"));
  m = load_error(with("checkpoint", "  dir: [a, b]\n"));
  CHECK(contains(m, "checkpoint.dir: expected a string, got a list"));

  m = load_error(with("training", "  micro_batch_size: 0\n"));
  CHECK(contains(m, "config configs/x.yaml: training.micro_batch_size = 0: must be >= 1"));
  m = load_error(with("model", "  dropout: 1.0\n"));
  CHECK(contains(m, "model.dropout = 1.0: must be in [0, 1)"));
  m = load_error(with("optimizer", "  adam_eps: 0\n"));
  CHECK(contains(m, "optimizer.adam_eps = 0.0: must be > 0"));
  m = load_error(with("model", "  dropout: .nan\n"));
  CHECK(contains(m, "model.dropout: expected a number"));

  m = load_error(with("training", "  precision: bf32\n"));
  CHECK(contains(m, "training.precision = 'bf32': must be one of fp32, bf16, fp16"));
  m = load_error(with("model", "  arch: gpt3\n"));
  CHECK(contains(m, "model.arch = 'gpt3': must be one of gpt2, llama"));

  // Booleans take the usual YAML spellings; integers a leading '+'.
  CHECK(load(with("parallel", "  distributed_optimizer: yes\n")).parallel.distributed_optimizer);
  CHECK(load(with("model", "  num_query_groups: +2\n")).model.num_query_groups == 2);
  CHECK(load(with("model", "  dropout: 1e-1\n")).model.dropout == 0.1);
}

TEST_CASE("config: required keys, syntax errors and cross-field rules", "[config]") {
  std::string base = kBaseYaml;
  std::string no_layers = base;
  no_layers.erase(no_layers.find("  num_layers: 2\n"), 16);
  std::string m = load_error(no_layers);
  CHECK(contains(m, "config configs/x.yaml: model.num_layers is required (no default)"));
  CHECK(contains(m, "--set model.num_layers="));
  m = load_error("");
  CHECK(contains(m, "model.num_layers is required (no default)"));

  m = load_error("model:\n  num_layers: [1, 2\ntraining:\n");
  CHECK(contains(m, "config configs/x.yaml: YAML syntax error at line"));
  CHECK(contains(m, "column"));
  m = load_error("model:\n\tnum_layers: 2\n");
  CHECK(contains(m, "YAML syntax error at line 2"));

  m = load_error(with("training", "  precision: bf16\n"));  // base has device: cpu
  CHECK(contains(m, "the CPU backend runs fp32; set training.precision: fp32"));
  m = load_error(with("model", "  arch: gpt2\n  num_query_groups: 2\n"));
  CHECK(contains(m, "model.num_query_groups (2) must be 0 or model.num_attention_heads (4) for arch gpt2"));
  std::string no_ffn = base;
  no_ffn.erase(no_ffn.find("  ffn_hidden_size: 128\n"), 22);
  m = load_error(no_ffn);
  CHECK(contains(m, "model.ffn_hidden_size is required for arch llama"));
  CHECK(load(no_ffn, {"model.arch=gpt2"}).model.ffn_hidden_size == 0);
  m = load_error(with("optimizer", "  lr: 1e-4\n  min_lr: 1e-3\n"));
  CHECK(contains(m, "optimizer.min_lr (0.001) must be <= optimizer.lr (0.0001)"));
  m = load_error(with("optimizer", "  warmup_iters: 11\n"));
  CHECK(contains(m, "optimizer.warmup_iters (11) must be <= optimizer.lr_decay_iters (10, i.e. training.train_iters)"));
  m = load_error(with("parallel", "  expert: 2\n"));
  CHECK(contains(m, "parallel.expert (2) > 1 needs experts; set model.num_experts or parallel.expert: 1"));
  m = load_error(with("parallel", "  sequence_parallel: true\n"));
  CHECK(contains(m, "set sequence_parallel: false or tensor > 1"));
  m = load_error(with("parallel", "  virtual_pipeline: 2\n"));
  CHECK(contains(m, "parallel.virtual_pipeline (2) > 1 needs parallel.pipeline > 1"));
  m = load_error(with("checkpoint", "  load: \"\"\n"));
  CHECK(contains(m, "checkpoint.load is empty"));
  // bf16 gradients: bf16 training only, and not with FP8's fp32 weight-gradient GEMMs
  m = load_error(with("parallel", "  grad_reduce_in_fp32: false\n"));  // base: fp32 on the CPU
  CHECK(contains(m, "parallel.grad_reduce_in_fp32"));
  CHECK(contains(m, "training.precision"));
  m = load_error(with("parallel", "  grad_reduce_in_fp32: false\n"),
                 {"training.device=cuda", "training.precision=bf16", "training.fp8=tensorwise"});
  CHECK(contains(m, "parallel.grad_reduce_in_fp32 is false but training.fp8 is tensorwise"));
  CHECK(contains(m, "set parallel.grad_reduce_in_fp32: true or training.fp8: none"));
  const mt::Config g16 =
      load(with("parallel", "  grad_reduce_in_fp32: false\n"), {"training.device=cuda", "training.precision=bf16"});
  CHECK_FALSE(g16.parallel.grad_reduce_in_fp32);
}

TEST_CASE("config: data.paths and data.split forms", "[config]") {
  mt::Config c = load(with("data", "  paths: [data/a_text_document]\n"));
  REQUIRE(c.data.paths.size() == 1);
  CHECK(c.data.paths[0] == std::make_pair(1.0, std::string("data/a_text_document")));
  c = load(with("data", "  paths: data/b\n"));
  CHECK(c.data.paths == mt::WeightedPaths{{1.0, "data/b"}});
  c = load(with("data", "  paths: [0.7, data/a, 0.3, /abs/b]\n"));
  CHECK(c.data.paths == mt::WeightedPaths{{0.7, "data/a"}, {0.3, "/abs/b"}});

  std::string m = load_error(with("data", "  paths: [0.7, data/a, 0.3]\n"));
  CHECK(contains(m, "data.paths: 3 elements, not weight/prefix pairs"));
  m = load_error(with("data", "  paths: [data/a, data/b]\n"));
  CHECK(contains(m, "data.paths: element 1 ('data/a') should be a weight"));
  m = load_error(with("data", "  paths: [0.5, 0.5]\n"));
  CHECK(contains(m, "element 2 (0.5) should be a path prefix"));
  m = load_error(with("data", "  paths: [0, data/a, 1, data/b]\n"));
  CHECK(contains(m, "data.paths: the weight of 'data/a' is 0.0: weights must be > 0"));
  m = load_error(with("data", "  paths: [0.5]\n"));
  CHECK(contains(m, "has a weight but no path prefix"));

  c = load(with("data", "  split: [90, 5, 5]\n"));
  CHECK(c.data.split == std::vector<double>{90, 5, 5});
  c = load(with("data", "  split: \"969, 30, 1\"\n"));
  CHECK(c.data.split == std::vector<double>{969, 30, 1});
  c = load(with("data", "  split: 98,1,1\n"));
  CHECK(c.data.split == std::vector<double>{98, 1, 1});
  m = load_error(with("data", "  split: [1, 2]\n"));
  CHECK(contains(m, "data.split = [1.0, 2.0]: expected a list of 3 numbers, got 2"));
  m = load_error(with("data", "  split: [98, -1, 3]\n"));
  CHECK(contains(m, "data.split = [98.0, -1.0, 3.0]: each value must be >= 0"));
  m = load_error(with("data", "  split: [0, 0, 0]\n"));
  CHECK(contains(m, "must have a positive sum"));
  m = load_error(with("data", "  split: [a, b, c]\n"));
  CHECK(contains(m, "data.split: expected a list of 3 numbers, but one element is 'a'"));

  std::string no_data = kBaseYaml;
  no_data.erase(no_data.find("data:\n"));
  m = load_error(no_data);
  CHECK(contains(m, "data.paths is empty and data.mock is false"));
}

TEST_CASE("config: --set overrides are parsed as YAML, applied before validation, and strict", "[config]") {
  mt::Config c = load(kBaseYaml, {"training.train_iters=20", "data.split=[90,5,5]", "checkpoint.dir=runs/x",
                                  "model.num_query_groups = 2", "data.paths=[0.5, a, 0.5, b]", "logging.metrics_file="});
  CHECK(c.training.train_iters == 20);
  CHECK(c.data.split == std::vector<double>{90, 5, 5});
  CHECK(c.checkpoint.dir == "runs/x");
  CHECK(c.model.num_query_groups == 2);
  CHECK(c.data.paths == mt::WeightedPaths{{0.5, "a"}, {0.5, "b"}});
  CHECK(c.logging.metrics_file.empty());

  // Later overrides win; an override can fix what the file alone would fail on.
  CHECK(load(kBaseYaml, {"training.eval_iters=3", "training.eval_iters=4"}).training.eval_iters == 4);
  CHECK(load(with("training", "  precision: bf16\n"), {"training.device=cuda"}).training.precision == "bf16");
  std::string no_layers = kBaseYaml;
  no_layers.erase(no_layers.find("  num_layers: 2\n"), 16);
  CHECK(load(no_layers, {"model.num_layers=6"}).model.num_layers == 6);

  std::string m = load_error(kBaseYaml, {"model.hiden_size=5"});
  CHECK(contains(m, "config --set model.hiden_size=5: unknown key 'model.hiden_size'; did you mean 'model.hidden_size'?"));
  m = load_error(kBaseYaml, {"modle.hidden_size=5"});
  CHECK(contains(m, "config --set modle.hidden_size=5: unknown section 'modle'; did you mean 'model'?"));
  m = load_error(kBaseYaml, {"num_layers=4"});
  CHECK(contains(m, "did you mean 'model.num_layers'"));
  m = load_error(kBaseYaml, {"training.train_iters"});
  CHECK(contains(m, "config --set training.train_iters: expected section.key=value"));
  m = load_error(kBaseYaml, {"training.train_iters=ten"});
  CHECK(contains(m, "config --set training.train_iters=ten: training.train_iters: expected an integer, got 'ten'"));
  m = load_error(kBaseYaml, {"training.micro_batch_size=0"});
  CHECK(contains(m, "config --set training.micro_batch_size=0: training.micro_batch_size = 0: must be >= 1"));
  m = load_error(kBaseYaml, {"data.split=[1, 2"});
  CHECK(contains(m, "config --set data.split=[1, 2: the value is not valid YAML"));
  m = load_error(kBaseYaml, {"training.precision=bf16"});  // cross-field rule, checked after the overrides
  CHECK(contains(m, "config configs/x.yaml: training.precision is bf16 but training.device is cpu"));
}

// Issue #20: a second document after '---' was ignored, and explicit tags were ignored.
TEST_CASE("config: several YAML documents and explicit tags are refused", "[config]") {
  // A leading '---' (and comments before it) is one document: fine.
  CHECK(load(std::string("# comment\n---\n") + kBaseYaml).model.num_layers == 2);
  CHECK(load(std::string(kBaseYaml) + "...\n").model.num_layers == 2);
  std::string msg = load_error(std::string(kBaseYaml) + "---\nmodel:\n  num_layers: 7\n");
  CHECK(contains(msg, "configs/x.yaml"));
  CHECK(contains(msg, "second YAML document"));
  CHECK(contains(msg, "(line 13)"));
  msg = load_error(std::string("---\n") + kBaseYaml + "---\ntraining: {train_iters: 3}\n");
  CHECK(contains(msg, "(line 14)"));
  msg = load_error(std::string(kBaseYaml) + "---\n");  // even an empty second document
  CHECK(contains(msg, "second YAML document"));
  msg = load_error(with("training", "  seed: !!str 2\n"));
  CHECK(contains(msg, "YAML tag '!!str'"));
  CHECK(contains(msg, "(line 9)"));
  msg = load_error(with("model", "  dropout: !!float 0.1\n"));
  CHECK(contains(msg, "YAML tag '!!float'"));
  msg = load_error(with("data", "  split: !custom [1, 1, 1]\n"));
  CHECK(contains(msg, "YAML tag '!custom'"));
  msg = load_error(std::string("!!map\n") + kBaseYaml);
  CHECK(contains(msg, "YAML tag '!!map'"));
  msg = load_error(kBaseYaml, {"training.seed=!!int 5"});
  CHECK(contains(msg, "YAML tag '!!int'"));
  // Quoted text is not a tag.
  CHECK(load(with("data", "  cache_dir: \"!!str\"\n")).data.cache_dir == "!!str");
}
