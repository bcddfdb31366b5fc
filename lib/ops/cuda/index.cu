// Index CUDA kernels: strided gathers (transpose, permute, broadcast_to), sums, means and maxima over axes
// (and the maximum's gradient), the mean squared error, embedding lookups and their scatter-add. One thread
// per output element, but for sums over leading or trailing axes (a block per 32 columns, a warp per row),
// the squared error (a block per 16 chunks) and the scatter-add (a block per slice of the table); every sum
// runs in a fixed order (no atomics), so the results are the same bits on every run.

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

// The same in 32 bits, for tensors whose indices and offsets fit: a 64-bit division is a long software
// sequence on the GPU, a 32-bit one a few instructions (GPT-2's head transposes went at a third of the
// memory's speed).
__device__ __forceinline__ uint32_t offset_of32(uint32_t i, const Strided& s) {
  uint32_t off = 0;
  for (int k = s.rank - 1; k >= 0; --k) {
    const auto d = static_cast<uint32_t>(s.dims[k]);
    off += (i % d) * static_cast<uint32_t>(s.stride[k]);
    i /= d;
  }
  return off;
}

template <typename E, bool kNarrow>
__global__ void gather_kernel(const E* x, E* y, int64_t n, Strided s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = x[kNarrow ? offset_of32(static_cast<uint32_t>(i), s) : offset_of(i, s)];
}

// Whether n elements gathered through s index and address in 32 bits.
bool narrow(int64_t n, const Strided& s) {
  int64_t last = 0;
  for (int k = 0; k < s.rank; ++k) last += (s.dims[k] - 1) * s.stride[k];
  return n <= INT32_MAX && last <= INT32_MAX;
}

template <typename E>
void gather(const void* x, void* y, int64_t n, const Strided& s, cudaStream_t st) {
  if (narrow(n, s))
    gather_kernel<E, true>
        <<<blocks_for(n), kThreads, 0, st>>>(static_cast<const E*>(x), static_cast<E*>(y), n, s);
  else
    gather_kernel<E, false>
        <<<blocks_for(n), kThreads, 0, st>>>(static_cast<const E*>(x), static_cast<E*>(y), n, s);
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

// Sums (means) over the leading axes of x viewed as [rows, cols], the bias gradients of linears: a block
// per 32 columns, its 32 x 32 threads each summing every 32nd row of one column in row order, then the 32
// partials of a column summed in order. The one-thread-per-output kernel above reads a column serially,
// with a division per element: 10 ms for a (16384, 3072) bf16 gradient on an H200.
template <typename T>
__global__ void column_sum_kernel(const T* x, T* y, int64_t rows, int64_t cols, float scale) {
  __shared__ float part[32][33];
  const int64_t col = blockIdx.x * int64_t{32} + threadIdx.x;
  float acc = 0.0f;
  if (col < cols)
    for (int64_t r = threadIdx.y; r < rows; r += 32) acc += load(x, r * cols + col);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float sum = 0.0f;
    for (int k = 0; k < 32; ++k) sum += part[k][threadIdx.x];
    store(y, col, sum * scale);
  }
}

// Sums (means) over the trailing axes, x viewed as [rows, cols] with cols contiguous: a warp per row, its
// lanes striding the row, the lanes' partials summed in a fixed tree.
template <typename T>
__global__ void row_sum_kernel(const T* x, T* y, int64_t rows, int64_t cols, float scale) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (row >= rows) return;
  float acc = 0.0f;
  for (int64_t j = lane; j < cols; j += 32) acc += load(x, row * cols + j);
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) store(y, row, acc * scale);
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

