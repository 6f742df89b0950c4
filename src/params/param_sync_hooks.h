// What the model reports while it runs, so that communication can overlap it (parallel/grad_sync.h
// implements it). Ranges are element ranges of the parameter store's flat buffers; each layer's
// parameters form one range.
#pragma once

#include <cstdint>

namespace mt {

class ParamSyncHooks {
 public:
  virtual ~ParamSyncHooks() = default;
  // The parameters in [begin, end) are about to be read by a forward.
  virtual void params_needed(int64_t begin, int64_t end) = 0;
  // A backward finished accumulating one micro-batch into the gradients of [begin, end).
  virtual void grads_accumulated(int64_t begin, int64_t end) = 0;
};

}  // namespace mt
