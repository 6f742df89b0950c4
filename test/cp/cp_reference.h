// Shared pieces of the context-parallel tests: the load-balanced chunks of a (B, T, ...) tensor (what rank r of P
// holds: chunks r and 2P - 1 - r of 2P), and the inverse (a rank's local tensor written back at its chunks).
#pragma once

#include "core/rope_params.h"
#include "tensor/ops.h"

namespace mt::test {

// Rank r's two chunks of x (B, T, ...) -> (B, T / P, ...).
inline Tensor cp_local(const Tensor& x, int P, int r) {
  const int64_t T = x.size(1), c = T / (2 * P);
  Shape s = x.shape();
  s[1] = 2 * c;
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  const RopePositions pos = context_chunk_positions(2 * c, P, r);
  ops::seq_copy(out, 0, x, pos(0), c);
  ops::seq_copy(out, c, x, pos(c), c);
  return out;
}

// lse (B, H, T) -> rank r's (B, H, T / P).
inline Tensor cp_local_lse(const Tensor& lse, int P, int r) {
  const int64_t B = lse.size(0), H = lse.size(1), T = lse.size(2);
  return cp_local(lse.view({B * H, T, 1}), P, r).view({B, H, T / P});
}

}  // namespace mt::test
