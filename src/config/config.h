// The run configuration: one struct per YAML section, field names = YAML keys (docs/ARCHITECTURE.md).
// Loading (config_loader.cpp) is strict: unknown keys, wrong types and out-of-range values are
// errors naming the file, the key path and the fix. Values derived from the config live in
// DerivedConfig and are never written back into Config (nothing the user wrote is altered).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mt {

struct ModelConfig {
  std::string arch = "llama";          // gpt2 | llama: a preset for the feature keys left unset below
  int num_layers = 0;                  // required
  int hidden_size = 0;                 // required
  int num_attention_heads = 0;         // required
  int num_query_groups = 0;            // 0 = num_attention_heads (plain multi-head attention)
  int ffn_hidden_size = 0;             // 0 = 4 * hidden_size (gpt2); required for llama
  int vocab_size = 0;                  // required: the tokenizer's vocabulary
  int make_vocab_size_divisible_by = 128;
  int seq_length = 0;                  // required
  double rope_theta = 10000.0;         // position_embedding_type rope
  double norm_epsilon = 1e-5;
  // Model features (Megatron-Core's names). Unset (std::nullopt) = the arch preset's value
  // (model_features.h); a value written in the config always wins.
  std::optional<std::string> normalization;             // layernorm | rmsnorm
  std::optional<std::string> activation;                // gelu | swiglu
  std::optional<bool> add_bias_linear;                  // biases on every linear layer
  bool add_qkv_bias = false;                            // bias on linear_qkv only (Qwen2)
  bool qk_layernorm = false;                            // RMSNorm over head_dim of each q and k head (Qwen3)
  int kv_channels = 0;                                  // head dim; 0 = hidden_size / num_attention_heads
  std::optional<std::string> position_embedding_type;  // learned_absolute | rope | none
  std::optional<bool> untie_embeddings_and_output_weights;
  bool rope_scaling = false;                            // Llama-3.x frequency scaling of RoPE
  double rope_scaling_factor = 8.0;
  double rope_scaling_low_freq_factor = 1.0;
  double rope_scaling_high_freq_factor = 4.0;
  int rope_scaling_original_max_position_embeddings = 8192;
  double init_method_std = 0.02;
  double dropout = 0.0;                // hidden dropout (after attention and MLP), training only

  // ---- mixture of experts (issue #16; Megatron-Core names). num_experts 0 = dense MLPs everywhere.
  int num_experts = 0;
  int moe_router_topk = 2;
  int moe_ffn_hidden_size = 0;                       // per expert; required with experts
  std::vector<double> moe_layer_freq = {1};          // [k]: every k-th layer (i % k == 0); or one 0/1 per layer
  int moe_shared_expert_intermediate_size = 0;       // 0 = no shared expert
  std::string moe_router_score_function = "softmax"; // softmax | sigmoid
  bool moe_router_pre_softmax = false;               // softmax over all experts, not renormalized over the k
  double moe_router_topk_scaling_factor = 1.0;
  std::string moe_router_load_balancing_type = "aux_loss";  // aux_loss | seq_aux_loss | none
  double moe_aux_loss_coeff = 0.0;
  double moe_z_loss_coeff = 0.0;
  bool moe_router_enable_expert_bias = false;        // DeepSeek-V3 auxiliary-loss-free balancing
  double moe_router_bias_update_rate = 1e-3;
  double moe_expert_capacity_factor = 0.0;           // 0 = dropless
  bool moe_router_force_load_balancing = false;      // benchmark only: standard-normal random router logits
};

// Elements per data-parallel gradient / parameter bucket unless parallel.grad_bucket_size says otherwise
// (Megatron-LM's --ddp-bucket-size default); also the default of stores the trainer does not configure.
inline constexpr int64_t kDefaultGradBucketSize = 40000000;

struct ParallelConfig {
  int tensor = 1;
  int pipeline = 1;
  int virtual_pipeline = 1;
  int context = 1;
  std::string cp_comm_type = "p2p";    // p2p (ring) | a2a (all-to-all over heads, Ulysses)
  int expert = 1;
  bool sequence_parallel = false;
  bool distributed_optimizer = false;
  bool overlap_grad_reduce = true;     // reduce gradient buckets during backward
  bool overlap_param_gather = true;    // distributed optimizer: all-gather parameters during the next forward
  bool tp_comm_overlap = false;        // column-parallel backward: TP communication beside the GEMMs
  int64_t grad_bucket_size = kDefaultGradBucketSize;  // elements per DP gradient / parameter bucket
  // bf16: the gradients (accumulated over micro-batches, reduced over data parallel, read by the optimizer) in fp32
  // main grads, or (false) in bf16, as Megatron-Core's DDP config
  bool grad_reduce_in_fp32 = true;
  // Uneven pipeline split, only when stated: layers on the first / last stage (0 = even split).
  int decoder_first_pipeline_num_layers = 0;
  int decoder_last_pipeline_num_layers = 0;
};

