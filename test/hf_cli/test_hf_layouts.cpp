// (Its own folder: these tests start mpirun, which a process that initialized MPI, as test/hf does, cannot.)
// The binary as a user runs it: `megatrain convert import` of a transformers fixture, then training
// from it under TP2 x PP2 (mpirun, 4 ranks, another vocabulary padding) gives the single-rank
// losses; a checkpoint saved under TP1 with one padding resumes under TP2 with another and
// continues the loss curve of an uninterrupted run; imported mixtures of experts train under EP2 and TP2 x EP2
// as on one rank, and export from an EP checkpoint.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "catch.h"
#include "checkpoint/safetensors.h"
#include "common/run_binary.h"

using namespace mt::test;

namespace {
double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }
}  // namespace

TEST_CASE("imported Qwen3 fixture: TP2 x PP2 losses equal one rank's", "[hf_layouts]") {
  const std::string fixture = source_path("test/fixtures/hf/Qwen3ForCausalLM");
  if (!fs::exists(fixture + "/config.json")) {
    std::printf("SKIPPED: no fixture in %s\n", fixture.c_str());
    return;
  }
  const fs::path out = temp_dir() / "q3";
  RunResult imp = run_megatrain("convert import --hf " + fixture + " --output " + out.string(), "q3-import");
  INFO(imp.err);
  REQUIRE(imp.code == 0);
  auto train = [&](const std::string& name, int np, const std::string& extra) {
    return run_megatrain("train --config " + (out / "model.yaml").string() +
                             " --set training.train_iters=4 --set training.global_batch_size=4"
                             " --set model.seq_length=16 --set training.eval_iters=0 --set logging.log_interval=1"
                             " --set training.device=cpu --set checkpoint.dir= --set logging.metrics_file=" +
                             (temp_dir() / (name + ".jsonl")).string() + " " + extra,
                         name, np);
  };
  RunResult one = train("q3-single", 0, "");
  INFO(one.err.substr(0, 2000));
  REQUIRE(one.code == 0);
  RunResult four = train("q3-tp2pp2", 4, "--set parallel.tensor=2 --set parallel.pipeline=2");
  INFO(four.err.substr(0, 2000));
  REQUIRE(four.code == 0);
  auto a = read_metrics(temp_dir() / "q3-single.jsonl"), b = read_metrics(temp_dir() / "q3-tp2pp2.jsonl");
  REQUIRE(a.size() == 4);
  REQUIRE(b.size() == 4);
  for (auto& [it, s] : a) {
    INFO("iteration " << it << ": " << b[it].loss << " vs " << s.loss);
    CHECK(rel(b[it].loss, s.loss) < 1e-5);
  }
}

namespace {

// A mixture of experts imported, then trained 4 iterations on one rank and under each layout (EP2 = data 2 x
// expert 2; for Mixtral TP2 x EP2 with sequence parallelism, 4 ranks): the same losses and gradient norms to
// 1e-5. (The balancing loss is off: Megatron computes it over each tensor-parallel rank's rows.)
void check_moe_layouts(const std::string& arch, const std::vector<std::pair<int, std::string>>& layouts) {
  const std::string fixture = source_path("test/fixtures/hf/" + arch);
  if (!fs::exists(fixture + "/config.json")) {
    std::printf("SKIPPED: no fixture in %s\n", fixture.c_str());
    return;
  }
  const fs::path out = temp_dir() / arch;
  RunResult imp = run_megatrain("convert import --hf " + fixture + " --output " + out.string(), arch + "-import");
  INFO(imp.err);
  REQUIRE(imp.code == 0);
  auto train = [&](const std::string& name, int np, const std::string& extra) {
    return run_megatrain("train --config " + (out / "model.yaml").string() +
                             " --set training.train_iters=4 --set training.global_batch_size=4 --set optimizer.lr=1e-3"
                             " --set model.moe_aux_loss_coeff=0 --set model.seq_length=16 --set training.eval_iters=0"
                             " --set logging.log_interval=1 --set training.device=cpu --set checkpoint.dir="
                             " --set logging.metrics_file=" + (temp_dir() / (name + ".jsonl")).string() + " " + extra,
                         name, np);
  };
  RunResult one = train(arch + "-single", 0, "");
  INFO(one.err.substr(0, 2000));
  REQUIRE(one.code == 0);
  auto a = read_metrics(temp_dir() / (arch + "-single.jsonl"));
  REQUIRE(a.size() == 4);
  for (auto& [it, s] : a) CHECK(s.grad_norm > 0);  // lr 1e-3: the weights move
  for (size_t i = 0; i < layouts.size(); ++i) {
    const std::string name = arch + "-layout" + std::to_string(i);
    RunResult r = train(name, layouts[i].first, layouts[i].second);
    INFO(layouts[i].second << ": " << r.err.substr(0, 2000));
    REQUIRE(r.code == 0);
    auto b = read_metrics(temp_dir() / (name + ".jsonl"));
    REQUIRE(b.size() == 4);
    for (auto& [it, s] : a) {
      INFO(layouts[i].second << " iteration " << it << ": loss " << b[it].loss << " vs " << s.loss << ", grad norm "
                             << b[it].grad_norm << " vs " << s.grad_norm);
      CHECK(rel(b[it].loss, s.loss) < 1e-5);
      CHECK(rel(b[it].grad_norm, s.grad_norm) < 1e-5);
    }
  }
}

}  // namespace

