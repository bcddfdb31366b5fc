// Row-wise CUDA kernels: softmax, log_softmax, cross-entropy, nll_loss, layernorm and rmsnorm with their
// gradients. One block of kThreads threads per row (one block for a loss's mean); the row's sums and maxima
// are reduced in a fixed order (warp shuffles, then the warps' partials), f32 arithmetic on f32/f16/bf16
// storage.

#include "ops/cuda/device.cuh"

namespace flowrun::cuda {

namespace {

using namespace device;

// log(sum(exp(x))) of row x.
template <typename T>
__device__ float row_lse(const T* x, int64_t cols, float* scratch) {
  float m = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) m = fmaxf(m, load(x, j));
  m = block_reduce<true>(m, scratch);
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) s += expf(load(x, j) - m);
  return m + logf(block_reduce<false>(s, scratch));
}

template <typename T>
__global__ void softmax_kernel(bool log, const T* x, T* y, int64_t cols) {
  __shared__ float scratch[kWarps];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * cols;
  T* yr = y + r * cols;
  const float lse = row_lse(xr, cols, scratch);
  for (int64_t j = threadIdx.x; j < cols; j += kThreads)
    store(yr, j, log ? load(xr, j) - lse : expf(load(xr, j) - lse));
}

template <typename T>
__global__ void softmax_grad_kernel(bool log, const T* dy, const T* y, T* dx, int64_t cols) {
  __shared__ float scratch[kWarps];
  const int64_t r = blockIdx.x;
  const T *dyr = dy + r * cols, *yr = y + r * cols;
  T* dxr = dx + r * cols;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) s += log ? load(dyr, j) : load(dyr, j) * load(yr, j);
  s = block_reduce<false>(s, scratch);
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
    const float g = load(dyr, j), v = load(yr, j);
    store(dxr, j, log ? g - expf(v) * s : v * (g - s));
  }
}

// Per row: lse, and the row's loss term (0 for ignored or out-of-range labels) in partial.
template <typename T>
__global__ void cross_entropy_rows(const T* x, const int64_t* labels, T* lse, double* partial, int64_t cols,
                                   int64_t ignore) {
  __shared__ float scratch[kWarps];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * cols;
  const float l = row_lse(xr, cols, scratch);
  if (threadIdx.x == 0) {
    store(lse, r, l);
    const int64_t label = labels[r];
    // As the CPU kernel, which runs f16 and bf16 widened: the term uses the f32 lse, not the stored one (an
    // lse near 100 rounds by up to 1/32 in f16, 1/4 in bf16, and the loss is their difference).
    partial[r] = label != ignore && label >= 0 && label < cols ? double(l) - double(load(xr, label)) : 0.0;
  }
}

// Counts the rows that are not ignored; one block.
__device__ int64_t count_targets(const int64_t* labels, int64_t rows, int64_t ignore, float* scratch) {
  float n = 0.0f;
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) n += labels[r] != ignore ? 1.0f : 0.0f;
  return static_cast<int64_t>(block_reduce<false>(n, scratch) + 0.5f);
}

// The mean of the row terms, summed in row order as the CPU does (one thread; rows are few compared to the
// row work): over the count of valid labels, or over the denominator `den` where there is one (not null;
// 0 where it is 0).
template <typename T>
__global__ void cross_entropy_mean(const int64_t* labels, const double* partial, T* loss, int64_t rows,
                                   int64_t ignore, const T* den) {
  __shared__ float scratch[kWarps];
  const int64_t n = den ? 0 : count_targets(labels, rows, ignore, scratch);
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int64_t r = 0; r < rows; ++r) sum += partial[r];
    const double d = den ? static_cast<double>(load(den, 0)) : static_cast<double>(n);
    store(loss, 0, d != 0.0 ? static_cast<float>(sum / d) : 0.0f);
  }
}

template <typename T>
__global__ void cross_entropy_scale(const T* dloss, const int64_t* labels, float* scale, int64_t rows,
                                    int64_t ignore, const T* den) {
  __shared__ float scratch[kWarps];
  if (den) {
    if (threadIdx.x == 0) {
      const float d = load(den, 0);
      *scale = d != 0.0f ? load(dloss, 0) / d : 0.0f;
    }
    return;
  }
  const int64_t n = count_targets(labels, rows, ignore, scratch);
  if (threadIdx.x == 0) *scale = n > 0 ? load(dloss, 0) / static_cast<float>(n) : 0.0f;
}

