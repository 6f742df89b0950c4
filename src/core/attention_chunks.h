// How cuDNN's deterministic attention backward (cuda/attention_cudnn.cu) is cut so that its workspace fits a cap
// (training.attention_bwd_workspace_mib); `megatrain plan` (train/plan.cpp) reports the same decision.
// The backward materializes the scores' gradient dS, Bc x Hc x T x Tk x 2 bytes for a call on Bc samples and Hc
// query heads (T queries, Tk keys). Each call is one cuDNN graph execution on pointers offset into the full tensors
// (batch outermost; a head range is the same strides with a smaller head count). In order of preference:
//   1. whole samples: Bc = the most samples dividing B that fit (all heads per call), at least one sample fits;
//   2. one sample, Gc KV groups with their H/G query heads (Gc the most dividing G that fit): a group's dK/dV come
//      from one call, as unchunked;
//   3. one sample, one query head per call (GQA, when one group does not fit): the group's H/G calls write their
//      dK/dV contributions to scratch and one kernel sums them in head order in fp32 (deterministic).
// At one query head the workspace cannot shrink: over_cap says it still exceeds the cap.
// Plain integer arithmetic, no other headers (read by CUDA code and the CPU planner).
#pragma once

#include <cstdint>

namespace mt {

struct AttnBwdChunks {
  int64_t samples = 1;        // Bc: samples per call
  int64_t groups = 1;         // Gc: KV groups per call (each with H/G query heads); meaningless with single_heads
  int64_t heads = 1;          // Hc: query heads per call
  bool single_heads = false;  // one query head per call, a group's dK/dV summed from H/G calls (GQA)
  int64_t workspace = 0;      // bytes of dS per call: Bc Hc T Tk 2
  int64_t cap = 0;            // the cap it was cut for, bytes
  bool over_cap() const { return workspace > cap; }
  int64_t calls(int64_t B, int64_t H) const { return (B / samples) * (H / heads); }
};

// B samples, H query heads in G groups (G divides H), T queries, Tk keys, cap in bytes.
inline AttnBwdChunks attention_bwd_chunks(int64_t B, int64_t H, int64_t G, int64_t T, int64_t Tk, int64_t cap) {
  AttnBwdChunks c;
  c.cap = cap;
  const int64_t per_head = 2 * T * Tk, R = H / G;  // R: query heads per group
  if (H * per_head <= cap) {  // 1. whole samples
    for (int64_t b = 1; b <= B; ++b)
      if (B % b == 0 && b * H * per_head <= cap) c.samples = b;
    c.groups = G;
    c.heads = H;
  } else {
    c.samples = 1;
    c.groups = 0;
    for (int64_t g = 1; g <= G; ++g)  // 2. KV groups
      if (G % g == 0 && g * R * per_head <= cap) c.groups = g;
    if (c.groups > 0) {
      c.heads = c.groups * R;
    } else if (R == 1) {  // one group is one head: as small as it gets
      c.groups = 1;
      c.heads = 1;
    } else {  // 3. single query heads
      c.groups = 1;
      c.heads = 1;
      c.single_heads = true;
    }
  }
  c.workspace = c.samples * c.heads * per_head;
  return c;
}

}  // namespace mt
