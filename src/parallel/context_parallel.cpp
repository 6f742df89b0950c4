#include "parallel/context_parallel.h"

#include <memory>
#include <vector>

#include "tensor/ops.h"

namespace mt {

namespace {

Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), t.dtype(), t.device()); }

// Sequence range [t0, t0 + len) of x (B, T, ...): a view when B == 1 (contiguous), else a copy.
Tensor seq_range(const Tensor& x, int64_t t0, int64_t len) {
  Shape s = x.shape();
  s[1] = len;
  if (x.size(0) == 1) {
    Shape rows = x.shape();
    rows.erase(rows.begin());  // (T, ...)
    return x.view(rows).slice(t0, len).view(s);
  }
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  ops::seq_copy(out, 0, x, t0, len);
  return out;
}

// lse (B, H, T) -> its range [t0, t0 + len) of every (b, h) row, (B, H, len).
Tensor lse_range(const Tensor& lse, int64_t t0, int64_t len) {
  const int64_t B = lse.size(0), H = lse.size(1), T = lse.size(2);
  Tensor out = Tensor::empty({B * H, len, 1}, lse.dtype(), lse.device());
  ops::seq_copy(out, 0, lse.view({B * H, T, 1}), t0, len);
  return out.view({B, H, len});
}

// Sends every tensor of `send` to the next rank of the context ring and receives as many from the previous one.
// Tags from `tag` on (key/value blocks and their gradients use different ones).
std::unique_ptr<Work> ring_shift(const ParallelState& ps, const std::vector<Tensor*>& send,
                                 const std::vector<Tensor*>& recv, int tag) {
  const int P = ps.cp_size, r = ps.cp_rank;
  std::vector<P2POp> ops;
  for (size_t i = 0; i < send.size(); ++i) {
    ops.push_back({P2POp::Kind::Send, send[i], (r + 1) % P, tag + static_cast<int>(i)});
    ops.push_back({P2POp::Kind::Recv, recv[i], (r + P - 1) % P, tag + static_cast<int>(i)});
  }
  return ps.cp->batch_p2p_async(ops);
}

// ------------------------------------------------------------------ p2p (ring)

void ring_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                  const ParallelState& ps) {
  const int P = ps.cp_size, r = ps.cp_rank;
  const int64_t Tl = q.size(1), c = Tl / 2;
  Tensor kc = k, vc = v;  // the block of rank (r - i) mod P
  for (int i = 0; i < P; ++i) {
    Tensor kn, vn;
    std::unique_ptr<Work> next;
    if (i + 1 < P) {  // the next block travels while this one is computed
      kn = empty_like(k);
      vn = empty_like(v);
      next = ring_shift(ps, {&kc, &vc}, {&kn, &vn}, 0);
    }
    const int s = (r - i + P) % P;
    if (i == 0) {
      ops::attention_forward(out, lse, q, kc, vc, true);
    } else if (s < r) {  // every query, the block's first chunk
      Tensor part = empty_like(out), part_lse = empty_like(lse);
      ops::attention_forward(part, part_lse, q, seq_range(kc, 0, c), seq_range(vc, 0, c), false);
      ops::attention_merge(out, lse, part, part_lse, 0);
    } else {  // the second local chunk, the whole block
      Tensor qh = seq_range(q, c, c);
      Tensor part = empty_like(qh);
      Tensor part_lse = Tensor::empty({q.size(0), q.size(2), c}, lse.dtype(), lse.device());
      ops::attention_forward(part, part_lse, qh, kc, vc, false);
      ops::attention_merge(out, lse, part, part_lse, c);
    }
    if (next) {
      next->wait();
      kc = kn;
      vc = vn;
    }
  }
}

void ring_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                   const Tensor& v, const Tensor& out, const Tensor& lse, const ParallelState& ps) {
  const int P = ps.cp_size, r = ps.cp_rank;
  const int64_t Tl = q.size(1), c = Tl / 2;
  Tensor kc = k, vc = v;
  // The gradient of the block this rank computed last, on its way to the next rank, and the one arriving.
  Tensor send_k, send_v, recv_k, recv_v;
  std::unique_ptr<Work> grads_moving;
  for (int i = 0; i < P; ++i) {
    Tensor kn, vn;
    std::unique_ptr<Work> next;
    if (i + 1 < P) {
      kn = empty_like(k);
      vn = empty_like(v);
      next = ring_shift(ps, {&kc, &vc}, {&kn, &vn}, 0);
    }
    const int s = (r - i + P) % P;
    Tensor dkb, dvb;  // this rank's share of the gradient of block s, (B, Tl, G, D)
    if (i == 0) {
      dkb = empty_like(k);
      dvb = empty_like(v);
      ops::attention_backward(dq, dkb, dvb, dout, q, kc, vc, out, lse, true);
    } else if (s < r) {
      Tensor kh = seq_range(kc, 0, c), vh = seq_range(vc, 0, c);
      Tensor dqb = empty_like(q), dkh = empty_like(kh), dvh = empty_like(vh);
      ops::attention_backward(dqb, dkh, dvh, dout, q, kh, vh, out, lse, false);
      ops::add_(dq, dqb);
      dkb = Tensor::zeros(k.shape(), k.dtype(), k.device());
      dvb = Tensor::zeros(v.shape(), v.dtype(), v.device());
      ops::seq_copy(dkb, 0, dkh, 0, c);
      ops::seq_copy(dvb, 0, dvh, 0, c);
    } else {
      Tensor qh = seq_range(q, c, c), douth = seq_range(dout, c, c), outh = seq_range(out, c, c);
      Tensor dqh = empty_like(qh);
      dkb = empty_like(k);
      dvb = empty_like(v);
      ops::attention_backward(dqh, dkb, dvb, douth, qh, kc, vc, outh, lse_range(lse, c, c), false);
      ops::seq_copy(dq, c, dqh, 0, c, ops::GradMode::Accumulate);
    }
    if (i > 0) {  // add this share to what the earlier ranks summed for block s
      grads_moving->wait();
      ops::add_(recv_k, dkb);
      ops::add_(recv_v, dvb);
      dkb = recv_k;
      dvb = recv_v;
    }
    send_k = dkb;
    send_v = dvb;
    recv_k = empty_like(k);
    recv_v = empty_like(v);
    grads_moving = ring_shift(ps, {&send_k, &send_v}, {&recv_k, &recv_v}, 2);
    if (next) {
      next->wait();
      kc = kn;
      vc = vn;
    }
  }
  grads_moving->wait();  // this rank's own block, summed over every rank
  dk.copy_from(recv_k);
  dv.copy_from(recv_v);
}