struct TrainingConfig {
  int micro_batch_size = 1;
  int global_batch_size = 0;           // 0 = micro_batch_size * data-parallel size
  int64_t train_iters = 0;             // required
  int64_t eval_interval = 0;           // 0 = evaluate only at the end
  int64_t eval_iters = 10;             // 0 = no evaluation
  bool skip_train = false;             // evaluate the loaded weights (valid, test) and exit
  uint64_t seed = 1234;
  std::string precision = "fp32";      // fp32 | bf16 | fp16
  std::string device = "auto";         // auto | cpu | cuda
  bool deterministic = true;           // false: faster non-deterministic GPU kernels (cuDNN attention backward)
  std::string attention_backend = "auto";    // auto | cudnn | own (GPU attention: cuDNN's or our flash kernels)
  int64_t attention_bwd_workspace_mib = 1024;  // cap of cuDNN's deterministic attention backward workspace
  std::string recompute = "none";      // none | selective | full
  std::string recompute_method = "uniform";  // uniform | block (full recompute)
  int recompute_num_layers = 1;        // full recompute: layers per chunk (uniform) or count (block)
  bool recompute_norm_act = true;      // recompute norm outputs and llama's SwiGLU output in backward
  std::string nan_policy = "stop";     // stop | skip: what a NaN/Inf loss or gradient norm does
  int64_t nan_max_skips = 10;          // skip: this many non-finite iterations in a row stop the run
  int64_t exit_interval = 0;           // stop (with a checkpoint) after this many iterations; 0 = off
  double collective_timeout_s = 600;   // hang watchdog: a collective pending this long aborts the job; 0 = off
  // ---- FP8 linear layers (issue #18; Megatron's fp8_recipe / fp8_format / ... names)
  std::string fp8 = "none";            // none | tensorwise | delayed | blockwise
  std::string fp8_format = "e4m3";     // e4m3 | hybrid (e4m3 forward, e5m2 gradients)
  int fp8_amax_history_len = 1;        // delayed: steps of amax history
  std::string fp8_amax_compute_algo = "most_recent";  // delayed: max | most_recent
  int fp8_margin = 0;                  // scale = fp8_max / amax / 2^margin
  bool fp8_first_last_layers_bf16 = false;  // keep the first / last layers' linears out of FP8
  int num_layers_at_start_in_bf16 = 1;
  int num_layers_at_end_in_bf16 = 1;
};

struct OptimizerConfig {
  double lr = 3e-4;
  double min_lr = 0.0;
  int64_t warmup_iters = 0;
  int64_t lr_decay_iters = 0;          // 0 = train_iters
  std::string decay_style = "cosine";  // cosine | linear | constant
  double weight_decay = 0.01;
  bool weight_decay_embeddings = false;       // decay the embedding / output tables too
  bool weight_decay_norms_and_biases = false;  // decay norm weights and biases too
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.95;
  double adam_eps = 1e-8;
  double clip_grad = 1.0;              // 0 = no clipping
  // fp16 dynamic loss scaling
  double initial_loss_scale = 65536.0;
  double min_loss_scale = 1.0;
  int loss_scale_window = 1000;
  int hysteresis = 2;
};

struct DataConfig {
  bool mock = false;
  // Weighted prefixes: [w1, prefix1, w2, prefix2, ...] or just [prefix] (weight 1).
  std::vector<std::pair<double, std::string>> paths;
  std::vector<double> split = {98, 1, 1};  // train, valid, test weights
  std::string cache_dir;               // sample-index cache; "" = next to the data
  int prefetch = 2;                    // batches prepared ahead by the loader thread
  // The tokenizer the data was made with (read by `megatrain generate` to encode/decode text).
  std::string tokenizer_type = "none"; // none | gpt2-bpe | hf-json
  std::string vocab_file;              // gpt2-bpe: encoder.json
  std::string merge_file;              // gpt2-bpe: vocab.bpe
  std::string tokenizer_file;          // hf-json: tokenizer.json
};

struct CheckpointConfig {
  std::string dir;                     // "" = no checkpoints
  int64_t save_interval = 0;           // 0 = only at the end
  int keep_last = 0;                   // 0 = keep all
  std::string load = "auto";           // auto (latest in dir, if any) | none | PATH
  bool finetune = false;               // load weights only: iteration 0, fresh optimizer and data
  bool async_save = false;             // write checkpoints from a background thread
};