template <typename T>
__global__ void cross_entropy_grad_rows(const float* scale, const T* x, const int64_t* labels, const T* lse,
                                        T* dx, int64_t cols, int64_t ignore, int64_t offset,
                                        int64_t classes) {
  const int64_t r = blockIdx.x;
  const int64_t label = labels[r];
  const T* xr = x + r * cols;
  T* dxr = dx + r * cols;
  const float g = *scale;
  const bool counted = label != ignore && label >= 0 && label < classes;
  const int64_t target = label - offset;  // this rank's column of the label, if it holds it
  const float m = load(lse, r);
  for (int64_t j = threadIdx.x; j < cols; j += kThreads)
    store(dxr, j, counted ? g * expf(load(xr, j) - m) - (j == target ? g : 0.0f) : 0.0f);
}

// Vocabulary-parallel cross-entropy (see launch.h), the steps of the CPU's (ops/cpu/nn.cc,
// cross_entropy_split): f32 row maxima and sums of exponentials, widened to double for the reductions over
// the ranks; lse and the loss terms in double.
template <typename T>
__global__ void split_max_rows(const T* x, int64_t cols, double* stats) {
  __shared__ float scratch[kWarps];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * cols;
  float m = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) m = fmaxf(m, load(xr, j));
  m = block_reduce<true>(m, scratch);
  if (threadIdx.x == 0) stats[r] = m;
}

template <typename T>
__global__ void split_sum_rows(const T* x, const int64_t* labels, int64_t rows, int64_t cols, int64_t offset,
                               double* stats) {
  __shared__ float scratch[kWarps];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * cols;
  const float m = static_cast<float>(stats[r]);
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) s += expf(load(xr, j) - m);
  s = block_reduce<false>(s, scratch);
  if (threadIdx.x == 0) {
    stats[rows + r] = s;
    const int64_t l = labels[r] - offset;
    stats[2 * rows + r] = l >= 0 && l < cols ? static_cast<double>(load(xr, l)) : 0.0;
  }
}

// A thread per row; each row's loss term replaces its maximum in stats (read first), for cross_entropy_mean.
template <typename T>
__global__ void split_loss_rows(const int64_t* labels, T* lse, int64_t rows, int64_t classes, int64_t ignore,
                                double* stats) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows;
       r += int64_t{gridDim.x} * blockDim.x) {
    const float v = static_cast<float>(stats[r] + log(stats[rows + r]));
    store(lse, r, v);
    const int64_t l = labels[r];
    // As the CPU kernel, run widened in f16 and bf16: the term uses the f32 lse (see cross_entropy_rows).
    stats[r] = l != ignore && l >= 0 && l < classes ? static_cast<double>(v) - stats[2 * rows + r] : 0.0;
  }
}

template <typename T>
__global__ void layernorm_kernel(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd, int64_t d,
                                 float eps) {
  __shared__ float scratch[kWarps];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * d;
  T* yr = y + r * d;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += kThreads) s += load(xr, j);
  const float mu = block_reduce<false>(s, scratch) / static_cast<float>(d);
  float v = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += kThreads) {
    const float c = load(xr, j) - mu;
    v += c * c;
  }
  const float rs = rsqrtf(block_reduce<false>(v, scratch) / static_cast<float>(d) + eps);
  for (int64_t j = threadIdx.x; j < d; j += kThreads)
    store(yr, j, (load(xr, j) - mu) * rs * load(gamma, j) + load(beta, j));
  if (threadIdx.x == 0) {
    store(mean, r, mu);
    store(rstd, r, rs);
  }
}

// dx = rstd * (g dy - mean(g dy) - xhat mean(g dy xhat)) per row.
template <typename T>
__global__ void layernorm_dx(const T* dy, const T* x, const T* gamma, const T* mean, const T* rstd, T* dx,
                             int64_t d) {
  __shared__ float scratch[kWarps];
  const int64_t r = blockIdx.x;
  const T *dyr = dy + r * d, *xr = x + r * d;
  T* dxr = dx + r * d;
  const float mu = load(mean, r), rs = load(rstd, r);
  float a = 0.0f, b = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += kThreads) {
    const float gd = load(gamma, j) * load(dyr, j);
    a += gd;
    b += gd * (load(xr, j) - mu) * rs;
  }
  a = block_reduce<false>(a, scratch) / static_cast<float>(d);
  b = block_reduce<false>(b, scratch) / static_cast<float>(d);
  for (int64_t j = threadIdx.x; j < d; j += kThreads) {
    const float xhat = (load(xr, j) - mu) * rs;
    store(dxr, j, rs * (load(gamma, j) * load(dyr, j) - a - xhat * b));
  }
}

