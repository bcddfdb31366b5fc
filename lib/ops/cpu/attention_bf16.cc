// Native bf16 flash attention for CPUs with avx512_bf16 (Zen 4, Cooper Lake, Sapphire Rapids): attention.cc's
// block products run as vdpbf16ps dot products of bf16 pairs, at twice the f32 FMA rate, while the scores,
// the online softmax and every accumulator (out, dq, dk, dv) stay f32. As in FlashAttention-2 and PyTorch's
// bf16 attention, the probabilities P and dS are rounded to bf16 for the products that read them; that is
// the one rounding the widened f32 kernel does not make. Outputs are rounded once, at the end.
//
// Layouts. vdpbf16ps multiplies a pair (A[r][2p], A[r][2p+1]), broadcast as one 32-bit word, with 16 columns
// of B's pair row p, whose words are (B[2p][j], B[2p+1][j]). So each B operand is repacked once into "pair
// layout" [K/2][N] words, zero-padded to an even K:
//  - forward, per head: K^T for the scores, V for the output;
//  - backward, per head: K^T and V^T for the scores and dP, K for dq, and Q and dout over query rows for dk
//    and dv.
// An A operand's word (r, p) is read at a + r * ars + p * aps (in bf16 elements). Row-major tiles have
// aps = 2. P^T and dS^T are the tiles' own pair layout over query rows (ars = 2), built two f32 rows at a
// time, so no tile is transposed element by element.
//
// Scratch: the kernel's workspace holds, per (batch, head), the repacked operands, padded copies of q and
// dout (only read when D or Dv is odd), and the f32 accumulators; the tiles live on the task's stack.
//
// Determinism is as in attention.cc. Tasks own their rows (forward: a head's query block; backward: a whole
// head). Pairs are formed at even absolute indices, and the range that a group of rows computes beyond a
// row's own holds exact zeros only. So the bits do not depend on the thread count.
#include "ops/cpu/attention.h"

#if defined(__AVX512BF16__)

#include <immintrin.h>
#include <omp.h>

#include "ops/cpu/attention_tiles.h"
#include "ops/cpu/dnnl_matmul.h"
#include "ops/cpu/elementwise.h"
#include "ops/cpu/grow_buffer.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/simd16.h"

