// CPU kernels of the elementwise ops (ops/elementwise.cc).
#pragma once

#include "ops/registry.h"

namespace flowrun::cpu {

void add(const KernelCtx& c);
void sub(const KernelCtx& c);
void mul(const KernelCtx& c);
void div(const KernelCtx& c);
void add_scalar(const KernelCtx& c);
void mul_scalar(const KernelCtx& c);
void pow_scalar(const KernelCtx& c);
void relu(const KernelCtx& c);
void relu_grad(const KernelCtx& c);
void gelu(const KernelCtx& c);
void gelu_grad(const KernelCtx& c);
void silu(const KernelCtx& c);
void silu_grad(const KernelCtx& c);
void tanh(const KernelCtx& c);
void tanh_grad(const KernelCtx& c);
void sigmoid(const KernelCtx& c);
void sigmoid_grad(const KernelCtx& c);
void fill_like(const KernelCtx& c);
void copy(const KernelCtx& c);
void cast(const KernelCtx& c);
// n elements from one dtype to another (f16/bf16 rounded to nearest-even), in parallel; the cast kernel and
// the executor's widened f16/bf16 kernels use it.
void convert(const void* src, DType from, void* dst, DType to, int64_t n);

}  // namespace flowrun::cpu