// y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps), as the CPU computes it (the mean times 1 / d).
template <typename T>
__global__ void rmsnorm_kernel(const T* x, const T* gamma, T* y, T* rstd, int64_t d, float inv_d, float eps) {
  __shared__ float scratch[kWarps];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * d;
  T* yr = y + r * d;
  float v = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += kThreads) {
    const float xv = load(xr, j);
    v += xv * xv;
  }
  const float rs = 1.0f / sqrtf(block_reduce<false>(v, scratch) * inv_d + eps);
  for (int64_t j = threadIdx.x; j < d; j += kThreads) store(yr, j, load(xr, j) * rs * load(gamma, j));
  if (threadIdx.x == 0) store(rstd, r, rs);
}

// dx = rstd * (g dy - xhat mean(g dy xhat)) per row, xhat = x rstd.
template <typename T>
__global__ void rmsnorm_dx(const T* dy, const T* x, const T* gamma, const T* rstd, T* dx, int64_t d,
                           float inv_d) {
  __shared__ float scratch[kWarps];
  const int64_t r = blockIdx.x;
  const T *dyr = dy + r * d, *xr = x + r * d;
  T* dxr = dx + r * d;
  const float rs = load(rstd, r);
  float b = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += kThreads) b += load(gamma, j) * load(dyr, j) * (load(xr, j) * rs);
  b = block_reduce<false>(b, scratch) * inv_d;
  for (int64_t j = threadIdx.x; j < d; j += kThreads)
    store(dxr, j, rs * (load(gamma, j) * load(dyr, j) - load(xr, j) * rs * b));
}

// The parameter gradients of layernorm (kCentered: dgamma = sum over rows of dy xhat, dbeta = sum of dy) and
// rmsnorm (dgamma only), in two passes with the CPU kernel's fixed order: block (column tile, k) sums rows
// [k * rows / blocks, (k + 1) * rows / blocks) of its columns into the f32 partials of block k, vector p at
// partial[(k * parts + p) * d] (with one block of rows, straight into the outputs); then a thread per column
// adds the blocks' partials in k order. f16/bf16 gradients are rounded once, as the CPU's widened kernel
// does.
template <typename T, bool kCentered>
__global__ void norm_dparams_blocks(const T* dy, const T* x, const T* mean, const T* rstd, T* dgamma,
                                    T* dbeta, float* partial, int64_t rows, int64_t d, int64_t blocks) {
  const int64_t k = blockIdx.y, j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= d) return;
  const int64_t r0 = k * rows / blocks, r1 = (k + 1) * rows / blocks;
  float g = 0.0f, b = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const float v = load(dy, r * d + j);
    const float mu = kCentered ? load(mean, r) : 0.0f;
    g += v * ((load(x, r * d + j) - mu) * load(rstd, r));
    if (kCentered) b += v;
  }
  if (blocks == 1) {
    store(dgamma, j, g);
    if (kCentered) store(dbeta, j, b);
    return;
  }
  constexpr int64_t parts = kCentered ? 2 : 1;
  partial[k * parts * d + j] = g;
  if (kCentered) partial[(k * parts + 1) * d + j] = b;
}

template <typename T, bool kCentered>
__global__ void norm_dparams_sum(const float* partial, T* dgamma, T* dbeta, int64_t blocks, int64_t d) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= d) return;
  constexpr int64_t parts = kCentered ? 2 : 1;
  float g = partial[j], b = kCentered ? partial[d + j] : 0.0f;
  for (int64_t k = 1; k < blocks; ++k) {
    g += partial[k * parts * d + j];
    if (kCentered) b += partial[(k * parts + 1) * d + j];
  }
  store(dgamma, j, g);
  if (kCentered) store(dbeta, j, b);
}

template <typename T, bool kCentered>
void norm_dparams(const T* dy, const T* x, const T* mean, const T* rstd, T* dgamma, T* dbeta, float* partial,
                  int64_t rows, int64_t d, int64_t blocks, cudaStream_t s) {
  const unsigned tiles = static_cast<unsigned>((d + kThreads - 1) / kThreads);
  norm_dparams_blocks<T, kCentered><<<dim3(tiles, static_cast<unsigned>(blocks)), kThreads, 0, s>>>(
      dy, x, mean, rstd, dgamma, dbeta, partial, rows, d, blocks);
  if (blocks > 1)
    norm_dparams_sum<T, kCentered><<<tiles, kThreads, 0, s>>>(partial, dgamma, dbeta, blocks, d);
}

