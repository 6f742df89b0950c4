// derive_config: the resolved values and every layout / batch refusal (numbers quoted, fix named).
#include <string>
#include <vector>

#include "catch.h"
#include "config/config_loader.h"
#include "config_test_util.h"

using mt::test::contains;
using mt::test::error_of;

namespace {

// A llama-style model, CPU fp32, mock data; tests adjust fields and derive.
mt::Config base() {
  mt::Config c;
  c.source_file = "configs/d.yaml";
  c.model.num_layers = 8;
  c.model.hidden_size = 256;
  c.model.num_attention_heads = 8;
  c.model.num_query_groups = 4;
  c.model.ffn_hidden_size = 512;
  c.model.vocab_size = 1000;
  c.model.make_vocab_size_divisible_by = 64;
  c.model.seq_length = 128;
  c.training.train_iters = 100;
  c.training.micro_batch_size = 2;
  c.data.mock = true;
  return c;
}

std::string derive_error(const mt::Config& c, int world) {
  const std::string msg = error_of([&] { mt::derive_config(c, world); });
  INFO(msg);
  CHECK(mt::test::one_line(msg));
  CHECK(msg.rfind("config configs/d.yaml: ", 0) == 0);
  return msg;
}

}  // namespace

TEST_CASE("derive: resolved values for one rank", "[config]") {
  const mt::DerivedConfig d = mt::derive_config(base(), 1);
  CHECK(d.world_size == 1);
  CHECK(d.data_parallel_size == 1);
  CHECK(d.num_query_groups == 4);
  CHECK(d.ffn_hidden_size == 512);
  CHECK(d.head_dim == 32);
  CHECK(d.padded_vocab_size == 1024);
  CHECK(d.global_batch_size == 2);  // 0 -> micro x data-parallel
  CHECK(d.num_microbatches == 1);
  CHECK(d.lr_decay_iters == 100);  // 0 -> train_iters
  CHECK(d.tokens_per_iteration == 2 * 128);
}

TEST_CASE("derive: layouts over several ranks", "[config]") {
  mt::Config c = base();
  c.parallel.tensor = 2;
  c.parallel.pipeline = 2;
  c.training.global_batch_size = 32;
  c.optimizer.lr_decay_iters = 80;
  mt::DerivedConfig d = mt::derive_config(c, 8);
  CHECK(d.data_parallel_size == 2);
  CHECK(d.padded_vocab_size == 1024);  // multiple of 64 x 2
  CHECK(d.global_batch_size == 32);
  CHECK(d.num_microbatches == 8);
  CHECK(d.lr_decay_iters == 80);
  CHECK(d.tokens_per_iteration == 32 * 128);

  c.parallel.tensor = 8;
  c.parallel.pipeline = 1;
  c.model.num_query_groups = 8;  // one key/value head per tensor rank (fewer groups than ranks is refused below)
  c.model.vocab_size = 1100;
  d = mt::derive_config(c, 16);
  CHECK(d.data_parallel_size == 2);
  CHECK(d.padded_vocab_size == 1536);  // multiple of 512

  c = base();
  c.model.num_query_groups = 0;
  c.model.arch = "gpt2";
  c.model.ffn_hidden_size = 0;
  c.model.vocab_size = 50257;
  c.model.make_vocab_size_divisible_by = 128;
  d = mt::derive_config(c, 1);
  CHECK(d.num_query_groups == 8);
  CHECK(d.ffn_hidden_size == 4 * 256);
  CHECK(d.padded_vocab_size == 50304);
  c.parallel.tensor = 2;
  CHECK(mt::derive_config(c, 2).padded_vocab_size == 50432);

  // Sequence parallel, interleaved pipeline (micro-batches a multiple of the stages).
  c = base();
  c.parallel.tensor = 2;
  c.parallel.sequence_parallel = true;
  c.parallel.pipeline = 2;
  c.parallel.virtual_pipeline = 2;
  c.training.global_batch_size = 8;
  d = mt::derive_config(c, 8);
  CHECK(d.data_parallel_size == 2);
  CHECK(d.num_microbatches == 2);
}

TEST_CASE("derive: world size must fit tensor x pipeline x context", "[config]") {
  mt::Config c = base();
  c.parallel.tensor = 4;
  const std::string m = derive_error(c, 6);
  CHECK(contains(m, "world size 6 is not divisible by parallel.tensor (4) x parallel.pipeline (1) x parallel.context (1) = 4"));
  CHECK(contains(m, "4 (data-parallel 1), 8 (data-parallel 2), 12 (data-parallel 3)"));
  CHECK(contains(error_of([&] { mt::derive_config(c, 0); }), "world size 0 must be >= 1"));
}

