// The schema table (one row per YAML key) and the value formatting / checking it drives.
#include "config/config_schema.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <set>
#include <type_traits>

#include "config/model_features.h"
#include "core/check.h"

namespace mt {

namespace {

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

template <class T>
constexpr FieldType type_of() {
  if constexpr (is_optional<T>::value) return type_of<typename T::value_type>();
  else if constexpr (std::is_same_v<T, int>) return FieldType::Int;
  else if constexpr (std::is_same_v<T, int64_t>) return FieldType::Int64;
  else if constexpr (std::is_same_v<T, uint64_t>) return FieldType::UInt64;
  else if constexpr (std::is_same_v<T, double>) return FieldType::Double;
  else if constexpr (std::is_same_v<T, bool>) return FieldType::Bool;
  else if constexpr (std::is_same_v<T, std::string>) return FieldType::String;
  else if constexpr (std::is_same_v<T, std::vector<double>>) return FieldType::DoubleList;
  else if constexpr (std::is_same_v<T, WeightedPaths>) return FieldType::WeightedPaths;
  else static_assert(!sizeof(T), "config field of a type the schema does not know: add it to FieldType");
}

template <auto Section, auto Member>
FieldPtr member_ptr(Config& c) {
  auto& m = (c.*Section).*Member;
  if constexpr (is_optional<std::remove_reference_t<decltype(m)>>::value) {
    if (!m) m.emplace();
    return &*m;
  } else {
    return &m;
  }
}

template <auto Section, auto Member>
bool member_has_value(const Config& c) {
  return ((c.*Section).*Member).has_value();
}

template <auto Section, auto Member>
void member_reset(Config& c) {
  ((c.*Section).*Member).reset();
}

// Fluent row builder: MT_CONFIG_KEY(model, hidden_size).required().min(1).doc("...").
struct Row {
  ConfigField f;
  Row(const char* section, const char* key, FieldPtr (*get)(Config&), FieldType type,
      bool (*has_value)(const Config&) = nullptr, void (*reset)(Config&) = nullptr) {
    f.section = section;
    f.key = key;
    f.path = f.section + "." + f.key;
    f.get = get;
    f.type = type;
    f.optional = has_value != nullptr;
    f.has_value = has_value;
    f.reset = reset;
  }
  Row& required() { f.required = true; return *this; }
  Row& min(double lo) { f.range.lo = lo; f.range.lo_open = false; return *this; }     // >= lo
  Row& above(double lo) { f.range.lo = lo; f.range.lo_open = true; return *this; }    // > lo
  Row& below(double hi) { f.range.hi = hi; f.range.hi_open = true; return *this; }    // < hi
  Row& size(std::size_t n) { f.list_size = n; return *this; }
  Row& one_of(std::initializer_list<const char*> values) {
    MT_INTERNAL_ASSERT(f.type == FieldType::String, f.path, ": one_of needs a string field");
    f.type = FieldType::Enum;
    for (const char* v : values) f.allowed.emplace_back(v);
    return *this;
  }
  Row& megatron(std::initializer_list<const char*> names) {
    for (const char* n : names) f.aliases.emplace_back(n);
    return *this;
  }
  Row& doc(const char* text) { f.doc = text; return *this; }
};

// The key text is the member's own name: a key cannot name another field.
#define MT_CONFIG_KEY(sec, name)                                                 \
  Row(#sec, #name, &member_ptr<&Config::sec, &decltype(Config::sec)::name>,      \
      type_of<decltype(decltype(Config::sec)::name)>())
// The same for a std::optional member: unset (null) = the model.arch preset fills it (model_features.h).
#define MT_CONFIG_OPTIONAL_KEY(sec, name)                                                              \
  Row(#sec, #name, &member_ptr<&Config::sec, &decltype(Config::sec)::name>,                            \
      type_of<decltype(decltype(Config::sec)::name)>(), &member_has_value<&Config::sec, &decltype(Config::sec)::name>, \
      &member_reset<&Config::sec, &decltype(Config::sec)::name>)

std::vector<ConfigField> build_schema() {
  std::vector<Row> rows = {
      // ------------------------------------------------------------------ model
      MT_CONFIG_KEY(model, arch).one_of({"gpt2", "llama"})
          .doc("preset for the feature keys left unset: gpt2 (learned positions, layernorm, gelu MLP, biases, tied output layer) or llama (rope, rmsnorm, swiglu MLP, no biases, untied)"),
      MT_CONFIG_KEY(model, num_layers).required().min(1).doc("transformer layers"),
      MT_CONFIG_KEY(model, hidden_size).required().min(1).doc("model width"),
      MT_CONFIG_KEY(model, num_attention_heads).required().min(1).doc("attention (query) heads; must divide hidden_size"),
      MT_CONFIG_KEY(model, num_query_groups).min(0)
          .doc("key/value heads (grouped-query attention); 0 = num_attention_heads (plain multi-head attention)"),
      MT_CONFIG_KEY(model, ffn_hidden_size).min(0).doc("MLP inner size; 0 = 4 x hidden_size (gelu only: swiglu must set it)"),
      MT_CONFIG_KEY(model, vocab_size).required().min(1).doc("the tokenizer's vocabulary size (every token id is below it)"),
      MT_CONFIG_KEY(model, make_vocab_size_divisible_by).min(1)
          .doc("the embedding is padded to a multiple of this x parallel.tensor; padded rows never get probability"),
      MT_CONFIG_KEY(model, seq_length).required().min(1).doc("tokens per sample (also the longest position)")
          .megatron({"max_position_embeddings"}),
      MT_CONFIG_KEY(model, rope_theta).above(0).doc("RoPE base frequency (position_embedding_type rope)")
          .megatron({"rotary_base"}),
      MT_CONFIG_KEY(model, norm_epsilon).above(0).doc("epsilon of LayerNorm / RMSNorm").megatron({"layernorm_epsilon"}),
      MT_CONFIG_KEY(model, init_method_std).above(0).doc("standard deviation of the normal weight initialization"),
      MT_CONFIG_KEY(model, dropout).min(0).below(1).doc("hidden dropout after attention and MLP (training only)")
          .megatron({"hidden_dropout"}),
      MT_CONFIG_OPTIONAL_KEY(model, normalization).one_of({"layernorm", "rmsnorm"})
          .doc("norm of every layer and the final norm: layernorm (weight and bias) or rmsnorm (weight); unset = the arch preset (gpt2 layernorm, llama rmsnorm)"),
      MT_CONFIG_OPTIONAL_KEY(model, activation).one_of({"gelu", "swiglu"})
          .doc("MLP activation: gelu, or swiglu (linear_fc1 holds [gate; up]); unset = the arch preset (gpt2 gelu, llama swiglu)")
          .megatron({"swiglu"}),
      MT_CONFIG_OPTIONAL_KEY(model, add_bias_linear)
          .doc("biases on linear_qkv, linear_proj, linear_fc1 and linear_fc2; unset = the arch preset (gpt2 true, llama false)"),
      MT_CONFIG_KEY(model, add_qkv_bias).doc("a bias on linear_qkv only (Qwen2); implied by add_bias_linear"),
      MT_CONFIG_KEY(model, qk_layernorm)
          .doc("RMSNorm over the head dim of each query and key head, after the qkv split and before RoPE (Qwen3, OLMo-2)"),
      MT_CONFIG_KEY(model, kv_channels).min(0)
          .doc("head dim of queries, keys and values; 0 = hidden_size / num_attention_heads"),
      MT_CONFIG_OPTIONAL_KEY(model, position_embedding_type).one_of({"learned_absolute", "rope", "none"})
          .doc("positions: learned_absolute (an embedding table of seq_length rows), rope (rotary on q and k) or none; unset = the arch preset (gpt2 learned_absolute, llama rope)"),
      MT_CONFIG_OPTIONAL_KEY(model, untie_embeddings_and_output_weights)
          .doc("true: the output layer has its own weight; false: it reuses the word embeddings; unset = the arch preset (gpt2 false, llama true)"),
      MT_CONFIG_KEY(model, rope_scaling)
          .doc("Llama-3.x RoPE frequency scaling (HF rope_type llama3) with the rope_scaling_* keys")
          .megatron({"use_rope_scaling"}),
      MT_CONFIG_KEY(model, rope_scaling_factor).above(0).doc("rope_scaling: low frequencies are divided by this"),
      MT_CONFIG_KEY(model, rope_scaling_low_freq_factor).above(0)
          .doc("rope_scaling: wavelengths above original_max_position_embeddings / this are scaled in full"),
      MT_CONFIG_KEY(model, rope_scaling_high_freq_factor).above(0)
          .doc("rope_scaling: wavelengths below original_max_position_embeddings / this are not scaled"),
      MT_CONFIG_KEY(model, rope_scaling_original_max_position_embeddings).min(1)
          .doc("rope_scaling: the context length the model was trained with before scaling"),
      // mixture of experts (issue #16)
      MT_CONFIG_KEY(model, num_experts).min(0).doc("experts per MoE layer; 0 = a dense MLP in every layer"),
      MT_CONFIG_KEY(model, moe_router_topk).min(1).doc("experts each token is routed to"),
      MT_CONFIG_KEY(model, moe_ffn_hidden_size).min(0).doc("hidden size of each expert's MLP (required with experts)"),
      MT_CONFIG_KEY(model, moe_layer_freq).min(0)
          .doc("which layers are MoE: [k] (or k) every k-th layer (layer i when i % k == 0), or one 0/1 per layer"),
      MT_CONFIG_KEY(model, moe_shared_expert_intermediate_size).min(0)
          .doc("hidden size of the shared expert every token goes through (DeepSeek, Qwen2-MoE); 0 = none"),
      MT_CONFIG_KEY(model, moe_router_score_function).one_of({"softmax", "sigmoid"})
          .doc("router scores: softmax over the experts, or sigmoid (DeepSeek-V3)"),
      MT_CONFIG_KEY(model, moe_router_pre_softmax)
          .doc("softmax: the weights are the softmax over all experts (else over the chosen k)"),
      MT_CONFIG_KEY(model, moe_router_topk_scaling_factor).above(0).doc("the routing weights are multiplied by this"),
      MT_CONFIG_KEY(model, moe_router_load_balancing_type).one_of({"aux_loss", "seq_aux_loss", "none"})
          .doc("load-balancing loss: over the micro-batch (aux_loss), per sequence (seq_aux_loss), or none"),
      MT_CONFIG_KEY(model, moe_aux_loss_coeff).min(0).doc("weight of the load-balancing loss (aux_loss, seq_aux_loss)"),
      MT_CONFIG_KEY(model, moe_z_loss_coeff).min(0).doc("weight of the router z-loss (mean logsumexp^2); 0 = none"),
      MT_CONFIG_KEY(model, moe_router_enable_expert_bias)
          .doc("DeepSeek-V3's auxiliary-loss-free balancing: a per-expert bias in the choice, updated after each step"),
      MT_CONFIG_KEY(model, moe_router_bias_update_rate).min(0)
          .doc("step of the expert-bias update (with moe_router_enable_expert_bias)"),
      MT_CONFIG_KEY(model, moe_expert_capacity_factor).min(0)
          .doc("tokens per expert at most ceil(tokens * topk / experts * factor), the lowest-weight dropped; 0 = dropless"),
      MT_CONFIG_KEY(model, moe_router_force_load_balancing)
          .doc("benchmark only: the router's logits are replaced by standard-normal random values (keyed by seed, "
               "iteration, layer and token, the same in every layout; the gradient passes straight through to the "
               "router weight), so tokens spread evenly over the experts and the routing no longer depends on the "
               "model"),
      // ------------------------------------------------------------------ parallel
      MT_CONFIG_KEY(parallel, tensor).min(1).doc("tensor-parallel size: each layer's weights split over this many ranks")
          .megatron({"tensor_model_parallel_size"}),
      MT_CONFIG_KEY(parallel, pipeline).min(1).doc("pipeline-parallel size: stages the layers are split over")
          .megatron({"pipeline_model_parallel_size"}),
      MT_CONFIG_KEY(parallel, virtual_pipeline).min(1)
          .doc("model chunks per pipeline stage (interleaved 1F1B when > 1; needs pipeline > 1)")
          .megatron({"virtual_pipeline_model_parallel_size", "num_virtual_stages_per_pipeline_rank"}),
      MT_CONFIG_KEY(parallel, context).min(1)
          .doc("context-parallel size: each sequence cut into 2 x context chunks, rank r of the context group holding "
               "chunks r and 2 x context - 1 - r (balancing the causal mask)")
          .megatron({"context_parallel_size"}),
      MT_CONFIG_KEY(parallel, cp_comm_type).one_of({"p2p", "a2a"})
          .doc("context-parallel attention: p2p = ring, key/value blocks passed around the context group (the next "
               "transfer beside the current block's attention); a2a = all-to-all over heads before and after "
               "attention (Ulysses; needs the query groups per tensor rank divisible by context)")
          .megatron({"cp_comm_type"}),
      MT_CONFIG_KEY(parallel, expert).min(1).doc("expert-parallel size: the experts of each MoE layer split over this many of the data x context ranks")
          .megatron({"expert_model_parallel_size"}),
      MT_CONFIG_KEY(parallel, sequence_parallel)
          .doc("split norm and dropout activations along the sequence over the tensor-parallel ranks (needs tensor > 1)"),
      MT_CONFIG_KEY(parallel, distributed_optimizer).doc("shard optimizer state and master weights over data-parallel ranks")
          .megatron({"use_distributed_optimizer"}),
      MT_CONFIG_KEY(parallel, overlap_grad_reduce)
          .doc("reduce each gradient bucket over data-parallel ranks as soon as backward finished it (GPU: hidden behind the rest of backward)"),
      MT_CONFIG_KEY(parallel, overlap_param_gather)
          .doc("distributed optimizer: all-gather updated parameters bucket by bucket during the next forward"),
      MT_CONFIG_KEY(parallel, tp_comm_overlap)
          .doc("column-parallel layers' backward: all-gather the input (SP) during the input-gradient GEMM and reduce the input gradient during the weight-gradient GEMM (GPU: on the TP group's stream)"),
      MT_CONFIG_KEY(parallel, grad_bucket_size).min(1)
          .doc("elements per data-parallel communication bucket (gradient reduce, parameter all-gather): larger buckets mean fewer, more efficient collectives but a longer tail after the last layer's backward")
          .megatron({"ddp_bucket_size"}),
      MT_CONFIG_KEY(parallel, grad_reduce_in_fp32)
          .doc("bf16 training: parameter gradients in fp32 (true) or in bf16 (false: 2 bytes a parameter less, half "
               "the gradient traffic and data-parallel bytes; each weight gradient summed in fp32 and rounded to bf16; "
               "the micro-batches' gradients and the data-parallel sums added in bf16; the optimizer computes in "
               "fp32)"),
      MT_CONFIG_KEY(parallel, decoder_first_pipeline_num_layers).min(0)
          .doc("layers on the first pipeline stage (uneven split; the rest split evenly over the other stages); 0 = even split"),
      MT_CONFIG_KEY(parallel, decoder_last_pipeline_num_layers).min(0)
          .doc("layers on the last pipeline stage (uneven split); 0 = even split"),
      // ------------------------------------------------------------------ training
      MT_CONFIG_KEY(training, micro_batch_size).min(1).doc("samples per forward/backward on each data-parallel rank"),
      MT_CONFIG_KEY(training, global_batch_size).min(0)
          .doc("samples per optimizer step over all ranks (never adjusted); 0 = micro_batch_size x data-parallel size"),
      MT_CONFIG_KEY(training, train_iters).required().min(1).doc("optimizer steps to train for"),
      MT_CONFIG_KEY(training, eval_interval).min(0).doc("evaluate every this many steps; 0 = only at the end"),
      MT_CONFIG_KEY(training, eval_iters).min(0).doc("validation batches per evaluation; 0 = no evaluation"),
      MT_CONFIG_KEY(training, skip_train)
          .doc("evaluate the loaded checkpoint (checkpoint.load) on the validation and test splits and exit: nothing "
               "is trained or saved; the recipe (precision, fp8) may differ from the one the checkpoint was trained with")
          .megatron({"skip_train"}),
      MT_CONFIG_KEY(training, seed).doc("random seed (initialization, data order, dropout)"),
      MT_CONFIG_KEY(training, precision).one_of({"fp32", "bf16", "fp16"})
          .doc("compute precision (master weights and optimizer state stay fp32; bf16 keeps the master weights exactly as the bf16 values plus 16-bit low halves); the CPU backend runs fp32")
          .megatron({"bf16", "fp16"}),
      MT_CONFIG_KEY(training, device).one_of({"auto", "cpu", "cuda"}).doc("auto = cuda when a GPU is present, else cpu"),
      MT_CONFIG_KEY(training, deterministic)
          .doc("true = bit-identical reruns and resumes; false = faster non-deterministic GPU kernels (cuDNN "
               "attention backward accumulating dQ with fp32 atomics: less memory; reruns differ, in the last bits "
               "at first, more with every step)")
          .megatron({"deterministic_mode"}),
      MT_CONFIG_KEY(training, attention_backend).one_of({"auto", "cudnn", "own"})
          .doc("GPU attention: auto = cuDNN's fused attention for bf16/fp16 where it runs the shape (seq_length a "
               "multiple of 128; context parallelism p2p: its chunks, seq_length / (2 x context)), else our flash "
               "kernels; cudnn = cuDNN only (bf16/fp16, those lengths % 128 == 0, head dim 64 or 128; anything else "
               "is an error); own = our flash kernels only. The CPU runs its reference whatever this says (cudnn is "
               "refused there)")
          .megatron({"attention_backend"}),
      MT_CONFIG_KEY(training, attention_bwd_workspace_mib).min(1)
          .doc("cuDNN's deterministic attention backward needs micro_batch_size x (this rank's heads) x "
               "seq_length^2 x 2 bytes of workspace: it runs in chunks that fit in this many MiB: the most samples, "
               "else the most KV groups of one sample, else one query head at a time (seq_length^2 x 2 bytes: 2048 "
               "MiB at 32768 tokens, used even above this cap; megatrain plan says the workspace used and warns); "
               "more = fewer, faster chunks, more memory"),
      MT_CONFIG_KEY(training, recompute).one_of({"none", "selective", "full"})
          .doc("activation recomputation: selective = the attention core, full = whole layers")
          .megatron({"recompute_granularity"}),
      MT_CONFIG_KEY(training, recompute_method).one_of({"uniform", "block"})
          .doc("full recompute: uniform = every chunk of recompute_num_layers layers, block = the first recompute_num_layers layers of each stage"),
      MT_CONFIG_KEY(training, recompute_num_layers).min(1).doc("full recompute: layers per chunk (uniform) or recomputed layers per stage (block)"),
      MT_CONFIG_KEY(training, recompute_norm_act)
          .doc("true = each layer's two norm outputs and llama's SwiGLU output (an MoE layer: its experts' permuted "
               "input rows) are recomputed in backward from what is kept anyway (the same bits); false = kept "
               "instead: faster, (2 x hidden + ffn) x 2 more bytes per token per layer in bf16 (gpt2: 2 x hidden, "
               "its GELU output is always kept; an MoE layer: (2 + topk) x hidden)"),
      MT_CONFIG_KEY(training, nan_policy).one_of({"stop", "skip"})
          .doc("a NaN/Inf loss or gradient norm: stop = exit with an error, skip = drop that step's update and go on"),
      MT_CONFIG_KEY(training, nan_max_skips).min(1)
          .doc("nan_policy skip: this many non-finite iterations in a row stop the run with an error (the last "
               "checkpoint is kept)"),
      MT_CONFIG_KEY(training, exit_interval).min(0).doc("save a checkpoint and exit after this many steps; 0 = off"),
      MT_CONFIG_KEY(training, collective_timeout_s).min(0)
          .doc("hang watchdog: a collective not completed after this many seconds makes every rank log where it is and exit; 0 = off")
          .megatron({"distributed_timeout_minutes"}),
      MT_CONFIG_KEY(training, fp8).one_of({"none", "tensorwise", "delayed", "blockwise"})
          .doc("FP8 GEMMs in the transformer layers' linears (forward, input and weight gradient; attention core, "
               "norms, embedding and output layer stay in training.precision): tensorwise = one scale per tensor from "
               "its current amax, delayed = scales from an amax history of past steps, blockwise = 1x128 tiles for "
               "activations and gradients and 128x128 blocks for weights, power-of-2 scales (DeepSeek-V3). GPU: "
               "needs precision bf16; CPU: emulated (exact FP8 rounding around the fp32 reference)")
          .megatron({"fp8_recipe"}),
      MT_CONFIG_KEY(training, fp8_format).one_of({"e4m3", "hybrid"})
          .doc("FP8 formats: e4m3 for every tensor, or hybrid = e4m3 for activations and weights, e5m2 for gradients"),
      MT_CONFIG_KEY(training, fp8_amax_history_len).min(1).doc("fp8 delayed: steps of amax history kept per tensor"),
      MT_CONFIG_KEY(training, fp8_amax_compute_algo).one_of({"max", "most_recent"})
          .doc("fp8 delayed: the amax a scale is made from: the history's max, or the most recent step's"),
      MT_CONFIG_KEY(training, fp8_margin).min(0).doc("fp8 tensorwise / delayed: scales are fp8_max / amax / 2^fp8_margin"),
      MT_CONFIG_KEY(training, fp8_first_last_layers_bf16)
          .doc("fp8: the first num_layers_at_start_in_bf16 and last num_layers_at_end_in_bf16 transformer layers "
               "keep their linears in training.precision")
          .megatron({"first_last_layers_bf16"}),
      MT_CONFIG_KEY(training, num_layers_at_start_in_bf16).min(0)
          .doc("fp8_first_last_layers_bf16: leading transformer layers kept out of FP8"),
      MT_CONFIG_KEY(training, num_layers_at_end_in_bf16).min(0)
          .doc("fp8_first_last_layers_bf16: trailing transformer layers kept out of FP8"),
      // ------------------------------------------------------------------ optimizer
      MT_CONFIG_KEY(optimizer, lr).min(0).doc("peak learning rate (reached at the end of warmup)"),
      MT_CONFIG_KEY(optimizer, min_lr).min(0).doc("learning rate at the end of the decay (<= lr)"),
      MT_CONFIG_KEY(optimizer, warmup_iters).min(0).doc("steps of linear warmup from 0 to lr").megatron({"lr_warmup_iters"}),
      MT_CONFIG_KEY(optimizer, lr_decay_iters).min(0).doc("step at which the decay reaches min_lr; 0 = train_iters"),
      MT_CONFIG_KEY(optimizer, decay_style).one_of({"cosine", "linear", "constant"})
          .doc("learning-rate decay after warmup").megatron({"lr_decay_style"}),
      MT_CONFIG_KEY(optimizer, weight_decay).min(0).doc("AdamW decoupled weight decay"),
      MT_CONFIG_KEY(optimizer, weight_decay_embeddings).doc("also decay the embedding and output tables"),
      MT_CONFIG_KEY(optimizer, weight_decay_norms_and_biases).doc("also decay norm weights and biases"),
      MT_CONFIG_KEY(optimizer, adam_beta1).min(0).below(1).doc("AdamW first-moment decay"),
      MT_CONFIG_KEY(optimizer, adam_beta2).min(0).below(1).doc("AdamW second-moment decay"),
      MT_CONFIG_KEY(optimizer, adam_eps).above(0).doc("AdamW denominator epsilon"),
      MT_CONFIG_KEY(optimizer, clip_grad).min(0).doc("clip the global gradient L2 norm to this; 0 = no clipping"),
      MT_CONFIG_KEY(optimizer, initial_loss_scale).above(0).doc("fp16: starting dynamic loss scale"),
      MT_CONFIG_KEY(optimizer, min_loss_scale).above(0).doc("fp16: the loss scale never drops below this"),
      MT_CONFIG_KEY(optimizer, loss_scale_window).min(1).doc("fp16: steps without overflow before the loss scale doubles"),
      MT_CONFIG_KEY(optimizer, hysteresis).min(1).doc("fp16: overflows tolerated before the loss scale halves"),
      // ------------------------------------------------------------------ data
      MT_CONFIG_KEY(data, mock).doc("synthetic random tokens instead of data.paths (tests, benchmarks)").megatron({"mock_data"}),
      MT_CONFIG_KEY(data, paths)
          .doc("indexed datasets (PREFIX.bin/.idx): [prefix] or [weight1, prefix1, weight2, prefix2, ...] blended by weight")
          .megatron({"data_path"}),
      MT_CONFIG_KEY(data, split).size(3).min(0)
          .doc("train, valid, test proportions of each dataset: a list or Megatron's string \"98,1,1\""),
      MT_CONFIG_KEY(data, cache_dir).doc("sample-index cache directory; \"\" = next to the data").megatron({"data_cache_path"}),
      MT_CONFIG_KEY(data, prefetch).min(1).doc("batches the loader thread prepares ahead"),
      MT_CONFIG_KEY(data, tokenizer_type).one_of({"none", "gpt2-bpe", "hf-json"})
          .doc("tokenizer of the data (megatrain generate encodes prompts with it)").megatron({"tokenizer_type"}),
      MT_CONFIG_KEY(data, vocab_file).doc("gpt2-bpe: encoder.json").megatron({"vocab_file"}),
      MT_CONFIG_KEY(data, merge_file).doc("gpt2-bpe: vocab.bpe").megatron({"merge_file"}),
      MT_CONFIG_KEY(data, tokenizer_file).doc("hf-json: tokenizer.json").megatron({"tokenizer_model"}),
      // ------------------------------------------------------------------ checkpoint
      MT_CONFIG_KEY(checkpoint, dir).doc("checkpoint directory (DIR/iter_NNNNNNN/); \"\" = no checkpoints").megatron({"save"}),
      MT_CONFIG_KEY(checkpoint, save_interval).min(0).doc("save every this many steps; 0 = only at the end"),
      MT_CONFIG_KEY(checkpoint, keep_last).min(0).doc("newest checkpoints kept, older ones deleted; 0 = keep all"),
      MT_CONFIG_KEY(checkpoint, load).doc("auto = resume from the newest complete checkpoint in dir, if any; none = start fresh; or a checkpoint path"),
      MT_CONFIG_KEY(checkpoint, finetune)
          .doc("with load: PATH, load the model weights only: iteration 0, fresh optimizer and data position")
          .megatron({"finetune"}),
      MT_CONFIG_KEY(checkpoint, async_save)
          .doc("copy the tensors to host memory (page-locked and allocated once on a GPU, copied on a side stream while training goes on) and write the checkpoint from a background thread; a save due while the previous one is still writing waits for it")
          .megatron({"async_save"}),
      // ------------------------------------------------------------------ logging
      MT_CONFIG_KEY(logging, log_interval).min(1).doc("log and record training metrics every this many steps"),
      MT_CONFIG_KEY(logging, metrics_file).doc("JSON-lines metrics file; \"\" = none"),
      MT_CONFIG_KEY(logging, tensorboard_dir).doc("TensorBoard event files of every logged scalar (Megatron's --tensorboard-dir); \"\" = none"),
      MT_CONFIG_KEY(logging, level).one_of({"trace", "debug", "info", "warn", "error"}).doc("log level"),
  };

  std::vector<ConfigField> fields;
  fields.reserve(rows.size());
  const Config defaults;
  Config probe;  // optional fields are engaged here to find their addresses
  std::set<std::string> paths;
  std::set<const void*> addresses;
  for (Row& r : rows) {
    ConfigField& f = fields.emplace_back(std::move(r.f));
    MT_INTERNAL_ASSERT(paths.insert(f.path).second, "config key ", f.path, " has two schema rows");
    const void* addr = std::visit([](auto* p) { return static_cast<const void*>(p); }, f.at(probe));
    MT_INTERNAL_ASSERT(addresses.insert(addr).second, "config key ", f.path, " points at a field another row has");
    MT_INTERNAL_ASSERT(!f.doc.empty(), "config key ", f.path, " has no documentation");
    MT_INTERNAL_ASSERT(!f.optional || !f.is_set(defaults), "config key ", f.path, ": an optional key is unset by default");
    f.default_text = f.required ? "required" : f.optional ? kPresetDefault : format_field(f, defaults);
  }
  return fields;
}

#undef MT_CONFIG_KEY
#undef MT_CONFIG_OPTIONAL_KEY

bool is_integral_text(const std::string& s) {
  for (char c : s)
    if (c == '.' || c == 'e' || c == 'E' || c == 'n' || c == 'i') return false;
  return true;
}

}  // namespace

const std::vector<ConfigField>& config_fields() {
  static const std::vector<ConfigField> fields = build_schema();
  return fields;
}

const std::vector<std::string>& config_sections() {
  static const std::vector<std::string> sections = [] {
    std::vector<std::string> out;
    for (const ConfigField& f : config_fields())
      if (std::find(out.begin(), out.end(), f.section) == out.end()) out.push_back(f.section);
    return out;
  }();
  return sections;
}

const ConfigField* find_config_field(const std::string& path) {
  for (const ConfigField& f : config_fields())
    if (f.path == path) return &f;
  return nullptr;
}

// ---------------------------------------------------------------- ranges

bool Range::contains(double v) const {
  if (std::isnan(v)) return false;
  if (lo_open ? !(v > lo) : !(v >= lo)) return false;
  if (hi_open ? !(v < hi) : !(v <= hi)) return false;
  return true;
}

bool Range::unbounded() const { return std::isinf(lo) && std::isinf(hi); }

std::string Range::describe() const {
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  const bool has_lo = !std::isinf(lo), has_hi = !std::isinf(hi);
  if (has_lo && has_hi)
    return str_cat("in ", lo_open ? "(" : "[", num(lo), ", ", num(hi), hi_open ? ")" : "]");
  if (has_lo) return str_cat(lo_open ? "> " : ">= ", num(lo));
  if (has_hi) return str_cat(hi_open ? "< " : "<= ", num(hi));
  return "";
}

// ---------------------------------------------------------------- type names

std::string field_type_expectation(const ConfigField& f) {
  switch (f.type) {
    case FieldType::Int:
    case FieldType::Int64: return "an integer";
    case FieldType::UInt64: return "a non-negative integer";
    case FieldType::Double: return "a number";
    case FieldType::Bool: return "true or false";
    case FieldType::String: return "a string";
    case FieldType::Enum: {
      std::string s = "one of ";
      for (std::size_t i = 0; i < f.allowed.size(); ++i) s += (i ? ", " : "") + f.allowed[i];
      return s;
    }
    case FieldType::DoubleList:
      return f.list_size ? str_cat("a list of ", f.list_size, " numbers") : std::string("a list of numbers");
    case FieldType::WeightedPaths: return "[prefix] or [weight1, prefix1, weight2, prefix2, ...]";
  }
  return "?";
}

std::string field_type_name(const ConfigField& f) {
  std::string base;
  switch (f.type) {
    case FieldType::Int: base = "int"; break;
    case FieldType::Int64: base = "int64"; break;
    case FieldType::UInt64: base = "uint64"; break;
    case FieldType::Double: base = "double"; break;
    case FieldType::Bool: return "bool";
    case FieldType::String: return "string";
    case FieldType::Enum: return field_type_expectation(f);
    case FieldType::DoubleList: base = f.list_size ? str_cat("list of ", f.list_size, " doubles") : "list of doubles"; break;
    case FieldType::WeightedPaths: return "list: [prefix] or [weight, prefix, ...]";
  }
  if (!f.range.unbounded()) base += (f.type == FieldType::DoubleList ? ", each " : " ") + f.range.describe();
  return base;
}

// ---------------------------------------------------------------- formatting

std::string format_double(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  char buf[40];
  for (int prec : {15, 16, 17}) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s(buf);
  if (is_integral_text(s)) s += ".0";
  return s;
}

std::string yaml_quote(const std::string& s) {
  static const char* const kSpecial[] = {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "~"};
  bool plain = !s.empty() && (std::isalnum(static_cast<unsigned char>(s[0])) || s[0] == '_' || s[0] == '/' || s[0] == '.');
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '/' || c == '-' || c == '+'))
      plain = false;
  if (plain) {
    std::string lower;
    for (char c : s) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    for (const char* w : kSpecial)
      if (lower == w) plain = false;
    double d;
    const char* end = s.data() + s.size();
    auto [ptr, ec] = std::from_chars(s.data() + (s[0] == '+'), end, d);
    if (ec == std::errc() && ptr == end) plain = false;  // would read as a number elsewhere
  }
  if (plain) return s;
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string format_field(const ConfigField& f, const Config& cfg) {
  struct Visitor {
    std::string operator()(int* p) const { return std::to_string(*p); }
    std::string operator()(int64_t* p) const { return std::to_string(*p); }
    std::string operator()(uint64_t* p) const { return std::to_string(*p); }
    std::string operator()(double* p) const { return format_double(*p); }
    std::string operator()(bool* p) const { return *p ? "true" : "false"; }
    std::string operator()(std::string* p) const { return yaml_quote(*p); }
    std::string operator()(std::vector<double>* p) const {
      std::string s = "[";
      for (std::size_t i = 0; i < p->size(); ++i) s += (i ? ", " : "") + format_double((*p)[i]);
      return s + "]";
    }
    std::string operator()(WeightedPaths* p) const {
      std::string s = "[";
      for (std::size_t i = 0; i < p->size(); ++i)
        s += (i ? ", " : "") + format_double((*p)[i].first) + ", " + yaml_quote((*p)[i].second);
      return s + "]";
    }
  };
  if (!f.is_set(cfg)) return "null";
  return std::visit(Visitor{}, f.at(cfg));
}