// The mean of -logp[r, label] over the counted rows, summed in row order in double as the CPU does (one
// thread gathering one value a row).
template <typename T>
__global__ void nll_loss_kernel(const T* logp, const int64_t* labels, T* loss, int64_t rows, int64_t cols,
                                int64_t ignore) {
  __shared__ float scratch[kWarps];
  const int64_t n = count_targets(labels, rows, ignore, scratch);
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t label = labels[r];
      if (label != ignore && label >= 0 && label < cols)
        sum -= static_cast<double>(load(logp, r * cols + label));
    }
    store(loss, 0, n > 0 ? static_cast<float>(sum / static_cast<double>(n)) : 0.0f);
  }
}

// -dloss / count at each counted row's label of the zeroed dx; one block.
template <typename T>
__global__ void nll_loss_grad_labels(const T* dloss, const int64_t* labels, T* dx, int64_t rows, int64_t cols,
                                     int64_t ignore) {
  __shared__ float scratch[kWarps];
  const int64_t n = count_targets(labels, rows, ignore, scratch);
  if (n == 0) return;
  const float g = load(dloss, 0) / static_cast<float>(n);
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) {
    const int64_t label = labels[r];
    if (label != ignore && label >= 0 && label < cols) store(dx, r * cols + label, -g);
  }
}

unsigned grid(int64_t rows) {
  return static_cast<unsigned>(rows);
}

}  // namespace

void softmax(Storage t, bool log, const void* x, void* y, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows == 0) return;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    softmax_kernel<<<grid(rows), kThreads, 0, s>>>(log, static_cast<const T*>(x), static_cast<T*>(y), cols);
  });
  check(cudaGetLastError(), "softmax kernel launch");
}

void softmax_grad(Storage t, bool log, const void* dy, const void* y, void* dx, int64_t rows, int64_t cols,
                  cudaStream_t s) {
  if (rows == 0) return;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    softmax_grad_kernel<<<grid(rows), kThreads, 0, s>>>(log, static_cast<const T*>(dy),
                                                        static_cast<const T*>(y), static_cast<T*>(dx), cols);
  });
  check(cudaGetLastError(), "softmax gradient kernel launch");
}

void cross_entropy(Storage t, const void* x, const int64_t* labels, const void* den, void* loss, void* lse,
                   int64_t rows, int64_t cols, int64_t ignore, double* partial, cudaStream_t s) {
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (rows > 0)
      cross_entropy_rows<<<grid(rows), kThreads, 0, s>>>(static_cast<const T*>(x), labels,
                                                         static_cast<T*>(lse), partial, cols, ignore);
    cross_entropy_mean<<<1, kThreads, 0, s>>>(labels, partial, static_cast<T*>(loss), rows, ignore,
                                              static_cast<const T*>(den));
  });
  check(cudaGetLastError(), "cross-entropy kernel launch");
}

void cross_entropy_split_max(Storage t, const void* x, int64_t rows, int64_t cols, double* stats,
                             cudaStream_t s) {
  if (rows == 0) return;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    split_max_rows<<<grid(rows), kThreads, 0, s>>>(static_cast<const T*>(x), cols, stats);
  });
  check(cudaGetLastError(), "cross-entropy row maximum kernel launch");
}

void cross_entropy_split_sums(Storage t, const void* x, const int64_t* labels, int64_t rows, int64_t cols,
                              int64_t offset, double* stats, cudaStream_t s) {
  if (rows == 0) return;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    split_sum_rows<<<grid(rows), kThreads, 0, s>>>(static_cast<const T*>(x), labels, rows, cols, offset,
                                                   stats);
  });
  check(cudaGetLastError(), "cross-entropy row sum kernel launch");
}

void cross_entropy_split_loss(Storage t, const int64_t* labels, const void* den, void* loss, void* lse,
                              int64_t rows, int64_t classes, int64_t ignore, double* stats, cudaStream_t s) {
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (rows > 0)
      split_loss_rows<<<blocks_for(rows), kThreads, 0, s>>>(labels, static_cast<T*>(lse), rows, classes,
                                                            ignore, stats);
    cross_entropy_mean<<<1, kThreads, 0, s>>>(labels, stats, static_cast<T*>(loss), rows, ignore,
                                              static_cast<const T*>(den));
  });
  check(cudaGetLastError(), "cross-entropy loss kernel launch");
}

