#include "train/trainer.h"

#include <atomic>
#include <cstdlib>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <span>
#include <string>
#include <thread>

#include <pthread.h>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#if defined(MEGATRAIN_HAVE_CUDA)
#include "runtime/cuda/cuda_runtime.h"
#include "runtime/cuda/nccl_communicator.h"
#endif
#include "config/config_loader.h"
#include "core/log.h"
#include "data/context_chunks.h"
#include "data/dataset.h"
#include "model/gpt_model.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "parallel/grad_sync.h"
#include "parallel/layer_split.h"
#include "runtime/mesh.h"
#include "runtime/mpi_communicator.h"
#include "runtime/watchdog.h"
#include "core/counter_rng.h"
#include "tensor/cpu/cpu_ops.h"
#include "tensor/ops.h"
#include "tensor/scalar_read.h"
#include "train/metrics.h"
#include "train/moe_step.h"
#include "train/pipeline_executor.h"
#include "train/fp8_training.h"
#include "train/preflight.h"
#include "train/checkpoint_snapshot.h"
#include "train/train_checkpoint.h"

namespace mt {

namespace {

// SIGTERM, SIGUSR1 and the first SIGINT ask the loop to stop after the current iteration (saving a
// checkpoint); a second SIGINT exits at once. Only async-signal-safe calls here.
std::atomic<int> g_stop_signal{0};
std::atomic<int> g_sigint_count{0};
// this process prints the handler's lines (set before the handlers are installed; off once a fatal error is reported)
std::atomic<bool> g_signal_voice{true};
void say(const char* msg) {
  if (!g_signal_voice) return;
  ssize_t ignored = ::write(STDERR_FILENO, msg, std::strlen(msg));
  (void)ignored;
}
// One voice for the handler's lines, as for the log: rank 0 only, unless MEGATRAIN_LOG_ALL_RANKS=1. The handlers
// go in before MPI starts, so the rank is the launcher's (mpirun, srun); no launcher: rank 0. Without this, mpirun
// terminating the other ranks after rank 0's config error made each of them print a SIGTERM line.
bool signal_voice() {
  if (const char* all = std::getenv("MEGATRAIN_LOG_ALL_RANKS"); all && std::string(all) == "1") return true;
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* v = std::getenv(var)) return std::atoi(v) == 0;
  return true;
}
extern "C" void on_stop_signal(int sig) {
  if (sig == SIGINT && g_sigint_count.fetch_add(1) > 0) {
    say("megatrain: second SIGINT: exiting now without saving a checkpoint\n");
    ::_exit(130);
  }
  say(sig == SIGINT    ? "megatrain: SIGINT: stopping after the current iteration (a checkpoint is saved if "
                         "checkpoint.dir is set); press Ctrl-C again to exit at once\n"
      : sig == SIGTERM ? "megatrain: SIGTERM: stopping after the current iteration\n"
                       : "megatrain: SIGUSR1: stopping after the current iteration\n");
  g_stop_signal.store(sig);
}
const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGUSR1"; }

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

#if defined(MEGATRAIN_HAVE_CUDA)
// The GPU of this process: the local rank (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID) modulo the
// visible devices.
int local_rank(int world_rank) {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return world_rank;
}
#endif

// training.device: auto = a GPU when this build has the CUDA backend and one is visible.
Device resolve_device(const DerivedConfig& d, int world_rank) {
  if (d.device == DeviceMode::CPU) return Device::CPU;
#if defined(MEGATRAIN_HAVE_CUDA)
  std::string why;
  const int n = cuda::device_count(&why);
  if (n > 0) {
    cuda::initialize(local_rank(world_rank) % n);
    return Device::CUDA;
  }
  MT_CHECK(d.device != DeviceMode::CUDA, "training.device: cuda, but ", why, "; set training.device: cpu or auto");
#else
  (void)world_rank;
  MT_INTERNAL_ASSERT(d.device != DeviceMode::CUDA, "derive_config refuses training.device: cuda without the CUDA backend");
#endif
  return Device::CPU;
}

DType activation_dtype(const Config& cfg, const DerivedConfig& d, Device device) {
  if (d.precision == Precision::FP32) return DType::F32;
  // derive_config refuses this in a build without CUDA; here no GPU was visible (training.device auto).
  MT_CHECK(device == Device::CUDA, "training.precision: ", cfg.training.precision, " needs a GPU and this run is on the "
           "CPU (training.device: ", cfg.training.device, ", no GPU visible); set training.precision: fp32 to train on the CPU");
  return d.precision == Precision::FP16 ? DType::F16 : DType::BF16;
}

double peak_memory_gib(Device device) {
#if defined(MEGATRAIN_HAVE_CUDA)
  if (device == Device::CUDA) return static_cast<double>(cuda::allocator_stats().peak_allocated) / (1 << 30);
#endif
  (void)device;
  return 0.0;
}

// cudaMalloc calls of the caching allocator so far (0 on the CPU).
int64_t cuda_malloc_count(Device device) {
#if defined(MEGATRAIN_HAVE_CUDA)
  if (device == Device::CUDA) return static_cast<int64_t>(cuda::allocator_stats().num_cuda_mallocs);
#endif
  (void)device;
  return 0;
}

// Milliseconds the GPU's compute stream waited on communication since the last call (0 on the CPU,
// where communication is not overlapped).
double take_exposed_comm_ms(Device device) {
#if defined(MEGATRAIN_HAVE_CUDA)
  if (device == Device::CUDA) return cuda::take_exposed_comm_ms();
#endif
  (void)device;
  return 0.0;
}

// Testing the hang watchdog: MT_DEBUG_STALL_RANK=r MT_DEBUG_STALL_ITERATION=i make world rank r
// stop before iteration i's step, forever (its peers then wait in their next collective).
void debug_stall(int world_rank, int64_t iteration) {
  const char* rank = std::getenv("MT_DEBUG_STALL_RANK");
  const char* at = std::getenv("MT_DEBUG_STALL_ITERATION");
  if (!rank || std::atoi(rank) != world_rank || (at ? std::atoll(at) : 1) != iteration) return;
  log::warn("MT_DEBUG_STALL_RANK={}: rank {} stalls before iteration {} (testing the hang watchdog)", rank, world_rank,
            iteration);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// Environment switches of earlier versions: a run that sets one is refused (it would be silently ignored), naming
// what replaced it.
void refuse_removed_env_switches() {
  static constexpr const char* kRemoved[][2] = {
      {"MT_ATTENTION", "set training.attention_backend (auto, cudnn or own) instead"},
      {"MT_ATTENTION_BWD_WORKSPACE_MIB", "set training.attention_bwd_workspace_mib instead"},
      {"MT_FUSE_RESIDUAL", "a kernel comparison switch, removed"},
      {"MT_GRAD_FIRST_WRITE", "a kernel comparison switch, removed"},
      {"MT_GEMM_GELU", "a kernel comparison switch, removed"},
      {"MT_ATTENTION_FUSED", "a kernel comparison switch, removed"},
      {"MT_NORM_FWD", "a kernel comparison switch, removed"},
      {"MT_NORM_BWD", "a kernel comparison switch, removed"}};
  for (const auto& [var, instead] : kRemoved)
    if (const char* v = std::getenv(var))
      MT_CHECK(false, "environment variable ", var, "=", v, " is no longer read (", instead, "); unset it");
}

// training.attention_backend and attention_bwd_workspace_mib, for the whole process (like training.deterministic).
void set_attention_policy(const TrainingConfig& t, Device device) {
  MT_CHECK(t.attention_backend != "cudnn" || device == Device::CUDA, "training.attention_backend: cudnn, but this run "
           "is on the CPU (training.device: ", t.device, "); set training.attention_backend: auto or own");
  ops::set_attention_backend(t.attention_backend == "cudnn" ? ops::AttentionBackend::Cudnn
                             : t.attention_backend == "own" ? ops::AttentionBackend::Own
                                                            : ops::AttentionBackend::Auto);
  ops::set_attention_bwd_workspace_mib(t.attention_bwd_workspace_mib);
}

RecomputePolicy recompute_policy(const TrainingConfig& t, const DerivedConfig& d) {
  RecomputePolicy p;
  switch (d.recompute) {
    case RecomputeGranularity::None: p.mode = RecomputePolicy::Mode::None; break;
    case RecomputeGranularity::Selective: p.mode = RecomputePolicy::Mode::Selective; break;
    case RecomputeGranularity::Full: p.mode = RecomputePolicy::Mode::Full; break;
  }
  p.block = d.recompute_method == RecomputeMethod::Block;
  p.num_layers = t.recompute_num_layers;
  p.norm_act = t.recompute_norm_act;
  return p;
}

// Everything one training run holds.
struct Run {
  const Config& cfg;
  DerivedConfig d;
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Mesh> mesh;
  ModelContext ctx;
  std::unique_ptr<ParamStore> store;
  std::vector<std::unique_ptr<GPTModel>> chunks;  // this rank's model chunks (virtual pipeline)
  std::unique_ptr<PipelineExecutor> exec;
  std::unique_ptr<AdamW> opt;
  std::unique_ptr<GradSync> grad_sync;
  std::unique_ptr<Fp8Context> fp8;  // training.fp8 (null: none)
  data::Datasets data;
  std::string config_yaml;
  int64_t flops_per_token = 0;

  explicit Run(const Config& c) : cfg(c) {}
  const ParallelState& ps() const { return mesh->state(); }
  // The layout gradients, the optimizer and checkpoints see: ps() with its data-parallel group replaced by data x
  // context (Megatron's dp-cp group). Context ranks hold the same parameters and gradients of different tokens, so
  // they reduce, shard the optimizer and write checkpoints as data-parallel ranks do. Equal to ps() without context
  // parallelism.
  ParallelState grad_ps;

  uint64_t dropout_seed(int64_t iteration) const {
    return rng::mix64(cfg.training.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(iteration));
  }

  // The mean token loss over the global batch from this rank's loss sum (non-zero on the last stage).
  double global_mean(double loss_sum, int64_t iterations = 1) const {
    if (ps().pp_size > 1) loss_sum = ps().pp->all_reduce_scalar(loss_sum, ReduceOp::Sum);
    if (grad_ps.dp_size > 1) loss_sum = grad_ps.dp->all_reduce_scalar(loss_sum, ReduceOp::Sum);  // data x context
    return loss_sum / (static_cast<double>(d.tokens_per_iteration) * iterations);
  }

  double evaluate() { return evaluate(data.valid); }

  // The mean loss over the first eval_iters global batches of a split; -1 when it is empty.
  double evaluate(const std::shared_ptr<data::SampleDataset>& split) {
    if (!split || cfg.training.eval_iters <= 0) return -1;
    grad_sync->wait_params();
    // The same first eval_iters global batches of the validation split every time, so that
    // validation losses are comparable across evaluations and across resumes.
    data::BatchLoader loader(split, d.global_batch_size, cfg.training.micro_batch_size, ps().dp_rank,
                             d.data_parallel_size, 0, cfg.data.prefetch);
    double sum = 0;
    for (int64_t i = 0; i < cfg.training.eval_iters; ++i) {
      std::vector<data::MicroBatch> mbs = loader.next();
      data::context_chunks(mbs, ps().cp_size, ps().cp_rank);
      sum += exec->evaluate(mbs);
    }
    const double mean = global_mean(sum, cfg.training.eval_iters);
    take_exposed_comm_ms(ctx.device);  // evaluation's waits are not a training step's
    return mean;
  }
};

// training.skip_train (Megatron's --skip-train): the validation and test losses of the loaded weights (or of the
// initial model when nothing was loaded), logged and written to the metrics file at the loaded iteration; nothing
// is trained or saved. The same first eval_iters batches as every evaluation of a training run, so a checkpoint's
// value equals the one its run logged at that iteration (under the same precision and FP8 recipe), and the weights
// of one recipe can be evaluated under another.
template <typename Metrics, typename Summary>
TrainResult evaluate_only(Run& run, Metrics& metrics, int64_t iteration, const std::string& loaded, Summary& summary) {
  log::info("training.skip_train: evaluating {} without training (precision {}, fp8 {})",
            loaded.empty() ? std::string("the initial model (no checkpoint loaded)") : str_cat("the checkpoint ", loaded),
            run.cfg.training.precision, run.cfg.training.fp8);
  TrainResult result;
  result.last_iteration = iteration;
  result.last_val_loss = run.evaluate();
  if (result.last_val_loss >= 0) metrics.eval(iteration, result.last_val_loss);
  const bool has_test = run.data.test != nullptr;
  if (has_test) {
    result.last_test_loss = run.evaluate(run.data.test);
    if (result.last_test_loss >= 0) metrics.test(iteration, result.last_test_loss);
  }
  summary("evaluated (training.skip_train)", has_test && result.last_test_loss >= 0, result.last_test_loss);
  return result;
}

// Model FLOPs count every parameter of the whole model once (all stages), except learned
// position embeddings; the tied table once.
int64_t count_flop_params(const ParamStore& store, const ParallelState& ps) {
  int64_t n = 0;
  for (Param* p : store.params())
    if (p->spec.name != "embedding.position_embeddings.weight" && !p->spec.tied_copy && !is_expert_param(p->spec.name))
      n += shape_numel(p->spec.global_shape);  // the active experts are added by model_flops_per_token
  if (ps.pp_size > 1) n = ps.pp->all_reduce_int(n, ReduceOp::Sum);
  return n;
}

}  // namespace

void quiet_stop_signals() { g_signal_voice = false; }

void install_stop_signal_handlers() {
  g_signal_voice = signal_voice();
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGTERM, SIGUSR1, SIGINT}) {
    sigaction(sig, &sa, nullptr);
    sigaddset(&set, sig);
  }
  // A launcher may have blocked them: unblocked, one already pending is handled now.
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

