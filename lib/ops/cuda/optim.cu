// Optimizer updates on the device: one thread per element, the scalars (learning rate, step, the loss
// scaler's coefficient) read from device memory so that no step waits for the host.

#include <cmath>

#include "ops/cuda/device.cuh"

namespace flowrun::cuda {

namespace {

using namespace device;

// Block b: the sum of squares of its `block` elements in double, a tree over the threads (a fixed order).
template <typename T>
__global__ void sum_squares_kernel(const T* x, int64_t n, int64_t block, double* partial) {
  __shared__ double sums[kThreads];
  const int64_t begin = blockIdx.x * block, end = begin + block < n ? begin + block : n;
  double acc = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const double v = load(x, i);
    acc += v * v;
  }
  sums[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) sums[threadIdx.x] += sums[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sums[0];
}

// One thread: the sum is in a fixed order, and `out` may be one of the partials (read before it is written).
__global__ void sum_kernel(const double* partial, int64_t n, double* out) {
  double total = 0.0;
  for (int64_t b = 0; b < n; ++b) total += partial[b];
  *out = total;
}

__global__ void norm_kernel(const double* partial, int64_t n, double scale, float* out) {
  double total = 0.0;
  for (int64_t b = 0; b < n; ++b) total += partial[b];
  *out = static_cast<float>(scale * sqrt(total));
}

__global__ void clip_kernel(const float* norm, double max_norm, double scale, float* out) {
  const double clip = fmin(1.0, max_norm / (static_cast<double>(*norm) + 1e-6));
  *out = static_cast<float>(scale * clip);
}

__global__ void unscale_kernel(LossScaling a, const float* norm, const float* loss_scale, float* coef,
                               float* true_norm) {
  const double n = *norm, scale = *loss_scale, unscaled = n / scale;
  double c = nan("");
  if (isfinite(n)) {
    c = a.scale / scale;
    if (a.max_norm > 0) c *= fmin(1.0, a.max_norm / (unscaled + 1e-6));
  }
  *coef = static_cast<float>(c);
  *true_norm = static_cast<float>(unscaled);
}

__global__ void loss_scale_kernel(LossScaling a, const float* norm, float* loss_scale, int64_t* good,
                                  int64_t* skipped) {
  if (!isfinite(static_cast<double>(*norm))) {
    ++*skipped;
    if (a.dynamic) {
      *loss_scale = static_cast<float>(*loss_scale * a.backoff);
      *good = 0;
    }
    return;
  }
  if (!a.dynamic) return;
  if (++*good >= a.growth_interval) {
    const float grown = static_cast<float>(*loss_scale * a.growth);
    if (isfinite(grown)) *loss_scale = grown;
    *good = 0;
  }
}

template <typename T>
__global__ void accumulate_kernel(T* acc, const T* g, const int64_t* micro, int64_t n) {
  const bool first = *micro == 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    store(acc, i, first ? load(g, i) : load(acc, i) + load(g, i));
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

void sum_squares(Storage t, const void* x, int64_t n, int64_t block, double* partial, cudaStream_t s) {
  if (n == 0) return;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    sum_squares_kernel<<<static_cast<unsigned>((n + block - 1) / block), kThreads, 0, s>>>(
        static_cast<const T*>(x), n, block, partial);
  });
  check(cudaGetLastError(), "sum of squares kernel launch");
}

void norm_from_partials(const double* partial, int64_t n, double scale, float* out, cudaStream_t s) {
  norm_kernel<<<1, 1, 0, s>>>(partial, n, scale, out);
  check(cudaGetLastError(), "norm kernel launch");
}

void sum_partials(const double* partial, int64_t n, double* out, cudaStream_t s) {
  sum_kernel<<<1, 1, 0, s>>>(partial, n, out);
  check(cudaGetLastError(), "sum kernel launch");
}

void clip_coef(const float* norm, double max_norm, double scale, float* out, cudaStream_t s) {
  clip_kernel<<<1, 1, 0, s>>>(norm, max_norm, scale, out);
  check(cudaGetLastError(), "clip_coef kernel launch");
}

void unscale_coef(const LossScaling& a, const float* norm, const float* loss_scale, float* coef,
                  float* true_norm, cudaStream_t s) {
  unscale_kernel<<<1, 1, 0, s>>>(a, norm, loss_scale, coef, true_norm);
  check(cudaGetLastError(), "unscale_coef kernel launch");
}

void loss_scale_update(const LossScaling& a, const float* norm, float* loss_scale, int64_t* good,
                       int64_t* skipped, cudaStream_t s) {
  loss_scale_kernel<<<1, 1, 0, s>>>(a, norm, loss_scale, good, skipped);
  check(cudaGetLastError(), "loss_scale_update kernel launch");
}

void grad_accumulate(Storage t, void* acc, const void* g, const int64_t* micro, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    accumulate_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(acc), static_cast<const T*>(g),
                                                         micro, n);
  });
  check(cudaGetLastError(), "grad_accumulate kernel launch");
}

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
