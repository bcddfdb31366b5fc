// CPU flash attention: sdpa forward (online softmax over key blocks) and its FlashAttention-2 backward, with
// an optional key padding mask (key_ids == pad_id: the key's scores set to -inf after each score block).
//
// Scratch: the OpDef workspace holds a transposed copy of K (pre-multiplied by the scale) and, in the
// backward, of V: one (D x S) slice per (batch, head), sized from the shapes alone, so score products read
// contiguous key columns and each head is transposed once rather than once per query block. The tiles
// (scores/probabilities and dP/dS, kBQ x kBK elements: 32 KiB each in f64) have a fixed size and live on
// the stack of the thread running the task: exactly one set per running task whatever the OpenMP thread
// count is, never on the heap.
//
// Parallelism and determinism: the forward splits (batch, head, query block) tasks over threads; each task
// writes only its own rows of out and lse. The backward gives each thread whole (batch, head) slices, so the
// sums over query rows in dk and dv (and over key blocks in dq) run in one fixed order in one thread.
// Nothing depends on the thread count. The block products are small register-blocked loops, not BLAS:
// they run inside the OpenMP region, where OpenBLAS (itself OpenMP-threaded) nests badly.
#include "ops/cpu/attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "ops/cpu/attention_tiles.h"
#include "ops/cpu/grow_buffer.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/transpose8.h"

namespace flowrun::cpu {

namespace {

using namespace attn;

// C[R x NV*L] (+)= A[R x kd] B[kd x NV*L], one strip of NV registers per row: A element (r, p) at
// a[r * ars + p * acs] (so A may be a transposed view), B and C row-major. The R x NV accumulators stay in
// registers across the whole kd loop: each B load feeds R fused multiply-adds, each A broadcast NV.
template <typename T, int R, int NV>
inline void gemm_strip(int64_t kd, const T* a, int64_t ars, int64_t acs, const T* b, int64_t ldb, T* c,
                       int64_t ldc, bool acc) {
  using V = typename Vec<T>::type;
  constexpr int64_t L = kVecBytes / static_cast<int64_t>(sizeof(T));
  V cr[R][NV];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) cr[r][u] = acc ? vload<V>(c + r * ldc + u * L) : V{};
  for (int64_t p = 0; p < kd; ++p) {
    V br[NV];
    for (int u = 0; u < NV; ++u) br[u] = vload<V>(b + p * ldb + u * L);
    for (int r = 0; r < R; ++r) {
      const T av = a[r * ars + p * acs];
      for (int u = 0; u < NV; ++u) cr[r][u] += av * br[u];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) vstore(c + r * ldc + u * L, cr[r][u]);
}

#if defined(__AVX512F__)
// The last nt < 16 columns of gemm_strip's product in f32: one masked register per row. Scalar columns left a
// third of a 24-wide head's products (and the 17th key of a ViT's 17 tokens) to scalar loops.
template <int R>
inline void gemm_strip_tail(int64_t kd, const float* a, int64_t ars, int64_t acs, const float* b, int64_t ldb,
                            float* c, int64_t ldc, bool acc, __mmask16 m) {
  __m512 cr[R];
  for (int r = 0; r < R; ++r) cr[r] = acc ? _mm512_maskz_loadu_ps(m, c + r * ldc) : _mm512_setzero_ps();
  for (int64_t p = 0; p < kd; ++p) {
    const __m512 br = _mm512_maskz_loadu_ps(m, b + p * ldb);
    for (int r = 0; r < R; ++r) cr[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * ars + p * acs]), br, cr[r]);
  }
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(c + r * ldc, m, cr[r]);
}
#endif

