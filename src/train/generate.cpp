#include "train/generate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "checkpoint/checkpoint.h"
#include "config/config_loader.h"
#include "data_tools/tokenizer.h"
#include "model/gpt_model.h"
#include "tensor/cpu/cpu_ops.h"
#include "train/train_checkpoint.h"

namespace mt {

namespace {

// Samples the next id from one row of logits (only the first `vocab` entries are real tokens).
int32_t sample(const float* logits, int64_t vocab, double temperature, int top_k, std::mt19937_64& rng) {
  if (temperature <= 0) return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t k = top_k > 0 ? std::min<int64_t>(top_k, vocab) : vocab;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  std::vector<double> p(static_cast<size_t>(k));
  const double mx = logits[ids[0]];
  for (int64_t i = 0; i < k; ++i) p[i] = std::exp((logits[ids[i]] - mx) / temperature);
  std::discrete_distribution<int64_t> dist(p.begin(), p.end());
  return ids[dist(rng)];
}

}  // namespace

void run_generate(const GenerateOptions& opt) {
  ops::cpu::init_cpu_threads();
  MT_CHECK(opt.max_new_tokens >= 0, "--max-new-tokens must be >= 0");
  const std::string path = ckpt::resolve_load_path(opt.checkpoint, opt.checkpoint);
  MT_CHECK(!path.empty(), "--checkpoint ", opt.checkpoint, ": no checkpoint there (no 'latest' and no manifest.json)");
  ckpt::LoadedCheckpoint ck = ckpt::open_checkpoint(path);

  // The stored config, rebuilt on one rank; the padded vocabulary stays that of the saved layout.
  Config cfg = load_stored_config(ck.config_yaml, path + "/manifest.json");
  const DerivedConfig saved = derive_config(cfg, ck.world_size);
  cfg.parallel = ParallelConfig{};
  cfg.training.global_batch_size = cfg.training.micro_batch_size;
  DerivedConfig d = derive_config(cfg, 1);
  d.padded_vocab_size = saved.padded_vocab_size;
  if (cfg.model.moe_router_force_load_balancing)
    std::fprintf(stderr, "megatrain generate: note: %s was trained with model.moe_router_force_load_balancing (a "
                 "benchmark key): its MoE layers route by random logits here too, as in that run\n", path.c_str());

  data::TokenizerOptions tok;
  tok.type = opt.tokenizer_type.empty() ? cfg.data.tokenizer_type : opt.tokenizer_type;
  tok.vocab_file = opt.vocab_file.empty() ? cfg.data.vocab_file : opt.vocab_file;
  tok.merge_file = opt.merge_file.empty() ? cfg.data.merge_file : opt.merge_file;
  tok.tokenizer_file = opt.tokenizer_file.empty() ? cfg.data.tokenizer_file : opt.tokenizer_file;
  MT_CHECK(tok.type != "none", "the checkpoint's config names no tokenizer (data.tokenizer_type: none): give "
                               "--tokenizer-type gpt2-bpe --vocab-file F --merge-file F, or --tokenizer-type hf-json "
                               "--tokenizer-file F");
  // a file flag the chosen tokenizer does not read is refused, not ignored
  data::TokenizerOptions given;
  given.type = tok.type, given.vocab_file = opt.vocab_file, given.merge_file = opt.merge_file;
  given.tokenizer_file = opt.tokenizer_file;
  data::check_tokenizer_flags(given, "--tokenizer-type");
  std::unique_ptr<data::Tokenizer> tokenizer = data::make_tokenizer(tok);
  MT_CHECK(tokenizer->vocab_size() <= cfg.model.vocab_size, "tokenizer ", tokenizer->describe(), " has ",
           tokenizer->vocab_size(), " tokens but the model only ", cfg.model.vocab_size);

  ParallelState ps;
  ModelContext ctx;
  ctx.model = &cfg.model;
  ctx.derived = &d;
  ctx.ps = &ps;
  ParamStore store(0, 1);
  GPTModel model(ctx, store, ModelChunkSpec{0, cfg.model.num_layers, true, true});
  store.allocate(ctx.dtype, ctx.device);
  load_model_weights(ck, store);
  // Which weights these are, on stderr (stdout is the text).
  std::fprintf(stderr, "megatrain generate: loaded checkpoint %s (iteration %lld, %s, %d layers, hidden %d, saved by %d rank(s))\n",
               ck.path.c_str(), static_cast<long long>(ck.iteration), cfg.model.arch.c_str(), cfg.model.num_layers,
               cfg.model.hidden_size, ck.world_size);

  // Only ids the tokenizer can decode are sampled (a model may have more rows than the tokenizer ids).
  const int64_t sampled_vocab = std::min<int64_t>(tokenizer->vocab_size(), cfg.model.vocab_size);
  std::vector<int32_t> ids = tokenizer->encode(opt.prompt);
  if (ids.empty()) ids.push_back(tokenizer->eod_id());
  const size_t prompt_len = ids.size();
  std::mt19937_64 rng(opt.seed);
  std::printf("%s", opt.prompt.c_str());
  std::fflush(stdout);
  size_t printed = prompt_len;
  for (int i = 0; i < opt.max_new_tokens; ++i) {
    // The model sees at most seq_length tokens: the last ones.
    const size_t start = ids.size() > static_cast<size_t>(cfg.model.seq_length) ? ids.size() - cfg.model.seq_length : 0;
    const int64_t T = static_cast<int64_t>(ids.size() - start);
    Tensor logits = model.logits(ids.data() + start, 1, T);
    const float* last = logits.data<float>() + (T - 1) * logits.size(1);
    const int32_t next = sample(last, sampled_vocab, opt.temperature, opt.top_k, rng);
    if (next == tokenizer->eod_id()) break;
    ids.push_back(next);
    // Print whole UTF-8 characters as they complete (a character can span several tokens).
    std::string text = tokenizer->decode(std::span<const int32_t>(ids.data() + prompt_len, ids.size() - prompt_len));
    std::string before = tokenizer->decode(std::span<const int32_t>(ids.data() + prompt_len, printed - prompt_len));
    if (text.size() > before.size() && (static_cast<unsigned char>(text.back()) & 0xC0) != 0x80) {
      std::printf("%s", text.substr(before.size()).c_str());
      std::fflush(stdout);
      printed = ids.size();
    }
  }
  std::string rest = tokenizer->decode(std::span<const int32_t>(ids.data() + printed, ids.size() - printed));
  std::printf("%s\n", rest.c_str());
}

}  // namespace mt
