// One verdict (issue #15): a table of layouts and configs, each run through `megatrain config
// --world-size N` and a one-iteration `megatrain train` on N ranks (CPU, tiny model, mpirun for
// N > 1). Both must accept, or both must refuse with the same one-line message.
#include <string>
#include <vector>

#include "catch.h"
#include "common/run_binary.h"
#include "core/check.h"

using mt::str_cat;
using namespace mt::test;

namespace {

// Tiny llama on mock data: 4 layers, 4 heads (2 query groups), one iteration, no evaluation.
const char* kTinyYaml = R"(model:
  num_layers: 4
  hidden_size: 32
  num_attention_heads: 4
  num_query_groups: 2
  ffn_hidden_size: 64
  vocab_size: 64
  make_vocab_size_divisible_by: 16
  seq_length: 16
training:
  train_iters: 1
  eval_iters: 0
  micro_batch_size: 1
  device: cpu
data:
  mock: true
logging:
  log_interval: 1
)";

struct Row {
  const char* name;
  int ranks;
  std::string sets;      // --set overrides
  const char* refusal;   // "" = both accept; else a part of the message both must print
};

// The message of "megatrain: error: MSG" or "megatrain: error (rank R): MSG" (first such line).
std::string error_message(const std::string& err) {
  for (const char* head : {"megatrain: error: ", "megatrain: error (rank "}) {
    const size_t at = err.find(head);
    if (at == std::string::npos) continue;
    size_t begin = at + std::string(head).size();
    if (std::string(head).back() == ' ' && std::string(head).find('(') != std::string::npos)
      begin = err.find("): ", begin) + 3;
    return err.substr(begin, err.find('\n', begin) - begin);
  }
  return "";
}

}  // namespace

TEST_CASE("verdict: config and a one-iteration train agree on every layout of the table", "[config][verdict]") {
  const fs::path yaml = temp_dir() / "verdict.yaml";
  std::ofstream(yaml) << kTinyYaml;
  const std::vector<Row> rows = {
      {"valid-1", 1, "", ""},
      {"valid-tp2-sp", 2, "parallel.tensor=2 parallel.sequence_parallel=true", ""},
      {"valid-pp2-vpp2", 2, "parallel.pipeline=2 parallel.virtual_pipeline=2 training.global_batch_size=2", ""},
      {"valid-dp2-pp1", 2, "training.global_batch_size=4", ""},
      {"world-not-divisible", 3, "parallel.tensor=2", "world size 3 is not divisible by parallel.tensor (2)"},
      {"heads-vs-tensor", 3, "parallel.tensor=3", "model.num_attention_heads (4) must be divisible by parallel.tensor (3)"},
      {"query-groups-below-tensor", 4, "parallel.tensor=4",
       "model.num_query_groups (2) must be divisible by parallel.tensor (4)"},
      {"valid-context-2", 2, "parallel.context=2", ""},
      {"context-a2a-groups", 4, "parallel.context=4 parallel.cp_comm_type=a2a",
       "parallel.cp_comm_type a2a splits each tensor rank's key/value heads over parallel.context (4)"},
      {"batch-arithmetic", 2, "training.micro_batch_size=2 training.global_batch_size=6",
       "training.global_batch_size (6) must be a multiple of training.micro_batch_size (2) x data-parallel size (2) = 4"},
      {"sequence-parallel-without-tensor", 1, "parallel.sequence_parallel=true",
       "parallel.sequence_parallel needs parallel.tensor > 1"},
      {"pipeline-split", 3, "parallel.pipeline=3", "model.num_layers (4) cannot be split evenly over parallel.pipeline (3)"},
      {"interleaved-microbatches", 2, "parallel.pipeline=2 parallel.virtual_pipeline=2 training.global_batch_size=3",
       "the interleaved pipeline schedule (parallel.virtual_pipeline 2) needs the number of micro-batches (3"},
      {"vocab-mock", 1, "model.vocab_size=1", "model.vocab_size (1) must be >= 2 with data.mock: true"},
      {"precision-on-cpu", 1, "training.precision=bf16", "training.precision is bf16 but training.device is cpu"},
      {"split-train-0", 1, "data.split=[0,1,1]", "the train share (first weight) is 0"},
      {"split-train-0-dp2", 2, "data.split=[0,0,1]", "the train share (first weight) is 0"},
#if !defined(MEGATRAIN_HAVE_CUDA)
      {"cuda-without-backend", 1, "training.device=cuda", "this megatrain was built without the CUDA backend"},
#endif
  };
  for (const Row& row : rows) {
    INFO(row.name);
    std::string sets;
    for (size_t b = 0, e; b < row.sets.size(); b = e + 1) {
      e = row.sets.find(' ', b);
      if (e == std::string::npos) e = row.sets.size();
      sets += " --set " + row.sets.substr(b, e - b);
    }
    const std::string tag = std::string("verdict-") + row.name;
    const RunResult config = run_megatrain(str_cat("config --config ", yaml.string(), " --world-size ", row.ranks, sets),
                                           tag + "-config");
    const RunResult train = run_megatrain(str_cat("train --config ", yaml.string(), sets), tag + "-train",
                                          row.ranks > 1 ? row.ranks : 0, "", 300);
    INFO("config stderr: " << config.err);
    INFO("train stderr: " << train.err);
    if (std::string(row.refusal).empty()) {
      CHECK(config.code == 0);
      CHECK(train.code == 0);
      CHECK((train.out + train.err).find("iter 1/1") != std::string::npos);
      continue;
    }
    CHECK(config.code != 0);
    CHECK(train.code != 0);
    const std::string said = error_message(config.err);
    CHECK(said.find(row.refusal) != std::string::npos);
    CHECK(said.rfind("config " + yaml.string() + ": ", 0) == 0);  // names the file
    CHECK(error_message(train.err) == said);                       // the same verdict, word for word
    CHECK((train.out + train.err).find("iter 1/") == std::string::npos);  // refused before any iteration
  }
}
