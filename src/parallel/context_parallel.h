// Context-parallel attention (parallel.context = P > 1; Megatron-Core's context parallelism). Each rank holds two
// chunks of every sequence (chunks r and 2P - 1 - r of 2P, core/rope_params.h context_chunk_positions): its queries,
// keys and values q (B, Tl, H, D), k, v (B, Tl, G, D), Tl = 2c. The attention layer calls these instead of
// ops::attention_forward/backward; model code never sees the communicator.
//
// p2p (ring): the key/value blocks travel around the context group, rank r -> r + 1, the transfer of the next block
// issued before the attention on the current one. At step i rank r holds the block of rank s = r - i (mod P):
//   i = 0:  its own chunks, causal (both chunks in sequence order: the local causal mask is the global one);
//   s < r:  every local query sees chunk s (earlier), not chunk 2P-1-s (later than both local chunks);
//   s > r:  only the second local chunk (2P-1-r) sees the block, both its chunks, in full (both earlier);
// so each step after the first is half a block of full attention on every rank (the load balance). Partial results
// are merged by log-sum-exp (ops::attention_merge), in step order. Backward walks the ring again with the merged out
// and lse: dQ accumulates locally, the gradient of each key/value block travels with it (one step behind) and each
// rank adds its share in step order, so block s's gradient is summed in the fixed order s, s+1, ..., s+P-1 and
// arrives home after the last step (deterministic).
// a2a (Ulysses): all-to-all over heads (each rank gets H/P query heads and G/P key/value heads of the whole
// sequence), causal attention on them, all-to-all back. Backward redoes the all-to-alls of q, k, v, out, dout (the
// gathered copies are not kept) and scatters dq, dk, dv back. lse is kept in the gathered layout (same numel).
#pragma once

#include "config/config.h"
#include "runtime/parallel_state.h"
#include "tensor/tensor.h"

namespace mt {

// out (B, Tl, H, D), lse (B, H, Tl) (a2a: (B, H/P, P Tl) in the same storage): causal attention of the local
// queries over the whole sequence.
void context_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                               CpCommType type, const ParallelState& ps);
// dq, dk, dv (overwritten) from dout and the forward's out, lse.
void context_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                                const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                                CpCommType type, const ParallelState& ps);

}  // namespace mt
