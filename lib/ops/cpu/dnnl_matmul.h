// Matmul through oneDNN primitives (kept in its own file: dnnl.hpp is heavy to compile). A primitive is
// created on the first use of a shape, cached with its scratchpad, and then only re-bound to new data, so a
// steady-state step allocates nothing.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace flowrun::cpu {

// Row-major batched y = alpha * op(a) op(b) + beta * y with f32 accumulation, for f32 or bf16 operands, y in
// `ytype`: the operands' dtype, or f32 from bf16 operands (the f32 sum, not rounded); a stride of 0 means the
// operand is shared by all batches.
void dnnl_matmul(DType dtype, DType ytype, int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
                 int64_t a_stride, int64_t b_stride, float alpha, float beta, const void* a, const void* b,
                 void* y);

// Whether dnnl_matmul computes this f32 product (batch 1) as one sum over its whole K, not in K chunks: in
// one oneDNN call, or in gemm_avx2 on AVX2 hosts. There a beta adds beta * y to each finished sum within the
// one rounding, fma(beta, y, sum): the bits of the product with beta 0 followed by that fma (graph/passes.cc
// fuse_momentum_products). Never where oneDNN's gemm driver runs the products (below AVX-512 without AVX2),
// which scales y by beta before it adds the product: two roundings.
bool dnnl_matmul_whole_k(int64_t m, int64_t n, int64_t k, bool ta);

// y (rows x out) = x (rows x in) w^T (w: out x in) [+ bias (out, the operands' dtype), added to the f32 sum
// before the one rounding], f32 or bf16, y in `ytype` as for dnnl_matmul, as a linear layer computes it: the
// bias through the primitive's bias argument, one pass over y.
void dnnl_linear(DType dtype, DType ytype, int64_t rows, int64_t out, int64_t in, const void* x,
                 const void* w, const void* bias, void* y);

// True below AVX-512, where oneDNN 2.6 runs f32 matmuls through its BLAS-style gemm driver rather than
// brgemm: a plan for the thread count picks the kernel and the K split there. So dnnl_matmul runs the f32
// products in gemm_avx2 where the CPU has AVX2, and elsewhere every product as fixed tiles, each a one-thread
// oneDNN call, and each call may allocate its workspace.
bool dnnl_gemm_driver();
// True where oneDNN runs bf16 GEMMs and convolutions in hardware (avx512_bf16 or AMX). Elsewhere its bf16
// primitives fall back to reference loops ~1000x slower, so the bf16 kernels that use it are registered as
// unavailable and bf16 nodes run widened through the f32 kernels instead.
bool has_native_bf16();
// True where oneDNN runs bf16 products on AMX tiles (Sapphire Rapids and later), at 2-3x the avx512_bf16 rate.
bool has_amx_bf16();

}  // namespace flowrun::cpu