namespace flowrun::cpu {

namespace {

using namespace attn;

int64_t even(int64_t n) {
  return (n + 1) & ~int64_t{1};
}
// Elements rounded up to whole 64-byte lines, so that every scratch region starts aligned.
int64_t lines(int64_t n, int64_t elem_bytes) {
  const int64_t per = 64 / elem_bytes;
  return (n + per - 1) / per * per;
}

// C[R x 16 NV] (+)= A B over the pairs [p0, p1): A word (r, p) at a + r * ars + p * aps, B pair row p at
// b + p * 2 * ldb (ldb columns), C f32 row-major; with kMasked, the last of the NV registers of columns is
// masked by `last`. R x NV accumulators stay in registers across the pairs: each B load feeds R dot products.
// A fresh C (acc false) is stored times `alpha` (the attention scale of the scores, for free).
// Whole tiles load B unmasked: with a masked load in the loop GCC 12 kept the accumulators in memory as well,
// storing all R x NV of them every pair, which ran the products at a third of the vdpbf16ps rate.
template <int R, int NV, bool kMasked>
inline void bdot_tile(int64_t p0, int64_t p1, const uint16_t* a, int64_t ars, int64_t aps, const uint16_t* b,
                      int64_t ldb, float* c, int64_t ldc, bool acc, float alpha, __mmask16 last) {
  auto mask = [&](int u) { return kMasked && u == NV - 1 ? last : simd16::kAll; };
  __m512 cr[R][NV];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u)
      cr[r][u] = acc ? _mm512_maskz_loadu_ps(mask(u), c + r * ldc + 16 * u) : _mm512_setzero_ps();
  for (int64_t p = p0; p < p1; ++p) {
    __m512bh br[NV];
    for (int u = 0; u < NV; ++u) {
      const uint16_t* bp = b + (p * ldb + 16 * u) * 2;
      br[u] =
          (__m512bh)(kMasked && u == NV - 1 ? _mm512_maskz_loadu_epi32(last, bp) : _mm512_loadu_si512(bp));
    }
    for (int r = 0; r < R; ++r) {
      int32_t w;
      std::memcpy(&w, a + r * ars + p * aps, sizeof(w));
      const __m512bh av = (__m512bh)_mm512_set1_epi32(w);
      for (int u = 0; u < NV; ++u) cr[r][u] = _mm512_dpbf16_ps(cr[r][u], av, br[u]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u)
      _mm512_mask_storeu_ps(c + r * ldc + 16 * u, mask(u), acc ? cr[r][u] : _mm512_mul_ps(cr[r][u], va));
}

template <int R>
void bdot_rows(int64_t n, int64_t p0, int64_t p1, const uint16_t* a, int64_t ars, int64_t aps,
               const uint16_t* b, int64_t ldb, float* c, int64_t ldc, bool acc, float alpha) {
  int64_t j = 0;
  for (; j + 64 <= n; j += 64)
    bdot_tile<R, 4, false>(p0, p1, a, ars, aps, b + 2 * j, ldb, c + j, ldc, acc, alpha, simd16::kAll);
  const int64_t rest = n - j;
  if (rest == 0) return;
  auto tile = [&]<int NV>() {
    if (rest % 16 == 0)
      bdot_tile<R, NV, false>(p0, p1, a, ars, aps, b + 2 * j, ldb, c + j, ldc, acc, alpha, simd16::kAll);
    else
      bdot_tile<R, NV, true>(p0, p1, a, ars, aps, b + 2 * j, ldb, c + j, ldc, acc, alpha,
                             simd16::lanes(rest % 16));
  };
  switch ((rest + 15) / 16) {
    case 1:
      tile.template operator()<1>();
      break;
    case 2:
      tile.template operator()<2>();
      break;
    case 3:
      tile.template operator()<3>();
      break;
    default:
      tile.template operator()<4>();
      break;
  }
}

// C[m x n] (+)= A[m x k] B[k x n] with A and B as above (C = alpha A B when not accumulating). The optional
// per-row limits are attention.cc's gemm_nn's: `ncols` (columns computed, rounded up to 16) and [kbeg, kend)
// (the inner range, outside of which the row of A is zero, rounded out to whole pairs).
void bgemm(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t ars, int64_t aps, const uint16_t* b,
           int64_t ldb, float* c, int64_t ldc, bool acc, float alpha, const int64_t* ncols = nullptr,
           const int64_t* kbeg = nullptr, const int64_t* kend = nullptr) {
  auto run = [&]<int R>(int64_t i) {
    const int64_t last = i + R - 1;
    const int64_t nc = ncols ? std::min(n, (ncols[last] + 15) / 16 * 16) : n;
    const int64_t p0 = kbeg ? kbeg[i] / 2 : 0;
    const int64_t p1 = std::max(p0, ((kend ? kend[last] : k) + 1) / 2);
    bdot_rows<R>(nc, p0, p1, a + i * ars, ars, aps, b, ldb, c + i * ldc, ldc, acc, alpha);
  };
  int64_t i = 0;
  for (; i + 6 <= m; i += 6) run.template operator()<6>(i);
  for (; i + 4 <= m; i += 4) run.template operator()<4>(i);
  for (; i < m; ++i) run.template operator()<1>(i);
}

// Pair layout over rows of a (rows x cols) bf16 source whose rows are `lds` apart: word (p, j) = (src[2p][j],
// src[2p+1][j]), the row past an odd count zero. B for a product that sums over the source's rows.
void pack_rows(int64_t rows, int64_t cols, const uint16_t* src, int64_t lds, uint32_t* dst) {
  for (int64_t p = 0; p < (rows + 1) / 2; ++p) {
    const uint16_t* r0 = src + 2 * p * lds;
    uint32_t* d = dst + p * cols;
    if (2 * p + 1 < rows) {
      const uint16_t* r1 = r0 + lds;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) d[j] = r0[j] | static_cast<uint32_t>(r1[j]) << 16;
    } else {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) d[j] = r0[j];
    }
  }
}

// Pair layout over columns (the source's transpose, its rows `lds` apart): word (p, j) = (src[j][2p],
// src[j][2p+1]), the column past an odd count zero. With an even count and stride a source row is cols / 2
// whole words, so this is a transpose of 32-bit words, done in 16 x 16 blocks.
void pack_cols(int64_t rows, int64_t cols, const uint16_t* src, int64_t lds, uint32_t* dst) {
  const int64_t np = (cols + 1) / 2;
  if (cols % 2 == 0 && lds % 2 == 0) {
    for (int64_t j0 = 0; j0 < rows; j0 += 16)
      for (int64_t p0 = 0; p0 < np; p0 += 16)
        simd16::transpose16(src + j0 * lds + 2 * p0, lds / 2, std::min<int64_t>(16, rows - j0),
                            std::min<int64_t>(16, np - p0), dst + p0 * rows + j0, rows);
    return;
  }
  for (int64_t p = 0; p < np; ++p)
    for (int64_t j = 0; j < rows; ++j) {
      const uint16_t* s = src + j * lds + 2 * p;
      dst[p * rows + j] = s[0] | (2 * p + 1 < cols ? static_cast<uint32_t>(s[1]) << 16 : 0u);
    }
}

// A (rows x cols) source whose rows are `lds` apart, as contiguous rows padded to an even length (the pad
// zero), or the source itself when it is that already. The products read these A operands a word at a time
// down the rows, where rows 3 H D apart (sdpa_qkv's) would alias in L1. Returns the rows' stride.
const uint16_t* padded_rows(int64_t rows, int64_t cols, const uint16_t* src, int64_t lds, uint16_t* dst,
                            int64_t* ld) {
  if (cols % 2 == 0 && lds == cols) {
    *ld = cols;
    return src;
  }
  *ld = even(cols);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(src + r * lds, cols, dst + r * *ld);
    dst[r * *ld + cols] = 0;
  }
  return dst;
}

