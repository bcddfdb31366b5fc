// Skinny f32 products (skinny_gemm.h). The bench MLP's 10-class head took three oneDNN calls of 18-24 us
// each in its 1.7 ms step, 55-70 GFLOP/s: each call's setup and its split between the threads cost more
// than its 1.3 M multiply-adds. Here the short side stays in registers: the forward pass keeps the out
// sums of two rows (one row past 10 outputs) in registers along `in`, sharing each weight load between the
// rows; the input gradient runs along whole rows of C four at a time, the k <= 16 rows of B read from L1;
// the weight gradient keeps the m <= 16 output rows of a chunk in registers and runs down the k rows of x.
// Threads take whole rows (forward, input gradient) or whole 16-column chunks, so each output is computed
// whole by one thread in a fixed order. The input gradient went down the rows of one 16-column chunk at a
// time: its stores, a line every 2 KiB, waited on memory (the MLP head's 128 x 512 took 18.8 us on 1
// thread and 15-20 on 2; along the rows 10.1 and 6.3, and the relu_grad after it reads the rows its thread
// wrote: the MLP's step 0.02-0.03 ms less, alternating profiled runs, 2026-12-06).
#include "ops/cpu/skinny_gemm.h"

#include <algorithm>

#include "ops/cpu/parallel.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace flowrun::cpu {

#if defined(__AVX512F__)

namespace {

constexpr int kMax = 16;

// The 16 lanes added in halves (lane k and k + 8, then 4, 2, 1 apart): a fixed order. Masked shuffles in
// 512-bit registers, because GCC 12 reports the 256-bit extracts (and _mm512_reduce_add_ps) as maybe
// uninitialised.
inline float fold(__m512 v) {
  constexpr __mmask16 kAll = 0xffff;
  v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(kAll, v, v, 0x4e));
  v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(kAll, v, v, 0xb1));
  v = _mm512_add_ps(v, _mm512_maskz_permute_ps(kAll, v, 0x4e));
  v = _mm512_add_ps(v, _mm512_maskz_permute_ps(kAll, v, 0xb1));
  return _mm512_cvtss_f32(v);
}

// Rows [r0, r1) of y = x w^T (+ bias) for N outputs, R rows at a time (each row's sums are the same
// whatever R is: lane-wise FMAs along `in`, the lanes folded (fold), then the bias).
template <int N, int R>
void linear_rows(int64_t r0, int64_t r1, int64_t in, const float* x, const float* w, const float* bias,
                 float* y) {
  for (int64_t r = r0; r < r1; r += R) {
    if (r + R > r1) return linear_rows<N, 1>(r, r1, in, x, w, bias, y);
    __m512 acc[R][N];
    for (int u = 0; u < R; ++u)
      for (int o = 0; o < N; ++o) acc[u][o] = _mm512_setzero_ps();
    for (int64_t k = 0; k < in; k += 16) {
      __m512 xv[R];
      for (int u = 0; u < R; ++u) xv[u] = _mm512_loadu_ps(x + (r + u) * in + k);
      for (int o = 0; o < N; ++o) {
        const __m512 wv = _mm512_loadu_ps(w + o * in + k);
        for (int u = 0; u < R; ++u) acc[u][o] = _mm512_fmadd_ps(xv[u], wv, acc[u][o]);
      }
    }
    for (int u = 0; u < R; ++u)
      for (int o = 0; o < N; ++o) {
        const float s = fold(acc[u][o]);
        y[(r + u) * N + o] = bias ? s + bias[o] : s;
      }
  }
}

template <int N>
void linear_n(int64_t rows, int64_t in, const float* x, const float* w, const float* bias, float* y) {
  // Two rows share each weight load while their 2 N sums and operands fit the 32 registers.
  constexpr int R = N <= 10 ? 2 : 1;
  const int64_t groups = (rows + R - 1) / R;
  parallel_for(groups, 8, [&](int64_t s, int64_t e) {
    linear_rows<N, R>(s * R, std::min(rows, e * R), in, x, w, bias, y);
  });
}

