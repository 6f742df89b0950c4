// Which decoder layers each (pipeline stage, model chunk) holds. Even split over p*v virtual
// stages unless the config states parallel.decoder_first/last_pipeline_num_layers (then the first
// and last stage take those counts, split evenly over their v chunks, and the middle stages share
// the rest evenly). Never drops a layer: derive_config has already refused impossible splits.
#pragma once

#include "config/config.h"

namespace mt {

struct LayerRange {
  int begin = 0, end = 0;  // global layer numbers [begin, end)
};

LayerRange stage_layers(const ModelConfig& m, const ParallelConfig& par, int stage, int chunk);

}  // namespace mt
