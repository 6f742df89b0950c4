// Causal grouped-query attention, bf16 or fp16, through cuDNN's fused flash-attention engine (the graph
// API's composite SDPA graphs, built with raw cudnnBackend* calls; /work/shared/notes/cudnn-sdpa.md
// has the sources, the constraints of cuDNN 9.14 and what was measured). Same math and the same
// saved statistics as our kernels (attention.cu): lse (B, H, T) = natural-log sum-exp of the scaled,
// masked scores, so either backward can follow either forward.
// Shapes as cuDNN sees them (logical [b, h, s, d], any strides, last stride 1):
//   O, dO        [B, H, T, D] strides {T H D, D, H D, 1}   (our (B, T, H, D))
//   Q, dQ        [B, H, T, D] and K, V, dK, dV [B, G, T, D], strides per CudnnLayout: separate tensors
//                (B, T, H|G, D), or read (written) in place in the fused projection (B, T, 3 H D) of
//                multi-head attention, {T 3HD, 3D, 3HD, 1} at offsets 0, D, 2D. K is passed as K^T by
//                swapping the last two dims and strides. Stats [B, H, T, 1] strides {H T, T, 1, 1} (lse).
// Context-parallel blocks (s.causal false): K, V have Tk rows (Tk may differ from T), scores [B, H, T, Tk], no mask
// (and no -inf scalar: the variant pack binds only the tensors a graph has, see Graph::execute).
// Forward graph (14 ops): S = Q K^T; S *= c; causal mask (row >= col, else -inf); m = max_j S;
//   E = exp(S - m); l = sum_j E; Stats = m + log l; P = E / l (io type); O = P V.
// Backward graph (21 ops, + 2 head reductions under GQA): delta = sum_d dO O; P = exp(c Q K^T - Stats)
//   (masked); dV = P^T dO; dS = P (dO V^T - delta) c; dK = dS^T Q; dQ = dS K. Deterministic form (the default:
//   no dQ accumulator, no float atomics): its workspace grows as B H T^2, so it runs in batch chunks
//   (backward_batch_chunk). Under ops::set_deterministic(false), dQ is accumulated in fp32 with atomics
//   (dQ_accum, one more op converting it), faster and without the B H T^2 workspace.
// Plans are built once per shape (heuristics mode A, first configuration that finalizes) and cached;
// the first build of a kernel variant compiles it with NVRTC (~0.5-1 s). A shape cuDNN refuses is
// remembered and runs on our kernels (the caller falls back). training.attention_backend
// (ops::attention_backend()): own turns cuDNN off; cudnn makes a fallback an error (check_own_kernels_allowed).
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/attention_common.cuh"
#include "core/op_policy.h"

namespace mt::ops::cuda::attn {

using namespace ::mt::cuda;

namespace {

using Dims = std::array<int64_t, 4>;

// A failed backend call while building a graph or plan: the shape falls back to our kernels.
struct BuildError {
  std::string what;
};

void ok(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  char msg[512] = {0};
  cudnnGetLastErrorString(msg, sizeof msg);
  throw BuildError{std::string(what) + ": " + cudnnGetErrorString(s) + (msg[0] ? std::string(" (") + msg + ")" : "")};
}

Dims packed(const Dims& d) { return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1}; }

// Unique ids of the tensors the caller binds at execution (virtual tensors count up from 100).
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kDO, kDQ, kDK, kDV, kOne, kSoftmaxSum, kDQAccum,
};

// All descriptors of one graph and its plan; destroyed together.
class Graph {
 public:
  explicit Graph(cudnnHandle_t h) : handle_(h) {}
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() {
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }

  cudnnBackendDescriptor_t create(cudnnBackendDescriptorType_t t) {
    cudnnBackendDescriptor_t d = nullptr;
    ok(cudnnBackendCreateDescriptor(t, &d), "cudnnBackendCreateDescriptor");
    owned_.push_back(d);
    return d;
  }
  template <typename V>
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, const V* v,
           int64_t n = 1) {
    ok(cudnnBackendSetAttribute(d, a, t, n, v), "cudnnBackendSetAttribute");
  }
  void finalize(cudnnBackendDescriptor_t d, const char* what) { ok(cudnnBackendFinalize(d), what); }

  // A 4-D tensor; uid < 0: a virtual one with a fresh id.
  cudnnBackendDescriptor_t tensor(cudnnDataType_t dt, const Dims& dims, const Dims& strides, int64_t uid = -1,
                                  bool by_value = false) {
    cudnnBackendDescriptor_t d = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const bool is_virtual = uid < 0;
    if (is_virtual) uid = next_virtual_++;
    const int64_t align = 16;
    set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &dt);
    set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), 4);
    set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), 4);
    set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid);
    set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &align);
    set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &is_virtual);
    if (by_value) {
      const bool bv = true;
      set(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &bv);
    }
    finalize(d, "tensor");
    if (!is_virtual) bound_.push_back(uid);
    return d;
  }
  cudnnBackendDescriptor_t virt(const Dims& dims, cudnnDataType_t dt = CUDNN_DATA_FLOAT) {
    return tensor(dt, dims, packed(dims));
  }
  cudnnBackendDescriptor_t virt(const Dims& dims, const Dims& strides, cudnnDataType_t dt = CUDNN_DATA_FLOAT) {
    return tensor(dt, dims, strides);
  }
  // A by-value fp32 scalar {1, 1, 1, 1} (its host value is bound at execution).
  cudnnBackendDescriptor_t scalar(int64_t uid) { return tensor(CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, uid, true); }

  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, cudnnDataType_t prec = CUDNN_DATA_FLOAT,
                 int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &prec);
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &axis);
    finalize(pw, "pointwise descriptor");
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, &pw);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &x);
    if (b) set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &b);
    if (t) set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &t);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &y);
    finalize(op, "pointwise operation");
    ops_.push_back(op);
  }
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t mm = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &comp);
    finalize(mm, "matmul descriptor");
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &a);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &b);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &c);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &mm);
    finalize(op, "matmul operation");
    ops_.push_back(op);
  }
  void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t rd = create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &mode);
    set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &comp);
    finalize(rd, "reduction descriptor");
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &x);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &y);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &rd);
    finalize(op, "reduction operation");
    ops_.push_back(op);
  }
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &x);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &y);
    finalize(op, "reshape operation");
    ops_.push_back(op);
  }
  // The causal mask of S [b, h, s_q, s_kv]: keep where row >= col, else -inf (by-value kNegInf).
  cudnnBackendDescriptor_t causal_mask(cudnnBackendDescriptor_t s, const Dims& dims) {
    cudnnBackendDescriptor_t row = virt(dims, CUDNN_DATA_INT32), col = virt(dims, CUDNN_DATA_INT32);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, row, CUDNN_DATA_INT32, 2);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, col, CUDNN_DATA_INT32, 3);
    cudnnBackendDescriptor_t keep = virt(dims, CUDNN_DATA_BOOLEAN);
    pointwise(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, keep, CUDNN_DATA_BOOLEAN);
    cudnnBackendDescriptor_t out = virt(dims);
    if (!neg_inf_) neg_inf_ = scalar(kNegInf);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, neg_inf_, keep, out);
    return out;
  }

  // Operation graph, heuristics (mode A), the first configuration whose plan finalizes.
  void build_plan() {
    finalize_graph();
    std::string last;
    for (cudnnBackendDescriptor_t cfg : heuristic_configs(CUDNN_HEUR_MODE_A)) {
      try {
        plan_ = plan_from(cfg, &workspace_);
        return;
      } catch (const BuildError& e) {
        last = e.what;
      }
    }
    throw BuildError{"no engine configuration finalized: " + last};
  }
  void finalize_graph() {
    graph_ = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(graph_, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle_);
    set(graph_, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops_.data(),
        static_cast<int64_t>(ops_.size()));
    finalize(graph_, "operation graph");
  }
  // The engine configurations the heuristics of `mode` rank for the finalized graph, best first.
  std::vector<cudnnBackendDescriptor_t> heuristic_configs(cudnnBackendHeurMode_t mode) {
    cudnnBackendDescriptor_t heur = create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, &graph_);
    set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
    finalize(heur, "engine heuristics");
    int64_t count = 0;
    ok(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
       "engine heuristics results (count)");
    if (count <= 0) throw BuildError{"the heuristics found no engine configuration for the graph"};
    std::vector<cudnnBackendDescriptor_t> cfgs;
    for (int64_t i = 0; i < count; ++i) cfgs.push_back(create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    int64_t got = 0;
    ok(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                cfgs.data()),
       "engine heuristics results");
    cfgs.resize(static_cast<size_t>(got));
    return cfgs;
  }
  // A finalized execution plan of configuration cfg (throws BuildError when it does not finalize).
  cudnnBackendDescriptor_t plan_from(cudnnBackendDescriptor_t cfg, int64_t* workspace) {
    cudnnBackendDescriptor_t plan = create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle_);
    set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, &cfg);
    finalize(plan, "execution plan");
    int64_t n = 0;
    ok(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, workspace),
       "plan workspace size");
    return plan;
  }
  // A configuration of engine `global_index` with the knob choices (type, value) (benchmarks).
  cudnnBackendDescriptor_t config_of(int64_t global_index, const std::vector<std::pair<int64_t, int64_t>>& knobs) {
    cudnnBackendDescriptor_t engine = create(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    set(engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, &graph_);
    set(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, &global_index);
    finalize(engine, "engine");
    std::vector<cudnnBackendDescriptor_t> choices;
    for (const auto& [type, value] : knobs) {
      cudnnBackendDescriptor_t c = create(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
      const auto t = static_cast<cudnnBackendKnobType_t>(type);
      set(c, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, &t);
      set(c, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, &value);
      finalize(c, "knob choice");
      choices.push_back(c);
    }
    cudnnBackendDescriptor_t cfg = create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    set(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, &engine);
    if (!choices.empty())
      set(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, choices.data(),
          static_cast<int64_t>(choices.size()));
    finalize(cfg, "engine configuration");
    return cfg;
  }
  // The engine index and knob choices of a configuration, and the (type, min, max, stride) of its engine's knobs.
  struct ConfigInfo {
    int64_t engine = -1;
    std::vector<std::pair<int64_t, int64_t>> knobs;
    std::vector<std::array<int64_t, 4>> ranges;
  };
  ConfigInfo describe(cudnnBackendDescriptor_t cfg) {
    ConfigInfo info;
    cudnnBackendDescriptor_t engine = create(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    int64_t n = 0;
    ok(cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine),
       "config engine");
    ok(cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &info.engine),
       "engine index");
    constexpr int64_t kMax = 64;
    std::vector<cudnnBackendDescriptor_t> choices, infos;
    for (int64_t i = 0; i < kMax; ++i) choices.push_back(create(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR));
    for (int64_t i = 0; i < kMax; ++i) infos.push_back(create(CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR));
    ok(cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, kMax, &n,
                                choices.data()),
       "knob choices");
    for (int64_t i = 0; i < n; ++i) {
      cudnnBackendKnobType_t t;
      int64_t v = 0, m = 0;
      ok(cudnnBackendGetAttribute(choices[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &m, &t),
         "knob type");
      ok(cudnnBackendGetAttribute(choices[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &m, &v),
         "knob value");
      info.knobs.push_back({static_cast<int64_t>(t), v});
    }
    ok(cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_KNOB_INFO, CUDNN_TYPE_BACKEND_DESCRIPTOR, kMax, &n,
                                infos.data()),
       "knob info");
    for (int64_t i = 0; i < n; ++i) {
      cudnnBackendKnobType_t t;
      int64_t lo = 0, hi = 0, st = 0, m = 0;
      ok(cudnnBackendGetAttribute(infos[i], CUDNN_ATTR_KNOB_INFO_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &m, &t), "knob type");
      ok(cudnnBackendGetAttribute(infos[i], CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE, CUDNN_TYPE_INT64, 1, &m, &lo), "min");
      ok(cudnnBackendGetAttribute(infos[i], CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE, CUDNN_TYPE_INT64, 1, &m, &hi), "max");
      ok(cudnnBackendGetAttribute(infos[i], CUDNN_ATTR_KNOB_INFO_STRIDE, CUDNN_TYPE_INT64, 1, &m, &st), "stride");
      info.ranges.push_back({static_cast<int64_t>(t), lo, hi, st});
    }
    return info;
  }
  void use_plan(cudnnBackendDescriptor_t plan, int64_t workspace) {
    plan_ = plan;
    workspace_ = workspace;
  }

  // Binds the pointers of the graph's own tensors (uids it does not have are dropped: cuDNN fails on them) and runs.
  void execute(const std::vector<int64_t>& all_uids, const std::vector<void*>& all_ptrs, void* workspace) const {
    std::vector<int64_t> uids;
    std::vector<void*> ptrs;
    for (size_t i = 0; i < all_uids.size(); ++i)
      if (std::find(bound_.begin(), bound_.end(), all_uids[i]) != bound_.end()) {
        uids.push_back(all_uids[i]);
        ptrs.push_back(all_ptrs[i]);
      }
    cudnnBackendDescriptor_t vp = nullptr;
    MT_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp));
    struct Guard {
      cudnnBackendDescriptor_t d;
      ~Guard() { cudnnBackendDestroyDescriptor(d); }
    } guard{vp};
    MT_CUDNN_CHECK(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                            static_cast<int64_t>(uids.size()), uids.data()));
    MT_CUDNN_CHECK(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                            static_cast<int64_t>(ptrs.size()), ptrs.data()));
    MT_CUDNN_CHECK(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace));
    MT_CUDNN_CHECK(cudnnBackendFinalize(vp));
    MT_CUDNN_CHECK(cudnnSetStream(handle_, current_stream()));
    MT_CUDNN_CHECK(cudnnBackendExecute(handle_, plan_, vp));
  }
  int64_t workspace() const { return workspace_; }

 private:
  cudnnHandle_t handle_;
  std::vector<cudnnBackendDescriptor_t> owned_, ops_;
  std::vector<int64_t> bound_;  // uids of the non-virtual tensors
  cudnnBackendDescriptor_t graph_ = nullptr, plan_ = nullptr, neg_inf_ = nullptr;
  int64_t workspace_ = 0;
  int64_t next_virtual_ = 100;
};

