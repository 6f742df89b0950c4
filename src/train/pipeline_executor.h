// Runs one iteration's micro-batches through this rank's model chunks as the pipeline schedule
// (src/parallel/pipeline_schedule.h) lists them: forwards, backwards, and the batched sends and
// receives of activations and gradients between stages. With one stage it is plain gradient
// accumulation. Evaluation runs forwards only, micro-batch by micro-batch.
//
// Transfers are asynchronous (Communicator::batch_p2p_async): a received tensor is waited for only
// when the forward or backward that reads it starts, and a sent tensor is kept until the next batch
// is issued, so that (on GPUs) the transfers run on the pipeline group's stream beside compute.
#pragma once

#include <vector>

#include "data/dataset.h"
#include "model/gpt_model.h"

namespace mt {

class PipelineExecutor {
 public:
  // chunks[c] is this rank's model chunk c (virtual stage c * pp + pp_rank).
  PipelineExecutor(std::vector<const GPTModel*> chunks, const ModelContext& ctx);
  // Forward and backward of every micro-batch, queued without waiting for the device; returns the summed token loss
  // as one F64 element on the device (non-zero only on the last stage), to be read with the step's other values
  // (tensor/scalar_read.h). Each token's loss has weight dloss_per_token.
  Tensor train(const std::vector<data::MicroBatch>& mbs, uint64_t dropout_seed, double dloss_per_token);
  // Forward only (no dropout); returns the summed token loss on the last stage, 0 elsewhere.
  double evaluate(const std::vector<data::MicroBatch>& mbs);

 private:
  Tensor activation_buffer(const data::MicroBatch& mb) const;
  bool first_virtual(int chunk) const;
  bool last_virtual(int chunk) const;
  std::vector<const GPTModel*> chunks_;
  const ModelContext* ctx_;
};

}  // namespace mt
