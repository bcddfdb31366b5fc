// Index CUDA kernels: strided gathers (transpose, permute, broadcast_to), sums, means and maxima over axes
// (and the maximum's gradient), the mean squared error, embedding lookups and their scatter-add. One thread
// per output element (a block per 16 chunks for the squared error); every sum runs in a fixed order (no
// atomics), so the results are the same bits on every run.

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

// The maximum as the CPU's std::max(acc, v) keeps it: the first of equal values, and a NaN only when it
// comes first.
template <typename T>
__global__ void reduce_kernel(Reduction op, const T* x, T* y, int64_t n, Strided out, Strided reduced,
                              int64_t count, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t base = offset_of(i, out);
    if (op == Reduction::max) {
      float acc = load(x, base);
      for (int64_t r = 1; r < count; ++r) {
        const float v = load(x, base + offset_of(r, reduced));
        acc = acc < v ? v : acc;
      }
      store(y, i, acc);
      continue;
    }
    float acc = 0.0f;
    for (int64_t r = 0; r < count; ++r) acc += load(x, base + offset_of(r, reduced));
    store(y, i, op == Reduction::mean ? acc * scale : acc);
  }
}

template <typename T>
__global__ void max_grad_kernel(const T* dy, const T* x, const T* y, T* dx, int64_t n, Strided in) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = offset_of(i, in);
    store(dx, i, load(x, i) == load(y, j) ? load(dy, j) : 0.0f);
  }
}

// The lanes of ops/cpu/nn.cc's lane_sum: lane k sums the chunk's elements k, k + 16, ... in order.
constexpr int kMseLanes = 16;

// Thread t of a block is lane t % 16 of chunk blockIdx.x * 16 + t / 16: the lanes' double sums (no FMA, as
// the CPU computes them), then folded as the CPU folds them (lane k adds lane k + w, w = 8, 4, 2, 1).
template <typename T>
__global__ void mse_chunks(const T* p, const T* t, int64_t n, int64_t chunk, int64_t chunks,
                           double* partial) {
  const int lane = threadIdx.x % kMseLanes;
  const int64_t c = blockIdx.x * int64_t{kThreads / kMseLanes} + threadIdx.x / kMseLanes;
  double acc = 0.0;
  if (c < chunks) {
    const int64_t begin = c * chunk, end = begin + chunk < n ? begin + chunk : n;
    for (int64_t i = begin + lane; i < end; i += kMseLanes) {
      const double d = static_cast<double>(load(p, i)) - static_cast<double>(load(t, i));
      acc = __dadd_rn(acc, __dmul_rn(d, d));
    }
  }
  for (int w = kMseLanes / 2; w > 0; w /= 2)
    acc = __dadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, w, kMseLanes));
  if (lane == 0 && c < chunks) partial[c] = acc;
}

template <typename T>
__global__ void mse_mean(const double* partial, int64_t chunks, int64_t n, T* loss) {
  double sum = 0.0;
  for (int64_t k = 0; k < chunks; ++k) sum += partial[k];
  store(loss, 0, n > 0 ? static_cast<float>(sum / static_cast<double>(n)) : 0.0f);
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

void reduce(Reduction op, Storage t, const void* x, void* y, int64_t n, const Strided& out,
            const Strided& reduced, float scale, cudaStream_t s) {
  if (n == 0) return;
  int64_t count = 1;
  for (int k = 0; k < reduced.rank; ++k) count *= reduced.dims[k];
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    reduce_kernel<<<blocks_for(n), kThreads, 0, s>>>(op, static_cast<const T*>(x), static_cast<T*>(y), n, out,
                                                     reduced, count, scale);
  });
  check(cudaGetLastError(), "reduction kernel launch");
}

void reduce_max_grad(Storage t, const void* dy, const void* x, const void* y, void* dx, int64_t n,
                     const Strided& in, cudaStream_t s) {
  if (n == 0) return;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    max_grad_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const T*>(dy), static_cast<const T*>(x),
                                                       static_cast<const T*>(y), static_cast<T*>(dx), n, in);
  });
  check(cudaGetLastError(), "reduce_max gradient kernel launch");
}

void mse_loss(Storage t, const void* pred, const void* target, void* loss, int64_t n, int64_t chunk,
              double* partial, cudaStream_t s) {
  const int64_t chunks = (n + chunk - 1) / chunk;
  constexpr int64_t per_block = kThreads / kMseLanes;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (chunks > 0)
      mse_chunks<<<static_cast<unsigned>((chunks + per_block - 1) / per_block), kThreads, 0, s>>>(
          static_cast<const T*>(pred), static_cast<const T*>(target), n, chunk, chunks, partial);
    mse_mean<<<1, 1, 0, s>>>(partial, chunks, n, static_cast<T*>(loss));
  });
  check(cudaGetLastError(), "mse_loss kernel launch");
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