// Rows of f32 rounded to bf16 bits (simd16::round_to_bf16), times `scale`.
void round_row(const float* src, uint16_t* dst, int64_t n, float scale = 1.0f) {
  simd16::round_to_bf16(src, reinterpret_cast<bf16*>(dst), n, scale);
}

// Rounded rows of an f32 tile (ld kBK), row-major: dst[r][j] for j < even(n), the column past an odd n zero
// (src holds zeros there: the callers clear each row past its last key).
void round_tile(int64_t m, int64_t n, const float* src, uint16_t* dst) {
  for (int64_t r = 0; r < m; ++r) round_row(src + r * kBK, dst + r * kBK, even(n));
}

// Rounded f32 tile (ld kBK) in pair layout over its rows (ld kBK words): A^T for dv and dk.
void round_tile_pairs(int64_t m, int64_t n, const float* src, uint32_t* dst) {
  auto words = [](const float* row, __mmask16 k) {
    return _mm512_maskz_cvtepu16_epi32(simd16::kAll, simd16::bf16_words(_mm512_maskz_loadu_ps(k, row)));
  };
  for (int64_t p = 0; p < (m + 1) / 2; ++p) {
    const float* r0 = src + 2 * p * kBK;
    uint32_t* d = dst + p * kBK;
    const bool pair = 2 * p + 1 < m;
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 k = simd16::lanes(n - j);
      __m512i w = words(r0 + j, k);
      if (pair) w = _mm512_or_si512(w, _mm512_maskz_slli_epi32(simd16::kAll, words(r0 + kBK + j, k), 16));
      _mm512_mask_storeu_epi32(d + j, k, w);
    }
  }
}

// A score row of `lim` visible keys made whole vectors for the row passes: padded keys (key_ids == pad) and
// the columns from lim up to the next multiple of 16 become -inf, whose exp is 0, so the passes need no
// partial register. Returns that width (at most kBK, as the tile is).
int64_t masked_to_vectors(float* srow, int64_t lim, const int64_t* kid, int64_t pad) {
  if (kid)
    for (int64_t j = 0; j < lim; ++j)
      if (kid[j] == pad) srow[j] = -std::numeric_limits<float>::infinity();
  const int64_t w = (lim + 15) / 16 * 16;
  std::fill(srow + lim, srow + w, -std::numeric_limits<float>::infinity());
  return w;
}

// exp_sum on a score row's first w columns (whole registers, masked_to_vectors' width), the probabilities
// rounded to bf16 straight into P's row `pb` for `cols` columns (even; zero from w on) instead of stored in
// f32 and rounded by a second pass. The sum is exp_sum's, in its order.
float exp_sum_rounded(const float* s, int64_t w, float mx, uint16_t* pb, int64_t cols) {
  using V = Vec<float>::type;
  V acc = V{};
  auto probs = [&](int64_t j) {
    if (j >= w) return _mm512_setzero_ps();
    V x = vload<V>(s + j) - mx;
    exp_inplace(x);
    acc += x;
    return (__m512)x;
  };
  for (int64_t j = 0; j < cols; j += 32) {
    const __m512 lo = probs(j), hi = probs(j + 16);
    _mm512_mask_storeu_epi16(pb + j, cols - j >= 32 ? ~__mmask32{0} : (__mmask32{1} << (cols - j)) - 1,
                             simd16::round_halves(lo, hi));
  }
  return fold_lanes<float>(acc, [](auto a, auto b) { return a + b; });
}