// Table rows [v0, v0 + rows) and columns [c0, c0 + kThreads) per block, summed in f32 in shared memory (the
// CPU's widened f16/bf16 kernel sums in f32 too: a byte-level GPT's frequent ids get thousands of rows, which
// a running bf16 sum would mostly round away). The block scans the ids a block-width at a time into an
// ordered list of its hits; each thread then adds its column of those rows in token order, loading a group
// of rows before adding them so that the loads overlap. No atomics: the same bits on every run. One thread
// per column going through every token in turn took 7.7 ms for GPT-2's (16384, 768) bf16 gradient, as did a
// block per slice of rows adding each hit's row before loading the next (byte ids crowd a few blocks).
constexpr int kHitGroup = 8;
template <typename T>
__global__ void embedding_grad_kernel(const T* dy, const int64_t* ids, T* dt, int64_t n, int64_t V, int64_t D,
                                      int64_t offset, int rows) {
  extern __shared__ float acc[];  // rows x kThreads
  __shared__ unsigned hits[kWarps];
  __shared__ int64_t hit_token[kThreads];
  __shared__ int hit_row[kThreads];
  const int64_t v0 = blockIdx.x * int64_t{rows}, c = blockIdx.y * int64_t{kThreads} + threadIdx.x;
  const int nr = static_cast<int>(min(int64_t{rows}, V - v0));
  for (int r = 0; r < nr; ++r) acc[r * kThreads + threadIdx.x] = 0.0f;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  for (int64_t base = 0; base < n; base += kThreads) {
    const int64_t i = base + threadIdx.x;
    const int64_t row = i < n ? ids[i] - offset - v0 : -1;
    const bool hit = row >= 0 && row < nr;
    const unsigned mask = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) hits[warp] = mask;
    __syncthreads();
    int at = 0, count = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (w == warp) at = count + __popc(mask & ((1u << lane) - 1u));
      count += __popc(hits[w]);
    }
    if (hit) {
      hit_token[at] = i;
      hit_row[at] = static_cast<int>(row);
    }
    __syncthreads();
    if (c < D)
      for (int g = 0; g < count; g += kHitGroup) {
        float x[kHitGroup];
        const int m = min(kHitGroup, count - g);
        for (int u = 0; u < kHitGroup; ++u) x[u] = u < m ? load(dy, hit_token[g + u] * D + c) : 0.0f;
        for (int u = 0; u < m; ++u) acc[hit_row[g + u] * kThreads + threadIdx.x] += x[u];
      }
    __syncthreads();  // before the list and the masks are overwritten
  }
  if (c < D)
    for (int r = 0; r < nr; ++r) store(dt, (v0 + r) * D + c, acc[r * kThreads + threadIdx.x]);
}

}  // namespace

void gather_strided(size_t elem_bytes, const void* x, void* y, int64_t n, const Strided& out,
                    cudaStream_t s) {
  if (n == 0) return;
  switch (elem_bytes) {
    case 1:
      gather<uint8_t>(x, y, n, out, s);
      break;
    case 2:
      gather<uint16_t>(x, y, n, out, s);
      break;
    case 4:
      gather<uint32_t>(x, y, n, out, s);
      break;
    default:
      gather<uint64_t>(x, y, n, out, s);
  }
  check(cudaGetLastError(), "gather kernel launch");
}

void reduce(Reduction op, Storage t, const void* x, void* y, int64_t n, const Strided& out,
            const Strided& reduced, float scale, cudaStream_t s) {
  if (n == 0) return;
  int64_t count = 1;
  for (int k = 0; k < reduced.rank; ++k) count *= reduced.dims[k];
  // x as [rows, cols] when the reduced axes all lead (a sum over rows) or all trail (over columns): both
  // index sets are then contiguous runs of a row-major tensor.
  const auto contiguous = [](const Strided& a, int64_t inner) {
    for (int k = a.rank - 1; k >= 0; --k) {
      if (a.dims[k] != 1 && a.stride[k] != inner) return false;
      inner *= a.dims[k];
    }
    return true;
  };
  const float f = op == Reduction::mean ? scale : 1.0f;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xt = static_cast<const T*>(x);
    T* yt = static_cast<T*>(y);
    const bool lead = op != Reduction::max && contiguous(out, 1) && contiguous(reduced, n);
    const bool trail = op != Reduction::max && contiguous(reduced, 1) && contiguous(out, count);
    if (lead && (n >= 32 || !trail))  // a few outputs (a whole-tensor sum): a warp each, not a thread
      column_sum_kernel<<<static_cast<unsigned>((n + 31) / 32), dim3(32, 32), 0, s>>>(xt, yt, count, n, f);
    else if (trail)
      row_sum_kernel<<<static_cast<unsigned>((n + kWarps - 1) / kWarps), kThreads, 0, s>>>(xt, yt, n, count,
                                                                                           f);
    else
      reduce_kernel<<<blocks_for(n), kThreads, 0, s>>>(op, xt, yt, n, out, reduced, count, scale);
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
  // f32 accumulators for as many rows as fit the 48 KiB of shared memory a block gets without opting in,
  // beside the hit list (3 KiB): 44 rows.
  constexpr int kRows = static_cast<int>((45 * 1024 - 64) / (kThreads * sizeof(float)));
  const dim3 grid(static_cast<unsigned>((V + kRows - 1) / kRows),
                  static_cast<unsigned>((D + kThreads - 1) / kThreads));
  const size_t shared = size_t{kRows} * kThreads * sizeof(float);
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    embedding_grad_kernel<<<grid, kThreads, shared, s>>>(static_cast<const T*>(dy), ids,
                                                         static_cast<T*>(dtable), n, V, D, offset, kRows);
  });
  check(cudaGetLastError(), "embedding gradient kernel launch");
}

}  // namespace flowrun::cuda