// `megatrain config` without --world-size: one rank when the config fits it, else the smallest world size that
// derive_config accepts, else one rank again (whose error lists the world sizes that fit). (Layouts that need more
// than the first multiple of tensor x pipeline x context, for the experts: test/cli/moe_plan.sh.)
TEST_CASE("derive: the smallest world size a config fits", "[config]") {
  mt::Config c = base();
  CHECK(mt::smallest_world_size(c) == 1);
  c.parallel.tensor = 2;
  c.parallel.pipeline = 2;
  CHECK(mt::smallest_world_size(c) == 4);
  c.parallel.pipeline = 3;  // 8 layers over 3 stages: no world size fits
  CHECK(mt::smallest_world_size(c) == 1);
  CHECK(contains(derive_error(c, 1), "world size 1 is not divisible by"));
}

TEST_CASE("derive: attention heads, query groups, hidden and MLP sizes", "[config]") {
  mt::Config c = base();
  c.model.num_attention_heads = 30;
  c.model.num_query_groups = 0;
  c.model.hidden_size = 960;
  c.parallel.tensor = 4;
  std::string m = derive_error(c, 4);
  CHECK(contains(m, "model.num_attention_heads (30) must be divisible by parallel.tensor (4); tensor sizes that fit: 1, 2, 3, 5, 6, 10"));

  c = base();
  c.model.num_query_groups = 3;
  m = derive_error(c, 1);
  CHECK(contains(m, "model.num_attention_heads (8) must be divisible by model.num_query_groups (3)"));

  c = base();
  c.model.num_attention_heads = 12;
  c.model.hidden_size = 384;
  c.model.num_query_groups = 3;
  c.parallel.tensor = 2;
  m = derive_error(c, 2);
  CHECK(contains(m, "model.num_query_groups (3) must be divisible by parallel.tensor (2): each tensor-parallel rank "
                    "holds whole key/value heads"));
  CHECK(contains(m, "tensor sizes that fit: 1, 3, or raise num_query_groups"));

  c = base();  // fewer query groups (4) than tensor ranks (8): the model cannot replicate key/value heads
  c.parallel.tensor = 8;
  m = derive_error(c, 8);
  CHECK(contains(m, "model.num_query_groups (4) must be divisible by parallel.tensor (8)"));
  c.model.num_query_groups = 0;  // = heads
  CHECK(mt::derive_config(c, 8).num_query_groups == 8);

  c = base();
  c.model.hidden_size = 100;
  m = derive_error(c, 1);
  CHECK(contains(m, "model.hidden_size (100) must be divisible by model.num_attention_heads (8)"));

  c = base();
  c.model.hidden_size = 72;  // head_dim 9
  m = derive_error(c, 1);
  CHECK(contains(m, "= 9 must be even for RoPE"));

  c = base();
  c.model.ffn_hidden_size = 500;
  c.model.num_query_groups = 8;
  c.parallel.tensor = 8;
  m = derive_error(c, 8);
  CHECK(contains(m, "model.ffn_hidden_size (500) must be divisible by parallel.tensor (8)"));

  c = base();
  c.model.arch = "gpt2";
  c.model.num_query_groups = 2;
  m = derive_error(c, 1);
  CHECK(contains(m, "for arch gpt2"));
  c = base();
  c.model.ffn_hidden_size = 0;
  m = derive_error(c, 1);
  CHECK(contains(m, "model.ffn_hidden_size is required for arch llama"));
  c = base();
  c.model.num_layers = 0;  // built in code: ranges are checked too
  m = derive_error(c, 1);
  CHECK(contains(m, "model.num_layers = 0: must be >= 1"));
}

