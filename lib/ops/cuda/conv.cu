// The convolution family's own CUDA kernels beside cuDNN (ops/cuda/conv.cc): the conv2d bias, and pooling
// with its gradients, f32 arithmetic on f32/f16/bf16 storage, a thread per output element (grid-stride).
// The gradients are gathers: a thread per input element adds the output windows that hold it, in output
// order, which is the order in which the CPU kernels' scatters add into it, so there are no atomics.

#include "ops/cuda/device.cuh"

namespace flowrun::cuda {

namespace {

using namespace device;

template <typename T>
__global__ void channel_bias_kernel(T* y, const T* bias, int64_t total, int64_t c, int64_t plane) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x)
    store(y, i, load(y, i) + load(bias, (i / plane) % c));
}

// A window [o * stride - pad, o * stride - pad + k) clipped to [0, n): [lo, hi).
__device__ __forceinline__ void clip_window(int64_t o, int64_t k, int64_t stride, int64_t pad, int64_t n,
                                            int64_t& lo, int64_t& hi) {
  const int64_t start = o * stride - pad;
  lo = start > 0 ? start : 0;
  hi = start + k < n ? start + k : n;
}

// The outputs o in [0, out) whose window holds input position i (o * stride <= i + pad < o * stride + k):
// [lo, hi], empty when lo > hi.
__device__ __forceinline__ void windows_holding(int64_t i, int64_t k, int64_t stride, int64_t pad,
                                                int64_t out, int64_t& lo, int64_t& hi) {
  const int64_t first = i + pad - k + 1;  // the least o * stride
  lo = first > 0 ? (first + stride - 1) / stride : 0;
  hi = (i + pad) / stride;
  if (hi > out - 1) hi = out - 1;
}

template <typename T>
__global__ void maxpool_kernel(Pool p, const T* x, T* y, int64_t* idx) {
  const int64_t total = p.planes * p.oh * p.ow;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ox = i % p.ow, oy = (i / p.ow) % p.oh, pl = i / (p.ow * p.oh);
    const T* xp = x + pl * p.h * p.w;
    int64_t ya, yb, xa, xb;
    clip_window(oy, p.kh, p.sh, p.ph, p.h, ya, yb);
    clip_window(ox, p.kw, p.sw, p.pw, p.w, xa, xb);
    // The padding is -inf, never chosen: start from the window's first element in the image.
    int64_t bi = ya * p.w + xa;
    float best = load(xp, bi);
    for (int64_t iy = ya; iy < yb; ++iy)
      for (int64_t ix = xa; ix < xb; ++ix) {
        const float v = load(xp, iy * p.w + ix);
        if (v > best || v != v) {  // the first maximum wins; a NaN propagates (v != v)
          best = v;
          bi = iy * p.w + ix;
        }
      }
    store(y, i, best);
    idx[i] = bi;
  }
}

template <typename T>
__global__ void maxpool_grad_kernel(Pool p, const T* dy, const int64_t* idx, T* dx) {
  const int64_t total = p.planes * p.h * p.w;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ix = e % p.w, iy = (e / p.w) % p.h, pl = e / (p.w * p.h), self = iy * p.w + ix;
    int64_t oy0, oy1, ox0, ox1;
    windows_holding(iy, p.kh, p.sh, p.ph, p.oh, oy0, oy1);
    windows_holding(ix, p.kw, p.sw, p.pw, p.ow, ox0, ox1);
    const int64_t* ip = idx + pl * p.oh * p.ow;
    const T* gp = dy + pl * p.oh * p.ow;
    float acc = 0.0f;
    for (int64_t oy = oy0; oy <= oy1; ++oy)
      for (int64_t ox = ox0; ox <= ox1; ++ox) {
        const int64_t j = oy * p.ow + ox;
        if (ip[j] == self) acc += load(gp, j);
      }
    store(dx, e, acc);
  }
}

// The averaging divisor of output (oy, ox): the whole window, or its part inside the image.
__device__ __forceinline__ float avg_divisor(const Pool& p, bool include_pad, int64_t oy, int64_t ox) {
  if (include_pad) return static_cast<float>(p.kh * p.kw);
  int64_t ya, yb, xa, xb;
  clip_window(oy, p.kh, p.sh, p.ph, p.h, ya, yb);
  clip_window(ox, p.kw, p.sw, p.pw, p.w, xa, xb);
  return static_cast<float>((yb - ya) * (xb - xa));
}

template <typename T>
__global__ void avgpool_kernel(Pool p, bool include_pad, const T* x, T* y) {
  const int64_t total = p.planes * p.oh * p.ow;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ox = i % p.ow, oy = (i / p.ow) % p.oh, pl = i / (p.ow * p.oh);
    const T* xp = x + pl * p.h * p.w;
    int64_t ya, yb, xa, xb;
    clip_window(oy, p.kh, p.sh, p.ph, p.h, ya, yb);
    clip_window(ox, p.kw, p.sw, p.pw, p.w, xa, xb);
    float acc = 0.0f;
    for (int64_t iy = ya; iy < yb; ++iy)
      for (int64_t ix = xa; ix < xb; ++ix) acc += load(xp, iy * p.w + ix);
    store(y, i, acc / avg_divisor(p, include_pad, oy, ox));
  }
}