TrainResult run_training(const Config& cfg) {
  const auto run_start = Clock::now();
  ops::cpu::init_cpu_threads();
  Run run(cfg);
  run.world = make_world_communicator();
  run.d = derive_config(cfg, run.world->size());
  const DerivedConfig& d = run.d;
  run.ctx.device = resolve_device(d, run.world->rank());
  train_preflight(cfg, d, run.ctx.device, run.world->rank());  // checkpoint.dir, memory: before allocating
  ops::set_deterministic(cfg.training.deterministic);
  refuse_removed_env_switches();
  set_attention_policy(cfg.training, run.ctx.device);
  Mesh::Wrap wrap;
#if defined(MEGATRAIN_HAVE_CUDA)
  // One process per GPU: every group carries device tensors over NCCL, host values over MPI.
  if (run.ctx.device == Device::CUDA && run.world->size() > 1) wrap = cuda::make_nccl_communicator;
#endif
  run.mesh = std::make_unique<Mesh>(cfg.parallel, d, *run.world, wrap);
  const ParallelState& ps = run.ps();
  run.grad_ps = ps;
  if (ps.cp_size > 1) {
    run.grad_ps.dp = ps.dp_cp;
    run.grad_ps.dp_size = ps.dp_cp_size;
    run.grad_ps.dp_rank = ps.dp_cp_rank;
  }
  const ParallelState& gps = run.grad_ps;
  if (ps.world_size > 1) watchdog::start(cfg.training.collective_timeout_s, run.mesh->coords());
#if defined(MEGATRAIN_HAVE_CUDA)
  // The groups that carry device tensors get their NCCL communicators now, in one order everywhere.
  if (wrap)
    for (Communicator* g : {ps.tp, ps.pp, ps.dp, ps.embedding, ps.cp_size > 1 ? ps.cp : nullptr,
                            ps.cp_size > 1 ? ps.dp_cp : nullptr})
      if (g) cuda::init_nccl(*g);
  // mixture of experts: the token dispatch (expert parallel) and the expert gradients (expert data parallel)
  if (wrap && cfg.model.num_experts > 0)
    for (Communicator* g : {ps.ep, ps.expert_dp})
      if (g) cuda::init_nccl(*g);
#endif
  struct StopWatchdog {
    ~StopWatchdog() { watchdog::stop(); }
  } stop_watchdog;
  run.config_yaml = config_to_yaml(cfg);
  log::info("megatrain {} | config {} | resolved:\n{}", MEGATRAIN_VERSION, cfg.source_file, run.config_yaml);

  // Model: this rank's chunks of the layer stack (virtual pipeline stages chunk * pp + pp_rank).
  run.ctx.model = &cfg.model;
  run.ctx.derived = &run.d;
  run.ctx.ps = &ps;
  run.ctx.dtype = activation_dtype(cfg, d, run.ctx.device);
#if defined(MEGATRAIN_HAVE_CUDA)
  if (run.ctx.device == Device::CUDA) log::info("device: {} | {}", cuda::device_description(), cuda::library_versions());
#endif
  run.ctx.recompute = recompute_policy(cfg.training, d);
  run.ctx.tp_comm_overlap = cfg.parallel.tp_comm_overlap;
  // One micro-batch a step without a pipeline: each backward follows its own forward, and every update (at the step's
  // end, or beside the next forward, waited for before a layer's forward reads its parameters) is done before the
  // forward that follows it (ModelContext::gradients_free_until_backward).
  run.ctx.gradients_free_until_backward = d.num_microbatches == 1 && ps.pp_size == 1;
  run.fp8 = make_fp8_context(cfg, d, run.ctx, ps.world_rank == 0);
  run.store = std::make_unique<ParamStore>(ps.tp_rank, ps.tp_size);
  std::vector<const GPTModel*> chunk_ptrs;
  for (int c = 0; c < cfg.parallel.virtual_pipeline; ++c) {
    const LayerRange lr = stage_layers(cfg.model, cfg.parallel, ps.pp_rank, c);
    ModelChunkSpec spec{lr.begin, lr.end, ps.pp_rank == 0 && c == 0,
                        ps.pp_rank == ps.pp_size - 1 && c == cfg.parallel.virtual_pipeline - 1};
    run.chunks.push_back(std::make_unique<GPTModel>(run.ctx, *run.store, spec));
    chunk_ptrs.push_back(run.chunks.back().get());
  }
  const bool distributed = cfg.parallel.distributed_optimizer && gps.dp_size > 1;
  run.store->allocate(run.ctx.dtype, run.ctx.device, distributed ? gps.dp_size : 1, distributed ? ps.expert_dp_size : 1,
                      !cfg.parallel.grad_reduce_in_fp32);
  run.store->set_grad_bucket_elements(cfg.parallel.grad_bucket_size);
  run.store->initialize(cfg.training.seed, cfg.model.init_method_std, cfg.model.num_layers);
  run.exec = std::make_unique<PipelineExecutor>(chunk_ptrs, run.ctx);
  run.opt = std::make_unique<AdamW>(*run.store, cfg.optimizer, gps, distributed);
  GradSyncOptions sync;
  sync.distributed_optimizer = distributed;
  sync.tied_embeddings = !d.features.untie_embeddings_and_output_weights;
  sync.overlap_grad_reduce = cfg.parallel.overlap_grad_reduce;
  sync.overlap_param_gather = cfg.parallel.overlap_param_gather;
  sync.num_microbatches = static_cast<int>(d.num_microbatches);
  run.grad_sync = std::make_unique<GradSync>(*run.store, gps, sync);
  run.grad_sync->set_update_waiter([opt = run.opt.get()](int64_t b, int64_t e) { opt->params_needed(b, e); });
  run.ctx.hooks = run.grad_sync.get();
  MoEStepDriver moe(chunk_ptrs, cfg.model, d, ps);
  run.flops_per_token = model_flops_per_token(count_flop_params(*run.store, ps), cfg.model, d);
  log::info("model: {} layers, {} parameters on rank 0 ({:.2f} M), gradients {}, padded vocab {}, {} micro-batches of "
            "{} per iteration and data-parallel rank",
            cfg.model.num_layers, run.store->local_numel(), run.store->local_numel() / 1e6,
            dtype_name(run.store->flat_grads().dtype()), d.padded_vocab_size, d.num_microbatches,
            cfg.training.micro_batch_size);

  // State, possibly restored.
  int64_t iteration = 0, consumed = 0, skipped_total = 0;
  LossScaler scaler(cfg.optimizer);  // used with fp16 only
  std::string last_checkpoint;       // for the end-of-run summary
  TrainResult result;
  MT_CHECK(!cfg.checkpoint.finetune || (cfg.checkpoint.load != "auto" && cfg.checkpoint.load != "none"),
           "checkpoint.finetune: true needs checkpoint.load: PATH (the checkpoint whose weights to start from); it is ",
           cfg.checkpoint.load);
  const std::string load = ckpt::resolve_load_path(cfg.checkpoint.load, cfg.checkpoint.dir);
  if (!load.empty()) {
    ckpt::LoadedCheckpoint ck = ckpt::open_checkpoint(load);
    check_checkpoint_matches_model(ck, *run.store, cfg.model.vocab_size, cfg.checkpoint.finetune, *run.world,
                                   moe.state_buffers());
    if (cfg.checkpoint.finetune) {
      // Megatron's --finetune: the weights only; iteration 0, fresh optimizer and data position.
      load_model_weights(ck, *run.store);
      load_state_buffers(ck, moe.state_buffers());
      log::info("finetuning from the weights of {} (iteration {}): starting at iteration 0 with a fresh optimizer "
                "and data position", ck.path, ck.iteration);
    } else {
      const TrainingState st = read_training_state(ck);  // before anything is loaded
      load_training_checkpoint(ck, *run.store, *run.opt, moe.state_buffers());
      iteration = st.iteration;
      consumed = st.consumed_train_samples;
      skipped_total = st.skipped_iterations;
      run.opt->set_step_count(st.optimizer_step);
      scaler.load_state(ck.state);
      fp8_load_state(run.fp8.get(), ck.state);
      log::info("resumed from {} at iteration {} ({} samples consumed)", ck.path, iteration, consumed);
      last_checkpoint = ck.path;
    }
  }
  // The optimizer holds the master weights from here on (bf16: as halves; fp16 distributed: its shard of them).
  run.opt->take_master();
  // skip_train writes nothing, so an existing checkpoint directory is no reason to refuse.
  if (!cfg.checkpoint.dir.empty() && !cfg.training.skip_train) ckpt::refuse_overwrite(cfg.checkpoint.dir, iteration);
  const int64_t first_iteration = iteration, first_consumed = consumed;

  // Data.
  const data::SampleCounts counts = data::megatron_sample_counts(cfg, d);
  run.data = data::build_datasets(cfg, d, counts.train, counts.valid, counts.test);
  MT_INTERNAL_ASSERT(run.data.train, "no train dataset (derive_config refuses a data.split whose train share is 0)");
  log::info("train data: {}", run.data.train->describe());
  if (run.data.valid) log::info("valid data: {}", run.data.valid->describe());
  if (run.data.test) log::info("test data: {}", run.data.test->describe());
  data::BatchLoader loader(run.data.train, d.global_batch_size, cfg.training.micro_batch_size, ps.dp_rank,
                           d.data_parallel_size, consumed, cfg.data.prefetch);

  MetricsWriter metrics(cfg, d, run.flops_per_token, run.ctx.device == Device::CUDA, ps.world_rank == 0);
  metrics.start(iteration, /*keep_later=*/cfg.training.skip_train);
  // checkpoint.async_save: the save in flight, committed (collectively) once every rank wrote its
  // shard, before the next save, and before the run ends; its errors surface there. Its tensors are host
  // copies in `snapshot`'s buffers (allocated once, before the first iteration; train/checkpoint_snapshot.h),
  // copied from the GPU on a side stream while training goes on.
  CheckpointSnapshot snapshot;
  std::unique_ptr<ckpt::AsyncSave> async_save;
  double save_stall_ms = 0;  // the training thread's time in save() and in finishing saves (async: waits)
  if (cfg.checkpoint.async_save && !cfg.checkpoint.dir.empty()) {
    const auto t0 = Clock::now();
    const size_t bytes = snapshot.reserve(*run.store, *run.opt, ps, moe.state_buffers());
    log::info("checkpoint.async_save: {:.2f} GiB of {}host memory for the checkpoint snapshot, allocated in {:.1f} ms",
              bytes / 1073741824.0, snapshot.pinned() ? "page-locked " : "", ms_since(t0));
  }
  auto finish_async_save = [&] {
    if (!async_save) return;
    const auto t0 = Clock::now();
    const bool busy = !async_save->written();
    const std::string path = async_save->finish();
    const double waited = ms_since(t0);
    save_stall_ms += waited;
    log::info("saved checkpoint {} (written in the background: copy wait {:.1f} s, write {:.1f} s{})", path,
              async_save->copy_wait_seconds(), async_save->write_seconds(),
              busy ? fmt::format("; training waited {:.2f} s for it", waited / 1e3) : std::string());
    async_save.reset();
    last_checkpoint = path;
  };
  auto save = [&](int64_t it) {
    if (cfg.checkpoint.dir.empty()) return;
    const auto t_save = Clock::now();
    run.grad_sync->wait_params();
    nlohmann::json state = {{"iteration", it},
                            {"consumed_train_samples", loader.consumed_samples()},
                            {"optimizer_step", run.opt->step_count()},
                            {"skipped_iterations", skipped_total},
                            {"seed", cfg.training.seed}};
    if (run.ctx.dtype == DType::F16) scaler.save_state(state);
    fp8_save_state(run.fp8.get(), state);
    if (!cfg.checkpoint.async_save) {
      std::string path = save_training_checkpoint(cfg.checkpoint.dir, it, cfg.checkpoint.keep_last, *run.store,
                                                  *run.opt, gps, state, run.config_yaml, moe.state_buffers());
      log::info("saved checkpoint {}", path);
      last_checkpoint = path;
      save_stall_ms += ms_since(t_save);
      return;
    }
    // async_save: at most one save in flight. When the previous one is still writing, training waits for it
    // here (logged by finish_async_save).
    if (async_save && !async_save->written())
      log::info("checkpoint of iteration {}: the checkpoint of iteration {} is still being written; waiting for it",
                it, async_save->iteration());
    save_stall_ms += ms_since(t_save);
    finish_async_save();
    const auto t0 = Clock::now();
    async_save = std::make_unique<ckpt::AsyncSave>(
        snapshot.take(cfg.checkpoint.dir, it, cfg.checkpoint.keep_last, *run.store, *run.opt, gps, state,
                      run.config_yaml, moe.state_buffers()),
        *run.world);
    save_stall_ms += ms_since(t0);
    log::info("checkpoint of iteration {}: snapshot {} in {:.1f} ms, writing in the background", it,
              snapshot.pinned() ? "copying on a side stream, enqueued" : "taken", ms_since(t0));
  };

  auto summary = [&](const char* how_ended, bool has_test, double test_loss) {
    RunSummary s;
    s.first_iteration = first_iteration;
    s.last_iteration = iteration;
    s.train_iters = cfg.training.train_iters;
    s.wall_seconds = ms_since(run_start) / 1e3;
    s.tokens_total = loader.consumed_samples() * cfg.model.seq_length;
    s.tokens_this_run = (loader.consumed_samples() - first_consumed) * cfg.model.seq_length;
    s.last_loss = result.last_loss;
    s.best_val = metrics.best_val();
    s.has_test = has_test;
    s.test_loss = test_loss;
    s.last_checkpoint = last_checkpoint;
    s.how_ended = how_ended;
    log_run_summary(s);
  };

  // A stop signal during start-up (data, model, loading): exit before the first iteration.
  if (const int sig = static_cast<int>(run.world->all_reduce_int(g_stop_signal.load(), ReduceOp::Max))) {
    log::info("{} received during start-up: exiting before iteration {} (nothing new to save)", signal_name(sig),
              iteration + 1);
    result.last_iteration = iteration;
    result.stopped_by_signal = true;
    return result;
  }
  if (cfg.training.skip_train) return evaluate_only(run, metrics, iteration, last_checkpoint, summary);
  IterationRecord rec;
  double interval_loss = 0, interval_ms = 0;
  int interval_iters = 0, interval_steps = 0;  // steps counted in the loss / all steps since the last log line
  int64_t last_saved = iteration, last_eval = -1;
  int64_t nan_streak = 0;           // non-finite iterations in a row (nan_policy skip)
  bool updated_since_save = false;  // periodic saves of weights no update has changed are not written
  const int64_t decay_iters = d.lr_decay_iters;
  const auto loop_start = Clock::now();
  while (iteration < cfg.training.train_iters) {
    auto t0 = Clock::now();
    const int64_t it = iteration + 1;
    std::vector<data::MicroBatch> batches = loader.next();
    data::context_chunks(batches, ps.cp_size, ps.cp_rank);  // this context rank's two chunks of each sequence
    debug_stall(ps.world_rank, it);
    watchdog::iteration_begin(it);
    run.store->zero_grads();
    run.grad_sync->start_iteration();
    // fp16: the backward runs on loss * loss_scale; the gradient norm and the update undo the scale.
    const bool fp16 = run.ctx.dtype == DType::F16;
    const double loss_scale = fp16 ? scaler.scale() : 1.0;
    moe.before_iteration(loss_scale);
    fp8_begin_step(run.fp8.get());
    const Tensor loss_sum =
        run.exec->train(batches, run.dropout_seed(it), loss_scale / static_cast<double>(d.tokens_per_iteration));
    run.grad_sync->finish();
    fp8_end_step(run.fp8.get(), ps);
    // One wait for the device per step before the update: the loss, the gradient's sums of squares (queued behind
    // the backward, so the device goes on from the backward to them without waiting for the host) and the MoE
    // layers' loss values come to the host together. (Not after the optimizer step is queued: that read would wait
    // for the whole update, and the host's logging and next batch after it.)
    const GradSquareSums squares = grad_square_sums(*run.store, gps, run.opt->shard());
    std::vector<Tensor> scalars = squares.sums;
    scalars.push_back(loss_sum);
    const std::vector<Tensor> moe_values = moe.pending_values();
    scalars.insert(scalars.end(), moe_values.begin(), moe_values.end());
    const std::vector<double> values = read_scalars(scalars);
    const std::span<const double> all(values);
    const size_t n_sums = squares.sums.size();
    const double loss = run.global_mean(all[n_sums]);
    moe.after_backward(all.subspan(n_sums + 1));  // expert bias, routing metrics
    const double gnorm =
        global_grad_norm(squares, all.first(n_sums), *run.store, gps, run.opt->distributed()) / loss_scale;
    const double lr = learning_rate(cfg.optimizer, d.decay_style, decay_iters, it);
    bool skip = false;
    // A non-finite loss is divergence (training.nan_policy); with fp16 a non-finite gradient alone is
    // an overflow of the scaled gradients: the loss scaler's business, never nan_policy's.
    // The update's effect on Adam's second moment is checked before it is applied: an Inf there
    // would silently freeze those weights from then on (optim/adamw.h, AdamW::would_overflow).
    const double clip_scale =
        (cfg.optimizer.clip_grad > 0 && gnorm > cfg.optimizer.clip_grad) ? cfg.optimizer.clip_grad / (gnorm + 1e-6) : 1.0;
    const bool moments_overflow = std::isfinite(gnorm) && run.opt->would_overflow(gnorm * clip_scale);
    if (!std::isfinite(loss) || (!fp16 && !std::isfinite(gnorm)) || moments_overflow) {
      const std::string what = moments_overflow
                                   ? str_cat("gradient norm ", gnorm, " would overflow Adam's second moment")
                                   : str_cat("loss ", loss, ", gradient norm ", gnorm, " is not finite");
      MT_CHECK(d.nan_policy == NanPolicy::Skip, "iteration ", it, ": ", what,
               "; stopping (the last checkpoint is untouched). Lower optimizer.lr, or set "
               "training.nan_policy: skip to skip such iterations");
      ++nan_streak;
      MT_CHECK(nan_streak < cfg.training.nan_max_skips, "iteration ", it, ": ", what, ", the ", nan_streak,
               "th such iteration in a row (training.nan_max_skips = ", cfg.training.nan_max_skips,
               "); stopping (the last checkpoint is untouched). Lower optimizer.lr, or resume from an earlier "
               "checkpoint");
      skip = true;
      ++skipped_total;
      ++rec.skipped;
      log::warn("iteration {}: {}, update skipped ({} in a row, training.nan_max_skips = {})", it, what, nan_streak,
                cfg.training.nan_max_skips);
    } else if (fp16) {
      const bool overflow = !std::isfinite(gnorm);
      scaler.update(overflow);
      if (overflow) {
        skip = true;
        ++skipped_total;
        ++rec.skipped;
        log::warn("iteration {}: fp16 gradient overflow at loss scale {:g}, update skipped; loss scale now {:g}", it,
                  loss_scale, scaler.scale());
        interval_loss += loss;  // the forward was fine: its loss counts
        ++interval_iters;
      }
    }
    if (!skip) {
      const double clip = cfg.optimizer.clip_grad;
      const double scale = (clip > 0 && gnorm > clip) ? clip / (gnorm + 1e-6) : 1.0;
      snapshot.before_update();  // the step must not overwrite values an async save is still copying
      run.opt->step(lr, scale / loss_scale, gnorm * scale);
      run.grad_sync->gather_params();
      nan_streak = 0;
      updated_since_save = true;
      interval_loss += loss;
      ++interval_iters;
    }
    iteration = it;
    rec.comm_exposed_ms += take_exposed_comm_ms(run.ctx.device);
    interval_ms += ms_since(t0);
    ++interval_steps;
    watchdog::iteration_end(it);
    result.last_iteration = it;
    result.last_loss = loss;

    // The first line at iteration 1 (a newcomer sees the run start), then every log_interval.
    const bool log_now = it == 1 || it % cfg.logging.log_interval == 0 || it == cfg.training.train_iters;
    if (log_now) {
      rec.iteration = it;
      rec.consumed_samples = loader.consumed_samples();
      rec.loss = interval_iters ? interval_loss / interval_iters : NAN;
      rec.grad_norm = gnorm;
      rec.lr = lr;
      rec.loss_scale = scaler.scale();
      const int64_t n_iters = interval_steps;
      rec.ms_per_iter = interval_ms / static_cast<double>(n_iters);
      rec.comm_exposed_ms /= static_cast<double>(n_iters);
      rec.moe = moe.take_interval();
      rec.cuda_mallocs = cuda_malloc_count(run.ctx.device);
      double mem = peak_memory_gib(run.ctx.device);
      if (ps.world_size > 1) mem = run.world->all_reduce_scalar(mem, ReduceOp::Max);
      metrics.train(rec, mem);
      rec = IterationRecord{};
      interval_loss = interval_ms = 0;
      interval_iters = interval_steps = 0;
    }
    if (cfg.training.eval_interval > 0 && it % cfg.training.eval_interval == 0) {
      result.last_val_loss = run.evaluate();
      if (!(result.last_val_loss < 0)) metrics.eval(it, result.last_val_loss);  // NaN too: logged as null
      last_eval = it;
    }
    const int stop_sig = static_cast<int>(run.world->all_reduce_int(g_stop_signal.load(), ReduceOp::Max));
    const bool stop_signal = stop_sig != 0;
    const bool exit_now = cfg.training.exit_interval > 0 && it % cfg.training.exit_interval == 0;
    const bool periodic = cfg.checkpoint.save_interval > 0 && it % cfg.checkpoint.save_interval == 0;
    if (periodic && !updated_since_save && !stop_signal && !exit_now && !cfg.checkpoint.dir.empty()) {
      log::warn("iteration {}: no update since the checkpoint of iteration {} (every iteration skipped): not saving "
                "the same weights again", it, last_saved);
    } else if (periodic || stop_signal || exit_now) {
      save(it);
      last_saved = it;
      updated_since_save = false;
    }
    if (async_save && run.world->all_reduce_int(async_save->written() ? 1 : 0, ReduceOp::Min) == 1) finish_async_save();
    if (stop_signal || exit_now) {
      run.grad_sync->wait_params();  // the update beside the compute stream, before anyone reads the weights
      finish_async_save();
      log::info("{} at iteration {}: {}, exiting", stop_signal ? str_cat(signal_name(stop_sig), " received") : "exit_interval reached",
                it, cfg.checkpoint.dir.empty() ? "no checkpoint saved (checkpoint.dir is empty)" : "checkpoint saved");
      result.stopped_by_signal = stop_signal;
      summary(stop_signal ? "stopped by a signal" : "stopped at training.exit_interval", false, 0);
      return result;
    }
  }
  run.grad_sync->wait_params();  // the last update beside the compute stream, before anyone reads the weights
  if (iteration > first_iteration)
    log::info("training loop: iterations {}..{} in {:.3f} s, of which {:.3f} s in checkpoint saves", first_iteration + 1,
              iteration, ms_since(loop_start) / 1e3, save_stall_ms / 1e3);
  if (iteration == first_iteration) {
    // A finished job run again: nothing to train, evaluate or save.
    log::info("training already done: resumed at iteration {} and training.train_iters is {}; nothing to do "
              "(raise training.train_iters to train on)", iteration, cfg.training.train_iters);
    summary("already finished", false, 0);
    return result;
  }
  if (last_eval != iteration) {
    result.last_val_loss = run.evaluate();
    if (!(result.last_val_loss < 0)) metrics.eval(iteration, result.last_val_loss);  // NaN too: logged as null
  }
  if (last_saved != iteration) save(iteration);
  finish_async_save();
  // The test split once, at the end of training (as Megatron does).
  const bool has_test = run.data.test && cfg.training.eval_iters > 0;
  if (has_test) {
    result.last_test_loss = run.evaluate(run.data.test);
    // As validation: a record only for a finite loss.
    if (result.last_test_loss >= 0)
      metrics.test(iteration, result.last_test_loss);
    else
      log::warn("test at iter {}: the test loss is not finite ({}); no record written", iteration, result.last_test_loss);
  } else {
    log::info("test: skipped, {}", cfg.training.eval_iters <= 0 ? "training.eval_iters is 0"
                                                                : "the test split is empty (data.split gives it weight 0)");
  }
  log::info("training done: {} iterations, last loss {:.6f}", iteration, result.last_loss);
  summary("finished", has_test && result.last_test_loss >= 0, result.last_test_loss);
  return result;
}

}  // namespace mt
