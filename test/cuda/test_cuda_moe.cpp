// CUDA MoE ops against the CPU reference (fp64 on the same rounded inputs): router (softmax / sigmoid, bias,
// scaling), aux / seq-aux / z losses, routing map and permute / unpermute (fp32, bf16), grouped expert GEMMs
// (fp32, bf16; experts without rows; first-write and accumulating weight gradients), padded batched experts (equal
// groups: one strided batched GEMM per product; the padded layout against the exact groups on the CPU), our own
// Hopper grouped GEMMs (cuda/sm90, every product of bf16 experts at multiples of 256). Tolerances: test_cuda_util.h.
#include "catch.h"

#if defined(MEGATRAIN_HAVE_CUDA)
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "cuda/sm90/grouped_gemm.h"
#include "moe/moe_experts_pass.h"
#include "tensor/moe_ops.h"
#include "test_cuda_util.h"

using namespace mt;
using namespace mt::gpu_test;

namespace {
Tensor ints_to_device(const Tensor& h) {
  Tensor d = Tensor::empty(h.shape(), h.dtype(), Device::CUDA);
  d.copy_from(h);
  return d;
}
bool same_ints(const Tensor& device, const Tensor& host) {
  const Tensor h = to_host(device);
  return h.nbytes() == host.nbytes() && std::memcmp(h.raw(), host.raw(), h.nbytes()) == 0;
}
// The routing map of idx (N, k) over E experts on the CPU and on the GPU (from the same indices), compared.
struct RoutingMaps {
  Tensor s2r_ref, r2s_ref, cnt_ref;  // the CPU's
  Tensor di, s2r, r2s, cnt;          // the GPU's (di: idx on the device)
  int64_t M = 0;                     // routed rows
};
RoutingMaps check_routing_map(const Tensor& idx, int64_t E) {
  const int64_t Nk = idx.numel();
  RoutingMaps m;
  m.s2r_ref = Tensor::empty({Nk}, DType::I32);
  m.r2s_ref = Tensor::empty({Nk}, DType::I32);
  m.cnt_ref = Tensor::empty({E}, DType::I32);
  ops::moe_routing_map(m.s2r_ref, m.r2s_ref, m.cnt_ref, idx, E);
  m.di = ints_to_device(idx);
  m.s2r = Tensor::empty({Nk}, DType::I32, Device::CUDA);
  m.r2s = Tensor::empty({Nk}, DType::I32, Device::CUDA);
  m.cnt = Tensor::empty({E}, DType::I32, Device::CUDA);
  ops::moe_routing_map(m.s2r, m.r2s, m.cnt, m.di, E);
  CHECK(same_ints(m.s2r, m.s2r_ref));
  CHECK(same_ints(m.r2s, m.r2s_ref));
  CHECK(same_ints(m.cnt, m.cnt_ref));
  for (int64_t e = 0; e < E; ++e) m.M += m.cnt_ref.data<int32_t>()[e];
  return m;
}

// Permute / unpermute forward and backward on the GPU against the CPU in fp64 over the maps m, fp32 and bf16, random
// inputs from seeds seed .. seed + 3 (tokens N x C, top-k).
void check_permute_ops(const RoutingMaps& m, int64_t N, int64_t C, int64_t k, uint64_t seed) {
  const int64_t M = m.M;
  for (DType dt : {DType::F32, DType::BF16}) {
    INFO(dtype_name(dt));
    const Tensor x64 = rounded(randn64({N, C}, seed), dt), yp64 = rounded(randn64({M, C}, seed + 1), dt),
                 dy64 = rounded(randn64({N, C}, seed + 2), dt), w64 = rounded(randn64({N, k}, seed + 3), DType::F32);
    Tensor xp_ref = Tensor::empty({M, C}, DType::F64);
    ops::moe_permute_forward(xp_ref, x64, m.s2r_ref, k);
    Tensor xp = poisoned({M, C}, dt);
    ops::moe_permute_forward(xp, to_device(x64, dt), m.s2r, k);
    CHECK(rel_err(to_host64(xp), xp_ref) == 0.0);  // copies
    Tensor dx_ref = Tensor::empty({N, C}, DType::F64);
    ops::moe_permute_backward(dx_ref, yp64, m.r2s_ref, k);
    Tensor dx = poisoned({N, C}, dt);
    ops::moe_permute_backward(dx, to_device(yp64, dt), m.r2s, k);
    check_close("moe_permute_backward", dx, dx_ref, dt);
    {  // with the router's input gradient (dlogits fp32 x its weight) and a residual, rounded once with the sum
      const int64_t E = 8;
      const Tensor dl64 = rounded(randn64({N, E}, seed + 4), DType::F32), rw64 = rounded(randn64({E, C}, seed + 5), dt);
      Tensor dxr_ref = Tensor::empty({N, C}, DType::F64), dxr = poisoned({N, C}, dt);
      ops::moe_permute_backward(dxr_ref, yp64, m.r2s_ref, k, &dl64, &rw64, &x64);
      const Tensor dl = to_device(dl64, DType::F32), rw = to_device(rw64, dt), res = to_device(x64, dt);
      ops::moe_permute_backward(dxr, to_device(yp64, dt), m.r2s, k, &dl, &rw, &res);
      check_close("moe_permute_backward + router term + residual", dxr, dxr_ref, dt);
    }
    Tensor y_ref = Tensor::empty({N, C}, DType::F64);
    ops::moe_unpermute_forward(y_ref, yp64, w64, m.r2s_ref);
    Tensor y = poisoned({N, C}, dt);
    const Tensor w = to_device(w64, DType::F32), yp = to_device(yp64, dt);
    ops::moe_unpermute_forward(y, yp, w, m.r2s);
    check_close("moe_unpermute_forward", y, y_ref, dt);
    Tensor yr_ref = Tensor::empty({N, C}, DType::F64), yr = poisoned({N, C}, dt);  // with the residual stream added
    ops::moe_unpermute_forward(yr_ref, yp64, w64, m.r2s_ref, &x64);
    const Tensor xd = to_device(x64, dt);
    ops::moe_unpermute_forward(yr, yp, w, m.r2s, &xd);
    check_close("moe_unpermute_forward + residual", yr, yr_ref, dt);
    Tensor dyp_ref = Tensor::empty({M, C}, DType::F64), dw_ref = Tensor::empty({N, k}, DType::F64);
    ops::moe_unpermute_backward(dyp_ref, dw_ref, dy64, yp64, w64, m.r2s_ref);
    Tensor dyp = poisoned({M, C}, dt), dw = poisoned({N, k}, DType::F32);
    ops::moe_unpermute_backward(dyp, dw, to_device(dy64, dt), yp, w, m.r2s);
    check_close("moe_unpermute_backward dyp", dyp, dyp_ref, dt);
    check_close("moe_unpermute_backward dweights", dw, dw_ref, dt);
  }
}
}  // namespace