// Layouts of our tensors as cuDNN's logical [b, h, s, d]: out, dout (B, T, H, D); q (and dq) and
// k, v (and dk, dv) either separate (B, T, H|G, D) tensors or heads of the fused projection.
Dims q_dims(const AttnShape& s) { return {s.B, s.H, s.T, s.D}; }
Dims o_strides(const AttnShape& s) { return {s.T * s.H * s.D, s.D, s.H * s.D, 1}; }
Dims kv_dims(const AttnShape& s) { return {s.B, s.G, s.keys(), s.D}; }
Dims t_dims(const Dims& d) { return {d[0], d[1], d[3], d[2]}; }  // swap the last two
Dims stat_dims(const AttnShape& s) { return {s.B, s.H, s.T, 1}; }
Dims stat_strides(const AttnShape& s) { return {s.H * s.T, s.T, 1, 1}; }

// io: the data type of q, k, v, out and their gradients (CUDNN_DATA_BFLOAT16 or CUDNN_DATA_HALF).
// with_plan false: the finalized operation graph without a plan (the benchmark sweep picks its own).
std::unique_ptr<Graph> build_forward(cudnnHandle_t h, const AttnShape& s, const CudnnLayout& lay, cudnnDataType_t io,
                                     bool with_plan = true) {
  auto g = std::make_unique<Graph>(h);
  auto Q = g->tensor(io, q_dims(s), lay.q, kQ);
  auto KT = g->tensor(io, t_dims(kv_dims(s)), t_dims(lay.kv), kK);
  auto V = g->tensor(io, kv_dims(s), lay.kv, kV);
  auto O = g->tensor(io, q_dims(s), o_strides(s), kO);
  auto stats = g->tensor(CUDNN_DATA_FLOAT, stat_dims(s), stat_strides(s), kStats);
  auto scale = g->scalar(kScale);
  const Dims sd{s.B, s.H, s.T, s.keys()}, rd = stat_dims(s), rs = stat_strides(s);
  auto S = g->virt(sd);
  g->matmul(Q, KT, S);
  auto S1 = g->virt(sd);
  g->pointwise(CUDNN_POINTWISE_MUL, S, scale, nullptr, S1);
  auto S2 = s.causal ? g->causal_mask(S1, sd) : S1;
  auto m = g->virt(rd, rs);
  g->reduction(CUDNN_REDUCE_TENSOR_MAX, S2, m);
  auto S3 = g->virt(sd);
  g->pointwise(CUDNN_POINTWISE_SUB, S2, m, nullptr, S3);
  auto E = g->virt(sd);
  g->pointwise(CUDNN_POINTWISE_EXP, S3, nullptr, nullptr, E);
  auto l = g->virt(rd, rs);
  g->reduction(CUDNN_REDUCE_TENSOR_ADD, E, l);
  auto logl = g->virt(rd, rs);
  g->pointwise(CUDNN_POINTWISE_LOG, l, nullptr, nullptr, logl);
  g->pointwise(CUDNN_POINTWISE_ADD, m, logl, nullptr, stats);
  auto P = g->virt(sd, io);
  g->pointwise(CUDNN_POINTWISE_DIV, E, l, nullptr, P);
  g->matmul(P, V, O);
  if (with_plan) g->build_plan();
  else g->finalize_graph();
  return g;
}

