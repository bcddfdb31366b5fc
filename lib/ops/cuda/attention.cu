// Scaled-dot-product attention on the device, exact (not tiled like FlashAttention yet): a thread block per
// query row computes its scores into shared memory, the row's max and log-sum-exp, then each output column;
// the backward recomputes the probabilities from lse (FlashAttention-2's equations) with a block per query
// row for dq and a block per key row for dk and dv, so every sum runs in a fixed order without atomics.

#include "ops/cuda/device.cuh"

namespace flowrun::cuda {

namespace {

using namespace device;

// The keys query i of a head sees: [0, end).
__device__ __forceinline__ int64_t keys_seen(const Attention& a, int64_t i) {
  if (!a.causal) return a.s;
  const int64_t e = i + a.s - a.t + 1;
  return e < a.s ? e : a.s;
}

template <typename T>
__device__ float dot(const T* x, const T* y, int64_t n) {
  float acc = 0.0f;
  for (int64_t k = 0; k < n; ++k) acc += load(x, k) * load(y, k);
  return acc;
}

// Block (head h, query i): scores, lse, out row.
template <typename T>
__global__ void forward_kernel(Attention a, const T* q, const T* k, const T* v, T* out, float* lse) {
  extern __shared__ float p[];  // the row's scores, then probabilities
  __shared__ float scratch[kWarps];
  const int64_t row = blockIdx.x, h = row / a.t, i = row % a.t;
  const T* qi = q + row * a.d;
  const T* kh = k + h * a.s * a.d;
  const T* vh = v + h * a.s * a.dv;
  const int64_t n = keys_seen(a, i);
  float m = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    p[j] = a.scale * dot(qi, kh + j * a.d, a.d);
    m = fmaxf(m, p[j]);
  }
  m = block_reduce<true>(m, scratch);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    p[j] = expf(p[j] - m);
    sum += p[j];
  }
  sum = block_reduce<false>(sum, scratch);  // its __syncthreads also publishes p
  const float inv = 1.0f / sum;
  for (int64_t c = threadIdx.x; c < a.dv; c += kThreads) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) acc += p[j] * load(vh, j * a.dv + c);
    store(out, row * a.dv + c, acc * inv);
  }
  if (threadIdx.x == 0) lse[row] = m + logf(sum);
}

// Block (head h, query i): rowsum_i = dout_i . out_i, then dq_i = scale * sum_j ds_ij k_j with
// ds_ij = p_ij (dout_i . v_j - rowsum_i).
template <typename T>
__global__ void dq_kernel(Attention a, const T* dout, const T* q, const T* k, const T* v, const T* out,
                          const float* lse, T* dq, float* rowsum) {
  extern __shared__ float ds[];
  __shared__ float scratch[kWarps];
  const int64_t row = blockIdx.x, h = row / a.t, i = row % a.t;
  const T* qi = q + row * a.d;
  const T* doi = dout + row * a.dv;
  const T* kh = k + h * a.s * a.d;
  const T* vh = v + h * a.s * a.dv;
  float r = 0.0f;
  for (int64_t c = threadIdx.x; c < a.dv; c += kThreads) r += load(doi, c) * load(out, row * a.dv + c);
  r = block_reduce<false>(r, scratch);
  if (threadIdx.x == 0) rowsum[row] = r;
  const int64_t n = keys_seen(a, i);
  const float l = lse[row];
  for (int64_t j = threadIdx.x; j < n; j += kThreads) {
    const float pij = expf(a.scale * dot(qi, kh + j * a.d, a.d) - l);
    ds[j] = pij * (dot(doi, vh + j * a.dv, a.dv) - r);
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < a.d; c += kThreads) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) acc += ds[j] * load(kh, j * a.d + c);
    store(dq, row * a.d + c, a.scale * acc);
  }
}

// Block (head h, key j): dv_j = sum_i p_ij dout_i, dk_j = scale * sum_i ds_ij q_i over the queries that see
// j.
template <typename T>
__global__ void dkv_kernel(Attention a, const T* dout, const T* q, const T* k, const T* v, const float* lse,
                           const float* rowsum, T* dk, T* dv) {
  extern __shared__ float shared[];  // p (t floats), then ds (t floats)
  float* p = shared;
  float* ds = shared + a.t;
  const int64_t key = blockIdx.x, h = key / a.s, j = key % a.s;
  const T* kj = k + key * a.d;
  const T* vj = v + key * a.dv;
  const T* qh = q + h * a.t * a.d;
  const T* doh = dout + h * a.t * a.dv;
  // Queries i see j when j < keys_seen(i): under the causal mask, i >= j - (s - t).
  const int64_t first = a.causal ? (j - (a.s - a.t) > 0 ? j - (a.s - a.t) : 0) : 0;
  for (int64_t i = first + threadIdx.x; i < a.t; i += kThreads) {
    const int64_t row = h * a.t + i;
    const float pij = expf(a.scale * dot(qh + i * a.d, kj, a.d) - lse[row]);
    p[i] = pij;
    ds[i] = pij * (dot(doh + i * a.dv, vj, a.dv) - rowsum[row]);
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < a.dv; c += kThreads) {
    float acc = 0.0f;
    for (int64_t i = first; i < a.t; ++i) acc += p[i] * load(doh, i * a.dv + c);
    store(dv, key * a.dv + c, acc);
  }
  for (int64_t c = threadIdx.x; c < a.d; c += kThreads) {
    float acc = 0.0f;
    for (int64_t i = first; i < a.t; ++i) acc += ds[i] * load(qh, i * a.d + c);
    store(dk, key * a.d + c, a.scale * acc);
  }
}

}  // namespace

void sdpa(Storage st, const Attention& a, const void* q, const void* k, const void* v, void* out, float* lse,
          cudaStream_t s) {
  if (a.bh * a.t == 0) return;
  dispatch(st, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    forward_kernel<<<static_cast<unsigned>(a.bh * a.t), kThreads, a.s * sizeof(float), s>>>(
        a, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(out),
        lse);
  });
  check(cudaGetLastError(), "sdpa kernel launch");
}

void sdpa_grad(Storage st, const Attention& a, const void* dout, const void* q, const void* k, const void* v,
               const void* out, const float* lse, void* dq, void* dk, void* dv, float* rowsum,
               cudaStream_t s) {
  if (a.bh * a.t == 0) return;
  dispatch(st, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    dq_kernel<<<static_cast<unsigned>(a.bh * a.t), kThreads, a.s * sizeof(float), s>>>(
        a, static_cast<const T*>(dout), static_cast<const T*>(q), static_cast<const T*>(k),
        static_cast<const T*>(v), static_cast<const T*>(out), lse, static_cast<T*>(dq), rowsum);
    dkv_kernel<<<static_cast<unsigned>(a.bh * a.s), kThreads, 2 * a.t * sizeof(float), s>>>(
        a, static_cast<const T*>(dout), static_cast<const T*>(q), static_cast<const T*>(k),
        static_cast<const T*>(v), lse, rowsum, static_cast<T*>(dk), static_cast<T*>(dv));
  });
  check(cudaGetLastError(), "sdpa gradient kernel launch");
}

}  // namespace flowrun::cuda