TEST_CASE("cuda moe router and losses match the CPU", "[cuda][moe]") {
  init();
  const int64_t N = 257;
  uint64_t seed = 700;
  // E 5 / 16: several rows per warp (lane segments of 8 / 16; 5 leaves lanes without an expert); 64: two per lane
  for (int64_t E : {int64_t(5), int64_t(16), int64_t(64)})
  for (bool sigmoid : {false, true})
    for (bool pre : {false, true})
      for (int64_t k : {int64_t(1), int64_t(4)}) {
        if (sigmoid && pre) continue;
        ops::RouterSpec spec;
        spec.topk = k;
        spec.sigmoid = sigmoid;
        spec.pre_softmax = pre;
        spec.scaling = 1.5;
        INFO("E " << E << " sigmoid " << sigmoid << " pre " << pre << " k " << k);
        Tensor l64 = rounded(randn64({N, E}, ++seed, 3.0), DType::F32);
        Tensor b64 = rounded(randn64({E}, ++seed, 0.05), DType::F32);
        // ties: row 7's logits all equal and experts 0-3 with one bias: its picks go to the lower indices first
        for (int64_t e = 0; e < E; ++e) l64.data<double>()[7 * E + e] = 0.5;
        for (int64_t e = 0; e < std::min<int64_t>(E, 4); ++e) b64.data<double>()[e] = 0.25;  // above the others
        // CPU reference
        Tensor idx_ref = Tensor::empty({N, k}, DType::I32), w_ref = Tensor::empty({N, k}, DType::F64),
               s_ref = Tensor::empty({N, E}, DType::F64);
        ops::moe_router_forward(idx_ref, w_ref, s_ref, l64, &b64, spec);
        // GPU
        const Tensor l = to_device(l64, DType::F32), b = to_device(b64, DType::F32);
        Tensor idx = Tensor::empty({N, k}, DType::I32, Device::CUDA), w = poisoned({N, k}, DType::F32),
               s = poisoned({N, E}, DType::F32);
        ops::moe_router_forward(idx, w, s, l, &b, spec);
        CHECK(same_ints(idx, idx_ref));
        check_close("moe_router_forward scores", s, s_ref, DType::F32);
        check_close("moe_router_forward weights", w, w_ref, DType::F32);
        const Tensor dw64 = rounded(randn64({N, k}, ++seed), DType::F32);
        Tensor dl_ref = Tensor::empty({N, E}, DType::F64);
        ops::moe_router_backward(dl_ref, dw64, s_ref, idx_ref, spec);
        Tensor dl = poisoned({N, E}, DType::F32);
        ops::moe_router_backward(dl, to_device(dw64, DType::F32), s, idx, spec);
        if (!(k == 1 && !sigmoid && !pre)) check_close("moe_router_backward", dl, dl_ref, DType::F32);
        // losses (gradients accumulate onto dl)
        for (int64_t groups : {int64_t(1), int64_t(257)}) {
          Tensor loss = poisoned({1}, DType::F32), loss_ref = Tensor::empty({1}, DType::F64);
          ops::moe_aux_loss_forward(loss, s, idx, groups, 0.01, sigmoid);
          ops::moe_aux_loss_forward(loss_ref, s_ref, idx_ref, groups, 0.01, sigmoid);
          check_close("moe_aux_loss_forward", loss, loss_ref, DType::F32);
          Tensor g = to_device(dl_ref, DType::F32);
          Tensor g_ref = rounded(dl_ref, DType::F32);
          ops::moe_aux_loss_backward(g, s, idx, groups, 0.01, sigmoid, 2.0);
          ops::moe_aux_loss_backward(g_ref, s_ref, idx_ref, groups, 0.01, sigmoid, 2.0);
          check_close("moe_aux_loss_backward", g, g_ref, DType::F32);
        }
        Tensor z = poisoned({1}, DType::F32), z_ref = Tensor::empty({1}, DType::F64);
        ops::moe_z_loss_forward(z, l, 1e-3);
        ops::moe_z_loss_forward(z_ref, l64, 1e-3);
        check_close("moe_z_loss_forward", z, z_ref, DType::F32);
        Tensor gz = to_device(dl_ref, DType::F32), gz_ref = rounded(dl_ref, DType::F32);
        ops::moe_z_loss_backward(gz, l, 1e-3, 0.5);
        ops::moe_z_loss_backward(gz_ref, l64, 1e-3, 0.5);
        check_close("moe_z_loss_backward", gz, gz_ref, DType::F32);
      }
}

