// CPU reference of the MoE routing map, capacity, permute and unpermute (tensor/moe_ops.h). Gathers only (no
// scatter-add): each output row is written by one loop iteration, sums over a token's slots in slot order.
#include <algorithm>
#include <numeric>
#include <vector>

#include "tensor/cpu/moe_cpu.h"

namespace mt::ops::cpu {

void moe_expert_counts_cpu(int32_t* counts, const int32_t* indices, int64_t slots, int64_t E) {
  std::fill(counts, counts + E, 0);
  for (int64_t s = 0; s < slots; ++s)
    if (indices[s] >= 0) ++counts[indices[s]];
}

template <typename T>
void moe_apply_capacity_cpu(int32_t* indices, const T* weights, int64_t slots, int64_t E, int64_t capacity) {
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(E));
  for (int64_t s = 0; s < slots; ++s)
    if (indices[s] >= 0) by_expert[static_cast<size_t>(indices[s])].push_back(s);
  for (auto& v : by_expert) {
    if (static_cast<int64_t>(v.size()) <= capacity) continue;
    // highest weight first, ties toward the lower slot (v is in slot order: a stable sort keeps it)
    std::stable_sort(v.begin(), v.end(), [&](int64_t a, int64_t b) { return weights[a] > weights[b]; });
    for (size_t i = static_cast<size_t>(capacity); i < v.size(); ++i) indices[v[i]] = -1;
  }
}

void moe_dest_ranks_cpu(int32_t* dest, const int32_t* indices, int64_t N, int64_t k, int64_t P, int64_t El) {
  std::fill(dest, dest + N * P, -1);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < k; ++j)
      if (const int32_t e = indices[n * k + j]; e >= 0) dest[n * P + e / El] = static_cast<int32_t>(e / El);
}

void moe_local_choices_cpu(int32_t* local, const int32_t* indices, const int32_t* send_slot, int64_t S, int64_t k,
                           int64_t P, int64_t El) {
  for (int64_t r = 0; r < S; ++r) {
    const int64_t n = send_slot[r] / P, d = send_slot[r] % P;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = indices[n * k + j];
      local[r * k + j] = e >= 0 && e / El == d ? static_cast<int32_t>(e - d * El) : -1;
    }
  }
}

void moe_routing_map_cpu(int32_t* slot_of_row, int32_t* row_of_slot, int32_t* counts, const int32_t* indices,
                         int64_t slots, int64_t E) {
  moe_expert_counts_cpu(counts, indices, slots, E);
  std::vector<int64_t> next(static_cast<size_t>(E), 0);
  for (int64_t e = 1; e < E; ++e) next[e] = next[e - 1] + counts[e - 1];
  std::fill(slot_of_row, slot_of_row + slots, -1);
  for (int64_t s = 0; s < slots; ++s) {  // slots in token order: tokens ascend inside each expert
    if (indices[s] < 0) {
      row_of_slot[s] = -1;
      continue;
    }
    const int64_t r = next[indices[s]]++;
    row_of_slot[s] = static_cast<int32_t>(r);
    slot_of_row[r] = static_cast<int32_t>(s);
  }
}

void moe_pad_routing_map_cpu(int32_t* slot_of_row_pad, int32_t* row_of_slot, const int32_t* slot_of_row,
                             const int64_t* counts, const int64_t* regions, int64_t slots, int64_t E) {
  std::vector<int64_t> start(static_cast<size_t>(E) + 1, 0), pstart(static_cast<size_t>(E) + 1, 0);
  for (int64_t e = 0; e < E; ++e) start[e + 1] = start[e] + counts[e], pstart[e + 1] = pstart[e] + regions[e];
  std::vector<int32_t> pad_of_row(static_cast<size_t>(start[E]));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = 0; i < regions[e]; ++i) {
      const int64_t p = pstart[e] + i;
      if (i < counts[e]) {
        slot_of_row_pad[p] = slot_of_row[start[e] + i];
        pad_of_row[start[e] + i] = static_cast<int32_t>(p);
      } else {
        slot_of_row_pad[p] = -1;
      }
    }
  for (int64_t s = 0; s < slots; ++s)
    if (row_of_slot[s] >= 0) row_of_slot[s] = pad_of_row[row_of_slot[s]];
}

template <typename T>
void moe_zero_unrouted_rows_cpu(T* x, const int32_t* slot_of_row, int64_t M, int64_t C) {
  for (int64_t r = 0; r < M; ++r)
    if (slot_of_row[r] < 0) std::fill_n(x + r * C, C, T(0));
}

