// `megatrain plan` under context parallelism: a rank's activations are those of its T / context tokens (the same as a
// context-1 run at seq_length / context), the optimizer state shards over data x context with the distributed
// optimizer, and the bytes each rank sends per layer follow the ring's and the all-to-all's schedules
// (parallel/context_parallel.h) for llama-1b's shape.
#include <string>

#include "catch.h"
#include "common/run_binary.h"
#include "config/config_loader.h"
#include "train/plan.h"

using namespace mt;

namespace {
Config llama1b(const std::vector<std::string>& overrides) {
  return load_config(test::source_path("configs/llama-1b.yaml"), overrides);
}
}  // namespace

TEST_CASE("plan: activations per rank under context parallelism are those of its share of the sequence", "[cp][plan]") {
  const PlanReport cp4 = make_plan(llama1b({"model.seq_length=32768", "parallel.context=4", "training.micro_batch_size=1",
                                            "training.global_batch_size=2"}),
                                   8);
  const PlanReport cp1 = make_plan(
      llama1b({"model.seq_length=8192", "training.micro_batch_size=1", "training.global_batch_size=2"}), 2);
  for (int i = 0; i < kNumRecomputeModes; ++i) {
    CHECK(cp4.layer_act[i] == cp1.layer_act[i]);
    CHECK(cp4.stages[0].activation[i] == cp1.stages[0].activation[i]);
  }
  CHECK(cp4.logits_per_microbatch == cp1.logits_per_microbatch);

  // Ring: (cp - 1) K and V blocks forward; backward those again and cp dK, dV blocks. llama-1b: 8 key/value heads of
  // 64, bf16, 8192 tokens per rank.
  const int64_t kv = 8192LL * 8 * 64 * 2;
  CHECK(cp4.cp_bytes_forward == 3 * 2 * kv);
  CHECK(cp4.cp_bytes_backward == 3 * 2 * kv + 4 * 2 * kv);
  CHECK(cp1.cp_bytes_forward == 0);
  const std::string text = format_plan(cp4);
  CHECK(text.find("context 4 (p2p: ring of key/value blocks): each sequence in 8 chunks of 4096 tokens") !=
        std::string::npos);

  // All-to-all: 3/4 of q, k, v and out forward; of q, k, v, out, dout, dq, dk, dv backward (32 query heads).
  const PlanReport a2a = make_plan(llama1b({"model.seq_length=32768", "parallel.context=4", "parallel.cp_comm_type=a2a",
                                            "training.micro_batch_size=1", "training.global_batch_size=2"}),
                                   8);
  const int64_t q = 8192LL * 32 * 64 * 2;
  CHECK(a2a.cp_bytes_forward == (2 * q + 2 * kv) * 3 / 4);
  CHECK(a2a.cp_bytes_backward == (4 * q + 4 * kv) * 3 / 4);

  // The distributed optimizer shards over data x context.
  const PlanReport dist = make_plan(llama1b({"model.seq_length=32768", "parallel.context=4", "training.micro_batch_size=1",
                                             "training.global_batch_size=2", "parallel.distributed_optimizer=true"}),
                                    8);
  CHECK(dist.stages[0].optimizer_bytes * 8 >= cp4.stages[0].optimizer_bytes);
  CHECK(dist.stages[0].optimizer_bytes * 8 < cp4.stages[0].optimizer_bytes + 8 * 12);
}