TEST_CASE("cuda moe routing map, permute and unpermute match the CPU", "[cuda][moe]") {
  init();
  const int64_t N = 301, C = 77, E = 8, k = 2;
  Tensor idx = randint32({N, k}, 5, -1, int32_t(E - 2));  // -1: dropped slots; experts E-1 never chosen
  for (int64_t n = 0; n < N; ++n)  // a token's two choices differ
    if (idx.data<int32_t>()[n * k] == idx.data<int32_t>()[n * k + 1] && idx.data<int32_t>()[n * k] >= 0)
      idx.data<int32_t>()[n * k + 1] = -1;
  const RoutingMaps m = check_routing_map(idx, E);
  check_permute_ops(m, N, C, k, 11);
}

// Token-level dispatch's maps (expert parallelism) on the GPU equal the CPU's: the destination ranks, the send order
// through the routing map over ranks, and each send row's local choices; 64 experts top-8 over 2 and 4 ranks,
// dropped slots included.
TEST_CASE("cuda moe token-level send map matches the CPU", "[cuda][moe]") {
  init();
  const int64_t N = 3001, k = 8, E = 64;
  Tensor idx = randint32({N, k}, 7, -1, int32_t(E - 1));
  for (int64_t P : {2, 4}) {
    INFO("P " << P);
    const int64_t El = E / P;
    Tensor dest_ref = Tensor::empty({N, P}, DType::I32), ss_ref = Tensor::empty({N * P}, DType::I32),
           rs_ref = Tensor::empty({N * P}, DType::I32), rows_ref = Tensor::empty({P}, DType::I32);
    ops::moe_dest_ranks(dest_ref, idx, El);
    ops::moe_routing_map(ss_ref, rs_ref, rows_ref, dest_ref, P);
    int64_t S = 0;
    for (int64_t d = 0; d < P; ++d) S += rows_ref.data<int32_t>()[d];
    Tensor local_ref = Tensor::empty({S, k}, DType::I32);
    ops::moe_local_choices(local_ref, idx, ss_ref, P, El);
    const Tensor di = ints_to_device(idx);
    Tensor dest = Tensor::empty({N, P}, DType::I32, Device::CUDA), ss = Tensor::empty({N * P}, DType::I32, Device::CUDA),
           rs = Tensor::empty({N * P}, DType::I32, Device::CUDA), rows = Tensor::empty({P}, DType::I32, Device::CUDA);
    ops::moe_dest_ranks(dest, di, El);
    ops::moe_routing_map(ss, rs, rows, dest, P);
    Tensor local = Tensor::empty({S, k}, DType::I32, Device::CUDA);
    ops::moe_local_choices(local, di, ss, P, El);
    CHECK(same_ints(dest, dest_ref));
    CHECK(same_ints(ss, ss_ref));
    CHECK(same_ints(rs, rs_ref));
    CHECK(same_ints(rows, rows_ref));
    CHECK(same_ints(local, local_ref));
  }
}

