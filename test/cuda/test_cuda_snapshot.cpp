// checkpoint.async_save on a GPU with the bf16 master weights held as halves (optim/adamw.h take_master): the
// snapshot joins them on its side stream, kJoinPiece elements at a time through one device buffer, and copies each
// piece out before the next overwrites it (train/checkpoint_snapshot.h). Its data equals, bit for bit, the
// synchronous save's (joined through a device piece into host memory) and the halves joined on the CPU, with an
// optimizer step enqueued behind it (ordered after the copies by before_update).
#include "catch.h"

#if defined(MEGATRAIN_HAVE_CUDA)
#include <cstring>
#include <stdexcept>
#include <string>

#include "cuda/cuda_context.h"
#include "optim/adamw.h"
#include "params/param_store.h"
#include "runtime/cuda/cuda_runtime.h"
#include "tensor/master_halves_ops.h"
#include "test_cuda_util.h"
#include "train/checkpoint_snapshot.h"
#include "train/train_checkpoint.h"

using namespace mt;
using namespace mt::gpu_test;

TEST_CASE("cuda async snapshot of bf16 master halves equals the synchronous save",
          "[cuda][checkpoint][master_halves]") {
  init();
  ParamStore store{0, 1};
  for (const auto& [name, shape] : {std::pair<const char*, Shape>{"layers.0.big", {kJoinPiece + 4099}},
                                    std::pair<const char*, Shape>{"layers.0.small", {33, 17}}}) {
    ParamSpec s;
    s.name = name;
    s.global_shape = shape;
    store.add(s);
  }
  store.allocate(DType::BF16, Device::CUDA);
  store.initialize(5, 0.02, 1);
  OptimizerConfig cfg;
  ParallelState ps;
  AdamW opt(store, cfg, ps, false);
  opt.take_master();
  const int64_t n = store.padded_numel();
  auto step = [&](uint64_t seed) {
    store.flat_grads().copy_from(to_device(rounded(randn64({n}, seed, 0.01), DType::F32), DType::F32));
    opt.step(1e-3, 1.0);
    opt.wait_update();
  };
  step(31);
  Tensor want = Tensor::empty({n}, DType::F32);
  ops::join_master(want, to_host(store.flat_values()), to_host(opt.master_low_halves()));

  const ckpt::SaveRequest sync = training_save_request("/tmp/unused", 1, 0, store, opt, ps, {}, "");
  CheckpointSnapshot snap;
  ckpt::SaveRequest async = snap.take("/tmp/unused", 1, 0, store, opt, ps, {}, "");
  snap.before_update();
  step(32);  // behind the snapshot's copies
  if (async.wait_ready) async.wait_ready();
  REQUIRE(sync.tensors.size() == async.tensors.size());
  int masters = 0;
  for (size_t i = 0; i < sync.tensors.size(); ++i) {
    const ckpt::ShardTensor &a = sync.tensors[i], &b = async.tensors[i];
    INFO(a.name);
    REQUIRE(a.name == b.name);
    REQUIRE(a.data.nbytes() == b.data.nbytes());
    CHECK(std::memcmp(a.data.raw(), b.data.raw(), a.data.nbytes()) == 0);
    if (a.name.find('/') != std::string::npos) continue;  // exp_avg, exp_avg_sq
    ++masters;
    const Param* p = store.find(a.name);
    REQUIRE(p != nullptr);
    REQUIRE(a.data.dtype() == DType::F32);
    CHECK(std::memcmp(a.data.raw(), want.data<float>() + p->flat_offset, a.data.nbytes()) == 0);
  }
  CHECK(masters == 2);
}

// The snapshot's and the update's side-stream scopes (runtime/cuda/cuda_runtime.h SideStreamScope): launches go to the
// side stream inside, and to the compute stream again after end(), and after an exception that left the scope early.
TEST_CASE("cuda side-stream scopes give the compute stream back, also when an exception leaves them",
          "[cuda][checkpoint][adamw]") {
  init();
  const cudaStream_t compute = mt::cuda::current_stream();
  for (const auto kind : {cuda::SideStreamScope::kSnapshot, cuda::SideStreamScope::kUpdate}) {
    INFO("kind " << kind);
    {
      cuda::SideStreamScope scope(kind, true);
      CHECK(mt::cuda::current_stream() != compute);
      scope.end();
      CHECK(mt::cuda::current_stream() == compute);
    }
    CHECK(mt::cuda::current_stream() == compute);
    try {
      const cuda::SideStreamScope scope(kind, true);
      throw std::runtime_error("a failure between begin and end");
    } catch (const std::runtime_error&) {
    }
    CHECK(mt::cuda::current_stream() == compute);
    {
      const cuda::SideStreamScope off(kind, false);
      CHECK(mt::cuda::current_stream() == compute);
    }
  }
}

// The compute stream one priority level above both side streams (cuda/cuda_context.h): when SMs free up, the
// forward's blocks go before the optimizer update's and the snapshot's.
TEST_CASE("cuda compute stream one priority level above the side streams", "[cuda][checkpoint][adamw]") {
  init();
  int least = 0, greatest = 0;
  REQUIRE(cudaDeviceGetStreamPriorityRange(&least, &greatest) == cudaSuccess);
  if (least == greatest) {
    WARN("skipped: this device has one stream priority level");
    return;
  }
  int compute = 0;
  REQUIRE(cudaStreamGetPriority(mt::cuda::current_stream(), &compute) == cudaSuccess);
  CHECK(compute == least - 1);  // (a lower number is a higher priority)
  for (const auto kind : {cuda::SideStreamScope::kSnapshot, cuda::SideStreamScope::kUpdate}) {
    INFO("kind " << kind);
    cuda::SideStreamScope scope(kind, true);
    int side = 0;
    REQUIRE(cudaStreamGetPriority(mt::cuda::current_stream(), &side) == cudaSuccess);
    scope.end();
    CHECK(side > compute);
  }
}

#endif  // MEGATRAIN_HAVE_CUDA
