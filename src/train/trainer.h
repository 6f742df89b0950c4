// The training loop: build the model on this rank's share of the layout, restore the latest
// checkpoint, then for each iteration run every micro-batch forward and backward, clip, step
// AdamW, log, evaluate and save. Losses are the mean over all tokens of the global batch.
#pragma once

#include <memory>
#include <string>

#include "config/config.h"

namespace mt {

struct TrainResult {
  int64_t last_iteration = 0;
  double last_loss = 0;
  double last_val_loss = -1;
  double last_test_loss = -1;  // the test split at the end of training; -1: not evaluated
  bool stopped_by_signal = false;
};

// Runs training as the config says (collective over all ranks). Throws mt::Error on bad input.
TrainResult run_training(const Config& cfg);

// SIGTERM / SIGUSR1 / a first SIGINT ask the loop to save a checkpoint (when checkpoint.dir is set)
// and exit 0 after the current iteration (before the first one when they come during start-up); a
// second SIGINT exits at once (status 130).
void install_stop_signal_handlers();
// The handlers print nothing more: the process is reporting a fatal error and exiting (under mpirun the other
// ranks' exit makes it SIGTERM this one meanwhile, whose "stopping after the current iteration" line would follow
// the error).
void quiet_stop_signals();

}  // namespace mt
