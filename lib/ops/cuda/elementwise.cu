// Elementwise CUDA kernels: one thread per element (grid-stride), f32 arithmetic on f32/f16/bf16 storage.

#include "ops/cuda/device.cuh"

namespace flowrun::cuda {

namespace {

using namespace device;

__device__ __forceinline__ float apply(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::add:
      return a + b;
    case BinaryOp::sub:
      return a - b;
    case BinaryOp::mul:
      return a * b;
    default:
      return a / b;
  }
}

template <typename T>
__global__ void binary_same(BinaryOp op, const T* a, const T* b, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    store(y, i, apply(op, load(a, i), load(b, i)));
}

template <typename T>
__global__ void binary_broadcast(BinaryOp op, const T* a, const T* b, T* y, int64_t n, Broadcast bc) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t rem = i, ia = 0, ib = 0;
    for (int k = bc.rank - 1; k >= 0; --k) {
      const int64_t idx = rem % bc.dims[k];
      rem /= bc.dims[k];
      ia += idx * bc.stride_a[k];
      ib += idx * bc.stride_b[k];
    }
    store(y, i, apply(op, load(a, ia), load(b, ib)));
  }
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

__device__ __forceinline__ float apply(UnaryOp op, float x, float v) {
  switch (op) {
    case UnaryOp::add_scalar:
      return x + v;
    case UnaryOp::mul_scalar:
      return x * v;
    case UnaryOp::pow_scalar:
      return powf(x, v);
    case UnaryOp::relu:
      return x > 0.0f ? x : 0.0f;
    case UnaryOp::gelu:
      return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
    case UnaryOp::gelu_tanh:
      return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
    case UnaryOp::silu:
      return x / (1.0f + expf(-x));
    case UnaryOp::tanh:
      return tanhf(x);
    case UnaryOp::sigmoid:
      return 1.0f / (1.0f + expf(-x));
    default:
      return v;  // fill
  }
}

template <typename T>
__global__ void unary_kernel(UnaryOp op, const T* x, T* y, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    store(y, i, apply(op, op == UnaryOp::fill ? 0.0f : load(x, i), v));
}

__device__ __forceinline__ float apply(GradOp op, float dy, float z) {
  switch (op) {
    case GradOp::relu:
      return z > 0.0f ? dy : 0.0f;
    case GradOp::gelu:
      return dy * (0.5f * (1.0f + erff(z * kInvSqrt2)) + z * kInvSqrt2Pi * expf(-0.5f * z * z));
    case GradOp::gelu_tanh: {
      const float t = tanhf(kSqrt2OverPi * (z + 0.044715f * z * z * z));
      const float du = kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * z * z);
      return dy * (0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * du);
    }
    case GradOp::silu: {
      const float s = 1.0f / (1.0f + expf(-z));
      return dy * s * (1.0f + z * (1.0f - s));
    }
    case GradOp::tanh:
      return dy * (1.0f - z * z);
    default:
      return dy * z * (1.0f - z);  // sigmoid
  }
}

template <typename T>
__global__ void grad_kernel(GradOp op, const T* dy, const T* z, T* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    store(dx, i, apply(op, load(dy, i), load(z, i)));
}

template <typename A, typename B>
__global__ void convert_kernel(const A* x, B* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    store(y, i, load(x, i));
}

}  // namespace

void binary(BinaryOp op, Storage t, const void* a, const void* b, void* y, int64_t n, const Broadcast* bc,
            cudaStream_t s) {
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* py = static_cast<T*>(y);
    if (bc)
      binary_broadcast<<<blocks_for(n), kThreads, 0, s>>>(op, pa, pb, py, n, *bc);
    else
      binary_same<<<blocks_for(n), kThreads, 0, s>>>(op, pa, pb, py, n);
  });
  check(cudaGetLastError(), "binary kernel launch");
}

void unary(UnaryOp op, Storage t, const void* x, void* y, int64_t n, float value, cudaStream_t s) {
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    unary_kernel<<<blocks_for(n), kThreads, 0, s>>>(op, static_cast<const T*>(x), static_cast<T*>(y), n,
                                                    value);
  });
  check(cudaGetLastError(), "unary kernel launch");
}

void unary_grad(GradOp op, Storage t, const void* dy, const void* z, void* dx, int64_t n, cudaStream_t s) {
  dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    grad_kernel<<<blocks_for(n), kThreads, 0, s>>>(op, static_cast<const T*>(dy), static_cast<const T*>(z),
                                                   static_cast<T*>(dx), n);
  });
  check(cudaGetLastError(), "gradient kernel launch");
}

void convert(Storage from, const void* x, Storage to, void* y, int64_t n, cudaStream_t s) {
  dispatch(from, [&](auto* a) {
    using A = std::remove_pointer_t<decltype(a)>;
    dispatch(to, [&](auto* b) {
      using B = std::remove_pointer_t<decltype(b)>;
      convert_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const A*>(x), static_cast<B*>(y), n);
    });
  });
  check(cudaGetLastError(), "convert kernel launch");
}

}  // namespace flowrun::cuda