// C[R x n] (+)= A[R x kd] B[kd x n]: strips of kStrip registers, then one narrower strip for what is left
// (the short rows of a causal diagonal tile run at the wide strips' rate), then the last columns: a masked
// register in f32 with AVX-512, scalar loops otherwise. A strip's R x kStrip accumulators, its kStrip
// registers of B and a broadcast fit the register file: 4 wide in AVX-512's 32, 2 in AVX2's 16 (6 x 4
// there spilled the accumulators: on a Zen 3 host gpt-tiny's attention forward ran at 0.32-0.40 of the
// products' rate in the same profiled step, 0.46-0.51 with strips of 2, its backward 0.42-0.47 and 0.56-0.64,
// six alternating runs each). Each element of C is the same sum in the same order at any strip width.
template <typename T, int R>
inline void gemm_rows(int64_t n, int64_t kd, const T* a, int64_t ars, int64_t acs, const T* b, int64_t ldb,
                      T* c, int64_t ldc, bool acc) {
  constexpr int64_t L = kVecBytes / static_cast<int64_t>(sizeof(T));
  constexpr int kStrip = kVecBytes == 64 ? 4 : 2;
  int64_t j = 0;
  for (; j + kStrip * L <= n; j += kStrip * L)
    gemm_strip<T, R, kStrip>(kd, a, ars, acs, b + j, ldb, c + j, ldc, acc);
  switch ((n - j) / L) {
    case 3:
      gemm_strip<T, R, 3>(kd, a, ars, acs, b + j, ldb, c + j, ldc, acc);
      break;
    case 2:
      gemm_strip<T, R, 2>(kd, a, ars, acs, b + j, ldb, c + j, ldc, acc);
      break;
    case 1:
      gemm_strip<T, R, 1>(kd, a, ars, acs, b + j, ldb, c + j, ldc, acc);
      break;
    default:
      break;
  }
  j += (n - j) / L * L;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    if (j < n)
      gemm_strip_tail<R>(kd, a, ars, acs, b + j, ldb, c + j, ldc, acc,
                         static_cast<__mmask16>((1u << (n - j)) - 1));
    return;
  }
#endif
  for (; j < n; ++j)
    for (int r = 0; r < R; ++r) {
      T s = acc ? c[r * ldc + j] : T(0);
      for (int64_t p = 0; p < kd; ++p) s += a[r * ars + p * acs] * b[p * ldb + j];
      c[r * ldc + j] = s;
    }
}

// C[m x n] (+)= A[m x kd] B[kd x n], strides as in gemm_rows. Under a causal mask only a staircase of a
// diagonal tile is live, so three optional per-row limits (each non-decreasing down the rows) trim the
// work: `ncols` limits the columns computed (the rest of that C row is left unwritten) and [kbeg, kend) the
// inner range (the rest of that A row must be zero). A group of rows takes the widest range any of its rows
// needs; the inner terms skipped are exact zeros, so the computed values do not depend on the grouping.
template <typename T>
void gemm_nn(int64_t m, int64_t n, int64_t kd, const T* a, int64_t ars, int64_t acs, const T* b, int64_t ldb,
             T* c, int64_t ldc, bool acc, const int64_t* ncols = nullptr, const int64_t* kbeg = nullptr,
             const int64_t* kend = nullptr) {
  constexpr int64_t L = kVecBytes / static_cast<int64_t>(sizeof(T));
  auto run = [&]<int R>(int64_t i) {
    const int64_t last = i + R - 1;
    const int64_t nc = ncols ? std::min(n, (ncols[last] + L - 1) / L * L) : n;
    const int64_t k0 = kbeg ? kbeg[i] : 0, k1 = kend ? kend[last] : kd;
    gemm_rows<T, R>(nc, std::max<int64_t>(k1 - k0, 0), a + i * ars + k0 * acs, ars, acs, b + k0 * ldb, ldb,
                    c + i * ldc, ldc, acc);
  };
  int64_t i = 0;
  for (; i + 6 <= m; i += 6) run.template operator()<6>(i);
  for (; i + 4 <= m; i += 4) run.template operator()<4>(i);
  for (; i < m; ++i) run.template operator()<1>(i);
}