TEST_CASE("derive: layers over pipeline stages", "[config]") {
  mt::Config c = base();
  c.model.num_layers = 30;
  c.parallel.pipeline = 4;
  std::string m = derive_error(c, 4);
  CHECK(contains(m, "model.num_layers (30) cannot be split evenly over parallel.pipeline (4) x parallel.virtual_pipeline (1) "
                    "stages; set parallel.decoder_first_pipeline_num_layers / decoder_last_pipeline_num_layers or choose "
                    "num_layers divisible by 4"));

  c.parallel.decoder_first_pipeline_num_layers = 6;
  c.parallel.decoder_last_pipeline_num_layers = 6;  // 18 left over 2 middle stages
  CHECK(mt::derive_config(c, 4).data_parallel_size == 1);
  c.parallel.decoder_first_pipeline_num_layers = 7;
  m = derive_error(c, 4);
  CHECK(contains(m, "leaves 17 layers, which cannot be split evenly over the 2 other pipeline stages"));
  c.parallel.decoder_first_pipeline_num_layers = 8;  // first only: 22 over 3 stages
  c.parallel.decoder_last_pipeline_num_layers = 0;
  m = derive_error(c, 4);
  CHECK(contains(m, "leaves 22 layers"));
  c.parallel.decoder_first_pipeline_num_layers = 9;  // 21 over 3 stages
  CHECK(mt::derive_config(c, 4).data_parallel_size == 1);
  c.parallel.decoder_first_pipeline_num_layers = 20;
  c.parallel.decoder_last_pipeline_num_layers = 20;
  m = derive_error(c, 4);
  CHECK(contains(m, "= 40 is more than model.num_layers (30)"));

  c.parallel.pipeline = 2;
  c.parallel.decoder_first_pipeline_num_layers = 14;
  c.parallel.decoder_last_pipeline_num_layers = 16;
  CHECK(mt::derive_config(c, 2).data_parallel_size == 1);
  c.parallel.decoder_last_pipeline_num_layers = 10;
  m = derive_error(c, 2);
  CHECK(contains(m, "must equal model.num_layers (30)"));

  c = base();
  c.parallel.pipeline = 2;
  c.parallel.virtual_pipeline = 3;
  c.model.num_layers = 8;
  m = derive_error(c, 2);
  CHECK(contains(m, "model.num_layers (8) cannot be split evenly over parallel.pipeline (2) x parallel.virtual_pipeline (3) stages"));
  c.parallel.decoder_first_pipeline_num_layers = 2;
  c.parallel.decoder_last_pipeline_num_layers = 6;
  m = derive_error(c, 2);
  CHECK(contains(m, "must be divisible by parallel.virtual_pipeline (3)"));

  c = base();
  c.parallel.virtual_pipeline = 2;
  m = derive_error(c, 1);
  CHECK(contains(m, "parallel.virtual_pipeline (2) > 1 needs parallel.pipeline > 1"));
  c = base();
  c.parallel.decoder_first_pipeline_num_layers = 2;
  m = derive_error(c, 1);
  CHECK(contains(m, "need parallel.pipeline > 1"));
}

TEST_CASE("derive: sequence and context parallel need divisible sequence lengths", "[config]") {
  mt::Config c = base();
  c.parallel.sequence_parallel = true;
  std::string m = derive_error(c, 1);
  CHECK(contains(m, "parallel.sequence_parallel needs parallel.tensor > 1"));
  CHECK(contains(m, "set sequence_parallel: false or tensor > 1"));
  c.parallel.tensor = 2;
  c.model.seq_length = 127;
  m = derive_error(c, 2);
  CHECK(contains(m, "model.seq_length (127) must be divisible by parallel.tensor (2) with parallel.sequence_parallel: true"));

  c = base();
  c.parallel.context = 2;
  c.model.seq_length = 130;
  m = derive_error(c, 2);
  CHECK(contains(m, "model.seq_length (130) must be divisible by 2 x parallel.context (2) = 4"));
  c.model.seq_length = 128;  // a fitting length
  CHECK(mt::derive_config(c, 2).data_parallel_size == 1);
  // a2a splits the key/value heads per tensor rank (4 / 2 = 2) over context: 4 does not divide them.
  c.parallel.cp_comm_type = "a2a";
  c.parallel.tensor = 2;
  c.parallel.context = 4;
  m = derive_error(c, 8);
  CHECK(contains(m, "parallel.cp_comm_type a2a splits each tensor rank's key/value heads over parallel.context (4), "
                    "but model.num_query_groups / parallel.tensor = 2 is not divisible by it"));
  c.parallel.context = 2;
  CHECK(mt::derive_config(c, 4).data_parallel_size == 1);
  c.model.dropout = 0.1;  // not yet with context parallelism
  m = derive_error(c, 4);
  CHECK(contains(m, "model.dropout (0.1) with parallel.context (2) > 1 is not supported yet"));
}