// ------------------------------------------------------------------ a2a (Ulysses)

// x (B, Tl, Hx, D), this rank's chunks of all its heads -> (B, P Tl, Hx / P, D): head group cp_rank of the whole
// sequence, in sequence order.
Tensor gather_sequence(const Tensor& x, const ParallelState& ps) {
  const int P = ps.cp_size;
  const int64_t B = x.size(0), Tl = x.size(1), c = Tl / 2, row = x.size(2) / P * x.size(3);
  Tensor send = Tensor::empty({P, B, Tl, row}, x.dtype(), x.device());
  Tensor by_group = x.view({B * Tl, P, row});
  for (int j = 0; j < P; ++j) {  // head group j goes to rank j
    Tensor dst = send.slice(j, 1).view({B * Tl, 1, row});
    ops::seq_copy(dst, 0, by_group, j, 1);
  }
  Tensor recv = empty_like(send);
  ps.cp->all_to_all(recv, send);
  Tensor out = Tensor::empty({B, P * Tl, x.size(2) / P, x.size(3)}, x.dtype(), x.device());
  Tensor seq = out.view({B, P * Tl, row});
  for (int j = 0; j < P; ++j) {  // rank j's chunks j and 2P-1-j
    Tensor src = recv.slice(j, 1).view({B, Tl, row});
    ops::seq_copy(seq, j * c, src, 0, c);
    ops::seq_copy(seq, (2 * int64_t{P} - 1 - j) * c, src, c, c);
  }
  return out;
}

// The inverse: y (B, P Tl, Hy, D) of head group cp_rank -> dst (B, Tl, Hy P, D), this rank's chunks.
void scatter_sequence(Tensor& dst, const Tensor& y, const ParallelState& ps) {
  const int P = ps.cp_size;
  const int64_t B = dst.size(0), Tl = dst.size(1), c = Tl / 2, row = y.size(2) * y.size(3);
  Tensor send = Tensor::empty({P, B, Tl, row}, y.dtype(), y.device());
  Tensor seq = y.view({B, P * Tl, row});
  for (int j = 0; j < P; ++j) {
    Tensor part = send.slice(j, 1).view({B, Tl, row});
    ops::seq_copy(part, 0, seq, j * c, c);
    ops::seq_copy(part, c, seq, (2 * int64_t{P} - 1 - j) * c, c);
  }
  Tensor recv = empty_like(send);
  ps.cp->all_to_all(recv, send);
  Tensor by_group = dst.view({B * Tl, P, row});
  for (int j = 0; j < P; ++j) ops::seq_copy(by_group, j, recv.slice(j, 1).view({B * Tl, 1, row}), 0, 1);
}

Tensor gathered_lse(const Tensor& lse, const Tensor& q, const ParallelState& ps) {
  return lse.view({q.size(0), q.size(2) / ps.cp_size, q.size(1) * ps.cp_size});
}

}  // namespace

void context_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                               CpCommType type, const ParallelState& ps) {
  MT_INTERNAL_ASSERT(ps.cp_size > 1 && q.size(1) % 2 == 0, "context attention on ", q.str(), " with context size ",
                     ps.cp_size);
  if (type == CpCommType::P2P) return ring_forward(out, lse, q, k, v, ps);
  Tensor qg = gather_sequence(q, ps), kg = gather_sequence(k, ps), vg = gather_sequence(v, ps);
  Tensor outg = empty_like(qg), lseg = gathered_lse(lse, q, ps);
  ops::attention_forward(outg, lseg, qg, kg, vg, true);
  scatter_sequence(out, outg, ps);
}

void context_attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                                const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                                CpCommType type, const ParallelState& ps) {
  if (type == CpCommType::P2P) return ring_backward(dq, dk, dv, dout, q, k, v, out, lse, ps);
  Tensor qg = gather_sequence(q, ps), kg = gather_sequence(k, ps), vg = gather_sequence(v, ps);
  Tensor outg = gather_sequence(out, ps), doutg = gather_sequence(dout, ps);
  Tensor dqg = empty_like(qg), dkg = empty_like(kg), dvg = empty_like(vg);
  ops::attention_backward(dqg, dkg, dvg, doutg, qg, kg, vg, outg, gathered_lse(lse, q, ps), true);
  scatter_sequence(dq, dqg, ps);
  scatter_sequence(dk, dkg, ps);
  scatter_sequence(dv, dvg, ps);
}

}  // namespace mt