TEST_CASE("imported Mixtral fixture: EP2 and TP2 x EP2 (SP) losses equal one rank's", "[hf_layouts]") {
  check_moe_layouts("MixtralForCausalLM",
                    {{2, "--set parallel.expert=2"},
                     {4, "--set parallel.tensor=2 --set parallel.sequence_parallel=true --set parallel.expert=2"}});
}

TEST_CASE("imported Qwen3-MoE fixture (a dense layer between MoE layers): EP2 losses equal one rank's", "[hf_layouts]") {
  check_moe_layouts("Qwen3MoeForCausalLM", {{2, "--set parallel.expert=2"}});
}

// Export from a checkpoint saved under TP2 x EP2 (each rank holds half the experts and a slice of the rest): one
// iteration at lr 0 changes nothing, so every tensor comes back as transformers saved it.
TEST_CASE("imported Mixtral saved under TP2 x EP2 exports every tensor bit for bit", "[hf_layouts]") {
  const std::string fixture = source_path("test/fixtures/hf/MixtralForCausalLM");
  if (!fs::exists(fixture + "/config.json")) {
    std::printf("SKIPPED: no fixture in %s\n", fixture.c_str());
    return;
  }
  const fs::path in = temp_dir() / "mixtral-in", ck = temp_dir() / "mixtral-ep-ckpt", exp = temp_dir() / "mixtral-ep-exp";
  REQUIRE(run_megatrain("convert import --hf " + fixture + " --output " + in.string(), "mixtral-ep-import").code == 0);
  RunResult r = run_megatrain("train --config " + (in / "model.yaml").string() +
                                  " --set training.train_iters=1 --set training.global_batch_size=4 --set optimizer.lr=0"
                                  " --set optimizer.min_lr=0 --set model.seq_length=16 --set training.eval_iters=0"
                                  " --set training.device=cpu --set checkpoint.save_interval=1 --set checkpoint.dir=" +
                                  ck.string() + " --set parallel.tensor=2 --set parallel.sequence_parallel=true"
                                  " --set parallel.expert=2",
                              "mixtral-ep-save", 4);
  INFO(r.err.substr(0, 2000));
  REQUIRE(r.code == 0);
  RunResult e = run_megatrain("convert export --checkpoint " + ck.string() + " --output " + exp.string() +
                                  " --hf-config " + (in / "hf" / "config.json").string(),
                              "mixtral-ep-export");
  INFO(e.err);
  REQUIRE(e.code == 0);
  mt::st::Archive want(fixture), got(exp.string());
  CHECK(got.entries().size() == want.entries().size());
  for (const auto& [name, t] : want.entries()) {
    INFO(name);
    const mt::st::Archive::Entry* f = got.find(name);
    REQUIRE(f != nullptr);
    REQUIRE(f->info->shape == t.info->shape);
    CHECK(std::memcmp(f->file->data(*f->info), t.file->data(*t.info), t.info->end - t.info->begin) == 0);
  }
  CHECK(nlohmann::json::parse(std::ifstream(exp / "config.json")) ==
        nlohmann::json::parse(std::ifstream(fixture + "/config.json")));
}

TEST_CASE("a TP1 checkpoint resumes under TP2 with another vocabulary padding", "[hf_layouts]") {
  // vocab 120, divisible by 48: padded 144 on one rank, 192 under tensor 2.
  auto run = [&](const std::string& name, const std::string& dir, int np, const std::string& extra) {
    return run_megatrain("train --config " + source_path("configs/ci/tiny-llama.yaml") +
                             " --set model.vocab_size=120 --set model.make_vocab_size_divisible_by=48"
                             " --set training.train_iters=12 --set training.eval_iters=0 --set logging.log_interval=1"
                             " --set checkpoint.save_interval=6 --set checkpoint.dir=" + (temp_dir() / dir).string() +
                             " --set logging.metrics_file=" + (temp_dir() / (name + ".jsonl")).string() + " " + extra,
                         name, np);
  };
  REQUIRE(run("pad-straight", "pad-straight", 0, "").code == 0);
  REQUIRE(run("pad-first", "pad-resumed", 0, "--set training.exit_interval=6").code == 0);
  REQUIRE(fs::exists(temp_dir() / "pad-resumed" / "iter_0000006" / "DONE"));
  RunResult second = run("pad-second", "pad-resumed", 2, "--set parallel.tensor=2");
  INFO(second.err.substr(0, 2000));
  REQUIRE(second.code == 0);
  auto a = read_metrics(temp_dir() / "pad-straight.jsonl"), b = read_metrics(temp_dir() / "pad-second.jsonl");
  REQUIRE(a.size() == 12);
  REQUIRE(b.size() == 6);  // iterations 7..12
  for (auto& [it, s] : b) {
    INFO("iteration " << it << ": " << s.loss << " vs " << a[it].loss);
    CHECK(rel(s.loss, a[it].loss) < 1e-5);
  }
}
