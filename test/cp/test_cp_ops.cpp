// The ops context parallelism adds, on the CPU reference: non-causal attention with keys of another length (naive
// fp64 reference, finite differences), the log-sum-exp merge, sequence copies, RoPE at two chunks' positions; and the
// load-balanced block schedule of the ring (parallel/context_parallel.h) simulated in one process: merged blocks equal
// full causal attention, and the blocks' backward summed in ring order equals the full backward (fp64, 1e-12).
#include <cmath>
#include <vector>

#include "cp/cp_reference.h"
#include "data/context_chunks.h"
#include "ops/gradcheck.h"

using namespace mt;
using namespace mt::test;

namespace {

// Plain loops: out[b,i,h] = sum_j softmax_j(q_i . k_j / sqrt(D)) v_j over every key j < Tk (non-causal).
Tensor naive_full_attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& lse) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3), Tk = k.size(1), G = k.size(2), R = H / G;
  Tensor out = Tensor::zeros(q.shape(), DType::F64);
  lse = Tensor::empty({B, H, T}, DType::F64);
  const double *Q = q.data<double>(), *K = k.data<double>(), *V = v.data<double>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(static_cast<size_t>(Tk));
        double m = -1e300;
        for (int64_t j = 0; j < Tk; ++j) {
          double d = 0;
          for (int64_t c = 0; c < D; ++c) d += Q[((b * T + i) * H + h) * D + c] * K[((b * Tk + j) * G + h / R) * D + c];
          s[j] = d / std::sqrt(static_cast<double>(D));
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (double x : s) sum += std::exp(x - m);
        for (int64_t j = 0; j < Tk; ++j)
          for (int64_t c = 0; c < D; ++c)
            out.data<double>()[((b * T + i) * H + h) * D + c] +=
                std::exp(s[j] - m) / sum * V[((b * Tk + j) * G + h / R) * D + c];
        lse.data<double>()[(b * H + h) * T + i] = m + std::log(sum);
      }
  return out;
}

struct Attn {
  Tensor out, lse;
};
Attn attend(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  Attn a{Tensor::empty(q.shape(), q.dtype()), Tensor::empty({q.size(0), q.size(2), q.size(1)}, q.dtype())};
  ops::attention_forward(a.out, a.lse, q, k, v, causal);
  return a;
}

}  // namespace

TEST_CASE("non-causal attention with keys of another length equals the naive reference", "[cp][ops]") {
  const int64_t B = 2, T = 5, H = 4, G = 2, D = 8;
  for (int64_t Tk : {3, 5, 9}) {
    INFO("Tk " << Tk);
    Tensor q = randn({B, T, H, D}, 1), k = randn({B, Tk, G, D}, 2), v = randn({B, Tk, G, D}, 3);
    Tensor ref_lse;
    Tensor ref = naive_full_attention(q, k, v, ref_lse);
    Attn a = attend(q, k, v, false);
    CHECK(max_abs_diff(a.out, ref) < 1e-12);
    CHECK(max_abs_diff(a.lse, ref_lse) < 1e-12);

    // Backward against finite differences of L = sum(w . out).
    Tensor w = randn(q.shape(), 4);
    Tensor dq = Tensor::empty(q.shape(), DType::F64), dk = Tensor::empty(k.shape(), DType::F64),
           dv = Tensor::empty(v.shape(), DType::F64);
    ops::attention_backward(dq, dk, dv, w, q, k, v, a.out, a.lse, false);
    auto L = [&] { return dot(attend(q, k, v, false).out, w); };
    check_grad("dq", dq, q, L);
    check_grad("dk", dk, k, L);
    check_grad("dv", dv, v, L);
  }
  Tensor q = randn({1, 4, 2, 8}, 5), k = randn({1, 3, 2, 8}, 6);
  Tensor out = Tensor::empty(q.shape(), DType::F64), lse = Tensor::empty({1, 2, 4}, DType::F64);
  CHECK_THROWS_AS(ops::attention_forward(out, lse, q, k, k, true), InternalError);  // causal needs Tk == T
}

