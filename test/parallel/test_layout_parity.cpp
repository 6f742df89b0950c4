// Every parallel layout of the CPU backend against the single-rank run of the same config and
// seed (through mpirun, ranks oversubscribed): per-iteration loss and gradient norm over 10
// iterations agree to 1e-5 relative, for a GPT-2-style (tied embeddings, learned positions,
// dropout) and a Llama-style (grouped-query attention) config, and (TP2+SP x PP2 x DP2 only) a
// Qwen-style config with the model features qk_layernorm, kv_channels != hidden/heads, add_qkv_bias and
// rope_scaling. A resumed 8-rank run matches an
// uninterrupted one bit for bit. Invalid layouts are refused before anything is allocated.
#include <cmath>
#include <iterator>
#include <string>
#include <vector>

#include "catch.h"
#include "common/layout_parity.h"

using namespace mt::test;

namespace {

const Layout kLayouts[] = {
    {"tp2", 2, "--set parallel.tensor=2"},
    {"tp2-sp", 2, "--set parallel.tensor=2 --set parallel.sequence_parallel=true"},
    // ... with the norm and SwiGLU outputs kept (training.recompute_norm_act false) as well.
    {"tp2-sp-overlap-kept", 2,
     "--set parallel.tensor=2 --set parallel.sequence_parallel=true --set parallel.tp_comm_overlap=true "
     "--set training.recompute_norm_act=false"},
    {"tp2-overlap", 2, "--set parallel.tensor=2 --set parallel.tp_comm_overlap=true"},
    {"pp2", 2, "--set parallel.pipeline=2"},
    {"pp4-vp2", 4, "--set parallel.pipeline=4 --set parallel.virtual_pipeline=2"},
    // An uneven split, stated in the config: 1 + 2 + 2 + 3 layers.
    {"pp4-uneven", 4,
     "--set parallel.pipeline=4 --set parallel.decoder_first_pipeline_num_layers=1 "
     "--set parallel.decoder_last_pipeline_num_layers=3"},
    {"dp2", 2, ""},
    // Small DP buckets (the models have ~270K parameters): several buckets, cut across parameters,
    // reduced during backward; the distributed optimizer owns a chunk of each.
    {"dp2-distopt-buckets", 2, "--set parallel.distributed_optimizer=true --set parallel.grad_bucket_size=30000"},
    {"tp2-pp2-dp2-buckets", 8, "--set parallel.tensor=2 --set parallel.pipeline=2 --set parallel.grad_bucket_size=25000"},
    {"tp2sp-pp2vp2-dp2distopt-recompute", 8,
     "--set parallel.tensor=2 --set parallel.sequence_parallel=true --set parallel.pipeline=2 "
     "--set parallel.virtual_pipeline=2 --set parallel.distributed_optimizer=true --set training.recompute=full "
     "--set parallel.grad_bucket_size=20000"},
};

// 8 layers so that PP4 x VP2 has a layer per virtual stage; global batch 8 = 4 micro-batches of 2.
void check_layouts(const std::string& config, const std::string& model_args, const std::string& tag,
                   const std::vector<Layout>& layouts = std::vector<Layout>(std::begin(kLayouts), std::end(kLayouts))) {
  check_layouts_match_single(config, "--set model.num_layers=8 " + model_args, tag, layouts);
}

}  // namespace

TEST_CASE("llama GQA: every layout matches the single-rank run", "[parallel][parity]") {
  check_layouts("configs/ci/tiny-llama.yaml", "", "llama");
}

TEST_CASE("gpt2 with dropout: every layout matches the single-rank run", "[parallel][parity]") {
  check_layouts("configs/ci/tiny-gpt2.yaml", "--set model.dropout=0.1", "gpt2");
}

TEST_CASE("qk_layernorm + kv_channels + add_qkv_bias + rope_scaling: TP2+SP x PP2 x DP2 matches one rank",
          "[parallel][parity][features]") {
  // 4 layers are enough for PP2; kv_channels 24 with 4 heads of a 64-wide model.
  check_layouts("configs/ci/qwen3-tiny.yaml",
                "--set model.num_layers=4 --set model.add_qkv_bias=true --set model.rope_scaling=true "
                "--set model.rope_scaling_factor=4.0 --set model.rope_scaling_original_max_position_embeddings=64",
                "qwen3", {{"tp2sp-pp2-dp2", 8, "--set parallel.tensor=2 --set parallel.sequence_parallel=true "
                                               "--set parallel.pipeline=2"}});
}

TEST_CASE("a resumed 8-rank run matches an uninterrupted one bit for bit", "[parallel][resume]") {
  const std::string layout =
      "--set parallel.tensor=2 --set parallel.sequence_parallel=true --set parallel.pipeline=2 "
      "--set parallel.virtual_pipeline=2 --set parallel.distributed_optimizer=true --set model.num_layers=4 "
      "--set training.train_iters=12 --set logging.log_interval=1 --set training.eval_iters=0";
  auto run = [&](const std::string& name, const std::string& extra) {
    return run_megatrain("train --config " + source_path("configs/ci/tiny-gpt2.yaml") + " " + layout +
                             " --set checkpoint.dir=" + (temp_dir() / name).string() + " --set logging.metrics_file=" +
                             (temp_dir() / (name + ".jsonl")).string() + " " + extra,
                         name, 8);
  };
  REQUIRE(run("straight", "").code == 0);
  REQUIRE(run("resumed", "--set training.exit_interval=6").code == 0);
  REQUIRE(fs::exists(temp_dir() / "resumed" / "iter_0000006" / "DONE"));
  REQUIRE(run("resumed", "").code == 0);
  auto a = read_metrics(temp_dir() / "straight.jsonl"), b = read_metrics(temp_dir() / "resumed.jsonl");
  REQUIRE(a.size() == 12);
  REQUIRE(b.size() == 12);
  for (auto& [it, s] : a) {
    INFO("iteration " << it);
    CHECK(b[it] == s);
  }
}

TEST_CASE("impossible layouts are refused before anything is allocated, saying what to change", "[parallel][errors]") {
  struct Bad {
    int np;
    const char* args;
    const char* expect;
  } bad[] = {
      {4, "--set model.num_layers=30 --set parallel.pipeline=4", "decoder_first_pipeline_num_layers"},
      {4, "--set parallel.tensor=4 --set model.num_attention_heads=6 --set model.num_query_groups=6 "
          "--set model.hidden_size=48",
       "num_attention_heads (6) must be divisible by parallel.tensor (4)"},
      {3, "", "global_batch_size"},
  };
  for (const Bad& b : bad) {
    RunResult r = run_megatrain("train --config " + source_path("configs/ci/tiny-llama.yaml") +
                                    " --set checkpoint.dir= " + b.args,
                                "bad", b.np);
    INFO(b.args << "\n" << r.err);
    CHECK(r.code != 0);
    CHECK(r.err.find(b.expect) != std::string::npos);
    CHECK(r.out.find("parameters on rank") == std::string::npos);  // refused before building the model
  }
}
