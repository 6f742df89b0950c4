// Mixture-of-experts training in every layout of the CPU backend against the single-rank run of the same config
// and seed (through mpirun, ranks oversubscribed): per-iteration loss and gradient norm over 10 iterations agree to
// 1e-5 relative, and so do the routing metrics (tokens per expert are counts: equal). Two configs: 8 experts top-2
// softmax routing with the aux and z losses (configs/ci/moe-tiny-8x-top2.yaml), and a DeepSeek-style one with a
// shared expert, sigmoid routing and the expert bias, its first layer dense (configs/ci/moe-tiny-shared-sigmoid.yaml);
// plus 64 experts top-1 on 32-token micro-batches, where at least half the experts get no token in every
// micro-batch (and an expert-parallel rank may get none). A checkpoint saved under EP4 (distributed optimizer)
// resumes under EP2, EP1 and EP2 x expert-data 2 and continues the uninterrupted loss curve.
// TP2 (sequence parallel) x EP2: each TP rank routes its own rows; the aux loss counts the micro-batch's tokens
// per expert over both (as one rank does) and the z-loss is the mean over both. With training.recompute_norm_act false
// (the experts' permuted input kept for the backward) EP4 matches the single-rank run that permutes again.
// model.moe_router_force_load_balancing (random router logits keyed by the tokens' global rows): EP2, TP2 (SP) x EP2,
// EP2 x DP2 with the distributed optimizer, PP2 x EP2 and EP2 under full recompute match one rank.
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "catch.h"
#include "common/layout_parity.h"

using namespace mt::test;

namespace {

// global batch 8 = 4 micro-batches of 2 sequences; np 4 = data 4 (EP4), data 4 = expert 2 x expert-data 2, ...
const Layout kLayouts[] = {
    {"ep2", 2, "--set parallel.expert=2"},
    {"ep4", 4, "--set parallel.expert=4"},
    // several buckets per region, cut across parameters; the distributed optimizer shards the expert region
    // over expert data parallel (2) and the rest over data parallel (4)
    {"ep2-dp2-distopt", 4,
     "--set parallel.expert=2 --set parallel.distributed_optimizer=true --set parallel.grad_bucket_size=20000"},
    {"pp2-ep2", 4, "--set parallel.pipeline=2 --set parallel.expert=2"},
};
// full recompute (the MoE forward, its exchange included, runs again before backward): the second config only
const Layout kRecompute = {"ep2-recompute", 2, "--set parallel.expert=2 --set training.recompute=full"};
const Layout kTensor = {"tp2sp-ep2", 4, "--set parallel.tensor=2 --set parallel.sequence_parallel=true --set parallel.expert=2"};

struct MoEStep {
  double loss = 0, grad_norm = 0, load = 0;
  int64_t dropped = 0;
  std::vector<double> tokens_mean, aux, z;  // per MoE layer
};

std::map<int64_t, MoEStep> read_moe_metrics(const fs::path& file) {
  std::map<int64_t, MoEStep> m;
  std::ifstream f(file);
  std::string line;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    MoEStep s;
    s.loss = j["loss"].get<double>();
    s.grad_norm = j["grad_norm"].get<double>();
    REQUIRE(j.contains("moe_load_max_mean"));
    s.load = j["moe_load_max_mean"].get<double>();
    s.dropped = j["moe_dropped"].get<int64_t>();
    for (const auto& l : j["moe_layers"]) {
      s.tokens_mean.push_back(l["tokens_mean"].get<double>());
      s.aux.push_back(l["aux_loss"].get<double>());
      s.z.push_back(l["z_loss"].get<double>());
    }
    m[j["iteration"].get<int64_t>()] = s;
  }
  return m;
}

