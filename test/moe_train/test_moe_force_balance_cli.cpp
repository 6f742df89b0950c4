// A checkpoint trained with model.moe_router_force_load_balancing (random routing, a benchmark key): `megatrain
// generate` and `convert export` say how their routing relates to that run's (generate routes by the random logits,
// as the run did; the exported model by its router weights, which the run did not route by), and the startup
// warning names the key. Nothing is refused: the weights are the run's.
#include <string>

#include "catch.h"
#include "common/run_binary.h"

using namespace mt::test;

TEST_CASE("forced-balance checkpoint: train warns, export and generate note the routing", "[moe][force_balance]") {
  const fs::path d = temp_dir() / "force-balance-cli";
  fs::remove_all(d);
  RunResult t = run_megatrain("train --config " + source_path("configs/ci/moe-tiny-8x-top2.yaml") +
                                  " --set training.train_iters=2 --set training.eval_iters=0 --set checkpoint.dir=" +
                                  (d / "ck").string() + " --set checkpoint.save_interval=2" +
                                  " --set model.moe_router_force_load_balancing=true",
                              "force-balance-train");
  INFO(t.err.substr(0, 2000));
  REQUIRE(t.code == 0);
  CHECK((t.out + t.err).find("model.moe_router_force_load_balancing: the MoE routing is forced balanced") !=
        std::string::npos);
  RunResult e = run_megatrain("convert export --checkpoint " + (d / "ck").string() + " --output " +
                                  (d / "hf").string(), "force-balance-export");
  INFO(e.err.substr(0, 2000));
  REQUIRE(e.code == 0);
  CHECK(e.err.find("the exported model routes by its router weights") != std::string::npos);
  // generate stops at the missing tokenizer (the tiny config names none), after the note
  RunResult g = run_megatrain("generate --checkpoint " + (d / "ck").string() + " --prompt a", "force-balance-gen");
  CHECK(g.err.find("its MoE layers route by random logits here too") != std::string::npos);
}
