// megatrain-data: data preparation for megatrain (Megatron-compatible indexed datasets).
//   preprocess  JSONL (plain or .gz) -> PREFIX_KEY_document.bin/.idx
//   inspect     counts, length histograms and decoded samples of a dataset
//   merge       several datasets into one
//   tokenize    encode text (or decode ids) with a tokenizer, for checking
// Errors are one line on stderr, exit status 1.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <thread>

#include "config/config_loader.h"
#include "core/check.h"
#include "core/log.h"
#include "data/dataset.h"
#include "data_tools/inspect.h"
#include "data_tools/merge.h"
#include "data_tools/preprocess.h"

namespace {

std::atomic<bool> g_cancel{false};

void on_signal(int sig) {
  g_cancel.store(true);
  std::signal(sig, SIG_DFL);  // a second signal kills at once
}

void add_tokenizer_options(CLI::App* app, mt::data::TokenizerOptions& t, bool required) {
  auto* opt = app->add_option("--tokenizer", t.type, "gpt2-bpe (--vocab-file, --merge-file) or hf-json (--tokenizer-file)")
                  ->check(CLI::IsMember({"gpt2-bpe", "hf-json"}));
  if (required) opt->required();
  app->add_option("--vocab-file", t.vocab_file, "gpt2-bpe: GPT-2 encoder.json (scripts/fetch_gpt2_tokenizer.sh)");
  app->add_option("--merge-file", t.merge_file, "gpt2-bpe: GPT-2 vocab.bpe");
  app->add_option("--tokenizer-file", t.tokenizer_file, "hf-json: Hugging Face tokenizer.json (byte-level BPE)");
  app->add_option("--eod-token", t.eod_token,
                  "hf-json: text of the end-of-document token (default: <|endoftext|>, <|end_of_text|>, </s> or <eos>)");
  app->add_flag("!--no-add-special-tokens", t.add_special_tokens,
                "hf-json: do not apply the post-processor template (e.g. Llama-3's <|begin_of_text|>)");
}

std::string format_number(const char* f, double a, double b = 0) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a, b);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"megatrain-data: JSONL -> Megatron indexed datasets (.bin/.idx), and tools for them"};
  app.require_subcommand(1);

  mt::data::PreprocessOptions pre;
  pre.workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  double chunk_mb = 1.0;
  auto* p = app.add_subcommand("preprocess", "Tokenize JSONL files into PREFIX_KEY_document.bin/.idx");
  p->add_option("--input", pre.inputs, "JSONL files, plain or gzip ('-' for stdin), read in order")->required();
  p->add_option("--json-keys", pre.json_keys, "keys to tokenize, one dataset each")->capture_default_str();
  add_tokenizer_options(p, pre.tokenizer, true);
  p->add_flag("--append-eod", pre.append_eod, "append the end-of-document token to every non-empty document");
  p->add_option("--workers", pre.workers, "tokenizer threads (default: all hardware threads)")->capture_default_str()
      ->check(CLI::PositiveNumber);
  p->add_option("--output-prefix", pre.output_prefix, "output prefix P: writes P_KEY_document.bin/.idx")->required();
  p->add_flag("--skip-bad", pre.skip_bad, "skip malformed lines (reported, counted) instead of stopping");
  p->add_option("--log-interval", pre.log_interval, "seconds between progress lines (0: none)")->capture_default_str();
  p->add_option("--chunk-mb", chunk_mb, "MB of JSONL per unit of work")->capture_default_str()->check(CLI::PositiveNumber);
  p->add_option("--chunks-in-flight", pre.chunks_in_flight, "chunks read but not yet written (0: 2 x workers + 2); bounds memory")
      ->capture_default_str();

  mt::data::InspectOptions ins;
  auto* i = app.add_subcommand("inspect", "Counts, length histograms and decoded samples of a dataset");
  i->add_option("prefix", ins.prefix, "dataset prefix (PREFIX.idx, PREFIX.bin)")->required();
  add_tokenizer_options(i, ins.tokenizer, false);
  i->add_option("--samples", ins.samples, "decoded documents to show (needs --tokenizer)")->capture_default_str();
  i->add_option("--max-chars", ins.max_chars, "characters shown of each sample")->capture_default_str();

  std::vector<std::string> merge_inputs;
  std::string merge_output;
  auto* m = app.add_subcommand("merge", "Concatenate datasets (same dtype) into one, as Megatron's merge_datasets.py");
  m->add_option("--inputs", merge_inputs, "dataset prefixes, or directories of them, in order")->required();
  m->add_option("--output-prefix", merge_output, "prefix of the merged dataset")->required();

  mt::data::TokenizerOptions tok_opt;
  std::vector<std::string> texts;
  bool decode = false;
  auto* t = app.add_subcommand("tokenize", "Print the token ids of each TEXT (or, with --decode, the text of ids)");
  add_tokenizer_options(t, tok_opt, true);
  t->add_option("text", texts, "texts to encode, or ids to decode")->required();
  t->add_flag("--decode", decode, "decode the given ids");

  std::string index_config;
  std::vector<std::string> index_overrides;
  int index_world = 1;
  auto* bi = app.add_subcommand("build-index",
                                "Build the GPT sample-index caches a training config will load (run once before a large "
                                "job, so that ranks do not each build them at start)");
  bi->add_option("--config,-c", index_config, "the training config")->required()->check(CLI::ExistingFile);
  bi->add_option("--set", index_overrides, "override a config key, as for `megatrain train` (repeatable)");
  bi->add_option("--world-size", index_world, "ranks the job will run on (sets the data-parallel size)")
      ->check(CLI::PositiveNumber);

  CLI11_PARSE(app, argc, argv);

  try {
    // what each subcommand's command line gave to its tokenizer: nothing given is ignored
    if (p->parsed()) mt::data::check_tokenizer_flags(pre.tokenizer, "--tokenizer");
    if (t->parsed()) mt::data::check_tokenizer_flags(tok_opt, "--tokenizer");
    if (i->parsed()) {
      mt::data::check_tokenizer_flags(ins.tokenizer, "--tokenizer");
      MT_CHECK(!i->count("--samples") || !ins.tokenizer.type.empty(), "inspect: --samples decodes documents and needs "
               "--tokenizer (gpt2-bpe or hf-json with its files); add it or remove --samples");
    }
    if (p->parsed()) {
      pre.chunk_bytes = static_cast<size_t>(chunk_mb * 1e6);
      std::signal(SIGINT, on_signal);
      std::signal(SIGTERM, on_signal);
      const auto st = mt::data::preprocess(pre, &g_cancel);
      for (const std::string& out : st.output_prefixes) std::printf("wrote %s.bin / .idx\n", out.c_str());
      std::printf("%lld documents (%lld sequences, %lld tokens, %s) from %lld lines, %s MB of JSONL in %s s: %s MB/s\n",
                  static_cast<long long>(st.documents), static_cast<long long>(st.sequences),
                  static_cast<long long>(st.tokens), st.dtype.c_str(), static_cast<long long>(st.lines),
                  format_number("%.1f", st.input_bytes / 1e6).c_str(), format_number("%.2f", st.seconds).c_str(),
                  format_number("%.2f", st.input_bytes / 1e6 / std::max(st.seconds, 1e-9)).c_str());
      std::printf("tokenizer loaded in %s s\n", format_number("%.2f", st.load_seconds).c_str());
      if (st.bad_lines) std::printf("%lld bad lines skipped (--skip-bad)\n", static_cast<long long>(st.bad_lines));
      if (st.blank_lines) std::printf("%lld blank lines ignored\n", static_cast<long long>(st.blank_lines));
    } else if (i->parsed()) {
      mt::data::inspect_dataset(ins, std::cout);
    } else if (m->parsed()) {
      const auto st = mt::data::merge_datasets(merge_inputs, merge_output);
      std::printf("merged %lld datasets into %s.bin / .idx: %lld documents, %lld sequences, %lld tokens (%s)\n",
                  static_cast<long long>(st.inputs), merge_output.c_str(), static_cast<long long>(st.documents),
                  static_cast<long long>(st.sequences), static_cast<long long>(st.tokens), st.dtype.c_str());
    } else if (bi->parsed()) {
      const mt::Config cfg = mt::load_config(index_config, index_overrides);
      MT_CHECK(!cfg.data.mock, "build-index: ", index_config, " trains on mock data (data.mock: true): nothing to build");
      mt::log::init(0, 1, "info");
      mt::data::build_sample_index_cache(cfg, mt::derive_config(cfg, index_world));
      std::printf("sample-index caches ready for %s on %d rank(s)\n", index_config.c_str(), index_world);
    } else if (t->parsed()) {
      auto tok = mt::data::make_tokenizer(tok_opt);
      if (decode) {
        std::vector<int32_t> ids;
        for (const std::string& s : texts) {
          try {
            ids.push_back(std::stoi(s));
          } catch (const std::exception&) {
            MT_CHECK(false, "tokenize --decode: \"", s, "\" is not a token id");
          }
        }
        std::cout << tok->decode(ids) << "\n";
      } else {
        for (const std::string& s : texts) {
          std::ostringstream os;
          for (int32_t id : tok->encode(s)) os << (os.tellp() > 0 ? " " : "") << id;
          std::cout << os.str() << "\n";
        }
      }
    }
  } catch (const mt::Error& e) {
    std::fprintf(stderr, "\nmegatrain-data: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nmegatrain-data: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
