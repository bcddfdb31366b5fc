// Batch normalisation and its gradient in CUDA, as ops/cpu/norm.cc: per-channel sums in two fixed stages
// (a block per (channel, part), then a thread per channel adding the parts in order in double), the channel
// statistics kept in f32 in the workspace for the element passes, f32 arithmetic on f32/f16/bf16 storage.

#include "ops/cuda/device.cuh"

namespace flowrun::cuda {

namespace {

using namespace device;

// Element j < m = n * s of channel ch of x viewed as (n, c, s).
__device__ __forceinline__ int64_t channel_elem(int64_t j, int64_t ch, int64_t c, int64_t s) {
  const int64_t i = j / s;
  return (i * c + ch) * s + (j - i * s);
}

// Stage one: block ch * parts + k sums values [k * per, (k + 1) * per) of channel ch (x, or (x - mean)^2
// with the f32 mean of `stat`) into part[ch * parts + k].
template <typename T, bool kCentred>
__global__ void channel_parts(const T* x, const float* stat, float* part, int64_t c, int64_t s, int64_t m,
                              int64_t parts, int64_t per) {
  __shared__ float scratch[kWarps];
  const int64_t ch = blockIdx.x / parts, k = blockIdx.x % parts;
  const int64_t end = (k + 1) * per < m ? (k + 1) * per : m;
  const float mu = kCentred ? stat[ch] : 0.0f;
  float acc = 0.0f;
  for (int64_t j = k * per + threadIdx.x; j < end; j += kThreads) {
    const float v = load(x, channel_elem(j, ch, c, s));
    acc += kCentred ? (v - mu) * (v - mu) : v;
  }
  acc = block_reduce<false>(acc, scratch);
  if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

// Stage two: channel ch's parts added in order.
__device__ __forceinline__ double parts_sum(const float* part, int64_t ch, int64_t parts) {
  double s = 0.0;
  for (int64_t k = 0; k < parts; ++k) s += part[ch * parts + k];
  return s;
}

template <typename T>
__global__ void batch_mean(const float* part, float* stat, T* mean, int64_t c, int64_t parts, int64_t m) {
  const int64_t ch = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (ch >= c) return;
  const float mu = static_cast<float>(parts_sum(part, ch, parts) / static_cast<double>(m));
  stat[ch] = mu;
  store(mean, ch, mu);
}

// From the centred squares: rstd, and PyTorch's update of the running statistics (the unbiased variance;
// infer rejects m == 1), with the CPU kernel's expressions.
template <typename T>
__global__ void batch_rstd(const float* part, float* stat, T* rstd, T* running_mean, T* running_var,
                           int64_t c, int64_t parts, int64_t m, float eps, float momentum) {
  const int64_t ch = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (ch >= c) return;
  const float ss = static_cast<float>(parts_sum(part, ch, parts)), mu = stat[ch];
  store(running_mean, ch, (1.0f - momentum) * load(running_mean, ch) + momentum * mu);
  store(running_var, ch,
        (1.0f - momentum) * load(running_var, ch) + momentum * (ss / static_cast<float>(m - 1)));
  const float r = 1.0f / sqrtf(ss / static_cast<float>(m) + eps);
  stat[c + ch] = r;
  store(rstd, ch, r);
}

template <typename T>
__global__ void running_stats(const T* running_mean, const T* running_var, float* stat, T* mean, T* rstd,
                              int64_t c, float eps) {
  const int64_t ch = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (ch >= c) return;
  const float mu = load(running_mean, ch), r = 1.0f / sqrtf(load(running_var, ch) + eps);
  stat[ch] = mu;
  stat[c + ch] = r;
  store(mean, ch, mu);
  store(rstd, ch, r);
}

template <typename T>
__global__ void normalize(const T* x, const T* gamma, const T* beta, const float* stat, T* y, int64_t total,
                          int64_t c, int64_t s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ch = (i / s) % c;
    store(y, i, (load(x, i) - stat[ch]) * (stat[c + ch] * load(gamma, ch)) + load(beta, ch));
  }
}

// Stage one of the gradient: sums of dy into part[ch * parts + k] and of dy (x - mean) into
// part[(c + ch) * parts + k].
template <typename T>
__global__ void grad_parts(const T* dy, const T* x, const T* mean, float* part, int64_t c, int64_t s,
                           int64_t m, int64_t parts, int64_t per) {
  __shared__ float scratch[kWarps];
  const int64_t ch = blockIdx.x / parts, k = blockIdx.x % parts;
  const int64_t end = (k + 1) * per < m ? (k + 1) * per : m;
  const float mu = load(mean, ch);
  float b = 0.0f, g = 0.0f;
  for (int64_t j = k * per + threadIdx.x; j < end; j += kThreads) {
    const int64_t e = channel_elem(j, ch, c, s);
    const float d = load(dy, e);
    b += d;
    g += d * (load(x, e) - mu);
  }
  b = block_reduce<false>(b, scratch);
  g = block_reduce<false>(g, scratch);
  if (threadIdx.x == 0) {
    part[blockIdx.x] = b;
    part[c * parts + blockIdx.x] = g;
  }
}

template <typename T>
__global__ void grad_params(const float* part, const T* rstd, float* stat, T* dgamma, T* dbeta, int64_t c,
                            int64_t parts) {
  const int64_t ch = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (ch >= c) return;
  const float db = static_cast<float>(parts_sum(part, ch, parts));
  const float dg = static_cast<float>(parts_sum(part + c * parts, ch, parts)) * load(rstd, ch);
  stat[ch] = db;
  stat[c + ch] = dg;
  store(dbeta, ch, db);
  store(dgamma, ch, dg);
}

template <typename T>
__global__ void grad_input(const T* dy, const T* x, const T* gamma, const T* mean, const T* rstd,
                           const float* stat, T* dx, int64_t total, int64_t c, int64_t s, float t) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ch = (i / s) % c;
    const float r = load(rstd, ch);
    const float bt = t * stat[ch], gt = t * r * stat[c + ch];
    store(dx, i, load(gamma, ch) * r * (load(dy, i) - bt - (load(x, i) - load(mean, ch)) * gt));
  }
}

