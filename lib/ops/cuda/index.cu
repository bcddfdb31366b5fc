// Index CUDA kernels: strided gathers (transpose, permute, broadcast_to), sums over axes, embedding lookups
// and their scatter-add. One thread per output element; every sum runs in a fixed order (no atomics), so the
// results are the same bits on every run.

#include "ops/cuda/device.cuh"

namespace flowrun::cuda {

namespace {

using namespace device;

__device__ __forceinline__ int64_t offset_of(int64_t i, const Strided& s) {
  int64_t off = 0;
  for (int k = s.rank - 1; k >= 0; --k) {
    off += (i % s.dims[k]) * s.stride[k];
    i /= s.dims[k];
  }
  return off;
}

template <typename E>
__global__ void gather_kernel(const E* x, E* y, int64_t n, Strided s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = x[offset_of(i, s)];
}

template <typename T>
__global__ void reduce_kernel(const T* x, T* y, int64_t n, Strided out, Strided reduced, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t base = offset_of(i, out);
    float acc = 0.0f;
    for (int64_t r = 0; r < count; ++r) acc += load(x, base + offset_of(r, reduced));
    store(y, i, acc);
  }
}

template <typename T>
__global__ void embedding_kernel(const int64_t* ids, const T* table, T* y, int64_t n, int64_t V, int64_t D,
                                 int64_t offset) {
  const int64_t total = n * D;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t id = ids[e / D] - offset, d = e % D;
    y[e] = id >= 0 && id < V ? table[id * D + d] : T(0.0f);
  }
}

// A thread per column of the (zeroed) table adds the rows of dy in id order, as the CPU kernel does.
template <typename T>
__global__ void embedding_grad_kernel(const T* dy, const int64_t* ids, T* dt, int64_t n, int64_t V, int64_t D,
                                      int64_t offset) {
  const int64_t d = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (d >= D) return;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = ids[i] - offset;
    if (id >= 0 && id < V) store(dt, id * D + d, load(dt, id * D + d) + load(dy, i * D + d));
  }
}

}  // namespace

void gather_strided(size_t elem_bytes, const void* x, void* y, int64_t n, const Strided& out,
                    cudaStream_t s) {
  if (n == 0) return;
  switch (elem_bytes) {
    case 1:
      gather_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const uint8_t*>(x),
                                                       static_cast<uint8_t*>(y), n, out);
      break;
    case 2:
      gather_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const uint16_t*>(x),
                                                       static_cast<uint16_t*>(y), n, out);
      break;
    case 4:
      gather_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const uint32_t*>(x),
                                                       static_cast<uint32_t*>(y), n, out);
      break;
    default:
      gather_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const uint64_t*>(x),
                                                       static_cast<uint64_t*>(y), n, out);
      break;
  }
  check(cudaGetLastError(), "gather kernel launch");
}

void reduce_sum(Storage t, const void* x, void* y, int64_t n, const Strided& out, const Strided& reduced,
                cudaStream_t s) {
  if (n == 0) return;
  int64_t count = 1;
  for (int k = 0; k < reduced.rank; ++k) count *= reduced.dims[k];
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    reduce_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), n, out,
                                                     reduced, count);
  });
  check(cudaGetLastError(), "reduce_sum kernel launch");
}

void embedding(Storage t, const int64_t* ids, const void* table, void* y, int64_t n, int64_t V, int64_t D,
               int64_t offset, cudaStream_t s) {
  if (n * D == 0) return;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    embedding_kernel<<<blocks_for(n * D), kThreads, 0, s>>>(ids, static_cast<const T*>(table),
                                                            static_cast<T*>(y), n, V, D, offset);
  });
  check(cudaGetLastError(), "embedding kernel launch");
}

void embedding_grad(Storage t, const void* dy, const int64_t* ids, void* dtable, int64_t n, int64_t V,
                    int64_t D, int64_t offset, cudaStream_t s) {
  if (V * D == 0) return;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check(cudaMemsetAsync(dtable, 0, static_cast<size_t>(V * D) * sizeof(T), s), "cudaMemsetAsync");
    embedding_grad_kernel<<<static_cast<unsigned>((D + kThreads - 1) / kThreads), kThreads, 0, s>>>(
        static_cast<const T*>(dy), ids, static_cast<T*>(dtable), n, V, D, offset);
  });
  check(cudaGetLastError(), "embedding gradient kernel launch");
}

}  // namespace flowrun::cuda