// deterministic: dQ = dS K written straight into dQ (cuDNN materializes dS: B H T^2 io-type workspace); else
// accumulated with fp32 atomics into dQ_accum (B, H, T, D) (bound to scratch memory), then converted into dQ.
std::unique_ptr<Graph> build_backward(cudnnHandle_t h, const AttnShape& s, const CudnnLayout& lay, cudnnDataType_t io,
                                      bool deterministic, bool with_plan = true) {
  auto g = std::make_unique<Graph>(h);
  const bool gqa = s.G != s.H;
  const Dims qd = q_dims(s), qs = lay.q, kd = kv_dims(s), ks = lay.kv, os = o_strides(s);
  auto Q = g->tensor(io, qd, qs, kQ);
  auto KT = g->tensor(io, t_dims(kd), t_dims(ks), kK);
  auto VT = g->tensor(io, t_dims(kd), t_dims(ks), kV);
  auto O = g->tensor(io, qd, os, kO);
  auto dO = g->tensor(io, qd, os, kDO);
  auto stats = g->tensor(CUDNN_DATA_FLOAT, stat_dims(s), stat_strides(s), kStats);
  auto dQ = g->tensor(io, qd, qs, kDQ);
  auto dK = g->tensor(io, kd, ks, kDK);
  auto dV = g->tensor(io, kd, ks, kDV);
  auto scale = g->scalar(kScale);
  auto one = g->scalar(kOne);
  const int64_t Tk = s.keys();
  const Dims sd{s.B, s.H, s.T, Tk}, rd = stat_dims(s), rs = stat_strides(s);
  const Dims td{s.B, s.H, Tk, s.T}, ts{s.H * s.T * Tk, s.T * Tk, 1, Tk};  // transposed views [b, h, kv, q]
  // delta = sum_d dO O (fp32, non-virtual: bound to scratch memory).
  auto dOO = g->virt(qd, {s.H * s.T * s.D, s.T * s.D, s.H * s.D, 1});
  g->pointwise(CUDNN_POINTWISE_MUL, dO, O, nullptr, dOO);
  auto delta0 = g->virt(rd, rs);
  g->reduction(CUDNN_REDUCE_TENSOR_ADD, dOO, delta0);
  auto delta = g->tensor(CUDNN_DATA_FLOAT, rd, rs, kSoftmaxSum);
  g->pointwise(CUDNN_POINTWISE_MUL, delta0, one, nullptr, delta);
  // P = exp(c Q K^T - Stats), masked.
  auto S = g->virt(sd);
  g->matmul(Q, KT, S);
  auto S1 = g->virt(sd);
  g->pointwise(CUDNN_POINTWISE_MUL, S, scale, nullptr, S1);
  auto S2 = g->virt(sd);
  g->pointwise(CUDNN_POINTWISE_SUB, S1, stats, nullptr, S2);
  auto S3 = s.causal ? g->causal_mask(S2, sd) : S2;
  auto P = g->virt(sd);
  g->pointwise(CUDNN_POINTWISE_EXP, S3, nullptr, nullptr, P);
  // dV = P^T dO (summed over the query heads of each group under GQA).
  auto PT = g->virt(td, ts, io);
  g->reshape(P, PT);
  const Dims full_kd{s.B, s.H, Tk, s.D};
  if (gqa) {
    auto dVf = g->virt(full_kd, io);
    g->matmul(PT, dO, dVf);
    g->reduction(CUDNN_REDUCE_TENSOR_ADD, dVf, dV);
  } else {
    g->matmul(PT, dO, dV);
  }
  // dS = P (dO V^T - delta) c.
  auto dP = g->virt(sd);
  g->matmul(dO, VT, dP);
  auto dP1 = g->virt(sd);
  g->pointwise(CUDNN_POINTWISE_SUB, dP, delta, nullptr, dP1);
  auto dP2 = g->virt(sd);
  g->pointwise(CUDNN_POINTWISE_MUL, dP1, P, nullptr, dP2);
  auto dS = g->virt(sd);
  g->pointwise(CUDNN_POINTWISE_MUL, dP2, scale, nullptr, dS);
  // dK = dS^T Q.
  auto dST = g->virt(td, ts, io);
  g->reshape(dS, dST);
  if (gqa) {
    auto dKf = g->virt(full_kd, io);
    g->matmul(dST, Q, dKf);
    g->reduction(CUDNN_REDUCE_TENSOR_ADD, dKf, dK);
  } else {
    g->matmul(dST, Q, dK);
  }
  // dQ = dS K (K^T viewed back as K).
  auto K = g->virt(kd, ks);
  g->reshape(KT, K);
  if (deterministic) {
    g->matmul(dS, K, dQ);
  } else {
    auto dQacc = g->tensor(CUDNN_DATA_FLOAT, qd, packed(qd), kDQAccum);
    g->matmul(dS, K, dQacc);
    g->pointwise(CUDNN_POINTWISE_IDENTITY, dQacc, nullptr, nullptr, dQ);
  }
  if (with_plan) g->build_plan();
  else g->finalize_graph();
  return g;
}