// Runs the single-rank reference and each layout; `slots`: routed slots per MoE layer and iteration (tokens of the
// global batch x topk), which the dropless metrics must account for exactly (0: a capacity drops some).
void check_layouts(const std::string& config, const std::string& model_args, const std::string& tag,
                   const std::vector<Layout>& layouts, int64_t experts, double slots) {
  RunResult ref = run_megatrain(parity_train_args(config, tag + "-single", model_args), tag + "-single");
  INFO(ref.err.substr(0, 2000));
  REQUIRE(ref.code == 0);
  auto single = read_moe_metrics(temp_dir() / (tag + "-single.jsonl"));
  REQUIRE(single.size() == 10);
  for (auto& [it, s] : single) {
    REQUIRE(!s.tokens_mean.empty());
    for (double t : s.tokens_mean)
      if (slots > 0) CHECK(t * static_cast<double>(experts) == slots);  // every slot routed once (dropless)
    if (slots > 0) CHECK(s.dropped == 0);
  }
  for (const Layout& l : layouts) {
    const std::string name = tag + "-" + l.name;
    RunResult r = run_megatrain(parity_train_args(config, name, model_args + " " + l.args), name, l.np);
    INFO(name << " (" << l.np << " ranks)\n" << r.err.substr(0, 2000));
    REQUIRE(r.code == 0);
    auto m = read_moe_metrics(temp_dir() / (name + ".jsonl"));
    REQUIRE(m.size() == 10);
    for (auto& [it, s] : single) {
      INFO("iteration " << it << ": loss " << m[it].loss << " vs " << s.loss << ", grad norm " << m[it].grad_norm
                        << " vs " << s.grad_norm << ", load " << m[it].load << " vs " << s.load);
      CHECK(rel(m[it].loss, s.loss) < 1e-5);
      CHECK(rel(m[it].grad_norm, s.grad_norm) < 1e-5);
      CHECK(m[it].load == s.load);
      CHECK(m[it].dropped == s.dropped);
      CHECK(m[it].tokens_mean == s.tokens_mean);
      REQUIRE(m[it].aux.size() == s.aux.size());
      for (size_t i = 0; i < s.aux.size(); ++i) {  // the layers' loss values (read from the device once per step)
        INFO("MoE layer " << i << ": aux " << m[it].aux[i] << " vs " << s.aux[i] << ", z " << m[it].z[i] << " vs "
                          << s.z[i]);
        CHECK(rel(m[it].aux[i], s.aux[i]) < 1e-5);
        CHECK(rel(m[it].z[i], s.z[i]) < 1e-5);
      }
    }
  }
}

const double kSlots = 8 * 32 * 2;  // global batch 8 x seq 32 x top-2

}  // namespace

TEST_CASE("moe 8x top-2 (aux + z loss): every layout matches the single-rank run", "[moe][parity]") {
  const std::string cfg = "configs/ci/moe-tiny-8x-top2.yaml";
  std::vector<Layout> layouts(std::begin(kLayouts), std::end(kLayouts));
  layouts.push_back(kTensor);
  check_layouts(cfg, "", "moe8", layouts, 8, kSlots);
  // each layer's losses where the routers start (logits near 0): aux = coeff E sum_e f_e P_e near coeff 0.01, z =
  // coeff mean(logsumexp^2) near 0.001 ln(8)^2 = 0.0043; their ranges are disjoint, so a swap or a lost value fails
  const MoEStep first = read_moe_metrics(temp_dir() / "moe8-single.jsonl").at(1);
  REQUIRE(first.aux.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    INFO("MoE layer " << i << ": aux " << first.aux[i] << ", z " << first.z[i]);
    CHECK(first.aux[i] > 0.008);
    CHECK(first.aux[i] < 0.015);
    CHECK(first.z[i] > 0.8 * 0.001 * std::log(8.0) * std::log(8.0));
    CHECK(first.z[i] < 1.25 * 0.001 * std::log(8.0) * std::log(8.0));
  }
  // a capacity: each rank drops its own micro-batch's slots over ceil(32 x 2 x 2 / 8 x 1.0) per expert
  check_layouts(cfg, "--set model.moe_expert_capacity_factor=1.0", "moe8-capacity",
                {{"ep2", 2, "--set parallel.expert=2"}}, 8, 0);
  auto cap = read_moe_metrics(temp_dir() / "moe8-capacity-single.jsonl");
  int64_t dropped = 0;
  for (auto& [it, s] : cap) dropped += s.dropped;
  CHECK(dropped > 0);  // the capacity bites
}

TEST_CASE("moe shared expert + sigmoid + expert bias: every layout matches the single-rank run", "[moe][parity]") {
  const std::string cfg = "configs/ci/moe-tiny-shared-sigmoid.yaml";
  std::vector<Layout> layouts(std::begin(kLayouts), std::end(kLayouts));
  layouts.push_back(kTensor);
  layouts.push_back(kRecompute);
  check_layouts(cfg, "", "moeds", layouts, 8, kSlots);
  check_layouts(cfg, "--set model.moe_expert_capacity_factor=1.0", "moeds-capacity",
                {{"ep2", 2, "--set parallel.expert=2"}}, 8, 0);
}