void cross_entropy_grad(Storage t, const void* dloss, const void* x, const int64_t* labels, const void* lse,
                        const void* den, void* dx, int64_t rows, int64_t cols, int64_t ignore, int64_t offset,
                        int64_t classes, float* scale, cudaStream_t s) {
  if (rows == 0) return;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    cross_entropy_scale<<<1, kThreads, 0, s>>>(static_cast<const T*>(dloss), labels, scale, rows, ignore,
                                               static_cast<const T*>(den));
    cross_entropy_grad_rows<<<grid(rows), kThreads, 0, s>>>(scale, static_cast<const T*>(x), labels,
                                                            static_cast<const T*>(lse), static_cast<T*>(dx),
                                                            cols, ignore, offset, classes);
  });
  check(cudaGetLastError(), "cross-entropy gradient kernel launch");
}

void layernorm(Storage t, const void* x, const void* gamma, const void* beta, void* y, void* mean, void* rstd,
               int64_t rows, int64_t d, float eps, cudaStream_t s) {
  if (rows == 0) return;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    layernorm_kernel<<<grid(rows), kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<const T*>(gamma),
                                                     static_cast<const T*>(beta), static_cast<T*>(y),
                                                     static_cast<T*>(mean), static_cast<T*>(rstd), d, eps);
  });
  check(cudaGetLastError(), "layernorm kernel launch");
}

void layernorm_grad(Storage t, const void* dy, const void* x, const void* gamma, const void* mean,
                    const void* rstd, void* dx, void* dgamma, void* dbeta, int64_t rows, int64_t d,
                    float* partial, int64_t blocks, cudaStream_t s) {
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (rows > 0)
      layernorm_dx<<<grid(rows), kThreads, 0, s>>>(static_cast<const T*>(dy), static_cast<const T*>(x),
                                                   static_cast<const T*>(gamma), static_cast<const T*>(mean),
                                                   static_cast<const T*>(rstd), static_cast<T*>(dx), d);
    norm_dparams<T, true>(static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(mean),
                          static_cast<const T*>(rstd), static_cast<T*>(dgamma), static_cast<T*>(dbeta),
                          partial, rows, d, blocks, s);
  });
  check(cudaGetLastError(), "layernorm gradient kernel launch");
}

void rmsnorm(Storage t, const void* x, const void* gamma, void* y, void* rstd, int64_t rows, int64_t d,
             float eps, cudaStream_t s) {
  if (rows == 0) return;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    rmsnorm_kernel<<<grid(rows), kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<const T*>(gamma),
                                                   static_cast<T*>(y), static_cast<T*>(rstd), d,
                                                   1.0f / static_cast<float>(d), eps);
  });
  check(cudaGetLastError(), "rmsnorm kernel launch");
}

void rmsnorm_grad(Storage t, const void* dy, const void* x, const void* gamma, const void* rstd, void* dx,
                  void* dgamma, int64_t rows, int64_t d, float* partial, int64_t blocks, cudaStream_t s) {
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (rows > 0)
      rmsnorm_dx<<<grid(rows), kThreads, 0, s>>>(static_cast<const T*>(dy), static_cast<const T*>(x),
                                                 static_cast<const T*>(gamma), static_cast<const T*>(rstd),
                                                 static_cast<T*>(dx), d, 1.0f / static_cast<float>(d));
    norm_dparams<T, false>(static_cast<const T*>(dy), static_cast<const T*>(x), nullptr,
                           static_cast<const T*>(rstd), static_cast<T*>(dgamma), nullptr, partial, rows, d,
                           blocks, s);
  });
  check(cudaGetLastError(), "rmsnorm gradient kernel launch");
}

void nll_loss(Storage t, const void* logp, const int64_t* labels, void* loss, int64_t rows, int64_t cols,
              int64_t ignore, cudaStream_t s) {
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    nll_loss_kernel<<<1, kThreads, 0, s>>>(static_cast<const T*>(logp), labels, static_cast<T*>(loss), rows,
                                           cols, ignore);
  });
  check(cudaGetLastError(), "nll_loss kernel launch");
}

void nll_loss_grad(Storage t, const void* dloss, const int64_t* labels, void* dx, int64_t rows, int64_t cols,
                   int64_t ignore, cudaStream_t s) {
  if (rows * cols == 0) return;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check(cudaMemsetAsync(dx, 0, static_cast<size_t>(rows * cols) * sizeof(T), s), "cudaMemsetAsync");
    nll_loss_grad_labels<<<1, kThreads, 0, s>>>(static_cast<const T*>(dloss), labels, static_cast<T*>(dx),
                                                rows, cols, ignore);
  });
  check(cudaGetLastError(), "nll_loss gradient kernel launch");
}

}  // namespace flowrun::cuda
