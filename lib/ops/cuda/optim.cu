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

// One element of an update, shared by the single and multi-tensor kernels so that both compute it alike.
__device__ __forceinline__ void sgd_element(const SgdParams& a, float k, float rate, bool first, float* p,
                                            const float* g, float* buf, int64_t i) {
  float gi = k * g[i] + a.weight_decay * p[i];
  if (a.momentum != 0.0f) {
    buf[i] = first ? gi : a.momentum * buf[i] + a.undamped * gi;
    gi = a.nesterov ? gi + a.momentum * buf[i] : buf[i];
  }
  p[i] -= rate * gi;
}

// PyTorch's first SGD step (the buffer set to the gradient) differs from a zero buffer's only with dampening.
__device__ __forceinline__ bool sgd_first(const SgdParams& a, const int64_t* step) {
  return a.momentum != 0.0f && a.undamped != 1.0f && *step == 1;
}

// Adam's per-step factors, every thread computing them from the device scalars; c1, c2: 1 - beta1, 1 - beta2
// formed in double and rounded once (1.0f - float(0.999) would be 0.000999987).
struct AdamStep {
  float k, ss, bc2, b1, b2, c1, c2, e, decay, l2;
};

__device__ __forceinline__ AdamStep adam_step(const AdamParams& a, const float* lr, const int64_t* step,
                                              float k) {
  // PyTorch's bias corrections in double from the integer step, then f32 as the CPU kernel.
  const double rate = *lr, t = static_cast<double>(*step);
  AdamStep st;
  st.k = k;
  st.ss = static_cast<float>(rate / (1.0 - pow(a.beta1, t)));
  st.bc2 = static_cast<float>(sqrt(1.0 - pow(a.beta2, t)));
  st.b1 = static_cast<float>(a.beta1);
  st.b2 = static_cast<float>(a.beta2);
  st.c1 = static_cast<float>(1.0 - a.beta1);
  st.c2 = static_cast<float>(1.0 - a.beta2);
  st.e = static_cast<float>(a.eps);
  st.decay = a.decoupled ? static_cast<float>(1.0 - rate * a.weight_decay) : 1.0f;
  st.l2 = a.decoupled ? 0.0f : static_cast<float>(a.weight_decay);
  return st;
}

__device__ __forceinline__ void adam_element(const AdamStep& st, float* p, const float* g, float* m, float* v,
                                             int64_t i) {
  const float gi = st.k * g[i] + st.l2 * p[i];
  float pi = p[i] * st.decay;
  const float mi = st.b1 * m[i] + st.c1 * gi;
  const float vi = st.b2 * v[i] + st.c2 * gi * gi;
  pi -= st.ss * mi / (sqrtf(vi) / st.bc2 + st.e);
  p[i] = pi;
  m[i] = mi;
  v[i] = vi;
}

__global__ void sgd_kernel(SgdParams a, float* p, const float* g, float* buf, const float* lr,
                           const int64_t* step, const float* coef, int64_t n) {
  const float k = coef ? *coef : 1.0f;
  if (!isfinite(k)) return;
  const float rate = *lr;
  const bool first = sgd_first(a, step);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    sgd_element(a, k, rate, first, p, g, buf, i);
}

__global__ void adamw_kernel(AdamParams a, float* p, const float* g, float* m, float* v, const float* lr,
                             const int64_t* step, const float* coef, int64_t n) {
  const float k = coef ? *coef : 1.0f;
  if (!isfinite(k)) return;
  const AdamStep st = adam_step(a, lr, step, k);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    adam_element(st, p, g, m, v, i);
}

// Multi-tensor updates (apex's multi_tensor_apply): a thread block per chunk of kChunk elements of one
// tensor; block b works on the tensor k with first_block[k] <= b < first_block[k + 1].
constexpr int64_t kChunk = 16 * kThreads;

struct MultiTable {
  float* p[kMultiTensors];
  const float* g[kMultiTensors];
  float* s0[kMultiTensors];
  float* s1[kMultiTensors];
  int64_t n[kMultiTensors];
  int first_block[kMultiTensors + 1];
  int count;
};