TEST_CASE("moe experts and ranks without tokens: 64 experts top-1 on 32-token micro-batches", "[moe][parity]") {
  // 32 slots per micro-batch for 64 experts: at least 32 experts idle in each.
  check_layouts("configs/ci/moe-tiny-8x-top2.yaml",
                "--set model.num_experts=64 --set model.moe_router_topk=1 --set training.micro_batch_size=1 "
                "--set model.moe_ffn_hidden_size=8",
                "moe64",
                {{"ep4-distopt", 4, "--set parallel.expert=4 --set parallel.distributed_optimizer=true"},
                 // the experts' permuted input kept for the backward (none on a rank without tokens) instead of
                 // permuted again: the same numbers
                 {"ep4-keep-input", 4, "--set parallel.expert=4 --set training.recompute_norm_act=false"}},
                64, 8 * 32);
}

TEST_CASE("moe forced balanced routing (random logits): EP2, TP2 (SP) x EP2, EP2 x DP2, PP2 x EP2 and full recompute "
          "match one rank", "[moe][parity][force_balance]") {
  // the random logits are keyed by the tokens' global rows: each layout routes every token as one rank does, and a
  // recomputed forward as the first
  const std::string forced = "--set model.moe_router_force_load_balancing=true";
  check_layouts("configs/ci/moe-tiny-8x-top2.yaml", forced, "moe8-forced",
                {kLayouts[0], kTensor, kLayouts[2], kLayouts[3], kRecompute}, 8, kSlots);
  // the load over 8 experts (64 slots each on average, per layer and step) is near even from the first step
  for (auto& [it, s] : read_moe_metrics(temp_dir() / "moe8-forced-single.jsonl")) {
    INFO("iteration " << it);
    CHECK(s.load < 1.5);
  }
}

TEST_CASE("moe checkpoint saved under EP4 resumes under EP2, EP1 and EP2 x expert-data 2", "[moe][resume]") {
  const std::string cfg = "configs/ci/moe-tiny-shared-sigmoid.yaml";
  const std::string common = " --set parallel.distributed_optimizer=true";
  const fs::path ck = temp_dir() / "moe-ck-ep4";
  RunResult straight = run_megatrain(parity_train_args(cfg, "moe-straight", common + " --set parallel.expert=4"), "moe-straight", 4);
  REQUIRE(straight.code == 0);
  RunResult saved = run_megatrain(parity_train_args(cfg, "moe-saved", common + " --set parallel.expert=4 --set training.exit_interval=5"
                                                                  " --set checkpoint.dir=" + ck.string()),
                                  "moe-saved", 4);
  REQUIRE(saved.code == 0);
  REQUIRE(fs::exists(ck / "iter_0000005" / "DONE"));
  auto a = read_moe_metrics(temp_dir() / "moe-straight.jsonl");
  REQUIRE(a.size() == 10);
  const Layout resumes[] = {{"ep2", 2, "--set parallel.expert=2"},
                            {"ep1", 1, "--set parallel.expert=1"},
                            {"ep2-edp2", 4, "--set parallel.expert=2"}};
  for (const Layout& l : resumes) {
    const std::string name = std::string("moe-resumed-") + l.name;
    RunResult r = run_megatrain(parity_train_args(cfg, name, common + " " + l.args + " --set checkpoint.load=" + ck.string() +
                                                    " --set checkpoint.dir=" + (temp_dir() / name).string()),
                                name, l.np);
    INFO(name << "\n" << r.err.substr(0, 2000));
    REQUIRE(r.code == 0);
    auto b = read_moe_metrics(temp_dir() / (name + ".jsonl"));
    REQUIRE(b.size() == 5);  // iterations 6..10
    for (auto& [it, s] : b) {
      INFO("iteration " << it << ": loss " << s.loss << " vs " << a[it].loss);
      CHECK(it > 5);
      CHECK(rel(s.loss, a[it].loss) < 1e-5);
      CHECK(rel(s.grad_norm, a[it].grad_norm) < 1e-5);
    }
  }
}
