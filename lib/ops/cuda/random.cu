// Dropout and BERT's masking on the device, bit-identical in their draws to the CPU kernels: each thread runs
// Philox4x32-10 for its element's block (core/rng.cc, the same rounds and constants) and maps its local index
// to the whole tensor's.

#include "ops/cuda/device.cuh"

namespace flowrun::cuda {

namespace {

using namespace device;

// Word w of Philox4x32-10 block `block` of (seed, stream), as RngStream::block.
__device__ uint32_t philox_word(uint64_t block, uint64_t seed, uint64_t stream, int w) {
  uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32),
           c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0, n1 = static_cast<uint32_t>(p1),
                   n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1, n3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return w == 0 ? c0 : w == 1 ? c1 : w == 2 ? c2 : c3;
}

// core/rng.cc's mix_stream: the step's and the node's ids into one stream id.
__device__ uint64_t mix_stream(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Element i of a piece (row-major in its own dims) numbered in the whole tensor: base + sum of its
// coordinates times the whole tensor's strides.
__device__ int64_t whole_index(const Strided& local, int64_t base, int64_t i) {
  int64_t g = base;
  for (int k = local.rank - 1; k >= 0; --k) {
    g += (i % local.dims[k]) * local.stride[k];
    i /= local.dims[k];
  }
  return g;
}

template <typename T>
__global__ void dropout_kernel(DropoutDraw d, Strided local, const T* x, T* y, uint8_t* mask, int64_t n) {
  const float scale = d.p < 1.0 ? static_cast<float>(1.0 / (1.0 - d.p)) : 0.0f;
  const uint64_t stream = mix_stream(static_cast<uint64_t>(d.step[0]), d.node_stream);
  const int64_t base = d.base + d.step[1] * d.whole;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t g = whole_index(local, base, i);
    const uint32_t word = philox_word(static_cast<uint64_t>(g / 4), d.seed, stream, static_cast<int>(g % 4));
    const float u = static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
    const bool keep = static_cast<double>(u) >= d.p;
    mask[i] = keep;
    store(y, i, keep ? load(x, i) * scale : 0.0f);
  }
}

template <typename T>
__global__ void dropout_grad_kernel(float scale, const T* dy, const uint8_t* mask, T* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    store(dx, i, mask[i] ? load(dy, i) * scale : 0.0f);
}

__device__ double uniform24(uint32_t w) {
  return static_cast<double>(static_cast<float>(w >> 8) * (1.0f / 16777216.0f));
}

__global__ void mlm_mask_kernel(MlmDraw d, Strided local, const int64_t* ids, int64_t* out, int64_t* labels,
                                int64_t n) {
  const uint64_t stream = mix_stream(d.fixed ? 0 : static_cast<uint64_t>(d.step[0]), d.node_stream);
  const int64_t base = d.base + d.step[1] * d.whole;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t g = whole_index(local, base, i);
    const uint64_t block = static_cast<uint64_t>(g);
    const int64_t id = ids[i];
    if (uniform24(philox_word(block, d.seed, stream, 0)) >= d.p) {
      out[i] = id;
      labels[i] = -100;
      continue;
    }
    labels[i] = id;
    const double u = uniform24(philox_word(block, d.seed, stream, 1));
    if (u < d.mask_p) {
      out[i] = d.mask_id;
    } else if (u < d.keep_above) {
      const uint64_t bits = (static_cast<uint64_t>(philox_word(block, d.seed, stream, 3)) << 32) |
                            philox_word(block, d.seed, stream, 2);
      out[i] = static_cast<int64_t>(bits % static_cast<uint64_t>(d.vocab));
    } else {
      out[i] = id;
    }
  }
}

// The count of selected elements of [0, total): each thread its own, summed over its warp, one integer
// atomic per warp (exact: the sum is the same in any order).
__global__ void mlm_count_kernel(MlmDraw d, int64_t total, unsigned long long* counter) {
  const uint64_t stream = mix_stream(d.fixed ? 0 : static_cast<uint64_t>(d.step[0]), d.node_stream);
  unsigned long long k = 0;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < total;
       g += int64_t{gridDim.x} * blockDim.x)
    k += uniform24(philox_word(static_cast<uint64_t>(g), d.seed, stream, 0)) < d.p;
  for (int o = 16; o > 0; o /= 2) k += __shfl_down_sync(0xffffffffu, k, o);
  if (threadIdx.x % 32 == 0 && k > 0) atomicAdd(counter, k);
}

__global__ void zero_counter(unsigned long long* counter) {
  *counter = 0;
}

__global__ void mlm_count_share(const unsigned long long* counter, int64_t total, int64_t local,
                                float* count) {
  *count = total > 0 ? static_cast<float>(static_cast<double>(*counter) * static_cast<double>(local) /
                                          static_cast<double>(total))
                     : 0.0f;
}

}  // namespace

void dropout(Storage t, const DropoutDraw& d, const Strided& local, const void* x, void* y, uint8_t* mask,
             int64_t n, cudaStream_t s) {
  if (n == 0) return;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    dropout_kernel<<<blocks_for(n), kThreads, 0, s>>>(d, local, static_cast<const T*>(x), static_cast<T*>(y),
                                                      mask, n);
  });
  check(cudaGetLastError(), "dropout kernel launch");
}

void dropout_grad(Storage t, double p, const void* dy, const uint8_t* mask, void* dx, int64_t n,
                  cudaStream_t s) {
  if (n == 0) return;
  const float scale = p < 1.0 ? static_cast<float>(1.0 / (1.0 - p)) : 0.0f;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    dropout_grad_kernel<<<blocks_for(n), kThreads, 0, s>>>(scale, static_cast<const T*>(dy), mask,
                                                           static_cast<T*>(dx), n);
  });
  check(cudaGetLastError(), "dropout gradient kernel launch");
}

void mlm_mask(const MlmDraw& d, const Strided& local, const int64_t* ids, int64_t* out, int64_t* labels,
              int64_t n, cudaStream_t s) {
  if (n == 0) return;
  mlm_mask_kernel<<<blocks_for(n), kThreads, 0, s>>>(d, local, ids, out, labels, n);
  check(cudaGetLastError(), "mlm_mask kernel launch");
}

void mlm_count(const MlmDraw& d, int64_t total, int64_t local, unsigned long long* counter, float* count,
               cudaStream_t s) {
  zero_counter<<<1, 1, 0, s>>>(counter);
  if (total > 0) mlm_count_kernel<<<blocks_for(total), kThreads, 0, s>>>(d, total, counter);
  mlm_count_share<<<1, 1, 0, s>>>(counter, total, local, count);
  check(cudaGetLastError(), "mlm_mask count kernel launch");
}

}  // namespace flowrun::cuda