TEST_CASE("attention_merge of two key blocks equals attention over both", "[cp][ops]") {
  const int64_t B = 2, T = 6, H = 2, G = 1, D = 4;
  Tensor q = randn({B, T, H, D}, 10), k = randn({B, 7, G, D}, 11), v = randn({B, 7, G, D}, 12);
  Tensor k1 = Tensor::empty({B, 3, G, D}, DType::F64), k2 = Tensor::empty({B, 4, G, D}, DType::F64);
  Tensor v1 = Tensor::empty(k1.shape(), DType::F64), v2 = Tensor::empty(k2.shape(), DType::F64);
  ops::seq_copy(k1, 0, k, 0, 3);
  ops::seq_copy(k2, 0, k, 3, 4);
  ops::seq_copy(v1, 0, v, 0, 3);
  ops::seq_copy(v2, 0, v, 3, 4);
  Attn whole = attend(q, k, v, false), a = attend(q, k1, v1, false);
  // The second block only for query rows [2, 6).
  Tensor qh = Tensor::empty({B, 4, H, D}, DType::F64);
  ops::seq_copy(qh, 0, q, 2, 4);
  Attn b = attend(qh, k2, v2, false);
  ops::attention_merge(a.out, a.lse, b.out, b.lse, 2);
  Tensor rows_out = Tensor::empty({B, 4, H, D}, DType::F64), whole_rows = Tensor::empty({B, 4, H, D}, DType::F64);
  ops::seq_copy(rows_out, 0, a.out, 2, 4);
  ops::seq_copy(whole_rows, 0, whole.out, 2, 4);
  CHECK(max_abs_diff(rows_out, whole_rows) < 1e-12);
  // Rows [0, 2) kept only the first block.
  Attn first = attend(q, k1, v1, false);
  CHECK(max_abs_diff(a.out.view({B, T * H * D}).slice(0, 1), first.out.view({B, T * H * D}).slice(0, 1)) > 0);
  Tensor head = Tensor::empty({B, 2, H, D}, DType::F64), first_head = Tensor::empty({B, 2, H, D}, DType::F64);
  ops::seq_copy(head, 0, a.out, 0, 2);
  ops::seq_copy(first_head, 0, first.out, 0, 2);
  CHECK(bitwise_equal(head, first_head));
}

TEST_CASE("seq_copy copies and accumulates ranges of the sequence dim", "[cp][ops]") {
  Tensor src = randn({2, 5, 3}, 20), dst = randn({2, 4, 3}, 21);
  Tensor before = dst.clone();
  ops::seq_copy(dst, 1, src, 2, 2);
  ops::seq_copy(dst, 3, src, 0, 1, ops::GradMode::Accumulate);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t c = 0; c < 3; ++c) {
      auto at = [&](const Tensor& t, int64_t T, int64_t i) { return t.data<double>()[(b * T + i) * 3 + c]; };
      CHECK(at(dst, 4, 0) == at(before, 4, 0));
      CHECK(at(dst, 4, 1) == at(src, 5, 2));
      CHECK(at(dst, 4, 2) == at(src, 5, 3));
      CHECK(at(dst, 4, 3) == at(before, 4, 3) + at(src, 5, 0));
    }
  CHECK_THROWS_AS(ops::seq_copy(dst, 3, src, 0, 2), InternalError);
}

TEST_CASE("each context rank holds chunks r and 2P-1-r of tokens, labels and positions", "[cp][data]") {
  data::MicroBatch mb;
  mb.rows = 2;
  mb.seq_length = 16;
  for (int i = 0; i < 32; ++i) {
    mb.tokens.push_back(i);
    mb.labels.push_back(100 + i);
  }
  for (int P : {2, 4}) {
    const int64_t c = 16 / (2 * P);
    std::vector<int> seen(32, 0);
    for (int r = 0; r < P; ++r) {
      const data::MicroBatch l = data::context_chunks(mb, P, r);
      REQUIRE(l.seq_length == 16 / P);
      const RopePositions pos = context_chunk_positions(l.seq_length, P, r);
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t t = 0; t < l.seq_length; ++t) {
          const int32_t tok = l.tokens[static_cast<size_t>(b * l.seq_length + t)];
          CHECK(tok == b * 16 + pos(t));  // the token at its true position
          CHECK(l.labels[static_cast<size_t>(b * l.seq_length + t)] == 100 + tok);
          CHECK(pos(t) / c == (t < c ? r : 2 * P - 1 - r));
          ++seen[static_cast<size_t>(tok)];
        }
    }
    for (int s : seen) CHECK(s == 1);  // every token on exactly one rank
  }
}

TEST_CASE("RoPE at two chunks' positions equals RoPE of the whole sequence, cut", "[cp][ops]") {
  const int64_t B = 2, T = 16, Hh = 2, D = 8;
  Tensor x = randn({B, T, Hh, D}, 30);
  Tensor whole = x.clone();
  ops::rope_forward(whole, 500.0, 0);
  for (int P : {2, 4})
    for (int r = 0; r < P; ++r) {
      Tensor local = cp_local(x, P, r);
      ops::rope_forward(local, 500.0, context_chunk_positions(local.size(1), P, r));
      CHECK(max_abs_diff(local, cp_local(whole, P, r)) < 1e-14);
      ops::rope_backward(local, 500.0, context_chunk_positions(local.size(1), P, r));
      CHECK(max_abs_diff(local, cp_local(x, P, r)) < 1e-14);
    }
}