// One head's scratch of the forward (a thread's, thread_scratch), in bytes from its base.
struct ForwardScratch {
  int64_t kt, vp, q, o, bytes;
  explicit ForwardScratch(const Geometry& g) {
    kt = 0;
    vp = kt + 2 * lines(even(g.d) * g.s, 2);
    q = vp + 2 * lines(even(g.s) * g.dv, 2);
    o = q + 2 * lines(g.t * even(g.d), 2);
    bytes = o + 4 * lines(g.t * g.dv, 4);
  }
};

struct BackwardScratch {
  int64_t kt, vt, kn, qp, dop, q, dout, dq, dk, dv, bytes;
  explicit BackwardScratch(const Geometry& g) {
    kt = 0;
    vt = kt + 2 * lines(even(g.d) * g.s, 2);
    kn = vt + 2 * lines(even(g.dv) * g.s, 2);
    qp = kn + 2 * lines(even(g.s) * g.d, 2);
    dop = qp + 2 * lines(even(g.t) * g.d, 2);
    q = dop + 2 * lines(even(g.t) * g.dv, 2);
    dout = q + 2 * lines(g.t * even(g.d), 2);
    dq = dout + 2 * lines(g.t * even(g.dv), 2);
    dk = dq + 4 * lines(g.t * g.d, 4);
    dv = dk + 4 * lines(g.s * g.d, 4);
    bytes = dv + 4 * lines(g.s * g.dv, 4);
  }
};

// Rows [i0, i0 + m) of one head: qb those rows of q (stride ldq, even), kt and vp in pair layout, o the
// head's f32 accumulator, out (rows `ldo` apart) and lse the head's outputs. The online softmax of
// attention.cc's forward_block on the f32 score tile; the probabilities are rounded to bf16 for the product
// with V.
void forward_block(const Geometry& g, const uint16_t* qb, int64_t ldq, const uint16_t* kt, const uint16_t* vp,
                   float* o, uint16_t* out, int64_t ldo, float* lse, int64_t i0, int64_t m,
                   const int64_t* kid) {
  alignas(64) float st[kBQ * kBK];
  alignas(64) uint16_t pb[kBQ * kBK];
  float mrow[kBQ], lrow[kBQ], mnew[kBQ];
  int64_t lim[kBQ], wid[kBQ];
  const int64_t dv = g.dv;
  const auto sc = static_cast<float>(g.scale);
  float* ob = o + i0 * dv;
  const int64_t kend = g.kv_end(i0 + m - 1);
  for (int64_t kb = 0; kb < kend; kb += kBK) {
    const int64_t n = std::min(kBK, kend - kb);
    g.limits(i0, m, kb, n, lim);
    bgemm(m, n, g.d, qb, ldq, 2, kt + 2 * kb, g.s, st, kBK, false, sc, lim);
    // The row maxima first, then the exp passes: each pass is short enough per row that consecutive rows'
    // dependency chains (the folds, the exp polynomial) overlap.
    for (int64_t r = 0; r < m; ++r) {
      float* srow = st + r * kBK;
      wid[r] = masked_to_vectors(srow, lim[r], kid ? kid + kb : nullptr, g.pad);
      mnew[r] = row_max(srow, wid[r], kb > 0 ? mrow[r] : -std::numeric_limits<float>::infinity());
    }
    for (int64_t r = 0; r < m; ++r) {
      float* srow = st + r * kBK;
      const float mprev = kb > 0 ? mrow[r] : -std::numeric_limits<float>::infinity();
      const float mx = mnew[r];
      const bool none = mx == -std::numeric_limits<float>::infinity();
      const float sum = exp_sum_rounded(srow, none ? 0 : wid[r], mx, pb + r * kBK, even(n));
      if (kb > 0) {
        const float alpha = none ? 1.0f : std::exp(mprev - mx);
        lrow[r] = lrow[r] * alpha + sum;
        if (alpha != 1.0f) {
          float* orow = ob + r * dv;
#pragma omp simd
          for (int64_t j = 0; j < dv; ++j) orow[j] *= alpha;
        }
      } else {
        lrow[r] = sum;
      }
      mrow[r] = mx;
    }
    bgemm(m, dv, n, pb, kBK, 2, vp + kb * dv, dv, ob, dv, /*acc=*/kb > 0, 1.0f, nullptr, nullptr, lim);
  }
  for (int64_t r = 0; r < m; ++r) {
    const bool none = lrow[r] == 0.0f;
    const float inv = none ? 0.0f : 1.0f / lrow[r];
    round_row(ob + r * dv, out + (i0 + r) * ldo, dv, inv);
    lse[i0 + r] = none ? 0.0f : mrow[r] + std::log(lrow[r]);
  }
}