struct MultiSgd {
  SgdParams a;
  const float* lr;
  const int64_t* step;
  const float* coef;
};
struct MultiAdam {
  AdamParams a;
  const float* lr;
  const int64_t* step;
  const float* coef;
};
// Kernel parameters: the table and the update's, within the 4 KiB every architecture and CUDA version takes.
static_assert(sizeof(MultiTable) + sizeof(MultiAdam) <= 4096 && sizeof(MultiTable) + sizeof(MultiSgd) <= 4096,
              "multi-tensor kernel parameters over 4 KiB");

// The tensor of this block (binary search over first_block) and the block's elements [begin, end) of it.
__device__ __forceinline__ int block_tensor(const MultiTable& t, int64_t* begin, int64_t* end) {
  const int b = static_cast<int>(blockIdx.x);
  int lo = 0, hi = t.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t.first_block[mid] <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  *begin = static_cast<int64_t>(b - t.first_block[lo]) * kChunk;
  *end = *begin + kChunk < t.n[lo] ? *begin + kChunk : t.n[lo];
  return lo;
}

__global__ void sgd_multi_kernel(MultiTable t, MultiSgd u) {
  const float k = u.coef ? *u.coef : 1.0f;
  if (!isfinite(k)) return;
  const float rate = *u.lr;
  const bool first = sgd_first(u.a, u.step);
  int64_t begin, end;
  const int j = block_tensor(t, &begin, &end);
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads)
    sgd_element(u.a, k, rate, first, t.p[j], t.g[j], t.s0[j], i);
}

__global__ void adamw_multi_kernel(MultiTable t, MultiAdam u) {
  const float k = u.coef ? *u.coef : 1.0f;
  if (!isfinite(k)) return;
  const AdamStep st = adam_step(u.a, u.lr, u.step, k);
  int64_t begin, end;
  const int j = block_tensor(t, &begin, &end);
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads)
    adam_element(st, t.p[j], t.g[j], t.s0[j], t.s1[j], i);
}

// Launches `kernel` over the list's non-empty tensors, as few launches as the grid's size allows (one for
// any realistic list: 2^31 - 1 blocks of kChunk elements).
template <typename Kernel, typename Update>
void launch_multi(Kernel kernel, const MultiTensorList& list, const Update& u, cudaStream_t s,
                  const char* what) {
  constexpr int64_t kMaxBlocks = 0x7fffffff;
  MultiTable t{};
  auto launch = [&] {
    if (t.count == 0) return;
    kernel<<<static_cast<unsigned>(t.first_block[t.count]), kThreads, 0, s>>>(t, u);
    check(cudaGetLastError(), what);
    t.count = 0;
  };
  for (int k = 0; k < list.count; ++k) {
    if (list.n[k] == 0) continue;
    const int64_t blocks = (list.n[k] + kChunk - 1) / kChunk;
    if (t.first_block[t.count] + blocks > kMaxBlocks) launch();
    const int j = t.count++;
    t.p[j] = list.p[k];
    t.g[j] = list.g[k];
    t.s0[j] = list.s0[k];
    t.s1[j] = list.s1[k];
    t.n[j] = list.n[k];
    t.first_block[j + 1] = static_cast<int>(t.first_block[j] + blocks);
  }
  launch();
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

void sgd_update(const SgdParams& a, float* p, const float* g, float* buf, const float* lr,
                const int64_t* step, const float* coef, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  sgd_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, p, g, buf, lr, step, coef, n);
  check(cudaGetLastError(), "sgd_update kernel launch");
}

void adamw_update(const AdamParams& a, float* p, const float* g, float* m, float* v, const float* lr,
                  const int64_t* step, const float* coef, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  adamw_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, p, g, m, v, lr, step, coef, n);
  check(cudaGetLastError(), "adamw_update kernel launch");
}

void sgd_update_multi(const SgdParams& a, const MultiTensorList& t, const float* lr, const int64_t* step,
                      const float* coef, cudaStream_t s) {
  launch_multi(sgd_multi_kernel, t, MultiSgd{a, lr, step, coef}, s, "sgd_update_multi kernel launch");
}

void adamw_update_multi(const AdamParams& a, const MultiTensorList& t, const float* lr, const int64_t* step,
                        const float* coef, cudaStream_t s) {
  launch_multi(adamw_multi_kernel, t, MultiAdam{a, lr, step, coef}, s, "adamw_update_multi kernel launch");
}

}  // namespace flowrun::cuda