#if defined(__AVX512F__)
// r[i] (row i of a 16 x 16 block) becomes column i, in 3 rounds of in-register shuffles: pairs of rows
// interleaved, then groups of 4 within each 128-bit lane, then the lanes exchanged.
// (The maskz_ forms with every lane set: GCC 12 reports the plain forms' undefined merge source as
// possibly uninitialised.)
inline void transpose16(__m512 r[16]) {
  constexpr __mmask16 kAll = 0xFFFF;
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_maskz_unpacklo_ps(kAll, r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_maskz_unpackhi_ps(kAll, r[2 * i], r[2 * i + 1]);
  }
  // r[4 i + j], 128-bit lane l: rows 4i..4i+3 of column j + 4 l.
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_maskz_shuffle_ps(kAll, t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_maskz_shuffle_ps(kAll, t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_maskz_shuffle_ps(kAll, t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_maskz_shuffle_ps(kAll, t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {
    t[j] = _mm512_maskz_shuffle_f32x4(kAll, r[j], r[4 + j], 0x88);      // columns j, j + 8 of rows 0..7
    t[4 + j] = _mm512_maskz_shuffle_f32x4(kAll, r[j], r[4 + j], 0xDD);  // columns j + 4, j + 12 of rows 0..7
    t[8 + j] = _mm512_maskz_shuffle_f32x4(kAll, r[8 + j], r[12 + j], 0x88);  // the same of rows 8..15
    t[12 + j] = _mm512_maskz_shuffle_f32x4(kAll, r[8 + j], r[12 + j], 0xDD);
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm512_maskz_shuffle_f32x4(kAll, t[j], t[8 + j], 0x88);
    r[j + 8] = _mm512_maskz_shuffle_f32x4(kAll, t[j], t[8 + j], 0xDD);
    r[j + 4] = _mm512_maskz_shuffle_f32x4(kAll, t[4 + j], t[12 + j], 0x88);
    r[j + 12] = _mm512_maskz_shuffle_f32x4(kAll, t[4 + j], t[12 + j], 0xDD);
  }
}
#endif

// dst[c * rows + r] = scale * src[r * ld + c] for r < rows, c < d: one head's K or V as (d x rows), from
// rows `ld` elements apart (d for a (B,H,T,D) head, 3 H D for one packed in qkv rows). f32 moves whole
// 16 x 16 blocks (AVX-512) or 8 x 8 blocks (AVX2) through registers; the rest goes element by element, 16
// rows per pass so that each destination row is written in short contiguous runs.
template <typename T>
void transpose_scaled(int64_t rows, int64_t d, const T* src, T* dst, T scale, int64_t ld) {
  constexpr int64_t kB = 16;
  int64_t whole = 0;  // rows done in blocks
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    if (d % kB == 0) {
      whole = rows / kB * kB;
      const __m512 sc = _mm512_set1_ps(scale);
      for (int64_t r0 = 0; r0 < whole; r0 += kB)
        for (int64_t c0 = 0; c0 < d; c0 += kB) {
          __m512 r[16];
          for (int i = 0; i < 16; ++i) r[i] = _mm512_mul_ps(sc, _mm512_loadu_ps(src + (r0 + i) * ld + c0));
          transpose16(r);
          for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + (c0 + i) * rows + r0, r[i]);
        }
    }
  }
#elif defined(__AVX2__)
  // 8 x 8 blocks: element by element, the transposes were a twentieth of gpt-tiny's attention on Zen 3.
  if constexpr (std::is_same_v<T, float>) {
    if (d % 8 == 0) {
      whole = rows / 8 * 8;
      const __m256 sc = _mm256_set1_ps(scale);
      for (int64_t r0 = 0; r0 < whole; r0 += 8)
        for (int64_t c0 = 0; c0 < d; c0 += 8) {
          __m256 r[8];
          for (int i = 0; i < 8; ++i) r[i] = _mm256_mul_ps(sc, _mm256_loadu_ps(src + (r0 + i) * ld + c0));
          transpose8(r);
          for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + (c0 + i) * rows + r0, r[i]);
        }
    }
  }
#endif
  for (int64_t r0 = whole; r0 < rows; r0 += kB) {
    const int64_t r1 = std::min(rows, r0 + kB);
    for (int64_t c = 0; c < d; ++c)
      for (int64_t r = r0; r < r1; ++r) dst[c * rows + r] = scale * src[r * ld + c];
  }
}

// Rows [i0, i0 + m) of one (batch, head): qb and ob those rows of its q (T x D) and o (T x Dv), kt = scale *
// k^T (D x S), v (S x Dv), lse (T) of that head. The output rows accumulate unnormalised in place, rescaled
// whenever a row's running maximum grows.
// With key padding (`kid`: the head's batch row of key_ids, else null) a padded key's score becomes -inf, and
// a row that has seen no visible key yet keeps max -inf, sum 0 and zero outputs (its probabilities are not
// formed: exp(-inf - -inf) would be NaN); a row that sees none at all ends with out 0 and lse 0.
template <typename T>
void forward_block(const Geometry& g, const T* qb, int64_t ldq, const T* kt, const T* v, int64_t ldv, T* ob,
                   int64_t ldo, T* lse, int64_t i0, int64_t m, const int64_t* kid) {
  alignas(64) T st[kBQ * kBK];  // scores, then probabilities
  T mrow[kBQ], lrow[kBQ], mnew[kBQ];
  int64_t lim[kBQ];
  const int64_t d = g.d, dv = g.dv;
  const int64_t kend = g.kv_end(i0 + m - 1);  // blocks wholly above the causal diagonal are never visited
  for (int64_t kb = 0; kb < kend; kb += kBK) {
    const int64_t n = std::min(kBK, kend - kb);
    g.limits(i0, m, kb, n, lim);
    gemm_nn(m, n, d, qb, ldq, 1, kt + kb, g.s, st, kBK, false, lim);
    // The row maxima first, then the exp passes: each pass is short enough per row that consecutive rows'
    // dependency chains (the folds, the exp polynomial) overlap.
    for (int64_t r = 0; r < m; ++r) {
      T* srow = st + r * kBK;
      if (kid)
        for (int64_t j = 0; j < lim[r]; ++j)
          if (kid[kb + j] == g.pad) srow[j] = -std::numeric_limits<T>::infinity();
      mnew[r] = row_max(srow, lim[r], kb > 0 ? mrow[r] : -std::numeric_limits<T>::infinity());
    }
    for (int64_t r = 0; r < m; ++r) {
      T* srow = st + r * kBK;
      // Without padding every row sees key 0 (off >= 0), so the first block leaves each running maximum
      // finite; with it, a row may have seen nothing yet (mx = -inf).
      const T mprev = kb > 0 ? mrow[r] : -std::numeric_limits<T>::infinity();
      const T mx = mnew[r];
      const bool none = mx == -std::numeric_limits<T>::infinity();
      const T sum = none ? T(0) : exp_sum(srow, lim[r], mx);
      std::fill(srow + (none ? 0 : lim[r]), srow + n, T(0));
      if (kb > 0) {
        const T alpha = none ? T(1) : std::exp(mprev - mx);
        lrow[r] = lrow[r] * alpha + sum;
        if (alpha != T(1)) {
          T* orow = ob + r * ldo;
#pragma omp simd
          for (int64_t j = 0; j < dv; ++j) orow[j] *= alpha;
        }
      } else {
        lrow[r] = sum;
      }
      mrow[r] = mx;
    }
    gemm_nn(m, dv, n, st, kBK, 1, v + kb * ldv, ldv, ob, ldo, /*acc=*/kb > 0, nullptr, nullptr, lim);
  }
  for (int64_t r = 0; r < m; ++r) {
    const bool none = lrow[r] == T(0);  // only under key padding: every key it would see is padding
    const T inv = none ? T(0) : T(1) / lrow[r];
    T* orow = ob + r * ldo;
#pragma omp simd
    for (int64_t j = 0; j < dv; ++j) orow[j] *= inv;
    lse[i0 + r] = none ? T(0) : mrow[r] + std::log(lrow[r]);
  }
}

// out[r] = a row r . b row r for r < m (rows n long, lda and ldb apart): four rows at a time, so that their
// chains of dependent adds interleave (one 64-wide row is four register products added in turn); each row's
// lanes are folded in halves, then its tail past the last whole register added in order.
template <typename T>
inline void row_dots(int64_t m, int64_t n, const T* a, int64_t lda, const T* b, int64_t ldb, T* out) {
  using V = typename Vec<T>::type;
  constexpr int64_t L = kLanes<T>, kRows = 4;
  const int64_t whole = n / L * L;
  for (int64_t r0 = 0; r0 < m; r0 += kRows) {
    const int64_t rows = std::min(kRows, m - r0);
    V acc[kRows] = {};
    for (int64_t j = 0; j < whole; j += L)
      for (int64_t u = 0; u < rows; ++u)
        acc[u] += vload<V>(a + (r0 + u) * lda + j) * vload<V>(b + (r0 + u) * ldb + j);
    for (int64_t u = 0; u < rows; ++u) {
      T sum = fold_lanes<T>(acc[u], [](auto x, auto y) { return x + y; });
      for (int64_t j = whole; j < n; ++j) sum += a[(r0 + u) * lda + j] * b[(r0 + u) * ldb + j];
      out[r0 + u] = sum;
    }
  }
}

// Gradients of one (batch, head); the calling thread owns its dq, dk, dv rows and its kt, vt scratch.
// `kid` as in forward_block: a padded key's score becomes -inf, so its probability and dS are exactly 0
// (lse is finite on every row, 0 where the forward saw no key).
template <typename T>
void backward_head(const Geometry& g, const HeadStrides& ld, const T* dout, const T* q, const T* k,
                   const T* v, const T* o, const T* lse, T* dq, T* dk, T* dv, T* kt, T* vt,
                   const int64_t* kid) {
  alignas(64) T pt[kBQ * kBK];  // scores, then P
  alignas(64) T ds[kBQ * kBK];  // dP, then dS
  T di[kBQ];
  int64_t lim[kBQ];    // keys of the current block each query row attends to
  int64_t first[kBK];  // first query row of the current block that attends to each key
  const T sc = static_cast<T>(g.scale);
  const int64_t d = g.d, dvn = g.dv;
  transpose_scaled(g.s, d, k, kt, sc, ld.k);
  transpose_scaled(g.s, dvn, v, vt, T(1), ld.v);
  // Where one product writes every row of a key block first (without the causal mask the first query
  // block's, with it and T == S the diagonal block's), that product stores its sums instead of adding them to
  // zeroed rows: the zeroing, a memset call per row of dk and of dv, was a twentieth of sdpa_qkv_grad. Both
  // start the sum from +0, so the bits are the same.
  static_assert(kBQ == kBK, "the diagonal block of query block i0 is key block i0");
  const bool first_writes = !g.causal || g.off == 0;
  if (!first_writes)
    for (int64_t j = 0; j < g.s; ++j) {
      std::fill_n(dk + j * ld.dk, d, T(0));
      std::fill_n(dv + j * ld.dv, dvn, T(0));
    }
  for (int64_t i0 = 0; i0 < g.t; i0 += kBQ) {
    const int64_t m = std::min(kBQ, g.t - i0);
    const T *qb = q + i0 * ld.q, *dob = dout + i0 * ld.dout, *ob = o + i0 * ld.o, *lb = lse + i0;
    T* dqb = dq + i0 * ld.dq;
    row_dots(m, dvn, dob, ld.dout, ob, ld.o, di);
    const int64_t kend = g.kv_end(i0 + m - 1);
    for (int64_t kb = 0; kb < kend; kb += kBK) {
      const int64_t n = std::min(kBK, kend - kb);
      g.limits(i0, m, kb, n, lim);
      Geometry::first_rows(lim, m, n, first);
      gemm_nn(m, n, d, qb, ld.q, 1, kt + kb, g.s, pt, kBK, false, lim);        // S = scale q k^T
      gemm_nn(m, n, dvn, dob, ld.dout, 1, vt + kb, g.s, ds, kBK, false, lim);  // dP = dout v^T
      for (int64_t r = 0; r < m; ++r) {
        T *prow = pt + r * kBK, *dsrow = ds + r * kBK;
        if (kid)
          for (int64_t j = 0; j < lim[r]; ++j)
            if (kid[kb + j] == g.pad) prow[j] = -std::numeric_limits<T>::infinity();
        probs_and_ds(prow, dsrow, lim[r], lb[r], di[r], sc);
        std::fill(prow + lim[r], prow + n, T(0));
        std::fill(dsrow + lim[r], dsrow + n, T(0));
      }
      // P and dS read transposed (A strides 1, kBK): dv += P^T dout, dk += dS^T q, then dq += dS k.
      const bool acc = !first_writes || (g.causal ? i0 != kb : i0 != 0);
      gemm_nn(n, dvn, m, pt, 1, kBK, dob, ld.dout, dv + kb * ld.dv, ld.dv, acc, nullptr, first);
      gemm_nn(n, d, m, ds, 1, kBK, qb, ld.q, dk + kb * ld.dk, ld.dk, acc, nullptr, first);
      gemm_nn(m, d, n, ds, kBK, 1, k + kb * ld.k, ld.k, dqb, ld.dq, /*acc=*/kb > 0, nullptr, nullptr, lim);
    }
  }
}

// The forward of every (batch, head), `heads(h)` giving head h's HeadRows: scale * k^T of each head into kt
// (D x S slices), then (head, query block) tasks, each writing its own rows of out and lse.
template <typename T, typename Heads>
void forward_heads(const Geometry& g, T* kt, T* lse, const Heads& heads) {
  parallel_for(g.bh, 1, [&](int64_t s, int64_t e) {
    for (int64_t h = s; h < e; ++h) {
      const HeadRows<T> r = heads(h);
      transpose_scaled(g.s, g.d, r.k, kt + h * g.s * g.d, static_cast<T>(g.scale), r.ldk);
    }
  });
  const int64_t nqb = (g.t + kBQ - 1) / kBQ;
  parallel_for(g.bh * nqb, 1, [&](int64_t s, int64_t e) {
    for (int64_t task = s; task < e; ++task) {
      const int64_t h = task / nqb, i0 = (task % nqb) * kBQ;
      const HeadRows<T> r = heads(h);
      forward_block(g, r.q + i0 * r.ldq, r.ldq, kt + h * g.s * g.d, r.v, r.ldv, r.out + i0 * r.ldo, r.ldo,
                    lse + h * g.t, i0, std::min(kBQ, g.t - i0), g.keys_of(h));
    }
  });
}

}  // namespace