struct Cache {
  std::mutex mu;
  cudnnHandle_t handle = nullptr;
  std::string unusable;      // why cuDNN cannot run attention at all; "" = it can
  std::string last_refusal;  // the last graph cuDNN refused, and why
  std::map<std::array<int64_t, 18>, std::unique_ptr<Graph>> plans;  // null: this shape falls back
};

Cache& cache() {
  static Cache* c = [] {
    auto* c = new Cache();  // lives for the process (destroying handles at exit races the driver)
    if (cudnnGetVersion() < 90500) {  // graphs measured on 9.14
      c->unusable = "cuDNN " + std::to_string(cudnnGetVersion()) + " is older than 9.5";
    } else if (cudnnCreate(&c->handle) != CUDNN_STATUS_SUCCESS) {
      std::fprintf(stderr, "megatrain: cuDNN handle creation failed; attention runs on our own kernels\n");
      c->unusable = "cuDNN handle creation failed";
    }
    return c;
  }();
  return *c;
}

// The cached plan for (direction, shape, determinism), built on first use; null when cuDNN cannot run it.
const Graph* plan_for(bool backward, const AttnShape& s, const CudnnLayout& lay, cudnnDataType_t io,
                      bool deterministic = true) {
  Cache& c = cache();
  if (!c.unusable.empty()) return nullptr;
  std::lock_guard<std::mutex> lock(c.mu);
  const std::array<int64_t, 18> key{backward,  s.B,       s.T,       s.H,       s.G,  s.D,
                                    lay.q[0],  lay.q[1],  lay.q[2],  lay.q[3],  lay.kv[0], lay.kv[1],
                                    lay.kv[2], lay.kv[3], io,        deterministic, s.keys(), s.causal};
  auto it = c.plans.find(key);
  if (it != c.plans.end()) return it->second.get();
  std::unique_ptr<Graph> g;
  try {
    g = backward ? build_backward(c.handle, s, lay, io, deterministic) : build_forward(c.handle, s, lay, io);
  } catch (const BuildError& e) {
    std::fprintf(stderr,
                 "megatrain: cuDNN attention %s (B %lld, T %lld, Tk %lld, H %lld, G %lld, D %lld%s) unavailable, "
                 "using our kernels: %s\n",
                 backward ? "backward" : "forward", (long long)s.B, (long long)s.T, (long long)s.keys(),
                 (long long)s.H, (long long)s.G, (long long)s.D, s.causal ? "" : ", non-causal", e.what.c_str());
    c.last_refusal = std::string(backward ? "the backward" : "the forward") + " graph was refused: " + e.what;
  }
  return c.plans.emplace(key, std::move(g)).first->second.get();
}

// cuDNN for bf16 and fp16 when T and Tk are multiples of 128 (cuDNN <= 9.15.0 wants s_kv % 128 == 0 in the
// backward, see the notes; the same rule for the forward keeps one path per shape) and D is one of ours: causal
// square attention, and the context-parallel blocks (non-causal, Tk may differ from T). Those blocks once failed at
// their first execution with CUDNN_STATUS_BAD_PARAM_NULL_POINTER: the variant pack bound the causal mask's -inf
// scalar, a uid the non-causal graph does not have; binding only the graph's own tensors fixed it (cuDNN 9.14, H100:
// a CP2 block at 32K, T 8192 x Tk 16384, 2.0 ms forward and 11.0 ms deterministic backward vs 142 / 403 ms on our
// fp32 kernels).
bool shape_ok(const AttnShape& s) {
  return (!s.causal || s.keys() == s.T) && s.T % 128 == 0 && s.keys() % 128 == 0 && (s.D == 64 || s.D == 128) &&
         s.H % s.G == 0;
}

// Whether the policy (training.attention_backend) lets cuDNN run this call at all.
bool cudnn_allowed() { return ::mt::ops::attention_backend() != ::mt::ops::AttentionBackend::Own; }

}  // namespace