unsigned channel_blocks(int64_t c) {
  return static_cast<unsigned>((c + kThreads - 1) / kThreads);
}

}  // namespace

void batchnorm(Storage t, const BatchNorm& b, const void* x, const void* gamma, const void* beta,
               void* running_mean, void* running_var, void* y, void* mean, void* rstd, float* ws,
               cudaStream_t s) {
  if (b.c == 0) return;
  const int64_t m = b.n * b.s, total = m * b.c, parts = batchnorm_parts(m), per = (m + parts - 1) / parts;
  float* part = ws + 2 * b.c;
  const unsigned part_blocks = static_cast<unsigned>(b.c * parts);
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xt = static_cast<const T*>(x);
    if (b.training) {
      channel_parts<T, false><<<part_blocks, kThreads, 0, s>>>(xt, ws, part, b.c, b.s, m, parts, per);
      batch_mean<<<channel_blocks(b.c), kThreads, 0, s>>>(part, ws, static_cast<T*>(mean), b.c, parts, m);
      channel_parts<T, true><<<part_blocks, kThreads, 0, s>>>(xt, ws, part, b.c, b.s, m, parts, per);
      batch_rstd<<<channel_blocks(b.c), kThreads, 0, s>>>(
          part, ws, static_cast<T*>(rstd), static_cast<T*>(running_mean), static_cast<T*>(running_var), b.c,
          parts, m, b.eps, b.momentum);
    } else {
      running_stats<<<channel_blocks(b.c), kThreads, 0, s>>>(
          static_cast<const T*>(running_mean), static_cast<const T*>(running_var), ws, static_cast<T*>(mean),
          static_cast<T*>(rstd), b.c, b.eps);
    }
    if (total > 0)
      normalize<<<blocks_for(total), kThreads, 0, s>>>(xt, static_cast<const T*>(gamma),
                                                       static_cast<const T*>(beta), ws, static_cast<T*>(y),
                                                       total, b.c, b.s);
  });
  check(cudaGetLastError(), "batchnorm kernel launch");
}

void batchnorm_grad(Storage t, const BatchNorm& b, const void* dy, const void* x, const void* gamma,
                    const void* mean, const void* rstd, void* dx, void* dgamma, void* dbeta, float* ws,
                    cudaStream_t s) {
  if (b.c == 0) return;
  const int64_t m = b.n * b.s, total = m * b.c, parts = batchnorm_parts(m), per = (m + parts - 1) / parts;
  float* part = ws + 2 * b.c;
  // dx's coefficient of the batch statistics' terms: 1 / m in training, as the CPU's T(1) / m.
  const float coef = b.training ? 1.0f / static_cast<float>(m > 1 ? m : 1) : 0.0f;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    grad_parts<<<static_cast<unsigned>(b.c * parts), kThreads, 0, s>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(mean), part, b.c, b.s, m,
        parts, per);
    grad_params<<<channel_blocks(b.c), kThreads, 0, s>>>(
        part, static_cast<const T*>(rstd), ws, static_cast<T*>(dgamma), static_cast<T*>(dbeta), b.c, parts);
    if (total > 0)
      grad_input<<<blocks_for(total), kThreads, 0, s>>>(
          static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(gamma),
          static_cast<const T*>(mean), static_cast<const T*>(rstd), ws, static_cast<T*>(dx), total, b.c, b.s,
          coef);
  });
  check(cudaGetLastError(), "batchnorm gradient kernel launch");
}

}  // namespace flowrun::cuda