struct LoggingConfig {
  int64_t log_interval = 10;
  std::string metrics_file;            // "" = none
  std::string tensorboard_dir;         // "" = none; TensorBoard event files (rank 0)
  std::string level = "info";          // trace | debug | info | warn | error
};

struct Config {
  ModelConfig model;
  ParallelConfig parallel;
  TrainingConfig training;
  OptimizerConfig optimizer;
  DataConfig data;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  std::string source_file;             // where it was loaded from (for error messages)
};

// Option strings of the config, resolved once by derive_config (the schema has already refused
// any other value); callers switch on these, never compare the strings again.
enum class Precision { FP32, BF16, FP16 };                // training.precision
enum class DeviceMode { Auto, CPU, CUDA };                // training.device as requested (auto resolves at run time)
enum class RecomputeGranularity { None, Selective, Full };  // training.recompute
enum class RecomputeMethod { Uniform, Block };            // training.recompute_method
enum class NanPolicy { Stop, Skip };                      // training.nan_policy
enum class DecayStyle { Cosine, Linear, Constant };       // optimizer.decay_style
enum class TokenizerType { None, Gpt2Bpe, HfJson };       // data.tokenizer_type
enum class CpCommType { P2P, A2A };                       // parallel.cp_comm_type
enum class Fp8Recipe { None, Tensorwise, Delayed, Blockwise };  // training.fp8
enum class Fp8Format { E4M3, Hybrid };                    // training.fp8_format
enum class Fp8AmaxAlgo { Max, MostRecent };               // training.fp8_amax_compute_algo

// The model's features, resolved once from the model section (arch preset + explicit keys) by
// resolve_model_features (model_features.cpp): the single place the model code asks.
enum class Normalization { LayerNorm, RMSNorm };
enum class Activation { GELU, SwiGLU };
enum class PositionEmbedding { LearnedAbsolute, RoPE, None };

struct RopeScalingConfig {  // Llama-3 kind (HF _compute_llama3_parameters)
  bool enabled = false;
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position_embeddings = 8192;
};

struct ModelFeatures {
  Normalization normalization = Normalization::RMSNorm;
  Activation activation = Activation::SwiGLU;
  bool add_bias_linear = false;  // linear_qkv, linear_proj, linear_fc1, linear_fc2
  bool qkv_bias = false;         // linear_qkv has a bias: add_bias_linear or add_qkv_bias
  bool qk_layernorm = false;
  int kv_channels = 0;           // resolved head dim (never 0)
  PositionEmbedding position_embedding = PositionEmbedding::RoPE;
  bool untie_embeddings_and_output_weights = true;
  double rope_theta = 10000.0;
  RopeScalingConfig rope_scaling;
  // Per global layer: its MLP slot is a mixture of experts (model.num_experts > 0 and model.moe_layer_freq).
  std::vector<bool> moe_layers;
};

// Values that follow from the config and the world size. Computed and checked by derive_config.
struct DerivedConfig {
  int world_size = 1;
  int data_parallel_size = 1;          // world / (tensor * pipeline * context)
  int num_query_groups = 0;            // resolved (never 0)
  int ffn_hidden_size = 0;             // resolved
  int head_dim = 0;                    // features.kv_channels (hidden_size / num_attention_heads unless set)
  int padded_vocab_size = 0;           // vocab padded to make_vocab_size_divisible_by * tensor
  int global_batch_size = 0;           // resolved
  int num_microbatches = 0;            // global_batch / (micro_batch * data_parallel)
  int64_t lr_decay_iters = 0;          // resolved
  int64_t tokens_per_iteration = 0;    // global_batch * seq_length
  // ---- option strings, resolved
  Precision precision = Precision::FP32;
  DeviceMode device = DeviceMode::Auto;
  RecomputeGranularity recompute = RecomputeGranularity::None;
  RecomputeMethod recompute_method = RecomputeMethod::Uniform;
  NanPolicy nan_policy = NanPolicy::Stop;
  DecayStyle decay_style = DecayStyle::Cosine;
  TokenizerType tokenizer_type = TokenizerType::None;
  CpCommType cp_comm_type = CpCommType::P2P;
  Fp8Recipe fp8 = Fp8Recipe::None;
  Fp8Format fp8_format = Fp8Format::E4M3;
  Fp8AmaxAlgo fp8_amax_compute_algo = Fp8AmaxAlgo::MostRecent;
  ModelFeatures features;              // resolved model features
};

}  // namespace mt