void check_own_kernels_allowed(const char* op, const AttnShape& s, bool fp32) {
  if (::mt::ops::attention_backend() != ::mt::ops::AttentionBackend::Cudnn) return;
  std::string why;
  if (fp32) {
    why = "fp32 (cuDNN's attention runs bf16 and fp16)";
  } else if (s.causal && s.keys() != s.T) {
    why = "causal attention with keys of another length runs on our kernels only";
  } else if (!shape_ok(s)) {
    why = "it runs T % 128 == 0 (and Tk % 128 == 0: under context parallelism seq_length / (2 x context)) and head "
          "dims 64 and 128";
  } else {
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mu);
    why = !c.unusable.empty() ? c.unusable : c.last_refusal;
  }
  MT_CHECK(false, op, ": training.attention_backend is cudnn, but cuDNN's attention cannot run B ", s.B, " T ", s.T,
           " Tk ", s.keys(), s.causal ? "" : " (non-causal)", " H ", s.H, " G ", s.G, " D ", s.D, ": ", why, "; set training.attention_backend: auto or own");
}

CudnnLayout CudnnLayout::separate(const AttnShape& s) {
  return {{s.T * s.H * s.D, s.D, s.H * s.D, 1}, {s.keys() * s.G * s.D, s.D, s.G * s.D, 1}};
}

CudnnLayout CudnnLayout::fused_mha(const AttnShape& s) {
  const int64_t W = 3 * s.H * s.D;  // per token: [q_h, k_h, v_h] for every head h
  return {{s.T * W, 3 * s.D, W, 1}, {s.T * W, 3 * s.D, W, 1}};
}

template <typename E>
constexpr cudnnDataType_t io_type() {
  return std::is_same_v<E, __half> ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
}

template <typename E>
bool cudnn_attention_forward(E* out, float* lse, const E* q, const E* k, const E* v, const AttnShape& s,
                             const CudnnLayout& lay) {
  if (!cudnn_allowed() || !shape_ok(s)) return false;
  const Graph* g = plan_for(false, s, lay, io_type<E>());
  if (!g) return false;
  float scale = 1.f / std::sqrt(static_cast<float>(s.D)), neg_inf = -INFINITY;
  Scratch ws(static_cast<size_t>(g->workspace()));
  g->execute({kQ, kK, kV, kO, kStats, kScale, kNegInf},
             {const_cast<E*>(q), const_cast<E*>(k), const_cast<E*>(v), out, lse, &scale, &neg_inf},
             ws.as<void>());
  return true;
}

// The deterministic backward's workspace is B H T^2 2 bytes (2 GiB at B 8, H 32, T 2048), so the batch runs in
// chunks of Bc samples (one plan, executed B / Bc times on pointers offset by whole samples: every tensor has the
// batch outermost): Bc is the largest divisor of B whose workspace fits in ops::attention_bwd_workspace_mib()
// (training.attention_bwd_workspace_mib, default 1024; at least one sample). Each extra chunk costs ~0.15 ms per
// layer on an H200 (its 5 kernels run once more, smaller: llama-1b, 16 layers, 216.0 / 216.8 / 218.3 ms per
// iteration in 1 / 2 / 4 chunks), so the default keeps chunks large: llama-1b runs in 2 (1 GiB instead of 2),
// llama-3b in 1 (768 MiB).
namespace {
int64_t backward_batch_chunk(const AttnShape& s) {
  const double cap = static_cast<double>(::mt::ops::attention_bwd_workspace_mib()) * 1048576.0;
  const double per_sample = 2.0 * static_cast<double>(s.H) * static_cast<double>(s.T) * static_cast<double>(s.keys());
  int64_t bc = 1;
  for (int64_t b = 2; b <= s.B; ++b)
    if (s.B % b == 0 && static_cast<double>(b) * per_sample <= cap) bc = b;
  return bc;
}
}  // namespace

// Scratch: delta (fp32 (Bc, H, T)), then, non-deterministic, dQ_accum (fp32 (B, H, T, D)), then the plan's
// workspace. The non-deterministic graph has no B H T^2 workspace and runs the whole batch at once.
template <typename E>
bool cudnn_attention_backward(E* dq, E* dk, E* dv, const E* dout, const E* q, const E* k, const E* v, const E* out,
                              const float* lse, const AttnShape& s, const CudnnLayout& lay) {
  if (!cudnn_allowed() || !shape_ok(s)) return false;
  const bool det = ::mt::ops::deterministic();  // the process-wide policy (training.deterministic)
  AttnShape cs = s;
  cs.B = det ? backward_batch_chunk(s) : s.B;
  const Graph* g = plan_for(true, cs, lay, io_type<E>(), det);
  if (!g) return false;
  float scale = 1.f / std::sqrt(static_cast<float>(s.D)), neg_inf = -INFINITY, one = 1.f;
  auto round256 = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t delta_bytes = round256(sizeof(float) * static_cast<size_t>(cs.B * s.H * s.T));
  const size_t acc_bytes = det ? 0 : round256(sizeof(float) * static_cast<size_t>(s.B * s.H * s.T * s.D));
  Scratch ws(delta_bytes + acc_bytes + static_cast<size_t>(g->workspace()));
  char* base = ws.as<char>();
  const int64_t o_sample = o_strides(s)[0], lse_sample = s.H * s.T;
  for (int64_t b0 = 0; b0 < s.B; b0 += cs.B) {
    const int64_t oq = b0 * lay.q[0], okv = b0 * lay.kv[0], oo = b0 * o_sample;
    std::vector<int64_t> uids{kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kScale, kOne, kNegInf, kSoftmaxSum};
    std::vector<void*> ptrs{const_cast<E*>(q + oq),  const_cast<E*>(k + okv),  const_cast<E*>(v + okv),
                            const_cast<E*>(out + oo), const_cast<E*>(dout + oo), const_cast<float*>(lse + b0 * lse_sample),
                            dq + oq,                 dk + okv,                 dv + okv,
                            &scale,                  &one,                     &neg_inf,
                            base};
    if (!det) {
      uids.push_back(kDQAccum);
      ptrs.push_back(base + delta_bytes);
    }
    g->execute(uids, ptrs, base + delta_bytes + acc_bytes);
  }
  return true;
}