template <typename T>
void moe_permute_forward_cpu(T* out, const T* x, const int32_t* slot_of_row, int64_t M, int64_t C, int64_t k) {
  for (int64_t r = 0; r < M; ++r) {
    if (slot_of_row[r] < 0)  // a padding row
      std::fill_n(out + r * C, C, T(0));
    else
      std::copy_n(x + (slot_of_row[r] / k) * C, C, out + r * C);
  }
}

namespace {
// y[n] = sum_j w[n, j] yp[row_of_slot[n k + j]] (w = 1 without weights) + sum_e dlogits[n, e] router_weight[e] (when
// given) + residual[n] (when given), summed in fp64 in that order and rounded once: the combine (unpermute forward)
// and the permute's backward.
template <typename T>
void combine_rows(T* y, const T* yp, const T* weights, const int32_t* row_of_slot, int64_t N, int64_t C, int64_t k,
                  const T* dlogits, const T* router_weight, int64_t E, const T* residual) {
  std::vector<double> acc(static_cast<size_t>(C));
  for (int64_t n = 0; n < N; ++n) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = row_of_slot[n * k + j];
      if (r < 0) continue;
      const double w = weights ? static_cast<double>(weights[n * k + j]) : 1.0;
      for (int64_t c = 0; c < C; ++c) acc[c] += w * static_cast<double>(yp[r * C + c]);
    }
    for (int64_t e = 0; dlogits && e < E; ++e) {
      const double g = static_cast<double>(dlogits[n * E + e]);
      for (int64_t c = 0; c < C; ++c) acc[c] += g * static_cast<double>(router_weight[e * C + c]);
    }
    if (residual)
      for (int64_t c = 0; c < C; ++c) acc[c] += static_cast<double>(residual[n * C + c]);
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = static_cast<T>(acc[c]);
  }
}
}  // namespace

template <typename T>
void moe_unpermute_forward_cpu(T* y, const T* yp, const T* weights, const int32_t* row_of_slot, int64_t N, int64_t C,
                               int64_t k, const T* residual) {
  combine_rows<T>(y, yp, weights, row_of_slot, N, C, k, nullptr, nullptr, 0, residual);
}

template <typename T>
void moe_permute_backward_cpu(T* dx, const T* dout, const int32_t* row_of_slot, int64_t N, int64_t C, int64_t k,
                              const T* dlogits, const T* router_weight, int64_t E, const T* residual) {
  // the plain sum of a token's rows (and the router's and residual terms)
  combine_rows<T>(dx, dout, nullptr, row_of_slot, N, C, k, dlogits, router_weight, E, residual);
}

template <typename T>
void moe_unpermute_backward_cpu(T* dyp, T* dweights, const T* dy, const T* yp, const T* weights,
                                const int32_t* row_of_slot, int64_t N, int64_t C, int64_t k) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t s = n * k + j;
      const int32_t r = row_of_slot[s];
      if (r < 0) {
        dweights[s] = T(0);
        continue;
      }
      const double w = static_cast<double>(weights[s]);
      double d = 0;
      for (int64_t c = 0; c < C; ++c) {
        d += static_cast<double>(dy[n * C + c]) * static_cast<double>(yp[r * C + c]);
        dyp[r * C + c] = static_cast<T>(w * static_cast<double>(dy[n * C + c]));
      }
      dweights[s] = static_cast<T>(d);
    }
}

#define MT_INSTANTIATE(T)                                                                                       \
  template void moe_apply_capacity_cpu<T>(int32_t*, const T*, int64_t, int64_t, int64_t);                      \
  template void moe_permute_forward_cpu<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t);           \
  template void moe_zero_unrouted_rows_cpu<T>(T*, const int32_t*, int64_t, int64_t);                             \
  template void moe_permute_backward_cpu<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t, const T*,   \
                                            const T*, int64_t, const T*);                                         \
  template void moe_unpermute_forward_cpu<T>(T*, const T*, const T*, const int32_t*, int64_t, int64_t, int64_t,     \
                                             const T*);                                                           \
  template void moe_unpermute_backward_cpu<T>(T*, T*, const T*, const T*, const T*, const int32_t*, int64_t,    \
                                              int64_t, int64_t);
MT_INSTANTIATE(float)
MT_INSTANTIATE(double)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cpu
