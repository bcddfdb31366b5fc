// f32 products with one side of at most 16 (a classifier head's 10 classes: its forward pass, input gradient
// and weight gradient), where a oneDNN call costs more than the multiply-adds (skinny_gemm.cc). Each output
// is one sum in a fixed order whatever the thread count.
#pragma once

#include <cstdint>

namespace flowrun::cpu {

// y (rows x out) = x (rows x in) w^T (w: out x in) + bias (out, or null), for out <= 16 and `in` a multiple
// of 16 on an AVX-512 build and CPU; false (nothing written) elsewhere. Each output sums its products 16
// lanes at a time, folds the lanes, then adds the bias.
bool skinny_linear(int64_t rows, int64_t out, int64_t in, const float* x, const float* w, const float* bias,
                   float* y);

// Row-major C[m, n] = op(A) B with B (k x n) not transposed and n a multiple of 16, where the short side is
// the inner one (A m x k, not transposed, k <= 16: a head's input gradient dy w) or the rows (A stored k x m,
// transposed, m <= 16: its weight gradient dy^T x); false (nothing written) for any other shape or build.
// Each output sums over k in order.
bool skinny_gemm(bool ta, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c);
// Whether skinny_gemm takes this shape on this build and CPU.
bool skinny_gemm_applies(bool ta, int64_t m, int64_t n, int64_t k);

}  // namespace flowrun::cpu
