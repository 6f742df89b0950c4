// Context-parallel attention (parallel/context_parallel.h) over the world as one context group (P = world size: 2 and
// 4 under mpirun, see test/CMakeLists.txt): every rank's out, lse, dq, dk and dv equal its chunks of single-process
// causal attention on the whole sequence (fp64, 1e-12), for the ring (p2p) and all-to-all (a2a), multi-head and
// grouped-query, one and two sequences; and two runs give the same bits (the fixed accumulation order).
#include <memory>

#include "catch.h"
#include "cp/cp_reference.h"
#include "ops/gradcheck.h"
#include "parallel/context_parallel.h"
#include "runtime/mpi_communicator.h"

using namespace mt;
using namespace mt::test;

TEST_CASE("context-parallel attention equals full causal attention on every rank", "[cp][mpi]") {
  std::unique_ptr<Communicator> world = make_world_communicator();
  const int P = world->size(), r = world->rank();
  if (P == 1) {
    WARN("a world of one rank: run under mpirun (ctest cp_mpi_np2, cp_mpi_np4)");
    return;
  }
  ParallelState ps;
  ps.world_size = ps.cp_size = P;
  ps.world_rank = ps.cp_rank = r;
  ps.cp = world.get();
  struct Case {
    int64_t B, H, G;
    CpCommType type;
  } cases[] = {{2, 4, 4, CpCommType::P2P}, {1, 8, 4, CpCommType::P2P}, {2, 8, 4, CpCommType::A2A},
               {1, 4, 4, CpCommType::A2A}};
  for (const Case& cs : cases) {
    if (cs.type == CpCommType::A2A && cs.G % P != 0) continue;
    const int64_t B = cs.B, H = cs.H, G = cs.G, D = 8, T = 2 * P * 3;
    INFO((cs.type == CpCommType::P2P ? "p2p" : "a2a") << " B " << B << " H " << H << " G " << G << " P " << P
                                                      << " rank " << r);
    Tensor q = randn({B, T, H, D}, 1), k = randn({B, T, G, D}, 2), v = randn({B, T, G, D}, 3);
    Tensor dout = randn(q.shape(), 4);
    Tensor out = Tensor::empty(q.shape(), DType::F64), lse = Tensor::empty({B, H, T}, DType::F64);
    ops::attention_forward(out, lse, q, k, v);
    Tensor dq = Tensor::empty(q.shape(), DType::F64), dk = Tensor::empty(k.shape(), DType::F64),
           dv = Tensor::empty(v.shape(), DType::F64);
    ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse);

    const Tensor ql = cp_local(q, P, r), kl = cp_local(k, P, r), vl = cp_local(v, P, r), dol = cp_local(dout, P, r);
    auto run = [&] {
      Tensor o = Tensor::empty(ql.shape(), DType::F64), l = Tensor::empty({B, H, T / P}, DType::F64);
      context_attention_forward(o, l, ql, kl, vl, cs.type, ps);
      Tensor gq = Tensor::empty(ql.shape(), DType::F64), gk = Tensor::empty(kl.shape(), DType::F64),
             gv = Tensor::empty(vl.shape(), DType::F64);
      context_attention_backward(gq, gk, gv, dol, ql, kl, vl, o, l, cs.type, ps);
      return std::vector<Tensor>{o, l, gq, gk, gv};
    };
    const std::vector<Tensor> got = run(), again = run();
    CHECK(max_abs_diff(got[0], cp_local(out, P, r)) < 1e-12);
    if (cs.type == CpCommType::P2P) CHECK(max_abs_diff(got[1], cp_local_lse(lse, P, r)) < 1e-12);
    CHECK(max_abs_diff(got[2], cp_local(dq, P, r)) < 1e-12);
    CHECK(max_abs_diff(got[3], cp_local(dk, P, r)) < 1e-12);
    CHECK(max_abs_diff(got[4], cp_local(dv, P, r)) < 1e-12);
    for (size_t i = 0; i < got.size(); ++i) CHECK(bitwise_equal(got[i], again[i]));
  }
}
