// CUDA kernels of decoding with a key/value cache (ops/attention.cc's sdpa_cache, ops/shape.cc's slice_at).
// Both read their position from device memory, so that a captured CUDA graph of a decode step follows the
// position the host writes before each replay.

#include "ops/cuda/device.cuh"

namespace flowrun::cuda {

namespace {

using namespace device;

// out[o, j, :] = x[o, start + j, :] in bytes, a thread per byte (grid-stride).
__global__ void slice_at_kernel(const char* x, char* y, const int64_t* start, int64_t outer, int64_t len,
                                int64_t axis_len, int64_t row) {
  const int64_t n = outer * len * row, s = *start;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = i / (len * row), rest = i % (len * row);
    y[i] = x[o * axis_len * row + s * row + rest];
  }
}

// The new positions' keys and values into the caches at rows position.. of each (batch, head).
__global__ void cache_write_kernel(CacheAttention a, const float* k, const float* v, float* kc, float* vc) {
  const int64_t bkv = a.bh / a.heads * a.kv_heads;
  const int64_t pos = *a.position, nk = bkv * a.t * a.d, nv = bkv * a.t * a.dv;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < nk + nv;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (i < nk) {
      const int64_t bh = i / (a.t * a.d), rest = i % (a.t * a.d);
      kc[(bh * a.l + pos) * a.d + rest] = k[i];
    } else {
      const int64_t j = i - nk, bh = j / (a.t * a.dv), rest = j % (a.t * a.dv);
      vc[(bh * a.l + pos) * a.dv + rest] = v[j];
    }
  }
}

// A block per query row (batch x head x new position): its scores against the cached keys 0..position + i
// in shared memory (a thread per key), the block's max and sum in a fixed order, then a thread per output
// element sums the weighted values over the keys in order.
__global__ void cache_attention_kernel(CacheAttention a, const float* q, const float* kc, const float* vc,
                                       float* out) {
  extern __shared__ float shared[];
  float* scores = shared + kWarps;  // shared[0..kWarps): block_reduce's scratch
  const int64_t row = blockIdx.x, bh = row / a.t, i = row % a.t, keys = *a.position + i + 1;
  const int64_t bk = bh / a.heads * a.kv_heads + bh % a.heads / (a.heads / a.kv_heads);
  const float* qr = q + row * a.d;
  const float* keys_of = kc + bk * a.l * a.d;
  float mx = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) {
    float dot = 0;
    for (int64_t p = 0; p < a.d; ++p) dot = fmaf(qr[p], keys_of[j * a.d + p], dot);
    scores[j] = dot * a.scale;
    mx = fmaxf(mx, scores[j]);
  }
  mx = block_reduce<true>(mx, shared);
  float sum = 0;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) sum += scores[j] = expf(scores[j] - mx);
  sum = block_reduce<false>(sum, shared);
  const float* vals = vc + bk * a.l * a.dv;
  for (int64_t p = threadIdx.x; p < a.dv; p += blockDim.x) {
    float acc = 0;
    for (int64_t j = 0; j < keys; ++j) acc = fmaf(scores[j], vals[j * a.dv + p], acc);
    out[row * a.dv + p] = acc / sum;
  }
}

}  // namespace

void slice_at(const void* x, void* y, const int64_t* start, int64_t outer, int64_t len, int64_t axis_len,
              int64_t row, cudaStream_t s) {
  const int64_t n = outer * len * row;
  if (n == 0) return;
  slice_at_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const char*>(x), static_cast<char*>(y),
                                                     start, outer, len, axis_len, row);
  check(cudaGetLastError(), "slice_at kernel launch");
}

void sdpa_cache(const CacheAttention& a, const float* q, const float* k, const float* v, float* kc, float* vc,
                float* out, cudaStream_t s) {
  if (a.bh * a.t == 0) return;
  cache_write_kernel<<<blocks_for(a.bh / a.heads * a.kv_heads * a.t * (a.d + a.dv)), kThreads, 0, s>>>(
      a, k, v, kc, vc);
  check(cudaGetLastError(), "sdpa_cache write launch");
  const size_t shared = static_cast<size_t>(kWarps + a.l) * sizeof(float);
  cache_attention_kernel<<<static_cast<unsigned>(a.bh * a.t), kThreads, shared, s>>>(a, q, kc, vc, out);
  check(cudaGetLastError(), "sdpa_cache attention launch");
}

}  // namespace flowrun::cuda
