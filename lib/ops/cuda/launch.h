// The CUDA kernels' launchers: plain functions over device pointers, so that the .cu files nvcc compiles see
// no project header but this one, and the adapters (ops/cuda/*.cc) turn KernelCtx into these calls.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace flowrun::cuda {

// Element storage of a floating tensor; arithmetic is f32 inside the kernels (f16/bf16 round to nearest-even
// on store, as the CPU kernels do).
enum class Storage : int { f32, f16, bf16 };

// numpy broadcasting over at most 8 axes: the output's dims and each input's element strides (0 where that
// input is stretched).
struct Broadcast {
  int rank = 0;
  int64_t dims[8] = {};
  int64_t stride_a[8] = {};
  int64_t stride_b[8] = {};
};

enum class BinaryOp : int { add, sub, mul, div };
// y = a op b; `bc` null when a, b and y have n elements each.
void binary(BinaryOp op, Storage t, const void* a, const void* b, void* y, int64_t n, const Broadcast* bc,
            cudaStream_t s);

enum class UnaryOp : int {
  add_scalar,
  mul_scalar,
  pow_scalar,
  relu,
  gelu,
  gelu_tanh,
  silu,
  tanh,
  sigmoid,
  fill
};
// y = f(x) (fill: y = value; x unread).
void unary(UnaryOp op, Storage t, const void* x, void* y, int64_t n, float value, cudaStream_t s);

// dx = f(dy, z) where z is the forward input (gelu, silu) or output (relu, tanh, sigmoid).
enum class GradOp : int { relu, gelu, gelu_tanh, silu, tanh, sigmoid };
void unary_grad(GradOp op, Storage t, const void* dy, const void* z, void* dx, int64_t n, cudaStream_t s);

// y = x converted between storages.
void convert(Storage from, const void* x, Storage to, void* y, int64_t n, cudaStream_t s);

}  // namespace flowrun::cuda