// Gradients of one head (attention.cc's backward_head with bf16 products); `ws` is the head's scratch.
void backward_head(const Geometry& g, const BackwardScratch& at, char* ws, const HeadStrides& ld,
                   const uint16_t* dout, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                   const uint16_t* o, const float* lse, uint16_t* dq, uint16_t* dk, uint16_t* dv,
                   const int64_t* kid) {
  alignas(64) float pt[kBQ * kBK];          // scores, then P
  alignas(64) float ds[kBQ * kBK];          // dP, then dS
  alignas(64) uint32_t pp[kBQ / 2 * kBK];   // P^T: P in pair layout over query rows
  alignas(64) uint32_t dsp[kBQ / 2 * kBK];  // dS^T likewise
  alignas(64) uint16_t dsr[kBQ * kBK];      // dS row-major
  float di[kBQ];
  int64_t lim[kBQ], first[kBK];
  const int64_t d = g.d, dvn = g.dv;
  const auto sc = static_cast<float>(g.scale);
  auto u16_at = [&](int64_t off) { return reinterpret_cast<uint16_t*>(ws + off); };
  auto u32_at = [&](int64_t off) { return reinterpret_cast<uint32_t*>(ws + off); };
  auto f32_at = [&](int64_t off) { return reinterpret_cast<float*>(ws + off); };
  pack_cols(g.s, d, k, ld.k, u32_at(at.kt));
  pack_cols(g.s, dvn, v, ld.v, u32_at(at.vt));
  pack_rows(g.s, d, k, ld.k, u32_at(at.kn));
  pack_rows(g.t, d, q, ld.q, u32_at(at.qp));
  pack_rows(g.t, dvn, dout, ld.dout, u32_at(at.dop));
  int64_t ldq = 0, ldo = 0;
  const uint16_t* qa = padded_rows(g.t, d, q, ld.q, u16_at(at.q), &ldq);
  const uint16_t* doa = padded_rows(g.t, dvn, dout, ld.dout, u16_at(at.dout), &ldo);
  const uint16_t *kt = u16_at(at.kt), *vt = u16_at(at.vt), *kn = u16_at(at.kn), *qp = u16_at(at.qp),
                 *dop = u16_at(at.dop);
  float *dqa = f32_at(at.dq), *dka = f32_at(at.dk), *dva = f32_at(at.dv);
  std::fill(dka, dka + g.s * d, 0.0f);
  std::fill(dva, dva + g.s * dvn, 0.0f);
  for (int64_t i0 = 0; i0 < g.t; i0 += kBQ) {
    const int64_t m = std::min(kBQ, g.t - i0);
    const float* lb = lse + i0;
    float* dqb = dqa + i0 * d;
    for (int64_t r = 0; r < m; ++r) {
      const uint16_t *dor = dout + (i0 + r) * ld.dout, *orow = o + (i0 + r) * ld.o;
      float acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int64_t j = 0; j < dvn; ++j) acc += float_of_bf16_bits(dor[j]) * float_of_bf16_bits(orow[j]);
      di[r] = acc;
    }
    const int64_t kend = g.kv_end(i0 + m - 1);
    for (int64_t kb = 0; kb < kend; kb += kBK) {
      const int64_t n = std::min(kBK, kend - kb);
      g.limits(i0, m, kb, n, lim);
      Geometry::first_rows(lim, m, n, first);
      bgemm(m, n, d, qa + i0 * ldq, ldq, 2, kt + 2 * kb, g.s, pt, kBK, false, sc, lim);       // S = q k^T
      bgemm(m, n, dvn, doa + i0 * ldo, ldo, 2, vt + 2 * kb, g.s, ds, kBK, false, 1.0f, lim);  // dP = dout v^T
      for (int64_t r = 0; r < m; ++r) {
        float *prow = pt + r * kBK, *dsrow = ds + r * kBK;
        const int64_t w = masked_to_vectors(prow, lim[r], kid ? kid + kb : nullptr, g.pad);
        probs_and_ds(prow, dsrow, w, lb[r], di[r], sc);
        std::fill(prow + lim[r], prow + even(n), 0.0f);
        std::fill(dsrow + lim[r], dsrow + even(n), 0.0f);
      }
      round_tile_pairs(m, n, pt, pp);
      round_tile_pairs(m, n, ds, dsp);
      round_tile(m, n, ds, dsr);
      const auto* ppa = reinterpret_cast<const uint16_t*>(pp);
      const auto* dspa = reinterpret_cast<const uint16_t*>(dsp);
      // dv += P^T dout, dk += dS^T q (A rows are keys, pairs over query rows), then dq += dS k.
      bgemm(n, dvn, m, ppa, 2, 2 * kBK, dop + i0 * dvn, dvn, dva + kb * dvn, dvn, true, 1.0f, nullptr, first);
      bgemm(n, d, m, dspa, 2, 2 * kBK, qp + i0 * d, d, dka + kb * d, d, true, 1.0f, nullptr, first);
      bgemm(m, d, n, dsr, kBK, 2, kn + kb * d, d, dqb, d, /*acc=*/kb > 0, 1.0f, nullptr, nullptr, lim);
    }
  }
  // Rounded row by row, inline: a call to convert per 64-element row (its dispatch and a nested
  // parallel_for) took a tenth of the backward.
  auto store = [](const float* src, uint16_t* dst, int64_t rows, int64_t cols, int64_t ldd) {
    for (int64_t r = 0; r < rows; ++r) round_row(src + r * cols, dst + r * ldd, cols);
  };
  store(dqa, dq, g.t, d, ld.dq);
  store(dka, dk, g.s, d, ld.dk);
  store(dva, dv, g.s, dvn, ld.dv);
}