// The ring's block schedule (parallel/context_parallel.cpp ring_forward / ring_backward) on the ranks' local
// tensors, in one process: step i of rank r uses the block of rank s = r - i.
TEST_CASE("load-balanced blocks merged by log-sum-exp equal full causal attention, forward and backward",
          "[cp][ops]") {
  const int64_t B = 2, H = 4, G = 2, D = 8;
  for (int P : {2, 3, 4}) {
    const int64_t T = 2 * P * 3, c = T / (2 * P);
    INFO("P " << P);
    Tensor q = randn({B, T, H, D}, 40 + P), k = randn({B, T, G, D}, 50 + P), v = randn({B, T, G, D}, 60 + P);
    Tensor dout = randn(q.shape(), 70 + P);
    Attn full = attend(q, k, v, true);
    Tensor dq = Tensor::empty(q.shape(), DType::F64), dk = Tensor::empty(k.shape(), DType::F64),
           dv = Tensor::empty(v.shape(), DType::F64);
    ops::attention_backward(dq, dk, dv, dout, q, k, v, full.out, full.lse, true);

    std::vector<Tensor> ql, kl, vl, dol, outl, lsel, dql, dkl, dvl;
    for (int r = 0; r < P; ++r) {
      ql.push_back(cp_local(q, P, r));
      kl.push_back(cp_local(k, P, r));
      vl.push_back(cp_local(v, P, r));
      dol.push_back(cp_local(dout, P, r));
    }
    auto half = [&](const Tensor& x, int64_t t0) {
      Shape s = x.shape();
      s[1] = c;
      Tensor o = Tensor::empty(s, DType::F64);
      ops::seq_copy(o, 0, x, t0, c);
      return o;
    };
    for (int r = 0; r < P; ++r) {  // forward
      Attn a = attend(ql[r], kl[r], vl[r], true);
      for (int i = 1; i < P; ++i) {
        const int s = (r - i + P) % P;
        if (s < r) {
          Attn b = attend(ql[r], half(kl[s], 0), half(vl[s], 0), false);
          ops::attention_merge(a.out, a.lse, b.out, b.lse, 0);
        } else {
          Attn b = attend(half(ql[r], c), kl[s], vl[s], false);
          ops::attention_merge(a.out, a.lse, b.out, b.lse, c);
        }
      }
      CHECK(max_abs_diff(a.out, cp_local(full.out, P, r)) < 1e-12);
      CHECK(max_abs_diff(a.lse, cp_local_lse(full.lse, P, r)) < 1e-12);
      outl.push_back(a.out);
      lsel.push_back(a.lse);
    }
    for (int r = 0; r < P; ++r) {
      dql.push_back(Tensor::zeros(ql[r].shape(), DType::F64));
      dkl.push_back(Tensor::zeros(kl[r].shape(), DType::F64));
      dvl.push_back(Tensor::zeros(vl[r].shape(), DType::F64));
    }
    for (int i = 0; i < P; ++i)  // backward, step by step (the sums' order differs from the ring's: 1e-12)
      for (int r = 0; r < P; ++r) {
        const int s = (r - i + P) % P;
        if (i == 0) {
          Tensor a = Tensor::empty(ql[r].shape(), DType::F64), bk = Tensor::empty(kl[r].shape(), DType::F64),
                 bv = Tensor::empty(vl[r].shape(), DType::F64);
          ops::attention_backward(a, bk, bv, dol[r], ql[r], kl[r], vl[r], outl[r], lsel[r], true);
          ops::add_(dql[r], a);
          ops::add_(dkl[s], bk);
          ops::add_(dvl[s], bv);
        } else if (s < r) {
          Tensor a = Tensor::empty(ql[r].shape(), DType::F64), bk = Tensor::empty(half(kl[s], 0).shape(), DType::F64),
                 bv = Tensor::empty(bk.shape(), DType::F64);
          ops::attention_backward(a, bk, bv, dol[r], ql[r], half(kl[s], 0), half(vl[s], 0), outl[r], lsel[r], false);
          ops::add_(dql[r], a);
          ops::seq_copy(dkl[s], 0, bk, 0, c, ops::GradMode::Accumulate);
          ops::seq_copy(dvl[s], 0, bv, 0, c, ops::GradMode::Accumulate);
        } else {
          Tensor lse_h = Tensor::empty({B * H, c, 1}, DType::F64);
          ops::seq_copy(lse_h, 0, lsel[r].view({B * H, 2 * c, 1}), c, c);
          Tensor a = Tensor::empty(half(ql[r], c).shape(), DType::F64), bk = Tensor::empty(kl[s].shape(), DType::F64),
                 bv = Tensor::empty(bk.shape(), DType::F64);
          ops::attention_backward(a, bk, bv, half(dol[r], c), half(ql[r], c), kl[s], vl[s], half(outl[r], c),
                                  lse_h.view({B, H, c}), false);
          ops::seq_copy(dql[r], c, a, 0, c, ops::GradMode::Accumulate);
          ops::add_(dkl[s], bk);
          ops::add_(dvl[s], bv);
        }
      }
    for (int r = 0; r < P; ++r) {
      CHECK(max_abs_diff(dql[r], cp_local(dq, P, r)) < 1e-12);
      CHECK(max_abs_diff(dkl[r], cp_local(dk, P, r)) < 1e-12);
      CHECK(max_abs_diff(dvl[r], cp_local(dv, P, r)) < 1e-12);
    }
  }
}
