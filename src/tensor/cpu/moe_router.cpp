// CPU reference of the MoE router and its balancing losses (tensor/moe_ops.h). Each row is independent;
// every sum runs in fp64 in a fixed order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/cpu/moe_cpu.h"

namespace mt::ops::cpu {

namespace {
// p_ne of the aux losses into p (E): the scores (softmax) or the sigmoid scores over their row sum.
template <typename T>
double aux_probs(double* p, const T* s, int64_t E, bool sigmoid) {
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += static_cast<double>(s[e]);
  const double inv = sigmoid ? 1.0 / sum : 1.0;
  for (int64_t e = 0; e < E; ++e) p[e] = static_cast<double>(s[e]) * inv;
  return sum;
}
}  // namespace

template <typename T>
void moe_router_forward_cpu(int32_t* indices, T* weights, T* scores, const T* logits, const T* bias, int64_t N,
                            int64_t E, const RouterSpec& spec) {
  const int64_t k = spec.topk;
  std::vector<double> choice(static_cast<size_t>(E));
  std::vector<char> taken(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    const T* l = logits + n * E;
    T* s = scores + n * E;
    if (spec.sigmoid) {
      for (int64_t e = 0; e < E; ++e) s[e] = static_cast<T>(1.0 / (1.0 + std::exp(-static_cast<double>(l[e]))));
    } else {
      double mx = -INFINITY, sum = 0;
      for (int64_t e = 0; e < E; ++e) mx = std::max(mx, static_cast<double>(l[e]));
      for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e]) - mx);
      for (int64_t e = 0; e < E; ++e) s[e] = static_cast<T>(std::exp(static_cast<double>(l[e]) - mx) / sum);
    }
    for (int64_t e = 0; e < E; ++e) {
      choice[e] = static_cast<double>(s[e]) + (bias ? static_cast<double>(bias[e]) : 0.0);
      taken[e] = 0;
    }
    double chosen_sum = 0;
    for (int64_t j = 0; j < k; ++j) {  // strict > keeps the lower index on ties
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e)
        if (!taken[e] && (best < 0 || choice[e] > choice[best])) best = e;
      taken[best] = 1;
      indices[n * k + j] = static_cast<int32_t>(best);
      chosen_sum += static_cast<double>(s[best]);
    }
    const double f = (spec.normalize() ? 1.0 / chosen_sum : 1.0) * spec.scaling;
    for (int64_t j = 0; j < k; ++j) weights[n * k + j] = static_cast<T>(static_cast<double>(s[indices[n * k + j]]) * f);
  }
}

template <typename T>
void moe_router_backward_cpu(T* dlogits, const T* dweights, const T* scores, const int32_t* indices, int64_t N,
                             int64_t E, const RouterSpec& spec) {
  const int64_t k = spec.topk;
  std::vector<double> ds(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    const T* s = scores + n * E;
    const int32_t* idx = indices + n * k;
    std::fill(ds.begin(), ds.end(), 0.0);
    // w_j = s_j / S * scale (normalized) or s_j * scale: ds_j = scale * (dw_j - sum_l dw_l s_l / S) / S
    double S = 0, dot = 0;
    for (int64_t j = 0; j < k; ++j) {
      S += static_cast<double>(s[idx[j]]);
      dot += static_cast<double>(dweights[n * k + j]) * static_cast<double>(s[idx[j]]);
    }
    for (int64_t j = 0; j < k; ++j) {
      const double dw = static_cast<double>(dweights[n * k + j]) * spec.scaling;
      ds[idx[j]] = spec.normalize() ? (dw - spec.scaling * dot / S) / S : dw;
    }
    T* dl = dlogits + n * E;
    if (spec.sigmoid) {
      for (int64_t e = 0; e < E; ++e) {
        const double se = static_cast<double>(s[e]);
        dl[e] = static_cast<T>(ds[e] * se * (1.0 - se));
      }
    } else {  // softmax: dl = s * (ds - sum(ds * s))
      double sd = 0;
      for (int64_t e = 0; e < E; ++e) sd += ds[e] * static_cast<double>(s[e]);
      for (int64_t e = 0; e < E; ++e) dl[e] = static_cast<T>(static_cast<double>(s[e]) * (ds[e] - sd));
    }
  }
}