const uint16_t* bits(const TensorView& t) {
  return reinterpret_cast<const uint16_t*>(t.as<bf16>());
}
uint16_t* bits_out(const TensorView& t) {
  return reinterpret_cast<uint16_t*>(t.as<bf16>());
}

}  // namespace

bool has_avx512_bf16() {
  static const bool yes = __builtin_cpu_supports("avx512bf16");
  return yes;
}

// On the AMX host (2026-12-07, 2 threads): flowrun_bench's sdpa_qkv (B16 T128 H4 D64, causal) took 1.19 ms
// forward and 4.12 ms forward + backward in these kernels against 0.98 and 2.90 in f32; gpt-tiny's bf16 step
// 65.7-68.3 -> 62.8-65.4 ms widened (3 of 3 alternating runs). On Zen 4 these kernels were the faster
// (lib/ops/README.md, "Low-precision kernels").
bool bf16_attention_native() {
  static const bool yes = has_avx512_bf16() && !has_amx_bf16();
  return yes;
}

size_t sdpa_bf16_forward_workspace(const std::vector<TensorType>&, const std::vector<TensorType>&,
                                   const Attrs&) {
  return 0;
}

std::vector<std::pair<std::string, size_t>> sdpa_bf16_buffers(const std::vector<TensorType>& in,
                                                              const std::vector<TensorType>&,
                                                              const Attrs& a) {
  const Geometry g = geometry(in[0].shape, in[1].shape, in[2].shape, a);
  return {{kSdpaThreadBuffers,
           static_cast<size_t>(ForwardScratch(g).bytes) * static_cast<size_t>(omp_get_max_threads())}};
}

size_t sdpa_grad_bf16_workspace(const std::vector<TensorType>& in, const std::vector<TensorType>&,
                                const Attrs& a) {
  const Geometry g = geometry(in[1].shape, in[2].shape, in[3].shape, a);
  return static_cast<size_t>(g.bh * BackwardScratch(g).bytes);
}

