// The optimizer update beside the next forward (optim/adamw.h, on a GPU): what orders the reads after it is
// GradSync's hooks passing the forward's parameter ranges to AdamW::params_needed, and wait_params (evaluation,
// checkpoints, the end of training) passing the whole buffer, also when no parameter all-gather is pending.
#include <utility>
#include <vector>

#include "catch.h"
#include "parallel/grad_sync.h"
#include "params/param_store.h"

using namespace mt;

TEST_CASE("grad sync: the forward's parameter requests and wait_params reach the update's waiter",
          "[optim][grad_sync]") {
  ParamStore store{0, 1};
  for (const char* name : {"a", "b"}) {
    ParamSpec s;
    s.name = name;
    s.global_shape = {5};
    store.add(s);
  }
  store.allocate(DType::F32, Device::CPU);
  ParallelState ps;
  GradSync sync(store, ps, GradSyncOptions{});
  std::vector<std::pair<int64_t, int64_t>> asked;
  sync.set_update_waiter([&](int64_t b, int64_t e) { asked.emplace_back(b, e); });
  sync.params_needed(5, 10);
  sync.wait_params();  // nothing gathered (one rank): the waiter still hears of the whole buffer
  sync.gather_params();  // not distributed: no gather, no wait
  REQUIRE(asked.size() == 2);
  CHECK(asked[0] == std::pair<int64_t, int64_t>{5, 10});
  CHECK(asked[1] == std::pair<int64_t, int64_t>{0, store.padded_numel()});
}
