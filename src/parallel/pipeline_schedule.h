// Pipeline schedules as data (docs/ARCHITECTURE.md): a pure function gives each stage the ordered list of
// actions it runs for one training iteration, for 1F1B (virtual_stages = 1) and interleaved 1F1B
// (virtual_stages > 1), in Megatron-Core's ordering (schedules.py:
// forward_backward_pipelining_without_interleaving / _with_interleaving). The executor in
// src/train runs the list; `plan` prints it; tests check it without a model.
//
// Terms: p stages (pipeline ranks), v model chunks per stage (virtual pipeline), m micro-batches.
// Chunk c of stage s is virtual stage c*p + s; the model's layers flow through virtual stages
// 0 .. v*p-1 in order. So the activation of (micro-batch, chunk c) leaving stage s goes to stage
// s+1 (same chunk), or from the last stage to stage 0, chunk c+1; gradients flow back the same way.
#pragma once

#include <string>
#include <vector>

namespace mt::pp {

enum class ActionKind {
  Forward,       // run the forward of (microbatch, chunk)
  Backward,      // run the backward of (microbatch, chunk)
  SendForward,   // send the output activation of (microbatch, chunk) to the next virtual stage
  RecvForward,   // receive the input activation of (microbatch, chunk) from the previous virtual stage
  SendBackward,  // send the input gradient of (microbatch, chunk) to the previous virtual stage
  RecvBackward,  // receive the output gradient of (microbatch, chunk) from the next virtual stage
};

struct Action {
  ActionKind kind;
  int microbatch = 0;
  int chunk = 0;   // local model chunk, 0 .. v-1
  int batch = -1;  // communication actions with the same batch id (always adjacent in the list)
                   // are issued together as one batch_p2p; -1 for Forward/Backward
};

// The actions of `stage` (0 .. stages-1). Requires microbatches >= 1; for virtual_stages > 1,
// microbatches % stages == 0 (as Megatron). Throws mt::Error otherwise, naming the numbers.
std::vector<Action> pipeline_schedule(int stages, int stage, int microbatches, int virtual_stages);

// Communication peers: the rank (in the pipeline group) an action's message goes to / comes from.
int peer_of(const Action& a, int stages, int stage);
// A tag unique to (kind of message, microbatch, chunk of the SENDING side's view) so that a send and
// its receive always carry the same tag, whatever order they are issued in.
int message_tag(const Action& a, int stages, int stage, int virtual_stages);

// The most (micro-batch, chunk) forwards of `stage` whose backward has not run yet (activations kept
// alive at once): min(p - s, m) for 1F1B, min(warmup + 1, m*v) for interleaved (warmup
// = (p - s - 1) * 2 + (v - 1) * p). Validates like pipeline_schedule.
int max_in_flight(int stages, int stage, int microbatches, int virtual_stages);

// "F0.1", "B2.0", "SF0.1", "RF", "SB", "RB" + micro-batch.chunk (logs, test messages).
std::string to_string(const Action& a);

// The idealized bubble fraction of the schedule: (p - 1) / (v*m + p - 1).
double bubble_fraction(int stages, int microbatches, int virtual_stages);

// One line per stage, e.g. "stage 0: F0.0 F1.0 B0.0 F2.0 ..." (F/B micro-batch.chunk; comm omitted),
// for `megatrain plan`.
std::string format_schedule(int stages, int microbatches, int virtual_stages);

}  // namespace mt::pp
