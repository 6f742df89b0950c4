// The gradient norm's sums of squares taken from their producer (ParamStore::record_grad_squares: the experts'
// weight-gradient GEMMs make them from their fp32 tiles): grad_square_sums uses a recorded range in place of a pass
// over its gradients only where nothing has changed them since (no data-parallel or sequence-parallel sum), only
// for a range this rank counts whole, and only for the step it was recorded in.
#include <cmath>
#include <vector>

#include "catch.h"
#include "optim/adamw.h"
#include "params/param_store.h"
#include "tensor/scalar_read.h"

using namespace mt;

namespace {

struct Fixture {
  ParamStore store{0, 1};
  ParallelState ps;
  int64_t expert_begin = 0;  // the two experts' weights: [expert_begin, expert_begin + 6)
  Fixture() {
    auto add = [&](const char* name, int64_t n, bool expert) {
      ParamSpec s;
      s.name = name;
      s.global_shape = {n};
      s.expert_parallel = expert;
      s.sequence_parallel_grad = expert;  // as the experts under sequence parallelism
      store.add(s);
    };
    add("dense", 4, false);
    add("experts.0.w", 3, true);
    add("experts.1.w", 3, true);
    store.allocate(DType::F64, Device::CPU);
    expert_begin = static_cast<int64_t>(store.find("experts.0.w")->flat_offset);
    double* g = store.flat_grads().data<double>();
    const double dense[] = {1, 2, 3, 4}, experts[] = {0.5, -1.5, 2.5, 3, -4, 0.25};
    for (int i = 0; i < 4; ++i) g[store.find("dense")->flat_offset + i] = dense[i];
    for (int i = 0; i < 6; ++i) g[expert_begin + i] = experts[i];
  }
  double true_norm() const { return std::sqrt(1 + 4 + 9 + 16 + 0.25 + 2.25 + 6.25 + 9 + 16 + 0.0625); }
  double norm() {
    const std::vector<ShardRange> shard = {{0, store.padded_numel()}};
    const GradSquareSums s = grad_square_sums(store, ps, shard);
    double sum = 0;  // (global_grad_norm would then sum over the groups of ps, which have no communicators here)
    for (double v : read_scalars(s.sums)) sum += v;
    return std::sqrt(sum);
  }
  // parts summing to `total`
  void record(int64_t begin, int64_t end, double total) {
    Tensor parts = Tensor::empty({2}, DType::F64);
    parts.data<double>()[0] = total / 4, parts.data<double>()[1] = total - total / 4;
    store.record_grad_squares(begin, end, parts);
  }
};

}  // namespace

TEST_CASE("grad norm: a recorded range's sums stand for its gradients", "[optim][grad_norm]") {
  Fixture f;
  CHECK(f.norm() == Approx(f.true_norm()).epsilon(1e-15));
  // the right sums: the same norm
  f.record(f.expert_begin, f.expert_begin + 6, 0.25 + 2.25 + 6.25 + 9 + 16 + 0.0625);
  CHECK(f.norm() == Approx(f.true_norm()).epsilon(1e-15));
  // other sums: they are what counts (the gradients are not read again)
  f.record(f.expert_begin, f.expert_begin + 6, 1000);
  CHECK(f.norm() == Approx(std::sqrt(30 + 1000.0)).epsilon(1e-15));
  // one expert's range only
  f.store.record_grad_squares(f.expert_begin, f.expert_begin + 6, Tensor());  // forgotten
  CHECK(f.norm() == Approx(f.true_norm()).epsilon(1e-15));
  f.record(f.expert_begin + 3, f.expert_begin + 6, 7);
  CHECK(f.norm() == Approx(std::sqrt(30 + 0.25 + 2.25 + 6.25 + 7)).epsilon(1e-15));
  // a new step forgets them
  f.store.zero_grads();
  CHECK(f.norm() == Approx(f.true_norm()).epsilon(1e-15));
}

TEST_CASE("grad norm: recorded sums are not used where the gradients change after their producer",
          "[optim][grad_norm]") {
  SECTION("summed over expert data parallel") {
    Fixture f;
    f.ps.expert_dp_size = 2;  // GradSync sums the expert gradients over two ranks after the backward
    f.record(f.expert_begin, f.expert_begin + 6, 1000);
    CHECK(f.norm() == Approx(f.true_norm()).epsilon(1e-15));
  }
  SECTION("summed over tensor parallel (sequence parallelism)") {
    Fixture f;
    f.ps.tp_size = 2;
    f.record(f.expert_begin, f.expert_begin + 6, 1000);
    CHECK(f.norm() == Approx(f.true_norm()).epsilon(1e-15));
  }
  SECTION("a range that cuts a parameter") {
    Fixture f;
    f.record(f.expert_begin, f.expert_begin + 4, 1000);
    CHECK(f.norm() == Approx(f.true_norm()).epsilon(1e-15));
  }
}
