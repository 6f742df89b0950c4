// AdamW step (decoupled weight decay), CPU reference, exactly the formula of ops.h, per element:
//   g = grad * grad_scale
//   m = b1 m + (1 - b1) g
//   v = b2 v + (1 - b2) g^2
//   p -= lr * ((m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps) + wd * p)
// (the weight decay term uses p before the update). Arithmetic in fp64, stored in T.
#include <cmath>

#include "tensor/cpu/cpu_ops.h"

namespace mt::ops::cpu {

template <typename T>
void adamw_step_cpu(T* param, T* m, T* v, const T* grad, int64_t n, double lr, double beta1, double beta2, double eps,
                    double weight_decay, int64_t step, double grad_scale) {
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
#pragma omp parallel for schedule(static) if (n > (1 << 14))
  for (int64_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(grad[i]) * grad_scale;
    const double mi = beta1 * static_cast<double>(m[i]) + (1.0 - beta1) * g;
    const double vi = beta2 * static_cast<double>(v[i]) + (1.0 - beta2) * g * g;
    const double p = static_cast<double>(param[i]);
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
    param[i] = static_cast<T>(p - lr * ((mi / bc1) / (std::sqrt(vi / bc2) + eps) + weight_decay * p));
  }
}

template void adamw_step_cpu<float>(float*, float*, float*, const float*, int64_t, double, double, double, double,
                                    double, int64_t, double);
template void adamw_step_cpu<double>(double*, double*, double*, const double*, int64_t, double, double, double,
                                     double, double, int64_t, double);

}  // namespace mt::ops::cpu