namespace {

// Row 0 of head h in q (and dq), k (dk), v (dv) and out (dout).
struct HeadOffsets {
  int64_t q, k, v, o;
};

// (B, H, T, D) heads, one after another.
HeadOffsets dense_offsets(const Geometry& g, int64_t h) {
  return {h * g.t * g.d, h * g.s * g.d, h * g.s * g.dv, h * g.t * g.dv};
}

// sdpa's forward, (q, k, v) -> (out, lse), over heads at offsets(h) with rows `ld` apart; the workspace
// holds scale * k^T, one (D x S) slice per head.
template <typename Offsets>
void forward_call(const KernelCtx& c, const Geometry& g, const HeadStrides& ld, Offsets offsets) {
  dispatch_float(c.in[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T *q = c.in[0].as<T>(), *k = c.in[1].as<T>(), *v = c.in[2].as<T>();
    T* o = c.out[0].as<T>();
    FR_CHECK(c.workspace_bytes >= static_cast<size_t>(g.bh * g.s * g.d) * sizeof(T), c.node->op,
             " workspace too small");
    forward_heads(g, static_cast<T*>(c.workspace), c.out[1].as<T>(), [&](int64_t h) {
      const HeadOffsets at = offsets(h);
      return HeadRows<T>{q + at.q, k + at.k, v + at.v, o + at.o, ld.q, ld.k, ld.v, ld.o};
    });
  });
}

// sdpa's backward, (dout, q, k, v, out, lse) -> (dq, dk, dv), likewise: whole heads per thread; the
// workspace holds scale * k^T and v^T, a slice of each per head.
template <typename Offsets>
void backward_call(const KernelCtx& c, const Geometry& g, const HeadStrides& ld, Offsets offsets) {
  dispatch_float(c.in[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T *dout = c.in[0].as<T>(), *q = c.in[1].as<T>(), *k = c.in[2].as<T>(), *v = c.in[3].as<T>();
    const T *o = c.in[4].as<T>(), *lse = c.in[5].as<T>();
    T *dq = c.out[0].as<T>(), *dk = c.out[1].as<T>(), *dv = c.out[2].as<T>();
    T* kt = static_cast<T*>(c.workspace);
    T* vt = kt + g.bh * g.s * g.d;
    FR_CHECK(c.workspace_bytes >= static_cast<size_t>(g.bh * g.s * (g.d + g.dv)) * sizeof(T), c.node->op,
             " workspace too small");
    parallel_for(g.bh, 1, [&](int64_t s, int64_t e) {
      for (int64_t h = s; h < e; ++h) {
        const HeadOffsets at = offsets(h);
        backward_head(g, ld, dout + at.o, q + at.q, k + at.k, v + at.v, o + at.o, lse + h * g.t, dq + at.q,
                      dk + at.k, dv + at.v, kt + h * g.s * g.d, vt + h * g.s * g.dv, g.keys_of(h));
      }
    });
  });
}

}  // namespace

