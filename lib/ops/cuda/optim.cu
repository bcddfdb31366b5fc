// Optimizer updates on the device: one thread per element, the scalars (learning rate, step, the loss
// scaler's coefficient) read from device memory so that no step waits for the host.
#include <cmath>

#include "core/cuda/runtime.h"
#include "ops/cuda/launch.h"

namespace flowrun::cuda {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 32 ? (b > 0 ? b : 1) : 65535 * 32);
}

__global__ void sgd_kernel(SgdParams a, float* p, const float* g, float* buf, const float* lr,
                           const float* coef, int64_t n) {
  const float k = coef ? *coef : 1.0f;
  if (!isfinite(k)) return;
  const float rate = *lr;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float gi = k * g[i] + a.weight_decay * p[i];
    if (a.momentum != 0.0f) {
      buf[i] = a.momentum * buf[i] + (1.0f - a.dampening) * gi;
      gi = a.nesterov ? gi + a.momentum * buf[i] : buf[i];
    }
    p[i] -= rate * gi;
  }
}

__global__ void adamw_kernel(AdamParams a, float* p, const float* g, float* m, float* v, const float* lr,
                             const int64_t* step, const float* coef, int64_t n) {
  const float k = coef ? *coef : 1.0f;
  if (!isfinite(k)) return;
  // PyTorch's bias corrections in double from the integer step, then f32 as the CPU kernel.
  const double rate = *lr, t = static_cast<double>(*step);
  const float ss = static_cast<float>(rate / (1.0 - pow(a.beta1, t)));
  const float bc2 = static_cast<float>(sqrt(1.0 - pow(a.beta2, t)));
  const float b1 = static_cast<float>(a.beta1), b2 = static_cast<float>(a.beta2),
              e = static_cast<float>(a.eps);
  const float decay = a.decoupled ? static_cast<float>(1.0 - rate * a.weight_decay) : 1.0f;
  const float l2 = a.decoupled ? 0.0f : static_cast<float>(a.weight_decay);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float gi = k * g[i] + l2 * p[i];
    float pi = p[i] * decay;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    pi -= ss * mi / (sqrtf(vi) / bc2 + e);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace

void sgd_update(const SgdParams& a, float* p, const float* g, float* buf, const float* lr, const float* coef,
                int64_t n, cudaStream_t s) {
  if (n == 0) return;
  sgd_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, p, g, buf, lr, coef, n);
  check(cudaGetLastError(), "sgd_update kernel launch");
}

void adamw_update(const AdamParams& a, float* p, const float* g, float* m, float* v, const float* lr,
                  const int64_t* step, const float* coef, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  adamw_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, p, g, m, v, lr, step, coef, n);
  check(cudaGetLastError(), "adamw_update kernel launch");
}

}  // namespace flowrun::cuda
