// flowrun's own f32 GEMM for AVX2 hosts without AVX-512 (Zen 3, Haswell to Comet Lake), where oneDNN 2.6 has
// no brgemm matmul and its BLAS-style gemm driver either changes its bits with the thread count or, run as
// fixed one-thread tiles, reaches half the FMA rate (dnnl_matmul.cc).
//
// Each element of y is one fma chain over k in order from 0, acc = fma(a_k, b_k, acc), finished as
// fma(beta, y, alpha * acc + bias): the bits of a plain loop, whatever the thread count, the tiling or the
// blocking. So a beta is fused in the one rounding of a whole-K sum, as brgemm does on AVX-512
// (dnnl_matmul_whole_k).
#pragma once

#include <cstdint>

namespace flowrun::cpu {

// True where gemm_avx2 runs: the CPU has AVX2 and FMA, and oneDNN would take its gemm driver
// (dnnl_gemm_driver).
bool gemm_avx2_applies();

// Row-major batched y = fma(beta, y, alpha * op(a) op(b) + bias) in f32, as dnnl_matmul: op(a) is m x k
// (stored k x m with lda when ta), op(b) k x n (stored n x k with ldb when tb), y m x n with row length ldy;
// a batch's matrices lie a_stride, b_stride and m * ldy apart (a stride of 0: shared); bias (n floats) may be
// null.
void gemm_avx2(int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb, int64_t a_stride,
               int64_t b_stride, float alpha, float beta, const float* a, int64_t lda, const float* b,
               int64_t ldb, const float* bias, float* y, int64_t ldy);

}  // namespace flowrun::cpu