template <typename T>
__global__ void avgpool_grad_kernel(Pool p, bool include_pad, const T* dy, T* dx) {
  const int64_t total = p.planes * p.h * p.w;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ix = e % p.w, iy = (e / p.w) % p.h, pl = e / (p.w * p.h);
    int64_t oy0, oy1, ox0, ox1;
    windows_holding(iy, p.kh, p.sh, p.ph, p.oh, oy0, oy1);
    windows_holding(ix, p.kw, p.sw, p.pw, p.ow, ox0, ox1);
    const T* gp = dy + pl * p.oh * p.ow;
    float acc = 0.0f;
    for (int64_t oy = oy0; oy <= oy1; ++oy)
      for (int64_t ox = ox0; ox <= ox1; ++ox)
        acc += load(gp, oy * p.ow + ox) / avg_divisor(p, include_pad, oy, ox);
    store(dx, e, acc);
  }
}

// A warp per plane: lane-strided sums, then the warp's shuffles (a fixed order).
template <typename T>
__global__ void global_avgpool_kernel(const T* x, T* y, int64_t planes, int64_t hw, float inv) {
  const int64_t pl = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (pl >= planes) return;  // the plane is the warp's: its lanes leave together
  const T* xp = x + pl * hw;
  float acc = 0.0f;
  for (int64_t i = lane; i < hw; i += 32) acc += load(xp, i);
  for (int o = 16; o > 0; o /= 2) acc += __shfl_down_sync(0xffffffffu, acc, o);
  if (lane == 0) store(y, pl, acc * inv);
}

}  // namespace

void channel_bias(Storage t, void* y, const void* bias, int64_t n, int64_t c, int64_t plane, cudaStream_t s) {
  const int64_t total = n * c * plane;
  if (total == 0) return;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    channel_bias_kernel<<<blocks_for(total), kThreads, 0, s>>>(static_cast<T*>(y),
                                                               static_cast<const T*>(bias), total, c, plane);
  });
  check(cudaGetLastError(), "conv2d bias kernel launch");
}

void maxpool2d(Storage t, const Pool& p, const void* x, void* y, int64_t* idx, cudaStream_t s) {
  const int64_t total = p.planes * p.oh * p.ow;
  if (total == 0) return;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    maxpool_kernel<<<blocks_for(total), kThreads, 0, s>>>(p, static_cast<const T*>(x), static_cast<T*>(y),
                                                          idx);
  });
  check(cudaGetLastError(), "maxpool2d kernel launch");
}

void maxpool2d_grad(Storage t, const Pool& p, const void* dy, const int64_t* idx, void* dx, cudaStream_t s) {
  const int64_t total = p.planes * p.h * p.w;
  if (total == 0) return;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    maxpool_grad_kernel<<<blocks_for(total), kThreads, 0, s>>>(p, static_cast<const T*>(dy), idx,
                                                               static_cast<T*>(dx));
  });
  check(cudaGetLastError(), "maxpool2d gradient kernel launch");
}

void avgpool2d(Storage t, const Pool& p, bool include_pad, const void* x, void* y, cudaStream_t s) {
  const int64_t total = p.planes * p.oh * p.ow;
  if (total == 0) return;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    avgpool_kernel<<<blocks_for(total), kThreads, 0, s>>>(p, include_pad, static_cast<const T*>(x),
                                                          static_cast<T*>(y));
  });
  check(cudaGetLastError(), "avgpool2d kernel launch");
}

void avgpool2d_grad(Storage t, const Pool& p, bool include_pad, const void* dy, void* dx, cudaStream_t s) {
  const int64_t total = p.planes * p.h * p.w;
  if (total == 0) return;
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    avgpool_grad_kernel<<<blocks_for(total), kThreads, 0, s>>>(p, include_pad, static_cast<const T*>(dy),
                                                               static_cast<T*>(dx));
  });
  check(cudaGetLastError(), "avgpool2d gradient kernel launch");
}

void global_avgpool(Storage t, const void* x, void* y, int64_t planes, int64_t hw, cudaStream_t s) {
  if (planes == 0) return;
  const float inv = 1.0f / static_cast<float>(hw);  // as the CPU: the sum times 1 / hw
  const unsigned blocks = static_cast<unsigned>((planes + kWarps - 1) / kWarps);
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    global_avgpool_kernel<<<blocks, kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), planes,
                                                      hw, inv);
  });
  check(cudaGetLastError(), "global_avgpool kernel launch");
}

}  // namespace flowrun::cuda
