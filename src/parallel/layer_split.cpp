#include "parallel/layer_split.h"

#include <vector>

#include "core/check.h"

namespace mt {

LayerRange stage_layers(const ModelConfig& m, const ParallelConfig& par, int stage, int chunk) {
  const int p = par.pipeline, v = par.virtual_pipeline, L = m.num_layers;
  // Layers of each stage, then of each chunk (same count for every chunk of a stage).
  std::vector<int> per_stage(p, 0);
  const int first = par.decoder_first_pipeline_num_layers, last = par.decoder_last_pipeline_num_layers;
  if (p == 1) {
    per_stage[0] = L;
  } else if (first == 0 && last == 0) {
    for (int s = 0; s < p; ++s) per_stage[s] = L / p;
  } else {
    int rest = L, middle = p;
    if (first > 0) { per_stage[0] = first; rest -= first; --middle; }
    if (last > 0) { per_stage[p - 1] = last; rest -= last; --middle; }
    for (int s = 0; s < p; ++s) {
      bool fixed = (s == 0 && first > 0) || (s == p - 1 && last > 0);
      if (!fixed) per_stage[s] = middle > 0 ? rest / middle : 0;
    }
  }
  int total = 0;
  for (int n : per_stage) total += n;
  MT_INTERNAL_ASSERT(total == L, "layer split over ", p, " stages covers ", total, " of ", L, " layers");
  // Virtual stage order: chunk-major (chunk c of every stage, then chunk c+1).
  int begin = 0;
  for (int c = 0; c <= chunk; ++c)
    for (int s = 0; s < p; ++s) {
      const int n = per_stage[s] / v;
      if (c == chunk && s == stage) return {begin, begin + n};
      begin += n;
    }
  MT_INTERNAL_ASSERT(false, "stage ", stage, " chunk ", chunk, " out of range");
  return {};
}

}  // namespace mt
