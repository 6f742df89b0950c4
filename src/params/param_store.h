// Parameters carry their layout (docs/ARCHITECTURE.md): global name and shape, which dimension is split over
// tensor-parallel ranks (and in how many independently split blocks), how they are initialized,
// whether weight decay applies. The same metadata drives initialization, gradient reduction,
// the optimizer and checkpoint save/load/reshard: one source of truth.
//
// All local parameter values live in one flat allocation and all gradients in another (each
// Param's value/grad are views), so the optimizer, the gradient norm and the data-parallel gradient
// buckets work on contiguous memory. Mixed precision (Megatron style): with bf16/fp16 values the
// gradients are fp32 ("main grads"; bf16 with parallel.grad_reduce_in_fp32: false) and a third flat buffer holds the
// fp32 master weights the optimizer updates; with fp32/fp64 values the values are the master weights.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace mt {

enum class ParamInit { Normal, ScaledNormal, Ones, Zeros };
enum class ParamKind { Weight, Bias, Norm, Embedding };

struct ParamSpec {
  std::string name;         // global, e.g. "layers.3.self_attention.linear_qkv.weight"
  Shape global_shape;       // before any split (vocab rows: the padded vocabulary)
  int partition_dim = -1;   // split over tensor-parallel ranks along this dim; -1 = replicated
  // The partition dim holds this many equal blocks, each split over TP separately, so that a rank
  // holds its part of every block (SwiGLU's fc1 = [gate; up] uses 2).
  int partition_chunks = 1;
  ParamInit init = ParamInit::Normal;
  ParamKind kind = ParamKind::Weight;
  // Rows at or beyond this index of dim 0 are vocab padding: initialized to zero (never used).
  int64_t valid_rows = -1;
  // Replicated over TP but computed on sequence-parallel rows: each TP rank's gradient is a partial
  // sum, all-reduced over TP before the optimizer (norm weights, position embeddings under SP).
  bool sequence_parallel_grad = false;
  // This rank's copy of a parameter that another pipeline stage owns (the tied word embeddings on
  // the last stage): gradients are summed over the embedding group; never saved, never counted
  // twice in the gradient norm.
  bool tied_copy = false;
  // One of this rank's experts (model/moe/experts.h): laid out in the flat buffers' expert region, reduced over
  // the expert-data-parallel group (not data parallel), sharded over it by the distributed optimizer, counted
  // once per expert-parallel rank in the gradient norm, saved by the expert-data rank 0 of each expert rank.
  bool expert_parallel = false;
};

// One box of the global tensor held locally: global offset/shape and the local dim-0 row range.
struct ParamBox {
  Shape global_offset;
  Shape shape;
  int64_t local_row_begin = 0;  // rows [local_row_begin, + shape[0]) of the local tensor
};

struct Param {
  ParamSpec spec;
  Shape local_shape;
  std::vector<ParamBox> boxes;  // how the local tensor tiles into boxes of the global tensor
  Tensor value;                 // local slice (compute/master dtype on CPU)
  Tensor grad;                  // same shape; gradients accumulate here over micro-batches
  size_t flat_offset = 0;       // element offset into the store's flat buffers
  bool weight_decay = true;     // resolved by the optimizer config
  // Set by ParamStore::zero_grads: grad holds a previous step's values and its first write of this step must
  // overwrite them (grad_write_mode / prepare_grad_accumulate below).
  bool grad_unwritten = false;
};

// How an op writes p's gradient: Overwrite for the first write after ParamStore::zero_grads (the weight-gradient
// GEMM then runs with beta 0: no zeroing pass, no read of zeros), else Accumulate. Marks p written.
ops::GradMode grad_write_mode(Param& p);
// For ops that only accumulate (norm, bias and embedding gradients): zeroes p's gradient first if it is
// unwritten this step. Marks p written.
void prepare_grad_accumulate(Param& p);

// A region of the flat buffers: [begin, end) with its parameters in [begin, used_end) and zero padding after.
// The dense region comes first; the expert region (ParamSpec::expert_parallel) follows when there are experts.
struct FlatRegion {
  int64_t begin = 0, used_end = 0, end = 0;
  bool expert = false;
};

