// What every CUDA kernel file shares (included by the .cu files only): f32 loads and rounding stores of the
// three storage types, dispatch on Storage, grid sizing for grid-stride loops, and block-wide reductions in a
// fixed order.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <type_traits>

#include "core/cuda/runtime.h"
#include "ops/cuda/launch.h"

namespace flowrun::cuda::device {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float load(const float* p, int64_t i) {
  return p[i];
}
__device__ __forceinline__ float load(const __half* p, int64_t i) {
  return __half2float(p[i]);
}
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
// Rounds to nearest-even, as the CPU kernels store f16 and bf16.
__device__ __forceinline__ void store(float* p, int64_t i, float v) {
  p[i] = v;
}
__device__ __forceinline__ void store(__half* p, int64_t i, float v) {
  p[i] = __float2half_rn(v);
}
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

// Calls f with a null pointer of the storage type (the kernels' template argument).
template <typename F>
void dispatch(Storage t, F f) {
  switch (t) {
    case Storage::f32:
      f(static_cast<float*>(nullptr));
      break;
    case Storage::f16:
      f(static_cast<__half*>(nullptr));
      break;
    case Storage::bf16:
      f(static_cast<__nv_bfloat16*>(nullptr));
      break;
  }
}

// Blocks of kThreads for a grid-stride loop over n elements (capped; the loop covers the rest).
inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 32 ? (b > 0 ? b : 1) : 65535 * 32);
}

// The block's sum (or maximum) of every thread's v, returned to every thread: warp shuffles, then the warps'
// partials, always in the same order. `scratch`: kWarps floats of shared memory. Every thread must call it.
template <bool kMax>
__device__ float block_reduce(float v, float* scratch) {
  for (int o = 16; o > 0; o /= 2) {
    const float w = __shfl_down_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? scratch[lane] : (kMax ? -FLT_MAX : 0.0f);
    for (int o = 16; o > 0; o /= 2) {
      const float w = __shfl_down_sync(0xffffffffu, v, o);
      v = kMax ? fmaxf(v, w) : v + w;
    }
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  const float r = scratch[0];
  __syncthreads();  // scratch is reused by the next reduction
  return r;
}

}  // namespace flowrun::cuda::device