// Training-like sizes: several tiles of the routing map's histograms and scatter (2048 slots each) and of the aux
// loss's counts (4096 slots each), 16-byte row vectors in permute / unpermute (C % 8 == 0), 64 experts top-8.
TEST_CASE("cuda moe routing map, permute, unpermute and aux loss at training-like sizes", "[cuda][moe]") {
  init();
  const int64_t N = 4099, C = 256, E = 64, k = 8;
  // distinct experts per token (a random subset of 8), a few dropped slots (-1)
  Tensor idx = Tensor::empty({N, k}, DType::I32);
  const Tensor pick = randint32({N, E}, 31, 0, 1 << 20);
  for (int64_t n = 0; n < N; ++n) {
    std::vector<int32_t> order(E);
    for (int32_t e = 0; e < E; ++e) order[e] = e;
    const int32_t* key = pick.data<int32_t>() + n * E;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return key[a] < key[b]; });
    for (int64_t j = 0; j < k; ++j) idx.data<int32_t>()[n * k + j] = (n * k + j) % 97 == 5 ? -1 : order[j];
  }
  const RoutingMaps m = check_routing_map(idx, E);
  check_routing_map(randint32({2000, 4}, 9, -1, 1499), 1500);  // the scatter's shared memory over 48 KiB
  Tensor cnt2 = Tensor::empty({E}, DType::I32, Device::CUDA);
  ops::moe_expert_counts(cnt2, m.di, E);
  CHECK(same_ints(cnt2, m.cnt_ref));
  check_permute_ops(m, N, C, k, 41);
  // the balancing loss over one group and over 4099 / 3 ... groups of whole rows (counts over several tiles)
  const Tensor l64 = rounded(randn64({N, E}, 45, 2.0), DType::F32);
  ops::RouterSpec spec;
  spec.topk = k;
  Tensor ridx_ref = Tensor::empty({N, k}, DType::I32), rw_ref = Tensor::empty({N, k}, DType::F64),
         rs_ref = Tensor::empty({N, E}, DType::F64);
  ops::moe_router_forward(ridx_ref, rw_ref, rs_ref, l64, nullptr, spec);
  const Tensor rs = to_device(rs_ref, DType::F32), ridx = ints_to_device(ridx_ref);
  for (int64_t groups : {int64_t(1), int64_t(4099)}) {
    Tensor loss = poisoned({1}, DType::F32), loss_ref = Tensor::empty({1}, DType::F64);
    ops::moe_aux_loss_forward(loss, rs, ridx, groups, 0.01, false);
    ops::moe_aux_loss_forward(loss_ref, rs_ref, ridx_ref, groups, 0.01, false);
    check_close("moe_aux_loss_forward (training size)", loss, loss_ref, DType::F32);
    Tensor g = Tensor::zeros({N, E}, DType::F32, Device::CUDA), g_ref = Tensor::zeros({N, E}, DType::F64);
    ops::moe_aux_loss_backward(g, rs, ridx, groups, 0.01, false, 2.0);
    ops::moe_aux_loss_backward(g_ref, rs_ref, ridx_ref, groups, 0.01, false, 2.0);
    check_close("moe_aux_loss_backward (training size)", g, g_ref, DType::F32);
  }
}

namespace {

// The grouped linear on the GPU against the CPU in fp64: forward, backward (dx and the fp32 weight gradient's first
// write), then the weight gradient accumulated once more (= twice the reference). Inputs rounded to dt; x, w, dout
// drawn from seeds seed, seed + 1, seed + 2 (w scaled by w_std). tag names the path in the messages.
// Returns whether the first write made the weight gradient's sums of squares (dweight_squares; checked against a
// pass over the gradient it wrote); the accumulating write never does on a GPU.
bool check_grouped_linear(const std::vector<int64_t>& counts, int64_t IC, int64_t OC, DType dt, uint64_t seed,
                          double w_std, const std::string& tag) {
  const int64_t El = static_cast<int64_t>(counts.size());
  const int64_t M = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  auto label = [&](const std::string& what) {
    if (tag.empty()) return what.empty() ? std::string() : " (" + what + ")";
    return " (" + tag + (what.empty() ? "" : ", " + what) + ")";
  };
  const Tensor x64 = rounded(randn64({M, IC}, seed), dt), w64 = rounded(randn64({El, OC, IC}, seed + 1, w_std), dt),
               dout64 = rounded(randn64({M, OC}, seed + 2), dt);
  Tensor out_ref = Tensor::empty({M, OC}, DType::F64);
  ops::moe_grouped_linear_forward(out_ref, x64, w64, counts);
  const Tensor x = to_device(x64, dt), w = to_device(w64, dt), dout = to_device(dout64, dt);
  Tensor out = poisoned({M, OC}, dt);
  ops::moe_grouped_linear_forward(out, x, w, counts);
  check_close("moe_grouped_linear_forward" + label(""), out, out_ref, dt);
  Tensor dx_ref = Tensor::empty({M, IC}, DType::F64), dw_ref = Tensor::empty({El, OC, IC}, DType::F64);
  ops::moe_grouped_linear_backward(&dx_ref, &dw_ref, dout64, x64, w64, counts, ops::GradMode::Overwrite);
  Tensor dx = poisoned({M, IC}, dt), dw = poisoned({El, OC, IC}, DType::F32), squares;
  ops::moe_grouped_linear_backward(&dx, &dw, dout, x, w, counts, ops::GradMode::Overwrite, &squares);
  check_close("moe_grouped_linear_backward dx" + label(""), dx, dx_ref, dt);
  check_close("moe_grouped_linear_backward dweight" + label("first write"), dw, dw_ref, dt);
  const bool made = squares.defined();
  if (made) {  // the tiles' partials (in another order than sum_squares: to fp64 rounding), the same bits again
    Tensor sums = Tensor::empty({2}, DType::F64, Device::CUDA);
    ops::sum_each(sums, {squares, squares});
    const Tensor h = to_host(sums);
    const double got = h.data<double>()[0], ref = ops::sum_squares(dw);
    INFO("dweight's sum of squares" << label("first write") << ": " << got << " vs " << ref);
    CHECK(std::fabs(got - ref) <= 1e-12 * ref);
    CHECK(std::memcmp(h.data<double>(), h.data<double>() + 1, sizeof(double)) == 0);
  }
  ops::moe_grouped_linear_backward(nullptr, &dw, dout, x, w, counts, ops::GradMode::Accumulate, &squares);
  CHECK_FALSE(squares.defined());
  ops::scale_(dw_ref, 2.0);
  check_close("moe_grouped_linear_backward dweight" + label("accumulate"), dw, dw_ref, dt);
  return made;
}

}  // namespace