#define MT_INSTANTIATE(E)                                                                                      \
  template bool cudnn_attention_forward<E>(E*, float*, const E*, const E*, const E*, const AttnShape&,         \
                                           const CudnnLayout&);                                                \
  template bool cudnn_attention_backward<E>(E*, E*, E*, const E*, const E*, const E*, const E*, const E*,      \
                                            const float*, const AttnShape&, const CudnnLayout&);
MT_INSTANTIATE(bf16_t)
MT_INSTANTIATE(__half)
#undef MT_INSTANTIATE

// ---------------------------------------------------------------- benchmark sweep (cuda_ops.h)
namespace {
// Max |a - b| over n bf16 values on the device (copied to the host; benchmarks only).
double max_abs_diff_bf16(const bf16_t* a, const bf16_t* b, int64_t n) {
  std::vector<uint16_t> ha(static_cast<size_t>(n)), hb(static_cast<size_t>(n));
  MT_CUDA_CHECK(cudaMemcpy(ha.data(), a, n * 2, cudaMemcpyDeviceToHost));
  MT_CUDA_CHECK(cudaMemcpy(hb.data(), b, n * 2, cudaMemcpyDeviceToHost));
  auto f = [](uint16_t x) {
    uint32_t u = uint32_t(x) << 16;
    float v;
    std::memcpy(&v, &u, 4);
    return v;
  };
  double m = 0;
  for (size_t i = 0; i < ha.size(); ++i) m = std::max(m, std::fabs(double(f(ha[i])) - double(f(hb[i]))));
  return m;
}
}  // namespace

}  // namespace mt::ops::cuda::attn

