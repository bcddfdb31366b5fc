// Rotary position embedding on the device: a thread per rotated pair (grid-stride), f32 arithmetic on
// f32/f16/bf16 storage, the angle formed as the CPU kernel forms it (ops/cpu/attention.h's rope_angle).

#include "ops/cuda/device.cuh"

namespace flowrun::cuda {

namespace {

using namespace device;

// rope_angle of ops/cpu/attention.h, operation for operation in IEEE float32 (the _rn intrinsics keep nvcc
// from contracting or approximating): inv_freq = 1 / fl32(theta^(fl32(2i / d))), the power in double.
__device__ float rope_angle(int64_t position, int64_t i, int64_t d, double theta) {
  const float e = __fdiv_rn(static_cast<float>(2 * i), static_cast<float>(d));
  const float p =
      static_cast<float>(pow(static_cast<double>(static_cast<float>(theta)), static_cast<double>(e)));
  const float inv_freq = __fdiv_rn(1.0f, p);
  return __fmul_rn(static_cast<float>(position), inv_freq);
}

template <typename T>
__global__ void rope_kernel(Rope r, const T* x, T* y) {
  const int64_t half = r.d / 2, pairs = r.rows * half;
  const int64_t offset = r.offset + (r.position ? *r.position : 0);
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < pairs;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = k / half, i = k % half;
    double sn, cs;
    sincos(static_cast<double>(rope_angle(offset + row % r.t, i, r.d, r.theta)), &sn, &cs);
    const float c = static_cast<float>(cs), s = r.inverse ? -static_cast<float>(sn) : static_cast<float>(sn);
    const int64_t at = row * r.d + i;
    const float a = load(x, at), b = load(x, at + half);
    store(y, at, a * c - b * s);
    store(y, at + half, b * c + a * s);
  }
}

}  // namespace

void rope(Storage st, const Rope& r, const void* x, void* y, cudaStream_t s) {
  const int64_t pairs = r.rows * (r.d / 2);
  if (pairs == 0) return;
  dispatch(st, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    rope_kernel<<<blocks_for(pairs), kThreads, 0, s>>>(r, static_cast<const T*>(x), static_cast<T*>(y));
  });
  check(cudaGetLastError(), "rope kernel launch");
}

}  // namespace flowrun::cuda
