// Layout parity through the binary (test/parallel, test/cp, test/moe_train): a config trained on one rank and under
// each parallel layout (mpirun, ranks oversubscribed) for 10 iterations with a metrics record per iteration; the
// per-iteration loss and gradient norm of every layout agree with the single-rank run to 1e-5 relative.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "catch.h"
#include "common/run_binary.h"

namespace mt::test {

struct Layout {
  const char* name;
  int np;
  const char* args;  // the --set overrides of the layout
};

inline double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

// `train` of `config` for 10 iterations, a log line and metrics record (temp_dir()/<name>.jsonl) each, no
// evaluation, no checkpoints; `extra` appended.
inline std::string parity_train_args(const std::string& config, const std::string& name, const std::string& extra) {
  return "train --config " + source_path(config) +
         " --set training.train_iters=10 --set logging.log_interval=1 --set training.eval_iters=0"
         " --set checkpoint.dir= --set logging.metrics_file=" +
         (temp_dir() / (name + ".jsonl")).string() + " " + extra;
}

// Runs `config` + `model_args` on one rank (tag-single) and under each layout (tag-<layout>); loss and grad norm of
// every iteration to 1e-5.
inline void check_layouts_match_single(const std::string& config, const std::string& model_args, const std::string& tag,
                                       const std::vector<Layout>& layouts) {
  RunResult ref = run_megatrain(parity_train_args(config, tag + "-single", model_args), tag + "-single");
  INFO(ref.err.substr(0, 2000));
  REQUIRE(ref.code == 0);
  auto single = read_metrics(temp_dir() / (tag + "-single.jsonl"));
  REQUIRE(single.size() == 10);
  for (const Layout& l : layouts) {
    const std::string name = tag + "-" + l.name;
    RunResult r = run_megatrain(parity_train_args(config, name, model_args + " " + l.args), name, l.np);
    INFO(name << " (" << l.np << " ranks)\n" << r.err.substr(0, 2000));
    REQUIRE(r.code == 0);
    auto m = read_metrics(temp_dir() / (name + ".jsonl"));
    REQUIRE(m.size() == 10);
    for (auto& [it, s] : single) {
      INFO("iteration " << it << ": loss " << m[it].loss << " vs " << s.loss << ", grad norm " << m[it].grad_norm
                        << " vs " << s.grad_norm);
      CHECK(rel(m[it].loss, s.loss) < 1e-5);
      CHECK(rel(m[it].grad_norm, s.grad_norm) < 1e-5);
    }
  }
}

}  // namespace mt::test