TEST_CASE("derive: batch arithmetic is checked, never adjusted", "[config]") {
  mt::Config c = base();
  c.training.micro_batch_size = 8;
  c.training.global_batch_size = 100;
  std::string m = derive_error(c, 2);
  CHECK(contains(m, "training.global_batch_size (100) must be a multiple of training.micro_batch_size (8) x data-parallel size (2) = 16"));
  CHECK(contains(m, "96 or 112"));
  c.training.global_batch_size = 8;
  m = derive_error(c, 2);
  CHECK(contains(m, "nearest that fit: 16 (0 means 16)"));
  c.training.global_batch_size = 64;
  const mt::DerivedConfig d = mt::derive_config(c, 2);
  CHECK(d.num_microbatches == 4);
}

TEST_CASE("derive: optimizer, precision and expert rules", "[config]") {
  mt::Config c = base();
  c.optimizer.warmup_iters = 50;
  c.optimizer.lr_decay_iters = 40;
  std::string m = derive_error(c, 1);
  CHECK(contains(m, "optimizer.warmup_iters (50) must be <= optimizer.lr_decay_iters (40)"));
  c = base();
  c.optimizer.min_lr = 1.0;
  m = derive_error(c, 1);
  CHECK(contains(m, "optimizer.min_lr (1.0) must be <= optimizer.lr (0.0003)"));
  c = base();
  c.parallel.expert = 2;
  m = derive_error(c, 2);
  CHECK(contains(m, "parallel.expert (2) > 1 needs experts; set model.num_experts or parallel.expert: 1"));
  c = base();
  c.training.device = "cpu";
  c.training.precision = "bf16";
  m = derive_error(c, 1);
  CHECK(contains(m, "the CPU backend runs fp32; set training.precision: fp32"));
  c.training.device = "auto";  // resolved when training starts: a GPU there, or a refusal
  CHECK(mt::derive_config(c, 1).world_size == 1);
  c.training.device = "cuda";
#if defined(MEGATRAIN_HAVE_CUDA)
  CHECK(mt::derive_config(c, 1).device == mt::DeviceMode::CUDA);
#else
  m = derive_error(c, 1);
  CHECK(contains(m, "training.device is cuda, but this megatrain was built without the CUDA backend"));
#endif
}

TEST_CASE("derive: the interleaved pipeline schedule's micro-batch needs", "[config]") {
  mt::Config c = base();
  c.parallel.pipeline = 2;
  c.parallel.virtual_pipeline = 2;
  c.training.micro_batch_size = 1;
  c.training.global_batch_size = 3;  // 3 micro-batches over 2 stages
  std::string m = derive_error(c, 2);
  CHECK(contains(m, "the interleaved pipeline schedule (parallel.virtual_pipeline 2) needs the number of micro-batches (3"));
  CHECK(contains(m, "to be a multiple of parallel.pipeline (2); change training.global_batch_size to a multiple of 2"));
  c.training.global_batch_size = 4;
  CHECK(mt::derive_config(c, 2).num_microbatches == 4);
  c.training.global_batch_size = 20000;  // 20000 x 2 chunks: more than the message tags allow
  m = derive_error(c, 2);
  CHECK(contains(m, "micro-batches (20000) x parallel.virtual_pipeline (2) = 40000 <= 16383"));
}

TEST_CASE("derive: data.split needs a train share; mock data needs two tokens", "[config]") {
  mt::Config c = base();
  for (const std::vector<double>& split : {std::vector<double>{0, 1, 1}, std::vector<double>{0, 0, 1}}) {
    c.data.split = split;
    const std::string m = derive_error(c, 1);
    CHECK(contains(m, "data.split = ["));
    CHECK(contains(m, "the train share (first weight) is 0, so there is nothing to train on; give it a positive "
                      "weight, e.g. data.split: [98, 1, 1]"));
  }
  c.data.split = {1, 0, 0};
  CHECK(mt::derive_config(c, 1).world_size == 1);
  c.model.vocab_size = 1;
  CHECK(contains(derive_error(c, 1), "model.vocab_size (1) must be >= 2 with data.mock: true"));
}