void sdpa(const KernelCtx& c) {
  const Geometry g = geometry(c, c.in[0], c.in[1], c.in[2], 3);
  forward_call(c, g, HeadStrides::dense(g), [&](int64_t h) { return dense_offsets(g, h); });
}

void sdpa_grad(const KernelCtx& c) {
  const Geometry g = geometry(c, c.in[1], c.in[2], c.in[3], 6);
  backward_call(c, g, HeadStrides::dense(g), [&](int64_t h) { return dense_offsets(g, h); });
}

// sdpa on packed projections: the sdpa kernel's blocks on the rows in place (q, k, v 3 H D apart, out and
// dout H D apart), so every value is computed as the unfused split -> transpose -> sdpa -> transpose computes
// it, without those passes over memory. Earlier versions copied each head's rows into a contiguous buffer
// first: ~7% of the op, for products that run as fast on the strided rows (they read whole 64-byte lines).
void sdpa_qkv(const KernelCtx& c) {
  const Packed p(c, c.in[0]);
  const Geometry g = p.geometry(c.attrs());
  dispatch_float(c.in[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* x = c.in[0].as<T>();
    T* o = c.out[0].as<T>();
    FR_CHECK(c.workspace_bytes >= static_cast<size_t>(g.bh * g.t * g.d) * sizeof(T),
             "sdpa_qkv workspace too small");
    forward_heads(g, static_cast<T*>(c.workspace), c.out[1].as<T>(), [&](int64_t h) {
      return HeadRows<T>{x + p.part(h, 0), x + p.part(h, 1), x + p.part(h, 2), o + p.merged(h),
                         p.row(),          p.row(),          p.row(),          p.h * p.d};
    });
  });
}

