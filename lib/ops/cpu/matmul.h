// CPU matmul kernels: f32 and bf16 through oneDNN (f32 products with a side of at most 16 through
// skinny_gemm.h), f64 through OpenBLAS.
#pragma once

#include "ops/registry.h"

namespace flowrun::cpu {

void matmul(const KernelCtx& c);
void matmul_bf16(const KernelCtx& c);
void linear_bf16(const KernelCtx& c);
void linear(const KernelCtx& c);

// Row-major C[m,n] = alpha * op(A) op(B) + beta * C, through BLAS.
template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, const T* b, T beta, T* c);

// Whether gemm<float> computes this product as one oneDNN call over the whole K sum (not through
// skinny_gemm.h, not in K chunks), so that with alpha 1 it gives C = fma(beta, C, op(A) op(B)), the product
// rounded as with beta 0 (dnnl_matmul_whole_k).
bool gemm_fuses_beta(bool ta, bool tb, int64_t m, int64_t n, int64_t k);

}  // namespace flowrun::cpu
