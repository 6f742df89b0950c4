#include <cmath>
#include <numbers>

#include "catch.h"
#include "optim/lr_schedule.h"

using namespace mt;

TEST_CASE("warmup then cosine decay to min_lr", "[lr]") {
  OptimizerConfig o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_iters = 10;
  CHECK(learning_rate(o, DecayStyle::Cosine, 110, 1) == Approx(0.1));
  CHECK(learning_rate(o, DecayStyle::Cosine, 110, 10) == Approx(1.0));
  CHECK(learning_rate(o, DecayStyle::Cosine, 110, 60) == Approx(0.1 + 0.9 * 0.5));  // halfway: cos(pi/2) = 0
  CHECK(learning_rate(o, DecayStyle::Cosine, 110, 110) == Approx(0.1));
  CHECK(learning_rate(o, DecayStyle::Cosine, 110, 500) == Approx(0.1));
  const double r = 25.0 / 100.0;
  CHECK(learning_rate(o, DecayStyle::Cosine, 110, 35) == Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * r))));
}

TEST_CASE("linear and constant decay", "[lr]") {
  OptimizerConfig o;
  o.lr = 2.0;
  o.min_lr = 0.0;
  o.warmup_iters = 0;
  CHECK(learning_rate(o, DecayStyle::Linear, 100, 25) == Approx(1.5));
  CHECK(learning_rate(o, DecayStyle::Linear, 100, 100) == Approx(0.0).margin(1e-12));
  const DecayStyle style = DecayStyle::Constant;
  CHECK(learning_rate(o, style, 100, 77) == Approx(2.0));
  o.warmup_iters = 4;
  CHECK(learning_rate(o, style, 100, 2) == Approx(1.0));
}