void sdpa_qkv_grad(const KernelCtx& c) {
  const Packed p(c, c.in[1]);
  const Geometry g = p.geometry(c.attrs());
  dispatch_float(c.in[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T *dout = c.in[0].as<T>(), *x = c.in[1].as<T>(), *o = c.in[2].as<T>(), *lse = c.in[3].as<T>();
    T* dx = c.out[0].as<T>();
    const int64_t hs = g.t * g.d;
    parallel_for(g.bh, 1, [&](int64_t s, int64_t e) {
      T* kt = static_cast<T*>(thread_scratch(static_cast<size_t>(kSdpaQkvGradBuffers * hs) * sizeof(T)));
      T* vt = kt + hs;
      for (int64_t h = s; h < e; ++h)
        backward_head(g, p.strides(), dout + p.merged(h), x + p.part(h, 0), x + p.part(h, 1),
                      x + p.part(h, 2), o + p.merged(h), lse + h * g.t, dx + p.part(h, 0), dx + p.part(h, 1),
                      dx + p.part(h, 2), kt, vt, static_cast<const int64_t*>(nullptr));
    });
  });
}

// sdpa on the projections' rows (attention_tiles.h Rows): the sdpa kernels' blocks with row strides H D and
// H Dv, so every value is computed as the unfused reshape -> transpose -> sdpa -> transpose computes it,
// without the transposes' passes over q, k, v, out and their gradients.
void sdpa_rows(const KernelCtx& c) {
  const Rows r(*c.in[0].shape, *c.in[1].shape, *c.in[2].shape, c.attrs());
  const Geometry g = r.geometry(c.attrs(), c.num_in > 3 ? c.in[3].as<int64_t>() : nullptr);
  forward_call(c, g, r.strides(), [&](int64_t h) { return HeadOffsets{r.q(h), r.k(h), r.v(h), r.o(h)}; });
}

