// Every collective of the MPI communicator on the world group with rank-valued inputs and
// closed-form results, and the sequence-parallel mappings as adjoint pairs
// (sum over ranks of <f(x), y> equals the sum of <x, f^T(y)>). Runs plain (one rank) and under
// `mpirun -np 8` / `-np 4` with the other [mpi] tests (test/CMakeLists.txt).
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "parallel/mappings.h"
#include "runtime/mpi_communicator.h"
#include "test/catch.h"

using namespace mt;

namespace {
Tensor filled(int64_t n, DType t, const std::function<double(int64_t)>& f) {
  Tensor x = Tensor::empty({n}, t);
  for (int64_t i = 0; i < n; ++i) {
    if (t == DType::F32) x.data<float>()[i] = static_cast<float>(f(i));
    else if (t == DType::F64) x.data<double>()[i] = f(i);
    else x.data<int64_t>()[i] = static_cast<int64_t>(f(i));
  }
  return x;
}
double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.data<double>()[i] * b.data<double>()[i];
  return s;
}
}  // namespace

TEST_CASE("MPI communicator collectives give closed-form results", "[mpi][communicator]") {
  auto world = make_world_communicator();
  const int r = world->rank(), n = world->size();
  const int64_t L = 5;

  Tensor s = filled(L, DType::F32, [&](int64_t i) { return (r + 1) * (i + 1); });
  world->all_reduce(s, ReduceOp::Sum);
  for (int64_t i = 0; i < L; ++i) CHECK(s.data<float>()[i] == static_cast<float>(n * (n + 1) / 2 * (i + 1)));
  Tensor mx = filled(L, DType::I64, [&](int64_t i) { return r * 10 + i; });
  world->all_reduce(mx, ReduceOp::Max);
  CHECK(mx.data<int64_t>()[3] == (n - 1) * 10 + 3);
  Tensor mn = filled(L, DType::F64, [&](int64_t i) { return r - i; });
  world->all_reduce(mn, ReduceOp::Min);
  CHECK(mn.data<double>()[2] == -2.0);

  // reduce_scatter: chunk c of rank q holds q + c*100 + i; this rank gets chunk r summed over q.
  Tensor in = filled(L * n, DType::F64, [&](int64_t k) { return r + (k / L) * 100 + k % L; });
  Tensor out = Tensor::empty({L}, DType::F64);
  world->reduce_scatter(out, in, ReduceOp::Sum);
  for (int64_t i = 0; i < L; ++i) CHECK(out.data<double>()[i] == n * (n - 1) / 2.0 + n * (r * 100.0 + i));

  // all_gather: chunk q of the result is rank q's tensor.
  Tensor part = filled(L, DType::F32, [&](int64_t i) { return r * 10 + i; });
  Tensor all = Tensor::empty({L * n}, DType::F32);
  world->all_gather(all, part);
  for (int64_t k = 0; k < L * n; ++k) CHECK(all.data<float>()[k] == static_cast<float>((k / L) * 10 + k % L));

  // all_to_all: chunk j of rank q (value q*100 + j) arrives at rank j as chunk q.
  Tensor a2a_in = filled(2 * n, DType::F64, [&](int64_t k) { return r * 100 + k / 2; });
  Tensor a2a_out = Tensor::empty({2 * n}, DType::F64);
  world->all_to_all(a2a_out, a2a_in);
  for (int64_t k = 0; k < 2 * n; ++k) CHECK(a2a_out.data<double>()[k] == (k / 2) * 100.0 + r);

  // broadcast from the last rank.
  Tensor b = filled(L, DType::F64, [&](int64_t i) { return r == n - 1 ? 7.0 + i : -1.0; });
  world->broadcast(b, n - 1);
  CHECK(b.data<double>()[4] == 11.0);

  // A ring in one batch: send to the next rank and receive from the previous, in both directions.
  if (n > 1) {
    Tensor to_next = filled(L, DType::F64, [&](int64_t i) { return r * 1000 + i; });
    Tensor to_prev = filled(L, DType::F64, [&](int64_t i) { return -(r * 1000 + i); });
    Tensor from_prev = Tensor::empty({L}, DType::F64), from_next = Tensor::empty({L}, DType::F64);
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    world->batch_p2p({{P2POp::Kind::Recv, &from_next, next, 1}, {P2POp::Kind::Send, &to_next, next, 0},
                      {P2POp::Kind::Send, &to_prev, prev, 1}, {P2POp::Kind::Recv, &from_prev, prev, 0}});
    CHECK(from_prev.data<double>()[2] == prev * 1000.0 + 2);
    CHECK(from_next.data<double>()[2] == -(next * 1000.0 + 2));
    // Plain send/recv between pairs (0,1), (2,3), ...
    Tensor msg = filled(L, DType::F64, [&](int64_t i) { return r + 0.5 * i; });
    if (r % 2 == 0 && r + 1 < n) world->send(msg, r + 1);
    if (r % 2 == 1) {
      world->recv(msg, r - 1);
      CHECK(msg.data<double>()[1] == r - 1 + 0.5);
    }
  }
  world->barrier();
}

TEST_CASE("sequence-parallel and tensor-parallel mappings are adjoint pairs", "[mpi][mappings]") {
  auto world = make_world_communicator();
  ParallelState ps;
  ps.tp = world.get();
  ps.tp_rank = world->rank();
  ps.tp_size = world->size();
  const int n = ps.tp_size;
  std::mt19937_64 g(1000 + ps.tp_rank);  // different data on every rank
  std::normal_distribution<double> u;
  auto randn = [&](Shape s) {
    Tensor t = Tensor::empty(s, DType::F64);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = u(g);
    return t;
  };
  auto global = [&](double local) { return world->all_reduce_scalar(local, ReduceOp::Sum); };

  // GatherFromSP: x_r (rows/n, C) -> X (rows, C); its backward reduce-scatters G_r (rows, C).
  Tensor x = randn({3, 4}), G = randn({3 * n, 4});
  Tensor X = GatherFromSP::forward(x, ps);
  Tensor gx = GatherFromSP::backward(G, ps);
  CHECK(global(dot(X, G)) == Approx(global(dot(x, gx))).epsilon(1e-12));

  // ReduceScatterToSP is the adjoint pair the other way round.
  Tensor Y = randn({3 * n, 4}), y = randn({3, 4});
  Tensor rs = ReduceScatterToSP::forward(Y, ps);
  Tensor ag = ReduceScatterToSP::backward(y, ps);
  CHECK(global(dot(rs, y)) == Approx(global(dot(Y, ag))).epsilon(1e-12));

  // CopyToTP / ReduceFromTP: for replicated x (the same on every rank) the copy's backward sums.
  Tensor xr = Tensor::empty({6}, DType::F64);
  for (int64_t i = 0; i < 6; ++i) xr.data<double>()[i] = 0.25 * i - 0.5;
  Tensor Gr = randn({6});
  const double lhs = global(dot(xr, Gr));  // sum_r <copy(x), G_r>
  Tensor gsum = Gr.clone();
  CopyToTP::backward(gsum, ps);            // all-reduce
  CHECK(lhs == Approx(dot(xr, gsum)).epsilon(1e-12));
  Tensor red = Gr.clone();
  ReduceFromTP::forward(red, ps);
  CHECK(dot(red, gsum) == Approx(dot(gsum, gsum)).epsilon(1e-12));  // forward == backward of the copy
}