TEST_CASE("cuda moe grouped GEMMs match the CPU, experts without rows included", "[cuda][moe]") {
  init();
  for (DType dt : {DType::F32, DType::BF16})
    CHECK_FALSE(check_grouped_linear({37, 0, 130, 1, 0, 64}, 96, 80, dt, 21, 0.1, ""));  // cuBLAS: no sums made
}

// bf16 experts whose sizes are multiples of 256 run on our own Hopper kernels (cuda/sm90/grouped_gemm.h): forward
// and dx for any row counts (of an expert's last tile of fewer than 128 rows, each consumer warpgroup's 64 rows
// stored through TMA when all are the expert's, row by row when some are, the MMAs skipped when none are; the rows
// of the next expert untouched), the fp32 weight gradient's first write when every count is a multiple of 64 (else,
// and when accumulating, cuBLAS). Counted launches prove the path; more tiles than multiprocessors make each CTA run
// several.
// The weight gradient also with an odd number of 128-row blocks per expert (OC 384).
TEST_CASE("cuda moe grouped GEMMs on our Hopper kernels (sm90) match the CPU", "[cuda][moe]") {
  init();
  if (!ops::cuda::sm90::grouped_gemm_supported()) {
    WARN("skipped: the GPU is not compute capability 9.0 (Hopper); cuBLAS runs these products");
    return;
  }
  struct Case {
    std::vector<int64_t> counts;
    int64_t IC, OC, launches;  // per check_grouped_linear: forward, dx, the weight gradient's first write (or not)
  };
  const std::vector<Case> cases = {
      {{256, 0, 384, 128, 64}, 256, 512, 3},         // counts multiples of 64: every product; a 64-row last tile
      {{37, 0, 130, 1, 300, 200}, 256, 512, 2},      // any counts: forward and dx (partial tiles; 200: a last tile
                                                     // of 72 rows, the first consumer's 64 through TMA), dW on cuBLAS
      {{128, 448, 0, 192}, 512, 256, 3},             // fc2-like: OC < IC
      {{1024, 2048, 640, 0, 1536}, 512, 1024, 3},    // 164 forward tiles: several per CTA, the ring wrapping around
      {{256, 0, 128, 64, 192}, 256, 384, 2},         // OC 384: dx, and dW's 3 row blocks per expert (cuBLAS forward)
  };
  for (const Case& c : cases) {
    const int64_t before = ops::cuda::sm90::grouped_gemm_launches();
    const bool made = check_grouped_linear(c.counts, c.IC, c.OC, DType::BF16, 81, 0.05,
                                           "sm90 IC " + std::to_string(c.IC) + " OC " + std::to_string(c.OC));
    CHECK(ops::cuda::sm90::grouped_gemm_launches() - before == c.launches);
    // the sm90 weight gradient makes its sums of squares
    CHECK(made == ops::cuda::sm90::grouped_dweight_takes(c.counts.data(), int64_t(c.counts.size()), c.IC, c.OC, false));
  }
}