void sdpa_rows_grad(const KernelCtx& c) {
  const Rows r(*c.in[1].shape, *c.in[2].shape, *c.in[3].shape, c.attrs());
  const Geometry g = r.geometry(c.attrs(), c.num_in > 6 ? c.in[6].as<int64_t>() : nullptr);
  backward_call(c, g, r.strides(), [&](int64_t h) { return HeadOffsets{r.q(h), r.k(h), r.v(h), r.o(h)}; });
}

}  // namespace flowrun::cpu

namespace flowrun::cpu {

// One query row at a time, its keys in blocks of kCacheBlock: the block's scores (vectorised dot products,
// summed in T), then the online softmax's rescale and the weighted values added to an accumulator row in T
// (f32 for the f32 programs, as the flash kernel accumulates). No buffer grows with the cache, and a decode
// step's attention stays a small part of its time at any position. Queries are independent tasks; each writes
// its own output row, so the result does not depend on the thread count.
void sdpa_cache(const KernelCtx& c) {
  dispatch_float(c.in[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int64_t kCacheBlock = 128, kMaxDv = 1024;
    const TensorView &q = c.in[0], &k = c.in[1], &v = c.in[2], &kc = c.in[3], &vc = c.in[4];
    const int64_t H = q.dim(1), KV = k.dim(1), BH = q.dim(0) * H, BKV = q.dim(0) * KV;
    const int64_t n = q.dim(2), D = q.dim(3), Dv = v.dim(3), L = kc.dim(2);
    const int64_t pos = c.in[5].as<int64_t>()[0];
    FR_CHECK(pos >= 0 && pos + n <= L, c.node->name, ": positions [", pos, ", ", pos + n,
             ") outside a cache of ", L);
    FR_CHECK(Dv <= kMaxDv, c.node->name, ": value head dim ", Dv, " above ", kMaxDv);
    const T scale = static_cast<T>(c.attrs().f("scale", 1.0 / std::sqrt(static_cast<double>(D))));
    T* kcache = kc.as<T>();
    T* vcache = vc.as<T>();
    parallel_for(BKV, 1, [&](int64_t s, int64_t e) {
      for (int64_t bk = s; bk < e; ++bk) {
        std::copy_n(k.as<T>() + bk * n * D, n * D, kcache + (bk * L + pos) * D);
        std::copy_n(v.as<T>() + bk * n * Dv, n * Dv, vcache + (bk * L + pos) * Dv);
      }
    });
    parallel_for(BH * n, std::max<int64_t>(1, 64 / std::max<int64_t>(n, 1)), [&](int64_t s, int64_t e) {
      T acc[kMaxDv], w[kCacheBlock];
      for (int64_t r = s; r < e; ++r) {
        const int64_t bh = r / n, keys = pos + r % n + 1;
        const int64_t bk = bh / H * KV + bh % H / (H / KV);  // the query head's key/value head
        const T* qr = q.as<T>() + r * D;
        const T* kb = kcache + bk * L * D;
        const T* vb = vcache + bk * L * Dv;
        T m = -std::numeric_limits<T>::infinity(), l = 0;
        std::fill_n(acc, Dv, T(0));
        for (int64_t j0 = 0; j0 < keys; j0 += kCacheBlock) {
          const int64_t nb = std::min(kCacheBlock, keys - j0);
          T bm = -std::numeric_limits<T>::infinity();
          for (int64_t j = 0; j < nb; ++j) {
            const T* kr = kb + (j0 + j) * D;
            T dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int64_t p = 0; p < D; ++p) dot += qr[p] * kr[p];
            w[j] = dot * scale;
            bm = std::max(bm, w[j]);
          }
          const T m_new = std::max(m, bm), shrink = std::exp(m - m_new);  // 0 on the first block
          l *= shrink;
#pragma omp simd
          for (int64_t p = 0; p < Dv; ++p) acc[p] *= shrink;
          m = m_new;
          for (int64_t j = 0; j < nb; ++j) {
            const T wj = std::exp(w[j] - m);
            l += wj;
            const T* vr = vb + (j0 + j) * Dv;
#pragma omp simd
            for (int64_t p = 0; p < Dv; ++p) acc[p] += wj * vr[p];
          }
        }
        T* o = c.out[0].as<T>() + r * Dv;
        for (int64_t p = 0; p < Dv; ++p) o[p] = acc[p] / l;
      }
    });
  });
}

}  // namespace flowrun::cpu