class ParamStore {
 public:
  ParamStore(int tp_rank, int tp_size) : tp_rank_(tp_rank), tp_size_(tp_size) {}
  // Registers a parameter; the returned pointer stays valid. Names must be unique.
  Param* add(const ParamSpec& spec);
  // Allocates the flat value/grad(/master) buffers and points every Param at its views. Each region is padded
  // with zeros: the dense one to a multiple of pad_multiple (the distributed optimizer's DP shards), the expert one
  // to a multiple of expert_pad_multiple (its expert-data shards). Expert parameters' flat offsets are final here
  // (the dense region's size is known only once every parameter is registered). bf16_grads (bf16 values on a GPU
  // only): the gradients are bf16 instead of fp32 main grads (parallel.grad_reduce_in_fp32: false).
  void allocate(DType dtype, Device device, int64_t pad_multiple = 1, int64_t expert_pad_multiple = 1,
                bool bf16_grads = false);
  bool allocated() const { return flat_values_.defined(); }
  // The regions (after allocate): the dense one, then the expert one if any parameter is an expert's.
  const std::vector<FlatRegion>& regions() const { return regions_; }
  bool has_experts() const { return expert_total_ > 0; }
  // Seeded initialization (of the master weights, then cast to the values): element e of the
  // GLOBAL tensor gets normal01(seed, hash(name), e) * std,
  // so every parallel layout starts from identical weights. ScaledNormal uses
  // std / sqrt(2 * num_layers) (output projections, Megatron's scaled init).
  void initialize(uint64_t seed, double std, int num_layers);
  // Starts a step's gradient accumulation: marks every gradient unwritten, so that its first write overwrites
  // (Param::grad_unwritten). The padding of the flat buffer is never written and stays zero.
  void zero_grads();
  // Zeroes the gradients of the parameters in the flat element range [begin, end) that no op wrote this step
  // (a module's backward is done with them: they had no gradient).
  void zero_unwritten(int64_t begin, int64_t end);
  // The gradient's sums of squares as their producer made them: `parts` (F64, on the grads' device) sum
  // (ops::sum_each) to the sum of squares of flat grads [begin, end) as the op that wrote them last left them
  // (optim/adamw.h grad_square_sums takes them instead of reading those gradients again). An undefined `parts`
  // forgets the range's; zero_grads forgets all (they hold for one step). Every write to a recorded range must
  // record anew (the experts' weight-gradient GEMMs do).
  struct GradSquares {
    int64_t begin = 0, end = 0;
    Tensor parts;
  };
  void record_grad_squares(int64_t begin, int64_t end, Tensor parts);
  const std::vector<GradSquares>& grad_squares() const { return grad_squares_; }  // ascending begin, disjoint

  // In ascending flat offsets after allocate (the dense parameters in registration order, then the experts').
  std::vector<Param*> params() const;
  // Registration order: parameter i of the num_params() added so far (a module's parameters are consecutive).
  size_t num_params() const { return params_.size(); }
  Param* param(size_t i) const { return params_[i].get(); }
  Param* find(const std::string& name) const;
  int64_t local_numel() const { return total_; }
  int64_t padded_numel() const { return flat_values_.numel(); }
  Tensor& flat_values() { return flat_values_; }
  Tensor& flat_grads() { return flat_grads_; }
  // The fp32 master weights (the values themselves unless the values are bf16/fp16). Not after release_master.
  Tensor& flat_master();
  bool has_separate_master() const { return separate_master_; }
  // Frees the separate master weights: the optimizer holds them from then on (AdamW::take_master).
  void release_master();
  // The master weights of one parameter (a view).
  Tensor master(const Param& p);
  // values = master (cast) over the element range [begin, begin + n) of the flat buffers.
  void sync_values_from_master(int64_t begin, int64_t n);
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }
  // Elements per data-parallel communication bucket of the flat buffers (parallel.grad_bucket_size;
  // parallel/grad_sync.h cuts the buckets). Set before the optimizer and GradSync are built.
  int64_t grad_bucket_elements() const { return grad_bucket_elements_; }
  void set_grad_bucket_elements(int64_t n) { grad_bucket_elements_ = n; }

 private:
  int tp_rank_, tp_size_;
  int64_t grad_bucket_elements_ = kDefaultGradBucketSize;
  std::vector<std::unique_ptr<Param>> params_;
  int64_t total_ = 0, expert_total_ = 0;  // all / the expert parameters' elements
  std::vector<FlatRegion> regions_;
  Tensor flat_values_, flat_grads_, flat_master_;
  bool separate_master_ = false, master_released_ = false;
  std::vector<GradSquares> grad_squares_;
};

// The boxes of `spec` held by tensor-parallel rank `tp_rank` of `tp_size`, and its local shape.
std::vector<ParamBox> param_boxes(const ParamSpec& spec, int tp_rank, int tp_size, Shape* local_shape);

}  // namespace mt