// fc2's backward through the SwiGLU in place (the layer's call: dh over h) runs the SwiGLU backward in the sm90 dx
// kernel's epilogue (cuda/sm90/grouped_gemm.h grouped_dx_swiglu): dh, the recomputed a and the weight gradient equal
// the unfused path (the dx GEMM storing da, then cuda/activation.cu's passes) bit for bit where that path also runs
// on our kernel (F a multiple of 256), and the CPU in fp64 everywhere. Partial last tiles (rows of the next expert
// untouched), an expert without rows, F with an odd number of 128-column tiles, more tiles than multiprocessors, and
// about 4 tiles a CTA of 4 K slices each (g and u of the next tile loading while one's epilogue runs).
TEST_CASE("cuda moe fc2 backward with the SwiGLU in the sm90 dx epilogue equals the unfused path", "[cuda][moe]") {
  init();
  if (!ops::cuda::sm90::grouped_gemm_supported()) {
    WARN("skipped: the GPU is not compute capability 9.0 (Hopper); the SwiGLU backward runs as its own pass");
    return;
  }
  struct Case {
    std::vector<int64_t> counts;
    int64_t F, OC;
  };
  const std::vector<Case> cases = {
      {{256, 0, 300, 1, 130, 200}, 256, 192},      // partial tiles (200: 72 rows), an empty expert, one row
      {{37, 128, 0, 64}, 384, 128},                // 3 column tiles (the unfused dx runs on cuBLAS: CPU check only)
      {{1024, 2048, 640, 0, 1536}, 512, 1024},     // 5,248 rows x 4 column tiles: many tiles per CTA
      {{4096, 8192, 0, 4096}, 512, 256},           // 512 tiles of 4 K slices
  };
  const DType bf = DType::BF16;
  for (const Case& c : cases) {
    const int64_t El = static_cast<int64_t>(c.counts.size()), F = c.F, OC = c.OC;
    const int64_t M = std::accumulate(c.counts.begin(), c.counts.end(), int64_t{0});
    INFO("F " << F << " OC " << OC << " rows " << M);
    const Tensor h64 = rounded(randn64({M, 2 * F}, 91), bf), w64 = rounded(randn64({El, OC, F}, 92, 0.05), bf),
                 dy64 = rounded(randn64({M, OC}, 93), bf);
    const Tensor w = to_device(w64, bf), dy = to_device(dy64, bf);
    // fused: in place
    Tensor dh = to_device(h64, bf), dw = poisoned({El, OC, F}, DType::F32);
    const int64_t before = ops::cuda::sm90::grouped_gemm_launches();
    ops::moe_grouped_linear_backward_swiglu(dh, &dw, dy, w, dh, c.counts, ops::GradMode::Overwrite);
    CHECK(ops::cuda::sm90::grouped_gemm_launches() > before);
    // unfused: dh into another tensor (not in place), as before this path existed
    const Tensor h = to_device(h64, bf);
    Tensor dh_u = poisoned({M, 2 * F}, bf), dw_u = poisoned({El, OC, F}, DType::F32);
    ops::moe_grouped_linear_backward_swiglu(dh_u, &dw_u, dy, w, h, c.counts, ops::GradMode::Overwrite);
    // the CPU
    Tensor dh_ref = Tensor::empty({M, 2 * F}, DType::F64), dw_ref = Tensor::empty({El, OC, F}, DType::F64);
    ops::moe_grouped_linear_backward_swiglu(dh_ref, &dw_ref, dy64, w64, h64, c.counts, ops::GradMode::Overwrite);
    check_close("moe fc2 backward, SwiGLU in the epilogue: dh", dh, dh_ref, bf);
    check_close("moe fc2 backward, SwiGLU in the epilogue: dweight", dw, dw_ref, bf);
    if (F % 256 == 0) {
      CHECK(bitwise_equal(dh, dh_u));
      CHECK(bitwise_equal(dw, dw_u));
    }
    // a kept from the forward (Experts::keep_activation_in): the fused kernel stores no a and the weight gradient
    // reads the kept one; not in place, the unfused path's SwiGLU backward recomputes nothing. The same bits.
    Tensor a = Tensor::empty({M, F}, bf, Device::CUDA);
    ops::swiglu_forward(a, h);
    Tensor dh_k = to_device(h64, bf), dw_k = poisoned({El, OC, F}, DType::F32);
    ops::moe_grouped_linear_backward_swiglu(dh_k, &dw_k, dy, w, dh_k, c.counts, ops::GradMode::Overwrite, nullptr, &a);
    CHECK(bitwise_equal(dh_k, dh));
    CHECK(bitwise_equal(dw_k, dw));
    Tensor dh_ku = poisoned({M, 2 * F}, bf), dw_ku = poisoned({El, OC, F}, DType::F32);
    ops::moe_grouped_linear_backward_swiglu(dh_ku, &dw_ku, dy, w, h, c.counts, ops::GradMode::Overwrite, nullptr, &a);
    CHECK(bitwise_equal(dh_ku, dh_u));
    CHECK(bitwise_equal(dw_ku, dw_u));
  }
}