template <typename T>
void moe_aux_loss_cpu(T* loss, T* dlogits, const T* scores, const int32_t* indices, int64_t N, int64_t E, int64_t k,
                      int64_t groups, double coeff, bool sigmoid, double dloss, const double* a_given) {
  const int64_t rows = N / groups;
  std::vector<double> a(static_cast<size_t>(E)), p(static_cast<size_t>(E));
  double total = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t n0 = g * rows;
    // a_e = dL/dp_ne = coeff / groups * E * f_ge / rows  (f_ge = count / (rows * k))
    std::fill(a.begin(), a.end(), 0.0);
    for (int64_t i = n0 * k; i < (n0 + rows) * k; ++i)
      if (indices[i] >= 0) a[indices[i]] += 1.0;
    for (int64_t e = 0; e < E; ++e)
      a[e] *= coeff / static_cast<double>(groups) * static_cast<double>(E) / static_cast<double>(rows * k * rows);
    if (a_given) std::copy(a_given, a_given + E, a.begin());
    for (int64_t n = n0; n < n0 + rows; ++n) {
      const double S = aux_probs(p.data(), scores + n * E, E, sigmoid);
      double ap = 0;
      for (int64_t e = 0; e < E; ++e) ap += a[e] * p[e];
      total += ap;
      if (!dlogits) continue;
      T* dl = dlogits + n * E;
      const T* s = scores + n * E;
      for (int64_t e = 0; e < E; ++e) {
        const double se = static_cast<double>(s[e]);
        // softmax: p = s, dl = s (a - a.s); sigmoid: p = s / S, ds = (a - a.p) / S, dl = ds s (1 - s)
        const double d = sigmoid ? (a[e] - ap) / S * se * (1.0 - se) : se * (a[e] - ap);
        dl[e] = static_cast<T>(static_cast<double>(dl[e]) + dloss * d);
      }
    }
  }
  if (loss) loss[0] = static_cast<T>(total);
}

template <typename T>
void moe_z_loss_cpu(T* loss, T* dlogits, const T* logits, int64_t N, int64_t E, double coeff, double dloss) {
  double total = 0;
  for (int64_t n = 0; n < N; ++n) {
    const T* l = logits + n * E;
    double mx = -INFINITY, sum = 0;
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, static_cast<double>(l[e]));
    for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e]) - mx);
    const double lse = mx + std::log(sum);
    total += lse * lse;
    if (!dlogits) continue;
    const double f = dloss * coeff * 2.0 * lse / static_cast<double>(N);
    for (int64_t e = 0; e < E; ++e)
      dlogits[n * E + e] =
          static_cast<T>(static_cast<double>(dlogits[n * E + e]) + f * std::exp(static_cast<double>(l[e]) - lse));
  }
  if (loss) loss[0] = static_cast<T>(coeff * total / static_cast<double>(N));
}

template <typename T>
void moe_expert_bias_update_cpu(T* bias, const double* load, int64_t E, double rate) {
  double mean = 0;
  for (int64_t e = 0; e < E; ++e) mean += load[e];
  mean /= static_cast<double>(E);
  for (int64_t e = 0; e < E; ++e) {
    const double d = mean - load[e];
    const double sign = d > 0 ? 1.0 : d < 0 ? -1.0 : 0.0;
    bias[e] = static_cast<T>(static_cast<double>(bias[e]) + rate * sign);
  }
}

#define MT_INSTANTIATE(T)                                                                                      \
  template void moe_router_forward_cpu<T>(int32_t*, T*, T*, const T*, const T*, int64_t, int64_t,             \
                                          const RouterSpec&);                                                  \
  template void moe_router_backward_cpu<T>(T*, const T*, const T*, const int32_t*, int64_t, int64_t,          \
                                           const RouterSpec&);                                                 \
  template void moe_aux_loss_cpu<T>(T*, T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, double, \
                                    bool, double, const double*);                                              \
  template void moe_z_loss_cpu<T>(T*, T*, const T*, int64_t, int64_t, double, double);                        \
  template void moe_expert_bias_update_cpu<T>(T*, const double*, int64_t, double);
MT_INSTANTIATE(float)
MT_INSTANTIATE(double)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cpu
