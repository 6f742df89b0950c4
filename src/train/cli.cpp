#include "train/cli.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "config/config_loader.h"
#include "config/model_features.h"
#include "core/edit_distance.h"
#include "core/log.h"
#include "runtime/mpi_communicator.h"
#include "train/convert.h"
#include "train/plan.h"
#include "train/preflight.h"
#include "train/generate.h"
#include "train/trainer.h"

namespace mt {

namespace {


// The first word, when it is not an option, must be a subcommand: `megatrain trian` names the word
// and the closest subcommand instead of CLI11's generic message.
void check_subcommand_word(CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return;
  const std::string word = argv[1];
  std::string closest, names;
  size_t best = std::string::npos;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name() == word) return;
    names += (names.empty() ? "" : ", ") + sub->get_name();
    const size_t dist = edit_distance(word, sub->get_name());
    if (dist < best) best = dist, closest = sub->get_name();
  }
  const bool near = best <= std::max<size_t>(2, closest.size() / 3);
  MT_CHECK(false, "unknown command '", word, "'", near ? "; did you mean '" + closest + "'?" : std::string(),
           " (commands: ", names, "; megatrain --help lists them)");
}

}  // namespace

int run_cli(int argc, char** argv) {
  CLI::App app{"megatrain: native trainer for GPT/Llama-style transformers (CPU and CUDA, MPI + NCCL)"};
  app.set_version_flag("--version", std::string("megatrain ") + MEGATRAIN_VERSION);
  app.require_subcommand(1);

  std::string config_path;
  std::vector<std::string> overrides;

  CLI::App* train = app.add_subcommand("train", "Train a model as a YAML config describes");
  train->add_option("--config,-c", config_path, "YAML config file (see configs/ and the README's reference)")
      ->required()
      ->check(CLI::ExistingFile);
  train->add_option("--set", overrides, "Override a config key: --set training.train_iters=20 (repeatable)");

  CLI::App* config = app.add_subcommand("config", "Validate a config and print it resolved, or print the key reference");
  bool reference = false;
  int world_size = 1;
  config->add_option("--config,-c", config_path, "YAML config file")->check(CLI::ExistingFile);
  config->add_option("--set", overrides, "Override a config key (repeatable)");
  config->add_option("--world-size", world_size,
                     "Check the layout for this many ranks (default: 1, or the smallest world size the layout fits)")
      ->check(CLI::PositiveNumber);
  config->add_flag("--reference", reference, "Print every config key with its type, default and meaning (markdown)");

  CLI::App* plan = app.add_subcommand("plan", "Check a parallel layout and estimate per-rank memory, FLOPs and the "
                                       "pipeline schedule, without allocating");
  int plan_world_size = 1;
  plan->add_option("--config,-c", config_path, "YAML config file")->required()->check(CLI::ExistingFile);
  plan->add_option("--world-size,--gpus,-n", plan_world_size, "Number of ranks (GPUs) to plan for")
      ->required()
      ->check(CLI::PositiveNumber);
  plan->add_option("--set", overrides, "Override a config key: --set parallel.tensor=2 (repeatable)");

  CLI::App* gen = app.add_subcommand("generate", "Sample text from a checkpoint");
  GenerateOptions g;
  gen->add_option("--checkpoint", g.checkpoint, "Checkpoint directory, or a checkpoint.dir holding 'latest'")->required();
  gen->add_option("--prompt", g.prompt, "Text to continue")->required();
  gen->add_option("--max-new-tokens", g.max_new_tokens, "Tokens to generate (default 100)");
  gen->add_option("--temperature", g.temperature, "Softmax temperature; 0 = greedy (default 0.8)");
  gen->add_option("--top-k", g.top_k, "Sample among the k most likely tokens; 0 = all (default 40)");
  gen->add_option("--seed", g.seed, "Sampling seed (default 1234)");
  gen->add_option("--tokenizer-type", g.tokenizer_type, "Override the config's data.tokenizer_type (gpt2-bpe | hf-json)");
  gen->add_option("--vocab-file", g.vocab_file, "gpt2-bpe: encoder.json");
  gen->add_option("--merge-file", g.merge_file, "gpt2-bpe: vocab.bpe");
  gen->add_option("--tokenizer-file", g.tokenizer_file, "hf-json: tokenizer.json");

  CLI::App* convert = app.add_subcommand("convert", "Convert models between Hugging Face and megatrain checkpoints");
  convert->require_subcommand(1);
  CLI::App* cimport = convert->add_subcommand("import", "Hugging Face model folder (config.json + safetensors) -> "
                                                        "a checkpoint folder with model.yaml");
  ImportOptions imp;
  cimport->add_option("--hf", imp.hf_dir, "Folder save_pretrained wrote (config.json, model.safetensors[.index.json])")
      ->required();
  cimport->add_option("--output,-o", imp.output, "Folder to create: checkpoint + model.yaml + hf/ side files")->required();
  CLI::App* cexport = convert->add_subcommand("export", "Checkpoint (any layout) -> Hugging Face model folder");
  ExportOptions exp;
  cexport->add_option("--checkpoint", exp.checkpoint, "Checkpoint directory, or a checkpoint.dir holding 'latest'")
      ->required();
  cexport->add_option("--output,-o", exp.output, "Folder to create")->required();
  cexport->add_option("--dtype", exp.dtype, "bf16 | fp16 | fp32 (default: the checkpoint's training.precision)");
  cexport->add_option("--max-shard-size", exp.max_shard_size, "Shard the weights above this size (default 5GB)");
  cexport->add_option("--hf-config", exp.hf_config, "config.json to start from (default: the one the import left)");

  CLI::App* ckpt_cmd = app.add_subcommand("checkpoint", "Checkpoint tools");
  ckpt_cmd->require_subcommand(1);
  CLI::App* inspect = ckpt_cmd->add_subcommand("inspect", "Print a checkpoint's tensors, layout, iteration and config");
  std::string inspect_path;
  inspect->add_option("CHECKPOINT", inspect_path, "Checkpoint directory, or a checkpoint.dir holding 'latest'")->required();

  check_subcommand_word(app, argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  if (*train) {
    install_stop_signal_handlers();  // first: a signal during start-up is handled too
    Config cfg = load_config(config_path, overrides);
    log::init(mpi_world_rank(), mpi_world_size(), cfg.logging.level);
    run_training(cfg);
    return 0;
  }
  if (*plan) {
    Config cfg = load_config(config_path, overrides);
    const PlanReport r = make_plan(cfg, plan_world_size);
    std::cout << format_plan(r);
    int ranks_on_host = 1;
    const MemoryBudget budget = plan_memory_budget(derive_config(cfg, plan_world_size), plan_world_size, &ranks_on_host);
    const std::string memory = memory_warning(plan_peak_bytes_per_rank(r), ranks_on_host, budget);
    if (!memory.empty()) std::cout << "\nwarning: " << memory << "\n";
    const std::string ckpt = checkpoint_dir_problem(cfg.checkpoint.dir);
    if (!ckpt.empty())
      std::cout << "\nwarning: checkpoint.dir '" << cfg.checkpoint.dir << "' cannot be created here: " << ckpt
                << "; megatrain train refuses it\n";
    return 0;
  }
  if (*gen) {
    log::init(mpi_world_rank(), mpi_world_size(), "warn");
    // greedy decoding draws nothing: a sampling flag beside --temperature 0 is refused, not ignored
    for (const char* flag : {"--top-k", "--seed"})
      MT_CHECK(g.temperature != 0 || gen->count(flag) == 0, "generate: ", flag, " is given but --temperature 0 is "
               "greedy (always the most likely token, no sampling); remove ", flag, " or give a temperature > 0");
    run_generate(g);
    return 0;
  }
  if (*cimport) {
    log::init(mpi_world_rank(), mpi_world_size(), "warn");
    std::unique_ptr<Communicator> world = make_world_communicator();
    for (const std::string& note : convert_import(imp, *world)) std::cerr << "note: " << note << "\n";
    std::cout << "imported " << imp.hf_dir << " into " << imp.output << " (config: " << imp.output << "/model.yaml)\n";
    return 0;
  }
  if (*cexport) {
    log::init(mpi_world_rank(), mpi_world_size(), "warn");
    convert_export(exp);
    std::cout << "exported " << exp.checkpoint << " to " << exp.output << "\n";
    return 0;
  }
  if (*inspect) {
    log::init(mpi_world_rank(), mpi_world_size(), "warn");
    checkpoint_inspect(inspect_path, std::cout);
    return 0;
  }
  if (*config) {
    if (reference) {  // the key reference reads no config: a config given beside it is refused, not ignored
      for (const char* flag : {"--config", "--set", "--world-size"})
        MT_CHECK(config->count(flag) == 0, "megatrain config: --reference prints the key reference and reads no "
                 "config; remove ", flag, " (or --reference, to check the config)");
      std::cout << config_reference_markdown();
      return 0;
    }
    MT_CHECK(!config_path.empty(), "megatrain config: give --config FILE (or --reference)");
    Config cfg = load_config(config_path, overrides);
    if (config->count("--world-size") == 0) {  // a multi-rank layout (configs/plan/) is checked where it fits
      world_size = smallest_world_size(cfg);
      if (world_size > 1)
        std::cerr << "megatrain config: note: the layout does not fit one rank; checked for " << world_size
                  << " ranks, the smallest world size it fits (--world-size N checks another)\n";
    }
    DerivedConfig d = derive_config(cfg, world_size);
    std::cout << config_to_yaml(cfg);
    std::cout << "# derived for " << world_size << " rank(s): data_parallel_size " << d.data_parallel_size
              << ", num_microbatches " << d.num_microbatches << ", padded_vocab_size " << d.padded_vocab_size
              << ", tokens_per_iteration " << d.tokens_per_iteration << "\n";
    const std::string ckpt = checkpoint_dir_problem(cfg.checkpoint.dir);  // checked by train at start, on its nodes
    if (!ckpt.empty())
      std::cerr << "megatrain config: warning: checkpoint.dir '" << cfg.checkpoint.dir << "' cannot be created here: "
                << ckpt << "; megatrain train refuses it\n";
    std::cout << "# resolved model features (model.arch " << cfg.model.arch << " fills the keys left null):\n";
    std::istringstream features(describe_model_features(cfg, d.features));
    for (std::string line; std::getline(features, line);) std::cout << "#   " << line << "\n";
    return 0;
  }
  return 0;
}

}  // namespace mt