// fc1's forward followed by the SwiGLU (the layer's call) runs the SwiGLU in the sm90 forward kernel's epilogue
// (cuda/sm90/grouped_gemm.h grouped_forward_swiglu, one launch): h and a equal the unfused path (the forward GEMM,
// then cuda/activation.cu's pass) bit for bit and the CPU in fp64. Partial last tiles (rows of the next expert
// untouched), an expert without rows, one row; main loops of 1 K slice (every deferred epilogue step after it), 3
// and 16; 3 column tiles; more tiles than multiprocessors.
TEST_CASE("cuda moe fc1 forward with the SwiGLU in the sm90 epilogue equals the unfused path", "[cuda][moe]") {
  init();
  if (!ops::cuda::sm90::grouped_gemm_supported()) {
    WARN("skipped: the GPU is not compute capability 9.0 (Hopper); the SwiGLU forward runs as its own pass");
    return;
  }
  struct Case {
    std::vector<int64_t> counts;
    int64_t IC, F;
  };
  const std::vector<Case> cases = {
      {{256, 0, 300, 1, 130, 200}, 64, 256},      // partial tiles (200: 72 rows), an empty expert, one row; one K slice
      {{37, 128, 0, 64}, 192, 384},               // 3 column tiles, 3 K slices
      {{1024, 2048, 640, 0, 1536}, 1024, 512},    // 5,248 rows x 4 column tiles: many tiles per CTA
  };
  const DType bf = DType::BF16;
  for (const Case& c : cases) {
    const int64_t El = static_cast<int64_t>(c.counts.size()), F = c.F, IC = c.IC;
    const int64_t M = std::accumulate(c.counts.begin(), c.counts.end(), int64_t{0});
    INFO("IC " << IC << " F " << F << " rows " << M);
    const Tensor x64 = rounded(randn64({M, IC}, 94), bf), w64 = rounded(randn64({El, 2 * F, IC}, 95, 0.05), bf);
    const Tensor x = to_device(x64, bf), w = to_device(w64, bf);
    Tensor h = poisoned({M, 2 * F}, bf), a = poisoned({M, F}, bf);
    const int64_t before = ops::cuda::sm90::grouped_gemm_launches();
    ops::moe_grouped_linear_forward_swiglu(h, a, x, w, c.counts);
    CHECK(ops::cuda::sm90::grouped_gemm_launches() - before == 1);
    Tensor h_u = poisoned({M, 2 * F}, bf), a_u = poisoned({M, F}, bf);
    ops::moe_grouped_linear_forward(h_u, x, w, c.counts);
    ops::swiglu_forward(a_u, h_u);
    Tensor h_ref = Tensor::empty({M, 2 * F}, DType::F64), a_ref = Tensor::empty({M, F}, DType::F64);
    ops::moe_grouped_linear_forward_swiglu(h_ref, a_ref, x64, w64, c.counts);
    check_close("moe fc1 forward, SwiGLU in the epilogue: h", h, h_ref, bf);
    check_close("moe fc1 forward, SwiGLU in the epilogue: a", a, a_ref, bf);
    CHECK(bitwise_equal(h, h_u));
    CHECK(bitwise_equal(a, a_u));
  }
}

// Groups large enough (2^34 FLOPs per group on average) run one cublasGemmEx per group (tensor/moe_ops.h
// moe_gemm_per_group): the same results as the CPU, an empty group included.
TEST_CASE("cuda moe grouped GEMMs with large groups (one GEMM per group) match the CPU", "[cuda][moe]") {
  init();
  const int64_t IC = 1024, OC = 2112, El = 3, M = 12300;  // OC not a multiple of 256: cuBLAS on Hopper too
  REQUIRE(ops::moe_gemm_per_group(M, El, IC, OC));
  REQUIRE(!ops::moe_gemm_per_group(M, El, IC / 2, OC));
  check_grouped_linear({4000, 0, 8300}, IC, OC, DType::BF16, 51, 0.03, "per group");
}

// Equal groups run as one cublasGemmStridedBatchedEx per product, a few distinct sizes as one batched call each
// (fp32 weight gradients included): the CPU's results, first write and accumulate.
TEST_CASE("cuda moe grouped GEMMs with equal groups (strided batched) match the CPU", "[cuda][moe]") {
  init();
  const int64_t El = 5;
  for (const std::vector<int64_t>& counts : {std::vector<int64_t>(El, 75), std::vector<int64_t>{75, 300, 0, 75, 75}})
    for (DType dt : {DType::F32, DType::BF16}) check_grouped_linear(counts, 96, 136, dt, 61, 0.1, "equal groups");
}