namespace {

// The forward of every head, `heads(h)` giving head h's HeadRows: (head, query block) tasks, each writing its
// own rows of out and lse. A thread runs a contiguous range of tasks in the scratch of its own
// (thread_scratch: one head's ForwardScratch), packing K^T and V of a head in pair layout when its range
// reaches that head. With every head's scratch in the arena (5 MiB for gpt-tiny's 64 heads), each call wrote
// and read it through DRAM: 1.43 ms a call in the step against 0.91 on warm buffers.
template <typename Heads>
void forward_heads(const Geometry& g, float* lse, const Heads& heads) {
  const ForwardScratch at(g);
  const int64_t nqb = (g.t + kBQ - 1) / kBQ;
  parallel_for(g.bh * nqb, 1, [&](int64_t s, int64_t e) {
    char* hw = static_cast<char*>(thread_scratch(static_cast<size_t>(at.bytes)));
    int64_t packed = -1;
    for (int64_t task = s; task < e; ++task) {
      const int64_t h = task / nqb, i0 = (task % nqb) * kBQ, m = std::min(kBQ, g.t - i0);
      const HeadRows<uint16_t> r = heads(h);
      if (h != packed) {
        pack_cols(g.s, g.d, r.k, r.ldk, reinterpret_cast<uint32_t*>(hw + at.kt));
        pack_rows(g.s, g.dv, r.v, r.ldv, reinterpret_cast<uint32_t*>(hw + at.vp));
        packed = h;
      }
      // The query block's rows alone, contiguous and padded when D is odd.
      int64_t ldq = 0;
      const uint16_t* qa = padded_rows(m, g.d, r.q + i0 * r.ldq, r.ldq,
                                       reinterpret_cast<uint16_t*>(hw + at.q) + i0 * even(g.d), &ldq);
      forward_block(g, qa, ldq, reinterpret_cast<const uint16_t*>(hw + at.kt),
                    reinterpret_cast<const uint16_t*>(hw + at.vp), reinterpret_cast<float*>(hw + at.o), r.out,
                    r.ldo, lse + h * g.t, i0, m, g.keys_of(h));
    }
  });
}

}  // namespace

void sdpa_bf16(const KernelCtx& c) {
  const Geometry g = geometry(c, c.in[0], c.in[1], c.in[2], 3);
  const uint16_t *q = bits(c.in[0]), *k = bits(c.in[1]), *v = bits(c.in[2]);
  uint16_t* out = bits_out(c.out[0]);
  forward_heads(g, c.out[1].as<float>(), [&](int64_t h) {
    return HeadRows<uint16_t>{
        q + h * g.t * g.d, k + h * g.s * g.d, v + h * g.s * g.dv, out + h * g.t * g.dv, g.d, g.d, g.dv, g.dv};
  });
}

void sdpa_grad_bf16(const KernelCtx& c) {
  const Geometry g = geometry(c, c.in[1], c.in[2], c.in[3], 6);
  const BackwardScratch at(g);
  FR_CHECK(c.workspace_bytes >= static_cast<size_t>(g.bh * at.bytes), "sdpa_grad workspace too small");
  char* ws = static_cast<char*>(c.workspace);
  const uint16_t *dout = bits(c.in[0]), *q = bits(c.in[1]), *k = bits(c.in[2]), *v = bits(c.in[3]),
                 *o = bits(c.in[4]);
  const float* lse = c.in[5].as<float>();
  uint16_t *dq = bits_out(c.out[0]), *dk = bits_out(c.out[1]), *dv = bits_out(c.out[2]);
  parallel_for(g.bh, 1, [&](int64_t s, int64_t e) {
    for (int64_t h = s; h < e; ++h) {
      const int64_t qo = h * g.t * g.d, ko = h * g.s * g.d, vo = h * g.s * g.dv, oo = h * g.t * g.dv;
      backward_head(g, at, ws + h * at.bytes, HeadStrides::dense(g), dout + oo, q + qo, k + ko, v + vo,
                    o + oo, lse + h * g.t, dq + qo, dk + ko, dv + vo, g.keys_of(h));
    }
  });
}

namespace {

// The geometry of sdpa_qkv's or sdpa_qkv_grad's heads from its types (qkv: input 0 of the forward, 1 of the
// gradient).
Geometry packed_geometry(const std::vector<TensorType>& in, const Attrs& a) {
  return Packed(in.size() == 1 ? in[0].shape : in[1].shape, a).geometry(a);
}

}  // namespace

// The forward's per-thread scratch: one head's ForwardScratch; the backward's: one head's BackwardScratch.
std::vector<std::pair<std::string, size_t>> sdpa_qkv_bf16_buffers(const std::vector<TensorType>& in,
                                                                  const std::vector<TensorType>&,
                                                                  const Attrs& a) {
  const Geometry g = packed_geometry(in, a);
  const bool grad = in.size() > 1;
  return {
      {kSdpaThreadBuffers, static_cast<size_t>(grad ? BackwardScratch(g).bytes : ForwardScratch(g).bytes) *
                               static_cast<size_t>(omp_get_max_threads())}};
}