namespace mt::ops::cuda {

void cudnn_attention_sweep(const AttnShape& s, bool backward, bool deterministic, const mt::bf16* q_,
                           const mt::bf16* k_, const mt::bf16* v_, mt::bf16* out_, float* lse,
                           const mt::bf16* dout_, mt::bf16* dq_, mt::bf16* dk_, mt::bf16* dv_, int iters,
                           double budget_s) {
  using namespace attn;
  using Clock = std::chrono::steady_clock;
  const auto* q = dev(q_);
  const auto* k = dev(k_);
  const auto* v = dev(v_);
  auto* out = dev(out_);
  const auto* dout = dev(dout_);
  auto *dq = dev(dq_), *dk = dev(dk_), *dv = dev(dv_);
  Cache& c = cache();
  if (!c.unusable.empty()) {
    std::printf("CUDNN-SWEEP unusable: %s\n", c.unusable.c_str());
    return;
  }
  const CudnnLayout lay = CudnnLayout::separate(s);
  const char* dir = backward ? "bwd" : "fwd";
  std::unique_ptr<Graph> g;
  try {
    g = backward ? build_backward(c.handle, s, lay, CUDNN_DATA_BFLOAT16, deterministic, false)
                 : build_forward(c.handle, s, lay, CUDNN_DATA_BFLOAT16, false);
  } catch (const BuildError& e) {
    std::printf("CUDNN-SWEEP %s graph refused: %s\n", dir, e.what.c_str());
    return;
  }
  struct Candidate {
    std::string source;
    cudnnBackendDescriptor_t cfg;
  };
  std::vector<Candidate> cands;
  std::vector<int64_t> engines;
  std::vector<Graph::ConfigInfo> infos;
  for (auto [mode, name] : {std::pair{CUDNN_HEUR_MODE_A, "A"}, std::pair{CUDNN_HEUR_MODE_B, "B"}}) {
    try {
      const auto cfgs = g->heuristic_configs(mode);
      for (size_t i = 0; i < cfgs.size(); ++i) {
        cands.push_back({std::string(name) + "#" + std::to_string(i), cfgs[i]});
        try {
          Graph::ConfigInfo info = g->describe(cfgs[i]);
          if (std::find(engines.begin(), engines.end(), info.engine) == engines.end()) {
            engines.push_back(info.engine);
            infos.push_back(info);
          }
        } catch (const BuildError& e) {
          std::printf("CUDNN-SWEEP %s %s#%zu: %s\n", dir, name, i, e.what.c_str());
        }
      }
    } catch (const BuildError& e) {
      std::printf("CUDNN-SWEEP %s heuristics %s: %s\n", dir, name, e.what.c_str());
    }
  }
  for (const Graph::ConfigInfo& info : infos) {  // every value of each knob of each engine, others as ranked
    std::string ranges;
    for (const auto& r : info.ranges)
      ranges += " knob" + std::to_string(r[0]) + "[" + std::to_string(r[1]) + ".." + std::to_string(r[2]) + "/" +
                std::to_string(r[3]) + "]";
    std::printf("CUDNN-SWEEP %s engine %lld:%s\n", dir, (long long)info.engine, ranges.c_str());
    for (const auto& r : info.ranges) {
      if (r[3] <= 0 || (r[2] - r[1]) / r[3] > 256) continue;
      for (int64_t val = r[1]; val <= r[2]; val += r[3]) {
        auto knobs = info.knobs;
        bool found = false;
        for (auto& kv : knobs)
          if (kv.first == r[0]) {
            found = true;
            kv.second = val;
          }
        if (!found) knobs.push_back({r[0], val});
        try {
          cands.push_back({"E" + std::to_string(info.engine) + "/knob" + std::to_string(r[0]) + "=" +
                               std::to_string(val),
                           g->config_of(info.engine, knobs)});
        } catch (const BuildError&) {
        }
      }
    }
  }
  const int64_t qn = s.B * s.T * s.H * s.D, kn = s.B * s.keys() * s.G * s.D;
  Scratch ref_a(qn * 2), ref_b(kn * 2);
  bool have_ref = false;
  cudaEvent_t e0, e1;
  MT_CUDA_CHECK(cudaEventCreate(&e0));
  MT_CUDA_CHECK(cudaEventCreate(&e1));
  const auto start = Clock::now();
  int refused = 0;
  for (const Candidate& cand : cands) {
    if (std::chrono::duration<double>(Clock::now() - start).count() > budget_s) {
      std::printf("CUDNN-SWEEP %s budget of %.0f s spent, %zu candidates left\n", dir, budget_s,
                  cands.size() - static_cast<size_t>(&cand - cands.data()));
      break;
    }
    const auto t0 = Clock::now();
    int64_t ws = 0;
    cudnnBackendDescriptor_t plan = nullptr;
    try {
      plan = g->plan_from(cand.cfg, &ws);
    } catch (const BuildError& e) {
      ++refused;
      continue;
    }
    const double fin_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    g->use_plan(plan, ws);
    std::string knobs;
    try {
      const Graph::ConfigInfo info = g->describe(cand.cfg);
      knobs = "E" + std::to_string(info.engine) + " ";
      for (const auto& kv : info.knobs) knobs += std::to_string(kv.first) + ":" + std::to_string(kv.second) + " ";
    } catch (const BuildError& e) {
      knobs = "?";
    }
    float scale = 1.f / std::sqrt(static_cast<float>(s.D)), neg_inf = -INFINITY, one = 1.f;
    const size_t delta_bytes = (sizeof(float) * static_cast<size_t>(s.B * s.H * s.T) + 255) / 256 * 256;
    const size_t acc_bytes = deterministic ? 0 : sizeof(float) * static_cast<size_t>(qn);
    Scratch scratch(delta_bytes + acc_bytes + static_cast<size_t>(ws));
    char* base = scratch.as<char>();
    auto run = [&] {
      if (!backward) {
        g->execute({kQ, kK, kV, kO, kStats, kScale, kNegInf},
                   {const_cast<bf16_t*>(q), const_cast<bf16_t*>(k), const_cast<bf16_t*>(v), out, lse, &scale,
                    &neg_inf},
                   base);
      } else {
        g->execute({kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kScale, kOne, kNegInf, kSoftmaxSum, kDQAccum},
                   {const_cast<bf16_t*>(q), const_cast<bf16_t*>(k), const_cast<bf16_t*>(v), out,
                    const_cast<bf16_t*>(dout), lse, dq, dk, dv, &scale, &one, &neg_inf, base, base + delta_bytes},
                   base + delta_bytes + acc_bytes);
      }
    };
    std::string err;
    try {
      run();
      MT_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
    } catch (const std::exception& e) {
      std::printf("CUDNN-SWEEP %s %-20s engine knobs %s: execution failed: %s\n", dir, cand.source.c_str(),
                  knobs.c_str(), e.what());
      continue;
    }
    double diff = 0;
    const bf16_t* res_a = backward ? dq : out;
    if (!have_ref) {
      MT_CUDA_CHECK(cudaMemcpy(ref_a.as<void>(), res_a, qn * 2, cudaMemcpyDeviceToDevice));
      if (backward) MT_CUDA_CHECK(cudaMemcpy(ref_b.as<void>(), dk, kn * 2, cudaMemcpyDeviceToDevice));
      have_ref = true;
    } else {
      diff = max_abs_diff_bf16(res_a, ref_a.as<bf16_t>(), qn);
      if (backward) diff = std::max(diff, max_abs_diff_bf16(dk, ref_b.as<bf16_t>(), kn));
    }
    std::vector<float> ms;
    for (int i = 0; i < iters; ++i) {
      MT_CUDA_CHECK(cudaEventRecord(e0, current_stream()));
      run();
      MT_CUDA_CHECK(cudaEventRecord(e1, current_stream()));
      MT_CUDA_CHECK(cudaEventSynchronize(e1));
      float t = 0;
      MT_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    std::printf("CUDNN-SWEEP %s %-20s knobs %-24s finalize %7.1f ms  ws %10lld B  median %8.3f ms  min %8.3f  "
                "max|diff| vs first %.3g\n",
                dir, cand.source.c_str(), knobs.c_str(), fin_ms, (long long)ws, ms[ms.size() / 2], ms[0], diff);
    std::fflush(stdout);
  }
  std::printf("CUDNN-SWEEP %s %zu candidates, %d did not finalize\n", dir, cands.size(), refused);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace mt::ops::cuda