bool field_equal(const ConfigField& f, const Config& a, const Config& b) {
  if (!f.is_set(a) || !f.is_set(b)) return f.is_set(a) == f.is_set(b);
  FieldPtr pa = f.at(a), pb = f.at(b);
  return std::visit(
      [&](auto* x) {
        using P = decltype(x);
        return *x == *std::get<P>(pb);
      },
      pa);
}

bool config_fields_equal(const Config& a, const Config& b) {
  for (const ConfigField& f : config_fields())
    if (!field_equal(f, a, b)) return false;
  return true;
}

// ---------------------------------------------------------------- checks

std::string config_error_prefix(const std::string& origin) {
  return str_cat("config ", origin.empty() ? std::string("<in-memory config>") : origin, ": ");
}

void check_field_value(const ConfigField& f, const Config& cfg, const std::string& origin, int line) {
  const std::string at_line = line >= 0 ? str_cat(" (line ", line, ")") : std::string();
  const std::string pre = config_error_prefix(origin);
  auto check_number = [&](double v, const std::string& shown) {
    MT_CHECK(std::isfinite(v), pre, f.path, " = ", shown, ": must be a finite number", at_line);
    MT_CHECK(f.range.contains(v), pre, f.path, " = ", shown, ": must be ", f.range.describe(), at_line);
  };
  if (!f.is_set(cfg)) return;  // unset optional: the preset fills it
  FieldPtr p = f.at(cfg);
  switch (f.type) {
    case FieldType::Int: check_number(*std::get<int*>(p), format_field(f, cfg)); break;
    case FieldType::Int64: check_number(static_cast<double>(*std::get<int64_t*>(p)), format_field(f, cfg)); break;
    case FieldType::UInt64: break;  // every value allowed
    case FieldType::Double: check_number(*std::get<double*>(p), format_field(f, cfg)); break;
    case FieldType::Bool:
    case FieldType::String: break;
    case FieldType::Enum: {
      const std::string& v = *std::get<std::string*>(p);
      MT_CHECK(std::find(f.allowed.begin(), f.allowed.end(), v) != f.allowed.end(), pre, f.path, " = '", v,
               "': must be ", field_type_expectation(f), at_line);
      break;
    }
    case FieldType::DoubleList: {
      const std::vector<double>& v = *std::get<std::vector<double>*>(p);
      MT_CHECK(f.list_size == 0 || v.size() == f.list_size, pre, f.path, " = ", format_field(f, cfg), ": expected ",
               field_type_expectation(f), ", got ", v.size(), at_line);
      for (double x : v)
        MT_CHECK(std::isfinite(x) && f.range.contains(x), pre, f.path, " = ", format_field(f, cfg),
                 ": each value must be ", f.range.unbounded() ? std::string("finite") : f.range.describe(), at_line);
      break;
    }
    case FieldType::WeightedPaths: {
      for (const auto& [w, prefix] : *std::get<WeightedPaths*>(p)) {
        MT_CHECK(std::isfinite(w) && w > 0, pre, f.path, ": the weight of '", prefix, "' is ", format_double(w),
                 ": weights must be > 0", at_line);
        MT_CHECK(!prefix.empty(), pre, f.path, ": an empty path prefix: give the dataset prefix (PREFIX.bin/.idx)",
                 at_line);
      }
      break;
    }
  }
}


}  // namespace mt