// sdpa_bf16 and sdpa_grad_bf16 on the packed rows in place (as attention.cc's sdpa_qkv): the same bits as the
// unfused split, transposes and sdpa.
void sdpa_qkv_bf16(const KernelCtx& c) {
  const Packed p(c, c.in[0]);
  const Geometry g = p.geometry(c.attrs());
  const uint16_t* x = bits(c.in[0]);
  uint16_t* out = bits_out(c.out[0]);
  forward_heads(g, c.out[1].as<float>(), [&](int64_t h) {
    return HeadRows<uint16_t>{x + p.part(h, 0), x + p.part(h, 1), x + p.part(h, 2), out + p.merged(h),
                              p.row(),          p.row(),          p.row(),          p.h * p.d};
  });
}

void sdpa_qkv_grad_bf16(const KernelCtx& c) {
  const Packed p(c, c.in[1]);
  const Geometry g = p.geometry(c.attrs());
  const BackwardScratch at(g);
  const uint16_t *dout = bits(c.in[0]), *x = bits(c.in[1]), *o = bits(c.in[2]);
  const float* lse = c.in[3].as<float>();
  uint16_t* dx = bits_out(c.out[0]);
  parallel_for(g.bh, 1, [&](int64_t s, int64_t e) {
    char* hw = static_cast<char*>(thread_scratch(static_cast<size_t>(at.bytes)));
    for (int64_t h = s; h < e; ++h)
      backward_head(g, at, hw, p.strides(), dout + p.merged(h), x + p.part(h, 0), x + p.part(h, 1),
                    x + p.part(h, 2), o + p.merged(h), lse + h * g.t, dx + p.part(h, 0), dx + p.part(h, 1),
                    dx + p.part(h, 2), nullptr);
  });
}

// sdpa_bf16 and sdpa_grad_bf16 on separate projections' rows in place (as attention.cc's sdpa_rows): the
// same bits as the unfused transposes and sdpa.
void sdpa_rows_bf16(const KernelCtx& c) {
  const Rows r(*c.in[0].shape, *c.in[1].shape, *c.in[2].shape, c.attrs());
  const Geometry g = r.geometry(c.attrs(), c.num_in > 3 ? c.in[3].as<int64_t>() : nullptr);
  const uint16_t *q = bits(c.in[0]), *k = bits(c.in[1]), *v = bits(c.in[2]);
  uint16_t* out = bits_out(c.out[0]);
  const HeadStrides ld = r.strides();
  forward_heads(g, c.out[1].as<float>(), [&](int64_t h) {
    return HeadRows<uint16_t>{q + r.q(h), k + r.k(h), v + r.v(h), out + r.o(h), ld.q, ld.k, ld.v, ld.o};
  });
}

void sdpa_rows_grad_bf16(const KernelCtx& c) {
  const Rows r(*c.in[1].shape, *c.in[2].shape, *c.in[3].shape, c.attrs());
  const Geometry g = r.geometry(c.attrs(), c.num_in > 6 ? c.in[6].as<int64_t>() : nullptr);
  const BackwardScratch at(g);
  const uint16_t *dout = bits(c.in[0]), *q = bits(c.in[1]), *k = bits(c.in[2]), *v = bits(c.in[3]),
                 *o = bits(c.in[4]);
  const float* lse = c.in[5].as<float>();
  uint16_t *dq = bits_out(c.out[0]), *dk = bits_out(c.out[1]), *dv = bits_out(c.out[2]);
  parallel_for(g.bh, 1, [&](int64_t s, int64_t e) {
    char* hw = static_cast<char*>(thread_scratch(static_cast<size_t>(at.bytes)));
    for (int64_t h = s; h < e; ++h)
      backward_head(g, at, hw, r.strides(), dout + r.o(h), q + r.q(h), k + r.k(h), v + r.v(h), o + r.o(h),
                    lse + h * g.t, dq + r.q(h), dk + r.k(h), dv + r.v(h), g.keys_of(h));
  });
}

// The forward's per-thread scratch (one head's ForwardScratch) or the backward's (one BackwardScratch).
std::vector<std::pair<std::string, size_t>> sdpa_rows_bf16_buffers(const std::vector<TensorType>& in,
                                                                   const std::vector<TensorType>&,
                                                                   const Attrs& a) {
  const bool grad = in.size() > 5;
  const size_t at = grad ? 1 : 0;
  const Geometry g = Rows(in[at].shape, in[at + 1].shape, in[at + 2].shape, a).geometry(a, nullptr);
  return {
      {kSdpaThreadBuffers, static_cast<size_t>(grad ? BackwardScratch(g).bytes : ForwardScratch(g).bytes) *
                               static_cast<size_t>(omp_get_max_threads())}};
}

}  // namespace flowrun::cpu

#endif  // __AVX512BF16__