// Rows [r0, r1) of C[m, n] = A[m, K] B[K, n], four rows at a time (four independent chains of K
// multiply-adds), each group along C's whole rows: B (K x n) stays in L1, and C is written in order.
template <int K>
void small_k(int64_t r0, int64_t r1, int64_t n, const float* a, const float* b, float* c) {
  const auto rows = [&]<int U>(int64_t r) {
    for (int64_t j = 0; j < n; j += 16) {
      __m512 acc[U];
      const __m512 b0 = _mm512_loadu_ps(b + j);
      for (int u = 0; u < U; ++u) acc[u] = _mm512_mul_ps(_mm512_set1_ps(a[(r + u) * K]), b0);
      for (int p = 1; p < K; ++p) {
        const __m512 bv = _mm512_loadu_ps(b + p * n + j);
        for (int u = 0; u < U; ++u) acc[u] = _mm512_fmadd_ps(_mm512_set1_ps(a[(r + u) * K + p]), bv, acc[u]);
      }
      for (int u = 0; u < U; ++u) _mm512_storeu_ps(c + (r + u) * n + j, acc[u]);
    }
  };
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) rows.template operator()<4>(r);
  for (; r < r1; ++r) rows.template operator()<1>(r);
}

// C[M, n] = A^T B with A stored (k x M) and B (k x n), 16-column chunks [j0, j1): the chunk's M output
// vectors in registers, summed over the k rows in order.
template <int M>
void small_m(int64_t j0, int64_t j1, int64_t n, int64_t k, const float* a, const float* b, float* c) {
  for (int64_t j = j0; j < j1; ++j) {
    __m512 acc[M];
    const __m512 b0 = _mm512_loadu_ps(b + j * 16);
    for (int o = 0; o < M; ++o) acc[o] = _mm512_mul_ps(_mm512_set1_ps(a[o]), b0);
    for (int64_t p = 1; p < k; ++p) {
      const __m512 bv = _mm512_loadu_ps(b + p * n + j * 16);
      for (int o = 0; o < M; ++o) acc[o] = _mm512_fmadd_ps(_mm512_set1_ps(a[p * M + o]), bv, acc[o]);
    }
    for (int o = 0; o < M; ++o) _mm512_storeu_ps(c + o * n + j * 16, acc[o]);
  }
}

using LinearFn = void (*)(int64_t, int64_t, const float*, const float*, const float*, float*);
using ChunkFn = void (*)(int64_t, int64_t, int64_t, int64_t, const float*, const float*, float*);
using RowsFn = void (*)(int64_t, int64_t, int64_t, const float*, const float*, float*);

// [s - 1]: the kernel for a short side of s.
constexpr auto kLinear = kernel_table<LinearFn, kMax>([](auto s) -> LinearFn { return &linear_n<s()>; });
constexpr auto kSmallK = kernel_table<RowsFn, kMax>([](auto s) -> RowsFn { return &small_k<s()>; });
constexpr auto kSmallM = kernel_table<ChunkFn, kMax>([](auto s) -> ChunkFn { return &small_m<s()>; });

bool avx512() {
  static const bool on = __builtin_cpu_supports("avx512f");
  return on;
}

}  // namespace

bool skinny_linear(int64_t rows, int64_t out, int64_t in, const float* x, const float* w, const float* bias,
                   float* y) {
  if (!avx512() || out < 1 || out > kMax || in < 16 || in % 16 != 0 || rows < 1) return false;
  kLinear[static_cast<size_t>(out - 1)](rows, in, x, w, bias, y);
  return true;
}

bool skinny_gemm_applies(bool ta, int64_t m, int64_t n, int64_t k) {
  const int64_t side = ta ? m : k;
  return avx512() && side >= 1 && side <= kMax && n >= 16 && n % 16 == 0 && m >= 1 && k >= 1;
}

bool skinny_gemm(bool ta, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c) {
  if (!skinny_gemm_applies(ta, m, n, k)) return false;
  if (ta) {
    const ChunkFn f = kSmallM[static_cast<size_t>(m - 1)];
    parallel_for(n / 16, 2, [&](int64_t s, int64_t e) { f(s, e, n, k, a, b, c); });
  } else {
    // Whole rows to each thread, in groups of four.
    const RowsFn f = kSmallK[static_cast<size_t>(k - 1)];
    parallel_for((m + 3) / 4, 2, [&](int64_t s, int64_t e) { f(s * 4, std::min(m, e * 4), n, a, b, c); });
  }
  return true;
}

#else

bool skinny_linear(int64_t, int64_t, int64_t, const float*, const float*, const float*, float*) {
  return false;
}
bool skinny_gemm_applies(bool, int64_t, int64_t, int64_t) {
  return false;
}
bool skinny_gemm(bool, int64_t, int64_t, int64_t, const float*, const float*, float*) {
  return false;
}

#endif

}  // namespace flowrun::cpu
