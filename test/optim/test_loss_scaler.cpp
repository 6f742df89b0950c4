#include "optim/loss_scaler.h"

#include "catch.h"
#include "core/check.h"

using namespace mt;

namespace {
OptimizerConfig scaler_config(double initial, double min, int window, int hysteresis) {
  OptimizerConfig o;
  o.initial_loss_scale = initial;
  o.min_loss_scale = min;
  o.loss_scale_window = window;
  o.hysteresis = hysteresis;
  return o;
}
}  // namespace

TEST_CASE("loss scale halves only after `hysteresis` overflows", "[loss_scaler]") {
  LossScaler s(scaler_config(1024, 1, 1000, 3));
  CHECK(s.scale() == 1024);
  s.update(true);
  s.update(true);
  CHECK(s.scale() == 1024);  // two overflows tolerated
  CHECK(s.hysteresis_tracker() == 1);
  s.update(true);
  CHECK(s.scale() == 512);
  s.update(true);  // hysteresis used up: every further overflow halves (Megatron)
  CHECK(s.scale() == 256);
  s.update(false);  // a good step does not refill the hysteresis; only growth does
  s.update(true);
  CHECK(s.scale() == 128);
}

TEST_CASE("loss scale doubles after loss_scale_window good steps and refills the hysteresis", "[loss_scaler]") {
  LossScaler s(scaler_config(8, 1, 4, 2));
  for (int i = 0; i < 3; ++i) s.update(false);
  CHECK(s.scale() == 8);
  CHECK(s.growth_tracker() == 3);
  s.update(false);
  CHECK(s.scale() == 16);
  CHECK(s.growth_tracker() == 0);
  // An overflow restarts the window.
  for (int i = 0; i < 3; ++i) s.update(false);
  s.update(true);  // first overflow: within hysteresis, scale kept
  CHECK(s.scale() == 16);
  CHECK(s.growth_tracker() == 0);
  for (int i = 0; i < 3; ++i) s.update(false);
  CHECK(s.scale() == 16);
  s.update(false);
  CHECK(s.scale() == 32);
  CHECK(s.hysteresis_tracker() == 2);  // refilled by the growth
  s.update(true);
  CHECK(s.scale() == 32);
  s.update(true);
  CHECK(s.scale() == 16);
}

TEST_CASE("loss scale never drops below min_loss_scale", "[loss_scaler]") {
  LossScaler s(scaler_config(4, 1.5, 1000, 1));
  s.update(true);
  CHECK(s.scale() == 2);
  s.update(true);
  CHECK(s.scale() == 1.5);
  for (int i = 0; i < 10; ++i) s.update(true);
  CHECK(s.scale() == 1.5);
}

TEST_CASE("loss scaler state round-trips through a checkpoint state", "[loss_scaler]") {
  const OptimizerConfig cfg = scaler_config(65536, 1, 5, 2);
  LossScaler a(cfg);
  const bool pattern[] = {false, false, true, false, true, true, false, false, false, true, false, false};
  for (bool inf : pattern) a.update(inf);
  nlohmann::json state = {{"iteration", 12}};
  a.save_state(state);
  // Through text, as a checkpoint stores it.
  const nlohmann::json reread = nlohmann::json::parse(state.dump());
  LossScaler b(cfg);
  b.load_state(reread);
  CHECK(b.scale() == a.scale());
  CHECK(b.growth_tracker() == a.growth_tracker());
  CHECK(b.hysteresis_tracker() == a.hysteresis_tracker());
  // Both continue identically.
  for (int i = 0; i < 20; ++i) {
    const bool inf = i % 7 == 3;
    a.update(inf);
    b.update(inf);
    CHECK(b.scale() == a.scale());
  }

  // A state without the scaler (a bf16 checkpoint) keeps the fresh scaler.
  LossScaler c(cfg);
  c.load_state(nlohmann::json{{"iteration", 3}});
  CHECK(c.scale() == 65536);
  CHECK(c.hysteresis_tracker() == 2);

  // A partial or malformed one is an error.
  CHECK_THROWS_AS(c.load_state(nlohmann::json{{"loss_scale", 2.0}}), Error);
  CHECK_THROWS_AS(c.load_state(nlohmann::json{{"loss_scale", "big"},
                                               {"loss_scale_growth_tracker", 0},
                                               {"loss_scale_hysteresis_tracker", 0}}),
                  Error);
  CHECK_THROWS_AS(c.load_state(nlohmann::json{{"loss_scale", -1.0},
                                              {"loss_scale_growth_tracker", 0},
                                              {"loss_scale_hysteresis_tracker", 0}}),
                  Error);
}