TEST_CASE("derive: option strings are resolved once into enums", "[config]") {
  mt::Config c = base();
  mt::DerivedConfig d = mt::derive_config(c, 1);
  CHECK(d.precision == mt::Precision::FP32);
  CHECK(d.device == mt::DeviceMode::Auto);
  CHECK(d.recompute == mt::RecomputeGranularity::None);
  CHECK(d.recompute_method == mt::RecomputeMethod::Uniform);
  CHECK(d.nan_policy == mt::NanPolicy::Stop);
  CHECK(d.decay_style == mt::DecayStyle::Cosine);
  CHECK(d.tokenizer_type == mt::TokenizerType::None);
  c.training.device = "cpu";
  c.training.recompute = "selective";
  c.training.nan_policy = "skip";
  c.optimizer.decay_style = "constant";
  c.data.tokenizer_type = "hf-json";
  d = mt::derive_config(c, 1);
  CHECK(d.device == mt::DeviceMode::CPU);
  CHECK(d.recompute == mt::RecomputeGranularity::Selective);
  CHECK(d.nan_policy == mt::NanPolicy::Skip);
  CHECK(d.decay_style == mt::DecayStyle::Constant);
  CHECK(d.tokenizer_type == mt::TokenizerType::HfJson);
  c.training.recompute = "full";
  c.training.recompute_method = "block";  // acts with full recompute only (refused beside selective)
  c.optimizer.decay_style = "linear";
  c.data.tokenizer_type = "gpt2-bpe";
  d = mt::derive_config(c, 1);
  CHECK(d.recompute == mt::RecomputeGranularity::Full);
  CHECK(d.recompute_method == mt::RecomputeMethod::Block);
  CHECK(d.decay_style == mt::DecayStyle::Linear);
  CHECK(d.tokenizer_type == mt::TokenizerType::Gpt2Bpe);
  c.training.device = "auto";
  for (const char* p : {"bf16", "fp16"}) {
    c.training.precision = p;
    CHECK(mt::derive_config(c, 1).precision == (std::string(p) == "bf16" ? mt::Precision::BF16 : mt::Precision::FP16));
  }
}

TEST_CASE("derive: training.attention_backend cudnn needs a run cuDNN's attention can take", "[config]") {
  mt::Config c = base();  // head dim 256 / 8 = 32, seq_length 128, fp32, device auto
  c.training.attention_backend = "cudnn";
  c.training.device = "cpu";
  std::string m = derive_error(c, 1);
  CHECK(contains(m, "training.attention_backend is cudnn but training.device is cpu; set "
                    "training.attention_backend: auto (cuDNN where it can, else our kernels) or own"));
  c.training.device = "auto";  // (cuda is refused by a build without the CUDA backend)
  m = derive_error(c, 1);
  CHECK(contains(m, "training.attention_backend is cudnn but training.precision is fp32"));
  c.training.precision = "bf16";
  m = derive_error(c, 1);
  CHECK(contains(m, "the head dim (model.kv_channels, or hidden_size / num_attention_heads: 32) is not 64 or 128"));
  c.model.hidden_size = 512;
  c.model.seq_length = 200;
  m = derive_error(c, 1);
  CHECK(contains(m, "model.seq_length (200) is not a multiple of 128"));
  c.model.seq_length = 256;
  CHECK(mt::derive_config(c, 1).world_size == 1);
  c.training.device = "auto";  // a GPU or not is known at start: the trainer refuses cudnn on the CPU
  c.training.precision = "fp16";
  CHECK(mt::derive_config(c, 1).world_size == 1);
  for (const char* other : {"auto", "own"}) {  // any run
    c = base();
    c.training.attention_backend = other;
    CHECK(mt::derive_config(c, 1).world_size == 1);
  }
  // Context parallelism: the ring's blocks are the chunks (seq_length / (2 x context) tokens), a2a the whole sequence.
  c = base();
  c.model.hidden_size = 512;
  c.training.precision = "bf16";
  c.training.attention_backend = "cudnn";
  c.parallel.context = 2;
  c.model.seq_length = 512;  // chunks of 128
  CHECK(mt::derive_config(c, 2).world_size == 2);
  c.model.seq_length = 256;  // chunks of 64
  m = derive_error(c, 2);
  CHECK(contains(m, "training.attention_backend is cudnn but the context-parallel chunks (model.seq_length / (2 x "
                    "parallel.context) = 64 tokens) are not a multiple of 128"));
  c.parallel.cp_comm_type = "a2a";  // attends over the whole 256
  CHECK(mt::derive_config(c, 2).world_size == 2);
  c.training.attention_backend = "auto";  // cuDNN where it can: any chunk
  c.parallel.cp_comm_type = "p2p";
  CHECK(mt::derive_config(c, 2).world_size == 2);
}