// The batched calls through cuBLASLt (cuda/batched_gemm.cu, an algorithm per exact shape and batch count): row
// counts on and off multiples of 128, evenly spaced groups (strided) and not (pointer arrays), fp32 / bf16 / fp16;
// and odd sizes (2-byte aligned rows) that cuBLASLt may refuse (then cuBLAS's batched calls run them).
TEST_CASE("cuda moe batched expert GEMMs (cuBLASLt) match the CPU at several shapes, batches and alignments",
          "[cuda][moe]") {
  init();
  for (int64_t r : {128, 200, 384})
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      check_grouped_linear({r, r, r}, 256, 384, dt, 71, 0.05, "strided, rows " + std::to_string(r));
      check_grouped_linear({r, 0, r, r, 0, r}, 256, 384, dt, 73, 0.05, "pointer arrays, rows " + std::to_string(r));
    }
  for (DType dt : {DType::F32, DType::BF16})
    check_grouped_linear({37, 37, 0, 37, 37}, 45, 19, dt, 75, 0.1, "odd sizes");
}

// The padded path of MoELayer (moe_pad_routing_map, permute with padding rows, GEMMs of a few distinct group sizes
// as batched calls, padding rows of the output gradient zeroed, the fused SwiGLU backward) on the GPU against the
// exact groups on the CPU (fp64), with an empty expert, one expert holding most rows and dropped slots; equal
// regions (strided batched) and two region sizes (the equal ones not evenly spaced: pointer arrays).
TEST_CASE("cuda moe padded batched experts match the CPU (an empty and a very unbalanced expert)", "[cuda][moe]") {
  init();
  const int64_t N = 600, C = 64, F = 48, E = 6, k = 2;
  const Tensor idx = test::unbalanced_routing(N), didx = ints_to_device(idx);
  // the layout's maps: the same integers as the CPU's
  {
    Tensor s2r = Tensor::empty({N * k}, DType::I32), r2s = Tensor::empty({N * k}, DType::I32),
           cnt = Tensor::empty({E}, DType::I32);
    ops::moe_routing_map(s2r, r2s, cnt, idx, E);
    const std::vector<int64_t> counts(cnt.data<int32_t>(), cnt.data<int32_t>() + E);
    const std::vector<int64_t> regions = test::two_regions(counts);
    int64_t P = 0;
    for (int64_t r : regions) P += r;
    Tensor ds2r = Tensor::empty({N * k}, DType::I32, Device::CUDA), dr2s = Tensor::empty({N * k}, DType::I32, Device::CUDA),
           dcnt = Tensor::empty({E}, DType::I32, Device::CUDA);
    ops::moe_routing_map(ds2r, dr2s, dcnt, didx, E);
    Tensor pad = Tensor::empty({P}, DType::I32), dpad = Tensor::empty({P}, DType::I32, Device::CUDA);
    ops::moe_pad_routing_map(pad, r2s, s2r, counts, regions);
    ops::moe_pad_routing_map(dpad, dr2s, ds2r, counts, regions);
    CHECK(same_ints(dpad, pad));
    CHECK(same_ints(dr2s, r2s));
  }
  const Tensor x64 = randn64({N, C}, 71), w64 = rounded(randn64({N, k}, 72), DType::F32),
               w1_64 = randn64({E, 2 * F, C}, 73, 0.2), w2_64 = randn64({E, C, F}, 74, 0.2), dy64 = randn64({N, C}, 75);
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor x = rounded(x64, dt), w1 = rounded(w1_64, dt), w2 = rounded(w2_64, dt), dy = rounded(dy64, dt);
    const test::ExpertsPass ref = test::run_experts_pass(nullptr, idx, x, w64, w1, w2, dy);
    for (test::Layout layout : {test::Layout(test::one_region), test::Layout(test::two_regions)}) {
      const test::ExpertsPass gpu = test::run_experts_pass(layout, didx, to_device(x, dt), to_device(w64, DType::F32),
                                                           to_device(w1, dt), to_device(w2, dt), to_device(dy, dt));
      CHECK(gpu.rows > ref.rows);
      // bf16: the intermediate activations (h, a, yp, dyp, dh) round to bf16 on the GPU, not on the CPU
      const double t = dt == DType::BF16 ? 3e-2 : tol(dt);
      check_close("padded experts y", gpu.y, ref.y, dt, t);
      check_close("padded experts dx", gpu.dx, ref.dx, dt, t);
      check_close("padded experts dweights", gpu.dweights, ref.dweights, dt, t);
      check_close("padded experts dw1", gpu.dw1, ref.dw1, dt, t);
      check_close("padded experts dw2", gpu.dw2, ref.dw2, dt, t);
      const Tensor dw1 = to_host64(gpu.dw1);  // the empty expert's gradient is exactly 0
      for (int64_t i = 0; i < 2 * F * C; ++i) REQUIRE(dw1.data<double>()[2 * 2 * F * C + i] == 0.0);
    }
  }
}

#endif
