// CPU conv2d (f32 through oneDNN in ops/cpu/dnnl_conv.cc, f64 by im2col + BLAS GEMM) and pooling kernels.
// GEMMs run outside any OpenMP region of ours (OpenBLAS threads them itself); im2col, col2im and pooling are
// parallel over rows/channels/planes with static chunks, and every accumulation runs in a fixed order, so
// results are bitwise reproducible for a thread count.
#include "ops/cpu/conv.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <variant>

#include "ops/cpu/dnnl_conv.h"
#include "ops/cpu/elementwise.h"
#include "ops/cpu/matmul.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/simd16.h"

namespace flowrun::cpu {

namespace {

constexpr int64_t kWork = 1 << 14;  // elements of work below which a loop is not worth a parallel region

// Rows of `total` units of `per_row` elements each that make one parallel chunk worth starting.
int64_t grain_for(int64_t per_row) {
  return std::max<int64_t>(1, kWork / std::max<int64_t>(1, per_row));
}

// Output positions o in [0, out_n) whose input position o * stride + off falls inside [0, in_n): [lo, hi).
// Computing the range once keeps the inner copy loops free of bounds branches.
void valid_range(int64_t out_n, int64_t in_n, int64_t stride, int64_t off, int64_t& lo, int64_t& hi) {
  lo = off >= 0 ? 0 : (-off + stride - 1) / stride;
  hi = in_n - 1 - off < 0 ? 0 : std::min(out_n, (in_n - 1 - off) / stride + 1);
  lo = std::min(lo, hi);
}

// col[(ci * kh + ki) * kw + kj, oy * ow + ox] = x[ci, oy * sh - ph + ki * dh, ox * sw - pw + kj * dw], zero
// in the padding; x is one image of all c channels, col is (c * kh * kw, oh * ow).
template <typename T>
void im2col(const ConvGeom& g, const T* x, T* col) {
  const int64_t rows = g.c * g.kh * g.kw, p = g.plane();
  parallel_for(rows, grain_for(p), [&](int64_t s, int64_t e) {
    for (int64_t r = s; r < e; ++r) {
      const int64_t ci = r / (g.kh * g.kw), ki = (r / g.kw) % g.kh, kj = r % g.kw;
      const int64_t off = kj * g.dw - g.pw;
      int64_t lo, hi;
      valid_range(g.ow, g.w, g.sw, off, lo, hi);
      const T* xc = x + ci * g.h * g.w;
      T* dst = col + r * p;
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        T* d = dst + oy * g.ow;
        const int64_t iy = oy * g.sh - g.ph + ki * g.dh;
        if (iy < 0 || iy >= g.h) {
          std::fill(d, d + g.ow, T(0));
          continue;
        }
        const T* src = xc + iy * g.w;
        std::fill(d, d + lo, T(0));
        if (g.sw == 1)
          for (int64_t ox = lo; ox < hi; ++ox) d[ox] = src[ox + off];
        else
          for (int64_t ox = lo; ox < hi; ++ox) d[ox] = src[ox * g.sw + off];
        std::fill(d + hi, d + g.ow, T(0));
      }
    }
  });
}

// The adjoint of im2col: dx = sum of col entries over every window position that read each input element.
// Parallel over channels, each channel summing its (ki, kj) rows in order: deterministic.
template <typename T>
void col2im(const ConvGeom& g, const T* col, T* dx) {
  const int64_t p = g.plane();
  parallel_for(g.c, grain_for(g.kh * g.kw * p), [&](int64_t s, int64_t e) {
    for (int64_t ci = s; ci < e; ++ci) {
      T* xc = dx + ci * g.h * g.w;
      std::fill(xc, xc + g.h * g.w, T(0));
      for (int64_t ki = 0; ki < g.kh; ++ki)
        for (int64_t kj = 0; kj < g.kw; ++kj) {
          const int64_t off = kj * g.dw - g.pw;
          int64_t lo, hi;
          valid_range(g.ow, g.w, g.sw, off, lo, hi);
          const T* src = col + ((ci * g.kh + ki) * g.kw + kj) * p;
          for (int64_t oy = 0; oy < g.oh; ++oy) {
            const int64_t iy = oy * g.sh - g.ph + ki * g.dh;
            if (iy < 0 || iy >= g.h) continue;
            T* d = xc + iy * g.w;
            const T* sr = src + oy * g.ow;
            if (g.sw == 1)
              for (int64_t ox = lo; ox < hi; ++ox) d[ox + off] += sr[ox];
            else
              for (int64_t ox = lo; ox < hi; ++ox) d[ox * g.sw + off] += sr[ox];
          }
        }
    }
  });
}

template <typename T>
T* workspace_of(const KernelCtx& c, const ConvGeom& g) {
  FR_CHECK(c.workspace_bytes >= static_cast<size_t>(g.col_elems()) * sizeof(T),
           "conv workspace too small: ", c.workspace_bytes, " bytes");
  return static_cast<T*>(c.workspace);
}

template <typename T>
void conv2d_t(const KernelCtx& c) {
  const ConvGeom g = conv_geom(*c.in[0].shape, *c.in[1].shape, c.attrs());
  const T* x = c.in[0].as<T>();
  const T* wt = c.in[1].as<T>();
  T* y = c.out[0].as<T>();
  T* col = workspace_of<T>(c, g);
  const int64_t k = g.kdim(), p = g.plane(), og = g.og(), img = g.c * g.h * g.w;
  for (int64_t n = 0; n < g.n; ++n) {
    const T* src = x + n * img;
    if (!g.pointwise()) {
      im2col(g, src, col);
      src = col;
    }
    for (int64_t gi = 0; gi < g.groups; ++gi)
      gemm<T>(false, false, og, p, k, T(1), wt + gi * og * k, src + gi * k * p, T(0),
              y + (n * g.o + gi * og) * p);
  }
  if (c.num_in > 2) {
    const T* bias = c.in[2].as<T>();
    parallel_for(g.n * g.o, grain_for(p), [&](int64_t s, int64_t e) {
      for (int64_t r = s; r < e; ++r) {
        const T b = bias[r % g.o];
        T* yr = y + r * p;
        for (int64_t i = 0; i < p; ++i) yr[i] += b;
      }
    });
  }
}

template <typename T>
void conv2d_grad_input_t(const KernelCtx& c) {
  const ConvGeom g = conv_geom(c.attrs().ints("in_shape"), *c.in[1].shape, c.attrs());
  const T* dy = c.in[0].as<T>();
  const T* wt = c.in[1].as<T>();
  T* dx = c.out[0].as<T>();
  T* col = workspace_of<T>(c, g);
  const int64_t k = g.kdim(), p = g.plane(), og = g.og(), img = g.c * g.h * g.w;
  for (int64_t n = 0; n < g.n; ++n) {
    const T* dyn = dy + n * g.o * p;
    T* dst = g.pointwise() ? dx + n * img : col;
    for (int64_t gi = 0; gi < g.groups; ++gi)
      gemm<T>(true, false, k, p, og, T(1), wt + gi * og * k, dyn + gi * og * p, T(0), dst + gi * k * p);
    if (!g.pointwise()) col2im(g, col, dx + n * img);
  }
}

template <typename T>
void conv2d_grad_weight_t(const KernelCtx& c) {
  const ConvGeom g = conv_geom(*c.in[1].shape, c.attrs().ints("w_shape"), c.attrs());
  const T* dy = c.in[0].as<T>();
  const T* x = c.in[1].as<T>();
  T* dw = c.out[0].as<T>();
  T* col = workspace_of<T>(c, g);
  const int64_t k = g.kdim(), p = g.plane(), og = g.og(), img = g.c * g.h * g.w;
  if (g.n == 0) std::fill(dw, dw + g.o * k, T(0));
  // Images accumulate into dw one after another (beta = 1 after the first): a fixed summation order.
  for (int64_t n = 0; n < g.n; ++n) {
    const T* src = x + n * img;
    if (!g.pointwise()) {
      im2col(g, src, col);
      src = col;
    }
    for (int64_t gi = 0; gi < g.groups; ++gi)
      gemm<T>(false, true, og, k, p, T(1), dy + (n * g.o + gi * og) * p, src + gi * k * p,
              n == 0 ? T(0) : T(1), dw + gi * og * k);
  }
}

// maxpool2d's attr relu (graph/passes.cc fuses a relu that only the pooling reads): each input is taken as
// relu(x) = x > 0 ? x : 0 as it is loaded, the relu op's values (NaN and -0 become +0), so windows, ties
// and indices are the unfused pair's. maxps(v, 0) is v > 0 ? v : 0, the same rule.
template <bool R, typename C>
C relu_if(C v) {
  if constexpr (R) return v > 0 ? v : C{0};
  return v;
}
#if defined(__AVX2__)
template <bool R>
__m256 relu8(__m256 v) {
  if constexpr (R) return _mm256_max_ps(v, _mm256_setzero_ps());
  return v;
}
#endif

#if defined(__AVX512F__)
template <bool R>
__m512 relu16(__m512 v) {
  // The zero-masking form: GCC 12 warns (maybe-uninitialized) inside the unmasked one.
  if constexpr (R) return _mm512_maskz_max_ps(0xffff, v, _mm512_setzero_ps());
  return v;
}

// The 2x2, stride-2 window on one output row of f32 planes: 16 outputs per step, from 32 floats of each of
// its two input rows (masked: rows of a small image hold fewer). Each input row's pairs are reduced first,
// then the two rows: the same choice as the row-major scan (the first maximum wins, because a pair's
// maximum beats the other pair's only when strictly greater; a NaN wins over a number, the later NaN over
// an earlier one), so values and indices equal the scalar loop's. Indices are int32 inside a plane, widened
// to the op's int64. R: relu applied to each input as it is loaded (attr relu).
template <bool R>
void maxpool2x2_row_f32(const float* r0, const float* r1, int64_t w, int64_t ow, int32_t base, float* y,
                        int64_t* id) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i lane2 =
      _mm512_slli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 1);
  // first-max(a, b) with b taken when greater or NaN; `took` marks the lanes that took b.
  auto pick = [](__m512 a, __m512 b, __mmask16& took) {
    took = _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
    return _mm512_mask_blend_ps(took, a, b);
  };
  for (int64_t ox = 0; ox < ow; ox += 16) {
    const int64_t n = std::min<int64_t>(16, ow - ox), x0 = 2 * ox;
    const int64_t avail = std::min<int64_t>(32, w - x0);  // input floats of this step in each row
    const __mmask16 lo = static_cast<__mmask16>(avail >= 16 ? 0xffff : (1u << avail) - 1);
    const __mmask16 hi = static_cast<__mmask16>(avail >= 32  ? 0xffff
                                                : avail > 16 ? (1u << (avail - 16)) - 1
                                                             : 0);
    const __m512 a0 = relu16<R>(_mm512_maskz_loadu_ps(lo, r0 + x0));
    const __m512 a1 = relu16<R>(_mm512_maskz_loadu_ps(hi, r0 + x0 + 16));
    const __m512 b0 = relu16<R>(_mm512_maskz_loadu_ps(lo, r1 + x0));
    const __m512 b1 = relu16<R>(_mm512_maskz_loadu_ps(hi, r1 + x0 + 16));
    __mmask16 right0, right1, lower;
    const __m512 top =
        pick(_mm512_permutex2var_ps(a0, even, a1), _mm512_permutex2var_ps(a0, odd, a1), right0);
    const __m512 bottom =
        pick(_mm512_permutex2var_ps(b0, even, b1), _mm512_permutex2var_ps(b0, odd, b1), right1);
    const __m512 best = pick(top, bottom, lower);
    // Index: base + x0 + 2 * lane + (right of the chosen row) + (lower ? w : 0).
    const __mmask16 right = static_cast<__mmask16>((right0 & ~lower) | (right1 & lower));
    __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(base + static_cast<int32_t>(x0)), lane2);
    idx = _mm512_mask_add_epi32(idx, right, idx, _mm512_set1_epi32(1));
    idx = _mm512_mask_add_epi32(idx, lower, idx, _mm512_set1_epi32(static_cast<int32_t>(w)));
    const __mmask16 out = static_cast<__mmask16>(n == 16 ? 0xffff : (1u << n) - 1);
    _mm512_mask_storeu_ps(y + ox, out, best);
    // The zero-masking forms: GCC 12 warns (maybe-uninitialized) inside the unmasked ones.
    _mm512_mask_storeu_epi64(id + ox, static_cast<__mmask8>(out & 0xff),
                             _mm512_maskz_cvtepi32_epi64(0xff, _mm512_maskz_extracti64x4_epi64(0xf, idx, 0)));
    _mm512_mask_storeu_epi64(id + ox + 8, static_cast<__mmask8>(out >> 8),
                             _mm512_maskz_cvtepi32_epi64(0xff, _mm512_maskz_extracti64x4_epi64(0xf, idx, 1)));
  }
}
#endif

// Calls f(o, ya, yb, xa, xb) for each output position o = oy * OW + ox of one plane, with its window clipped
// to the image: rows [ya, yb), columns [xa, xb) (padding lies outside and is never read).
template <typename F>
void for_each_window(const PoolGeom& g, F f) {
  for (int64_t oy = 0; oy < g.oh; ++oy) {
    const int64_t y0 = oy * g.sh - g.ph;
    const int64_t ya = std::max<int64_t>(y0, 0), yb = std::min(y0 + g.kh, g.h);
    for (int64_t ox = 0; ox < g.ow; ++ox) {
      const int64_t x0 = ox * g.sw - g.pw;
      f(oy * g.ow + ox, ya, yb, std::max<int64_t>(x0, 0), std::min(x0 + g.kw, g.w));
    }
  }
}

// The AVX-512 pooling code serves f32 and bf16 storage alike (simd16.h), 16 lanes (nChw16c, NHWC); the AVX2
// code f32 in 8 lanes (nChw8c).
template <typename S>
constexpr bool kSimd16 = std::is_same_v<S, float> || std::is_same_v<S, bf16>;

#if defined(__AVX2__)
// AVX2 helpers for 8 lanes of f32 beside their 8 int64 indices (two registers of 4).
// The indices' halves where mask (8 x 32 bits) is set: each 32-bit lane widened to the 64-bit one.
inline __m256i mask_lo64(__m256 mask) {
  return _mm256_cvtepi32_epi64(_mm256_castsi256_si128(_mm256_castps_si256(mask)));
}
inline __m256i mask_hi64(__m256 mask) {
  return _mm256_cvtepi32_epi64(_mm256_extracti128_si256(_mm256_castps_si256(mask), 1));
}
// The 8 lanes whose index (lo: lanes 0-3, hi: 4-7) equals i, as an 8 x 32-bit mask: the low halves of the
// two 64-bit compares, put back in lane order.
inline __m256 index_hits(__m256i lo, __m256i hi, __m256i i) {
  const __m256 pairs =
      _mm256_shuffle_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi64(lo, i)),
                        _mm256_castsi256_ps(_mm256_cmpeq_epi64(hi, i)), _MM_SHUFFLE(2, 0, 2, 0));
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(pairs), _MM_SHUFFLE(3, 1, 2, 0)));
}
#endif

// maxpool2d and its gradient on blocked activations (attr `blocked`, graph/layout.cc): each pixel is L
// channels (16 in nChw16c and NHWC, 8 in nChw8c), one per lane, and the indices are stored in the same
// layout, each still the position within its channel's plane. Every lane scans its window in the plain
// kernel's row-major order with the same rule, and the gradient adds into each element in the same order,
// so both give the plain kernels' values. pool_geom reads the shape (N, C, H, W) alone, which the layouts
// share.
template <typename T, int64_t L, bool R>
void maxpool2d_blocked(const KernelCtx& c, const PoolGeom& g, const PixelBlocks& pb) {
  using C = Compute<T>;
  const T* x = c.in[0].as<T>();
  T* y = c.out[0].as<T>();
  int64_t* idx = c.out[1].as<int64_t>();
  const int64_t ip = g.h * g.w, op = g.oh * g.ow;
  const int64_t ps = pb.step();
  parallel_for(g.n * pb.blocks(), grain_for(L * op * g.kh * g.kw), [&](int64_t s, int64_t e) {
    for (int64_t pl = s; pl < e; ++pl) {
      const T* xp = x + pb.base(pl, ip);
      const int64_t y0 = pb.base(pl, op);
      for_each_window(g, [&](int64_t j, int64_t ya, int64_t yb, int64_t xa, int64_t xb) {
        const int64_t first = ya * g.w + xa;
        const int64_t o = y0 + j * ps;
#if defined(__AVX512F__)
        if constexpr (kSimd16<T> && L == 16) {
          __m512 best = relu16<R>(simd16::load(xp + first * ps));
          __m512i lo = _mm512_set1_epi64(first), hi = lo;
          for (int64_t iy = ya; iy < yb; ++iy)
            for (int64_t ix = iy == ya ? xa + 1 : xa; ix < xb; ++ix) {
              const int64_t i = iy * g.w + ix;
              const __m512 v = relu16<R>(simd16::load(xp + i * ps));
              // first maximum wins; NaN propagates
              const __mmask16 t =
                  _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
              best = _mm512_mask_blend_ps(t, best, v);
              const __m512i iv = _mm512_set1_epi64(i);
              lo = _mm512_mask_blend_epi64(static_cast<__mmask8>(t), lo, iv);
              hi = _mm512_mask_blend_epi64(static_cast<__mmask8>(t >> 8), hi, iv);
            }
          simd16::store(y + o, best);
          _mm512_storeu_si512(idx + o, lo);
          _mm512_storeu_si512(idx + o + 8, hi);
          return;
        }
#endif
#if defined(__AVX2__)
        if constexpr (std::is_same_v<T, float> && L == 8) {
          __m256 best = relu8<R>(_mm256_loadu_ps(xp + first * ps));
          __m256i lo = _mm256_set1_epi64x(first), hi = lo;
          for (int64_t iy = ya; iy < yb; ++iy)
            for (int64_t ix = iy == ya ? xa + 1 : xa; ix < xb; ++ix) {
              const int64_t i = iy * g.w + ix;
              const __m256 v = relu8<R>(_mm256_loadu_ps(xp + i * ps));
              // first maximum wins; NaN propagates
              const __m256 t =
                  _mm256_or_ps(_mm256_cmp_ps(v, best, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
              best = _mm256_blendv_ps(best, v, t);
              const __m256i iv = _mm256_set1_epi64x(i);
              lo = _mm256_blendv_epi8(lo, iv, mask_lo64(t));
              hi = _mm256_blendv_epi8(hi, iv, mask_hi64(t));
            }
          _mm256_storeu_ps(y + o, best);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + o), lo);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + o + 4), hi);
          return;
        }
#endif
        C best[L];
        int64_t bi[L];
#pragma omp simd
        for (int l = 0; l < L; ++l) {
          best[l] = relu_if<R>(ld(xp[first * ps + l]));
          bi[l] = first;
        }
        for (int64_t iy = ya; iy < yb; ++iy)
          for (int64_t ix = iy == ya ? xa + 1 : xa; ix < xb; ++ix) {
            const int64_t i = iy * g.w + ix;
            const T* v = xp + i * ps;
#pragma omp simd
            for (int l = 0; l < L; ++l) {
              const C u = relu_if<R>(ld(v[l]));
              const bool t = u > best[l] || u != u;  // first maximum wins; NaN propagates
              best[l] = t ? u : best[l];
              bi[l] = t ? i : bi[l];
            }
          }
        for (int l = 0; l < L; ++l) y[o + l] = st<T>(best[l]);
        std::copy(bi, bi + L, idx + o);
      });
    }
  });
}

// Each output pixel adds its dy to every pixel of its window, in the lanes whose index points there, in
// output order: per element the plain kernel's additions in its order, L lanes at a time instead of one
// scattered add per element. bf16 rounds after each addition: where windows overlap, a pixel two windows
// chose gets two roundings, where the f32 kernel run widened gets one; where they tile the plane every pixel
// gets at most one dy and both are exact. The optional mask is maxpool2d's output y (relu_grad fused in,
// graph/passes.cc): a window adds its dy only where y > 0. y is the chosen element's value, so this is
// relu_grad's test of that element, made once per window on the pooled plane rather than on every element
// of dx: every window that chose an element sees the same y, and dx is 0 where none adds.
template <typename T, int64_t L>
void maxpool2d_grad_blocked(const KernelCtx& c, const PoolGeom& g, const PixelBlocks& pb) {
  const T* dy = c.in[0].as<T>();
  const int64_t* idx = c.in[1].as<int64_t>();
  const T* mask = c.num_in > 2 ? c.in[2].as<T>() : nullptr;
  T* dx = c.out[0].as<T>();
  const int64_t ip = g.h * g.w, op = g.oh * g.ow;
  const int64_t ps = pb.step();
  // Windows that tile the plane exactly: every element of dx is written once, 0 + dy where its window's
  // index points (the plain kernel's sum, -0 becoming +0) and 0 elsewhere, masked as it is written.
  [[maybe_unused]] const bool tiles =  // read only by the vector paths
      g.sh == g.kh && g.sw == g.kw && g.ph == 0 && g.pw == 0 && g.oh * g.kh == g.h && g.ow * g.kw == g.w;
  parallel_for(g.n * pb.blocks(), grain_for(L * (ip + op * g.kh * g.kw)), [&](int64_t s, int64_t e) {
    for (int64_t pl = s; pl < e; ++pl) {
      T* dp = dx + pb.base(pl, ip);
      const int64_t y0 = pb.base(pl, op);
#if defined(__AVX512F__)
      if constexpr (kSimd16<T> && L == 16) {
        if (tiles) {
          const __m512 zero = _mm512_setzero_ps();
          for (int64_t o = 0; o < op; ++o) {
            const __m512 gv = simd16::load(dy + y0 + o * ps);
            const __m512i lo = _mm512_loadu_si512(idx + y0 + o * ps);
            const __m512i hi = _mm512_loadu_si512(idx + y0 + o * ps + 8);
            const __mmask16 live =
                mask ? _mm512_cmp_ps_mask(simd16::load(mask + y0 + o * ps), zero, _CMP_GT_OQ) : 0xffff;
            const int64_t oy = o / g.ow, ox = o % g.ow;
            for (int64_t ky = 0; ky < g.kh; ++ky)
              for (int64_t kx = 0; kx < g.kw; ++kx) {
                const int64_t i = (oy * g.kh + ky) * g.w + ox * g.kw + kx;
                const __m512i iv = _mm512_set1_epi64(i);
                const __mmask16 keep = live & static_cast<__mmask16>(_mm512_cmpeq_epi64_mask(lo, iv) |
                                                                     (_mm512_cmpeq_epi64_mask(hi, iv) << 8));
                simd16::store(dp + i * ps, _mm512_maskz_add_ps(keep, zero, gv));
              }
          }
          continue;
        }
      }
#endif
#if defined(__AVX2__)
      if constexpr (std::is_same_v<T, float> && L == 8) {
        if (tiles) {
          const __m256 zero = _mm256_setzero_ps();
          for (int64_t o = 0; o < op; ++o) {
            __m256 gv = _mm256_add_ps(zero, _mm256_loadu_ps(dy + y0 + o * ps));
            if (mask)
              gv = _mm256_and_ps(_mm256_cmp_ps(_mm256_loadu_ps(mask + y0 + o * ps), zero, _CMP_GT_OQ), gv);
            const auto* io = reinterpret_cast<const __m256i*>(idx + y0 + o * ps);
            const __m256i lo = _mm256_loadu_si256(io), hi = _mm256_loadu_si256(io + 1);
            const int64_t oy = o / g.ow, ox = o % g.ow;
            for (int64_t ky = 0; ky < g.kh; ++ky)
              for (int64_t kx = 0; kx < g.kw; ++kx) {
                const int64_t i = (oy * g.kh + ky) * g.w + ox * g.kw + kx;
                _mm256_storeu_ps(dp + i * ps, _mm256_and_ps(index_hits(lo, hi, _mm256_set1_epi64x(i)), gv));
              }
          }
          continue;
        }
      }
#endif
      pb.each_run(ip, [dp](int64_t o, int64_t len) { std::fill(dp + o, dp + o + len, T{}); });
      for_each_window(g, [&](int64_t j, int64_t ya, int64_t yb, int64_t xa, int64_t xb) {
        const int64_t o = y0 + j * ps;
        const T* go = dy + o;
        const int64_t* io = idx + o;
#if defined(__AVX512F__)
        if constexpr (kSimd16<T> && L == 16) {
          const __m512 gv = simd16::load(go);
          const __m512i lo = _mm512_loadu_si512(io), hi = _mm512_loadu_si512(io + 8);
          const __mmask16 live =
              mask ? _mm512_cmp_ps_mask(simd16::load(mask + o), _mm512_setzero_ps(), _CMP_GT_OQ) : 0xffff;
          for (int64_t iy = ya; iy < yb; ++iy)
            for (int64_t ix = xa; ix < xb; ++ix) {
              const int64_t i = iy * g.w + ix;
              const __m512i iv = _mm512_set1_epi64(i);
              const __mmask16 hit = live & static_cast<__mmask16>(_mm512_cmpeq_epi64_mask(lo, iv) |
                                                                  (_mm512_cmpeq_epi64_mask(hi, iv) << 8));
              T* d = dp + i * ps;
              const __m512 dv = simd16::load(d);
              simd16::store(d, _mm512_mask_add_ps(dv, hit, dv, gv));
            }
          return;
        }
#endif
#if defined(__AVX2__)
        if constexpr (std::is_same_v<T, float> && L == 8) {
          const __m256 gv = _mm256_loadu_ps(go);
          const auto* iv = reinterpret_cast<const __m256i*>(io);
          const __m256i lo = _mm256_loadu_si256(iv), hi = _mm256_loadu_si256(iv + 1);
          const __m256 live = mask ? _mm256_cmp_ps(_mm256_loadu_ps(mask + o), _mm256_setzero_ps(), _CMP_GT_OQ)
                                   : _mm256_castsi256_ps(_mm256_set1_epi32(-1));
          for (int64_t iy = ya; iy < yb; ++iy)
            for (int64_t ix = xa; ix < xb; ++ix) {
              const int64_t i = iy * g.w + ix;
              T* d = dp + i * ps;
              const __m256 dv = _mm256_loadu_ps(d);
              const __m256 hit = _mm256_and_ps(live, index_hits(lo, hi, _mm256_set1_epi64x(i)));
              _mm256_storeu_ps(d, _mm256_blendv_ps(dv, _mm256_add_ps(dv, gv), hit));
            }
          return;
        }
#endif
        for (int64_t iy = ya; iy < yb; ++iy)
          for (int64_t ix = xa; ix < xb; ++ix) {
            const int64_t i = iy * g.w + ix;
            T* d = dp + i * ps;
            for (int l = 0; l < L; ++l)
              if (io[l] == i && (!mask || ld(mask[o + l]) > 0)) d[l] = st<T>(ld(d[l]) + ld(go[l]));
          }
      });
    }
  });
}

template <typename T, bool R>
void maxpool2d_plain(const KernelCtx& c, const PoolGeom& g) {
  const T* x = c.in[0].as<T>();
  T* y = c.out[0].as<T>();
  int64_t* idx = c.out[1].as<int64_t>();
  const int64_t ip = g.h * g.w, op = g.oh * g.ow;
  // The usual 2x2 window with stride 2 and no padding, unrolled with branch-free selects (the general loop
  // below spent ~6 ns per output on this case). Same rule: first maximum wins, NaN propagates.
  const bool pool2 = g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 && g.pw == 0;
  using C = Compute<T>;
  auto take = [](T s, int64_t i, C& best, int64_t& bi) {
    const C v = relu_if<R>(ld(s));
    const bool t = v > best || v != v;
    best = t ? v : best;
    bi = t ? i : bi;
  };
  parallel_for(g.n * g.c, grain_for(op * g.kh * g.kw), [&](int64_t s, int64_t e) {
    for (int64_t pl = s; pl < e; ++pl) {
      const T* xp = x + pl * ip;
      T* yp = y + pl * op;
      int64_t* id = idx + pl * op;
#if defined(__AVX512F__)
      if (pool2 && std::is_same_v<T, float> && ip <= std::numeric_limits<int32_t>::max()) {
        for (int64_t oy = 0; oy < g.oh; ++oy)
          maxpool2x2_row_f32<R>(reinterpret_cast<const float*>(xp) + 2 * oy * g.w,
                                reinterpret_cast<const float*>(xp) + (2 * oy + 1) * g.w, g.w, g.ow,
                                static_cast<int32_t>(2 * oy * g.w), reinterpret_cast<float*>(yp) + oy * g.ow,
                                id + oy * g.ow);
        continue;
      }
#endif
      if (pool2) {
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          const T* r0 = xp + 2 * oy * g.w;
          const T* r1 = r0 + g.w;
          const int64_t base = 2 * oy * g.w;
#pragma omp simd
          for (int64_t ox = 0; ox < g.ow; ++ox) {
            const int64_t i = 2 * ox;
            C best = relu_if<R>(ld(r0[i]));
            int64_t bi = base + i;
            take(r0[i + 1], base + i + 1, best, bi);
            take(r1[i], base + g.w + i, best, bi);
            take(r1[i + 1], base + g.w + i + 1, best, bi);
            yp[oy * g.ow + ox] = st<T>(best);
            id[oy * g.ow + ox] = bi;
          }
        }
        continue;
      }
      for_each_window(g, [&](int64_t o, int64_t ya, int64_t yb, int64_t xa, int64_t xb) {
        // Padding is -inf, i.e. never chosen: start from the first real element of the window.
        int64_t best_i = ya * g.w + xa;
        C best = relu_if<R>(ld(xp[best_i]));
        for (int64_t iy = ya; iy < yb; ++iy)
          for (int64_t ix = xa; ix < xb; ++ix) {
            const C v = relu_if<R>(ld(xp[iy * g.w + ix]));
            if (v > best || v != v) {  // first maximum wins; NaN propagates as in PyTorch
              best = v;
              best_i = iy * g.w + ix;
            }
          }
        yp[o] = st<T>(best);
        id[o] = best_i;
      });
    }
  });
}

template <typename T>
void maxpool2d_t(const KernelCtx& c) {
  const PoolGeom g = pool_geom(*c.in[0].shape, c.attrs());
  const auto run = [&](auto relu) {
    constexpr bool R = decltype(relu)::value;
    if (c.attrs().b("blocked")) {
      const PixelBlocks pb{g.c, c.attrs()};
      pb.with_lanes([&](auto lanes) { maxpool2d_blocked<T, decltype(lanes)::value, R>(c, g, pb); });
    } else {
      maxpool2d_plain<T, R>(c, g);
    }
  };
  if (c.attrs().b("relu"))
    run(std::true_type{});
  else
    run(std::false_type{});
}

template <typename T>
void maxpool2d_grad_t(const KernelCtx& c) {
  const Shape& xs = c.attrs().ints("in_shape");
  if (c.attrs().b("blocked")) {
    const PoolGeom g = pool_geom(xs, c.attrs());
    const PixelBlocks pb{g.c, c.attrs()};
    return pb.with_lanes([&](auto lanes) { maxpool2d_grad_blocked<T, decltype(lanes)::value>(c, g, pb); });
  }
  const int64_t ip = xs[2] * xs[3], op = c.in[0].dim(2) * c.in[0].dim(3);
  const T* dy = c.in[0].as<T>();
  const int64_t* idx = c.in[1].as<int64_t>();
  const T* mask = c.num_in > 2 ? c.in[2].as<T>() : nullptr;
  T* dx = c.out[0].as<T>();
  parallel_for(xs[0] * xs[1], grain_for(ip + op), [&](int64_t s, int64_t e) {
    for (int64_t pl = s; pl < e; ++pl) {
      T* dp = dx + pl * ip;
      const T* gp = dy + pl * op;
      const int64_t* id = idx + pl * op;
      const T* mp = mask ? mask + pl * op : nullptr;
      std::fill(dp, dp + ip, T{});
      for (int64_t j = 0; j < op; ++j)
        if (!mp || ld(mp[j]) > 0) dp[id[j]] = st<T>(ld(dp[id[j]]) + ld(gp[j]));
    }
  });
}

// The averaging divisor of window (ya..yb, xa..xb) clipped to the image.
inline int64_t avg_divisor(const PoolGeom& g, bool include_pad, int64_t ya, int64_t yb, int64_t xa,
                           int64_t xb) {
  return include_pad ? g.kh * g.kw : (yb - ya) * (xb - xa);
}

template <typename T>
void avgpool2d_t(const KernelCtx& c) {
  const PoolGeom g = pool_geom(*c.in[0].shape, c.attrs());
  const bool include_pad = c.attrs().b("count_include_pad", true);
  const T* x = c.in[0].as<T>();
  T* y = c.out[0].as<T>();
  const int64_t ip = g.h * g.w, op = g.oh * g.ow;
  parallel_for(g.n * g.c, grain_for(op * g.kh * g.kw), [&](int64_t s, int64_t e) {
    for (int64_t pl = s; pl < e; ++pl) {
      const T* xp = x + pl * ip;
      T* yp = y + pl * op;
      for_each_window(g, [&](int64_t o, int64_t ya, int64_t yb, int64_t xa, int64_t xb) {
        T acc = T(0);
        for (int64_t iy = ya; iy < yb; ++iy)
          for (int64_t ix = xa; ix < xb; ++ix) acc += xp[iy * g.w + ix];
        yp[o] = acc / static_cast<T>(avg_divisor(g, include_pad, ya, yb, xa, xb));
      });
    }
  });
}

template <typename T>
void avgpool2d_grad_t(const KernelCtx& c) {
  const PoolGeom g = pool_geom(c.attrs().ints("in_shape"), c.attrs());
  const bool include_pad = c.attrs().b("count_include_pad", true);
  const T* dy = c.in[0].as<T>();
  T* dx = c.out[0].as<T>();
  const int64_t ip = g.h * g.w, op = g.oh * g.ow;
  parallel_for(g.n * g.c, grain_for(op * g.kh * g.kw), [&](int64_t s, int64_t e) {
    for (int64_t pl = s; pl < e; ++pl) {
      T* dp = dx + pl * ip;
      const T* gp = dy + pl * op;
      std::fill(dp, dp + ip, T(0));
      for_each_window(g, [&](int64_t o, int64_t ya, int64_t yb, int64_t xa, int64_t xb) {
        const T v = gp[o] / static_cast<T>(avg_divisor(g, include_pad, ya, yb, xa, xb));
        for (int64_t iy = ya; iy < yb; ++iy)
          for (int64_t ix = xa; ix < xb; ++ix) dp[iy * g.w + ix] += v;
      });
    }
  });
}

template <typename T>
void global_avgpool_t(const KernelCtx& c) {
  const T* x = c.in[0].as<T>();
  T* y = c.out[0].as<T>();
  const int64_t planes = c.in[0].dim(0) * c.in[0].dim(1), hw = c.in[0].dim(2) * c.in[0].dim(3);
  const T inv = T(1) / static_cast<T>(hw);
  parallel_for(planes, grain_for(hw), [&](int64_t s, int64_t e) {
    for (int64_t pl = s; pl < e; ++pl) {
      const T* xp = x + pl * hw;
      T acc = T(0);
      for (int64_t i = 0; i < hw; ++i) acc += xp[i];
      y[pl] = acc * inv;
    }
  });
}

}  // namespace

bool attr_pair(const Attrs& a, std::string_view key, int64_t dflt, int64_t& h, int64_t& w) {
  const auto& m = a.all();
  const auto it = m.find(key);
  h = w = dflt;
  if (it == m.end()) return true;
  if (const int64_t* v = std::get_if<int64_t>(&it->second)) {
    h = w = *v;
    return true;
  }
  if (const auto* v = std::get_if<std::vector<int64_t>>(&it->second)) {
    if (v->size() == 1) {
      h = w = (*v)[0];
      return true;
    }
    if (v->size() == 2) {
      h = (*v)[0];
      w = (*v)[1];
      return true;
    }
  }
  return false;
}

ConvGeom conv_geom(const Shape& x, const Shape& w, const Attrs& a) {
  FR_CHECK(x.size() == 4 && w.size() == 4, "conv2d needs rank-4 input and weight");
  ConvGeom g;
  g.n = x[0];
  g.c = x[1];
  g.h = x[2];
  g.w = x[3];
  g.o = w[0];
  g.kh = w[2];
  g.kw = w[3];
  g.groups = a.i("groups", 1);
  FR_CHECK(attr_pair(a, "stride", 1, g.sh, g.sw) && attr_pair(a, "padding", 0, g.ph, g.pw) &&
               attr_pair(a, "dilation", 1, g.dh, g.dw),
           "bad conv2d attributes ", a.str());
  g.oh = (g.h + 2 * g.ph - g.dh * (g.kh - 1) - 1) / g.sh + 1;
  g.ow = (g.w + 2 * g.pw - g.dw * (g.kw - 1) - 1) / g.sw + 1;
  g.x_blocked = a.b("x_blocked");
  g.y_blocked = a.b("y_blocked");
  g.nchw8c = a.b("nchw8c");
  g.nhwc = a.b("nhwc");
  const int64_t lanes = g.nchw8c ? 8 : 16;
  FR_CHECK((!g.x_blocked || g.c % lanes == 0) && (!g.y_blocked || g.o % lanes == 0),
           "blocked conv2d tensors need channels in multiples of ", lanes);
  return g;
}

PoolGeom pool_geom(const Shape& x, const Attrs& a) {
  FR_CHECK(x.size() == 4, "pooling needs a rank-4 input");
  PoolGeom g;
  g.n = x[0];
  g.c = x[1];
  g.h = x[2];
  g.w = x[3];
  FR_CHECK(attr_pair(a, "kernel", 1, g.kh, g.kw) && attr_pair(a, "stride", 0, g.sh, g.sw) &&
               attr_pair(a, "padding", 0, g.ph, g.pw),
           "bad pooling attributes ", a.str());
  if (!a.has("stride")) {
    g.sh = g.kh;
    g.sw = g.kw;
  }
  g.oh = (g.h + 2 * g.ph - g.kh) / g.sh + 1;
  g.ow = (g.w + 2 * g.pw - g.kw) / g.sw + 1;
  return g;
}

// f32 and bf16 run through oneDNN (blocked layouts, ~3x the im2col GEMM); f64, which oneDNN lacks, stays on
// im2col. An empty batch has nothing to convolve, and its weight gradient is zero.
void conv2d(const KernelCtx& c) {
  if (c.in[0].dtype == DType::f64) return conv2d_t<double>(c);
  const ConvGeom g = conv_geom(*c.in[0].shape, *c.in[1].shape, c.attrs());
  if (g.n == 0) return;
  dnnl_conv2d(c.in[0].dtype, g, c.in[0].data, c.in[1].data, c.num_in > 2 ? c.in[2].data : nullptr,
              c.out[0].data);
}
void conv2d_grad_input(const KernelCtx& c) {
  if (c.in[0].dtype == DType::f64) return conv2d_grad_input_t<double>(c);
  const ConvGeom g = conv_geom(c.attrs().ints("in_shape"), *c.in[1].shape, c.attrs());
  if (g.n == 0) return;
  dnnl_conv2d_grad_input(c.in[0].dtype, g, c.in[0].data, c.in[1].data, c.out[0].data);
}
void conv2d_grad_weight(const KernelCtx& c) {
  if (c.in[0].dtype == DType::f64) return conv2d_grad_weight_t<double>(c);
  const ConvGeom g = conv_geom(*c.in[1].shape, c.attrs().ints("w_shape"), c.attrs());
  if (g.n == 0) {
    std::memset(c.out[0].data, 0, static_cast<size_t>(g.o * g.kdim()) * dtype_size(c.out[0].dtype));
    return;
  }
  dnnl_conv2d_grad_weight(c.in[0].dtype, g, c.in[0].data, c.in[1].data, c.out[0].data);
}
void maxpool2d(const KernelCtx& c) {
  dispatch_storage(c.in[0].dtype, [&](auto* t) { maxpool2d_t<std::remove_pointer_t<decltype(t)>>(c); });
}
void maxpool2d_grad(const KernelCtx& c) {
  dispatch_storage(c.in[0].dtype, [&](auto* t) { maxpool2d_grad_t<std::remove_pointer_t<decltype(t)>>(c); });
}
void avgpool2d(const KernelCtx& c) {
  dispatch_float(c.in[0].dtype, [&](auto* t) { avgpool2d_t<std::remove_pointer_t<decltype(t)>>(c); });
}
void avgpool2d_grad(const KernelCtx& c) {
  dispatch_float(c.in[0].dtype, [&](auto* t) { avgpool2d_grad_t<std::remove_pointer_t<decltype(t)>>(c); });
}
void global_avgpool(const KernelCtx& c) {
  dispatch_float(c.in[0].dtype, [&](auto* t) { global_avgpool_t<std::remove_pointer_t<decltype(t)>>(c); });
}

// Each (n, channel block) is L * HW contiguous elements in both layouts: an [L][HW] <-> [HW][L] transpose.
template <typename T, int64_t L>
void reorder_t(const void* from, void* to, int64_t blocks, int64_t hw, bool to_blocked) {
  const T* x = static_cast<const T*>(from);
  T* y = static_cast<T*>(to);
  parallel_for(blocks, grain_for(L * hw), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const T* src = x + b * L * hw;
      T* __restrict dst = y + b * L * hw;
#if defined(__AVX512F__)
      if constexpr (sizeof(T) == 4 && L == 16) {
        for (int64_t i = 0; i < hw; i += 16) {
          const int n = static_cast<int>(std::min<int64_t>(16, hw - i));
          if (to_blocked)
            simd16::transpose16(src + i, hw, 16, n, dst + i * 16, 16);
          else
            simd16::transpose16(src + i * 16, 16, n, 16, dst + i, hw);
        }
        continue;
      }
#endif
      int64_t done = 0;  // elements moved by the vector paths
#if defined(__AVX512BW__)
      // 2-byte values (bf16) as words of two pixels: 16 pixels of the 16 channel rows transposed as 8 x 16
      // words, each word's halves then split into (or joined from) the two pixels' channel vectors by one
      // permute. Element by element, ResNet-20's four bf16 reorders took 0.3 ms a step.
      if constexpr (sizeof(T) == 2 && L == 16) {
        if (hw % 2 == 0) {
          alignas(64) uint32_t tile[8 * 16];
          const auto* words = reinterpret_cast<const uint32_t*>(src);
          auto* dwords = reinterpret_cast<uint32_t*>(dst);
          for (; done + 16 <= hw; done += 16) {
            if (to_blocked) {
              simd16::transpose16(words + done / 2, hw / 2, 16, 8, tile, 16);
              for (int p = 0; p < 8; ++p)
                _mm512_storeu_si512(dst + (done + 2 * p) * 16,
                                    simd16::split_pairs(_mm512_load_si512(tile + 16 * p)));
            } else {
              for (int p = 0; p < 8; ++p)
                _mm512_store_si512(tile + 16 * p,
                                   simd16::join_pairs(_mm512_loadu_si512(src + (done + 2 * p) * 16)));
              simd16::transpose16(tile, 16, 8, 16, dwords + done / 2, hw / 2);
            }
          }
        }
      }
#endif
      for (int64_t i = done; i < hw; ++i)
        for (int64_t j = 0; j < L; ++j) {
          if (to_blocked)
            dst[i * L + j] = src[j * hw + i];
          else
            dst[j * hw + i] = src[i * L + j];
        }
    }
  });
}

template <int64_t L>
void reorder_lanes(const void* from, void* to, int64_t blocks, int64_t hw, size_t elem, bool to_blocked) {
  switch (elem) {
    case 2:
      return reorder_t<uint16_t, L>(from, to, blocks, hw, to_blocked);
    case 4:
      return reorder_t<uint32_t, L>(from, to, blocks, hw, to_blocked);
    default:
      return reorder_t<uint64_t, L>(from, to, blocks, hw, to_blocked);
  }
}

void reorder_blocked(const void* from, void* to, int64_t n, int64_t c, int64_t hw, size_t elem, int64_t lanes,
                     bool to_blocked) {
  FR_CHECK(lanes == 8 || lanes == 16, "reorder: channel blocks of 8 or 16");
  if (lanes == 8) return reorder_lanes<8>(from, to, n * (c / 8), hw, elem, to_blocked);
  reorder_lanes<16>(from, to, n * (c / 16), hw, elem, to_blocked);
}

void regroup_blocked(const void* from, void* to, int64_t n, int64_t c, int64_t hw, size_t elem,
                     int64_t from_lanes, int64_t to_lanes) {
  FR_CHECK((from_lanes == 8 && to_lanes == 16) || (from_lanes == 16 && to_lanes == 8),
           "regroup: between channel blocks of 8 and 16");
  FR_CHECK(c % 16 == 0, "regroup: channels in multiples of 16, got ", c);
  // Each 16-channel block is two 8-channel ones: pixel i's 16 lanes are its 8 in the first (at 8-lane
  // group 2 i of the wide block, group i of the first narrow one) and its 8 in the second (2 i + 1, hw + i).
  const size_t half = 8 * elem;
  const bool widen = to_lanes == 16;
  const auto* src = static_cast<const char*>(from);
  auto* dst = static_cast<char*>(to);
  parallel_for(n * (c / 16), grain_for(16 * hw), [&](int64_t s, int64_t e) {
    for (int64_t b = s; b < e; ++b)
      for (int64_t i = 0; i < hw; ++i)
        for (int64_t k = 0; k < 2; ++k) {
          const int64_t wide = 2 * b * hw + 2 * i + k, narrow = 2 * b * hw + k * hw + i;
          std::memcpy(dst + (widen ? wide : narrow) * half, src + (widen ? narrow : wide) * half, half);
        }
  });
}

// The nr x nc block at src (row stride lds) transposed into dst (row stride ldd), nr, nc <= 16: 32-bit
// values by transpose16, 16-bit ones (bf16) widened to 32 bits around it, others one by one.
template <typename T>
void transpose_tile(const T* src, int64_t lds, int64_t nr, int64_t nc, T* dst, int64_t ldd) {
#if defined(__AVX512BW__)
  if constexpr (sizeof(T) == 4) {
    simd16::transpose16(src, lds, nr, nc, reinterpret_cast<uint32_t*>(dst), ldd);
    return;
  }
  if constexpr (sizeof(T) == 2) {
    alignas(64) uint32_t a[16 * 16], b[16 * 16];
    const __mmask16 cols = simd16::lanes(nc), rows = simd16::lanes(nr);
    for (int64_t r = 0; r < nr; ++r)
      _mm512_store_si512(a + 16 * r, _mm512_maskz_cvtepu16_epi32(
                                         simd16::kAll, _mm256_maskz_loadu_epi16(cols, src + r * lds)));
    simd16::transpose16(a, 16, nr, nc, b, 16);
    for (int64_t q = 0; q < nc; ++q)
      _mm256_mask_storeu_epi16(dst + q * ldd, rows,
                               _mm512_maskz_cvtepi32_epi16(simd16::kAll, _mm512_load_si512(b + 16 * q)));
    return;
  }
#endif
  for (int64_t r = 0; r < nr; ++r)
    for (int64_t q = 0; q < nc; ++q) dst[q * ldd + r] = src[r * lds + q];
}

// NCHW <-> NHWC: each image a [C][HW] <-> [HW][C] transpose, in 16 x 16 tiles. The layout pass puts these
// only at the edges of a chain of convolutions.
template <typename T>
void reorder_nhwc_t(const void* from, void* to, int64_t n, int64_t c, int64_t hw, bool to_nhwc) {
  const T* x = static_cast<const T*>(from);
  T* y = static_cast<T*>(to);
  const int64_t it = (hw + 15) / 16;
  parallel_for(n * it, grain_for(16 * c), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t img = t / it, i0 = (t % it) * 16, ni = std::min<int64_t>(16, hw - i0);
      const T* src = x + img * c * hw;
      T* dst = y + img * c * hw;
      for (int64_t c0 = 0; c0 < c; c0 += 16) {
        const int64_t nch = std::min<int64_t>(16, c - c0);
        if (to_nhwc)
          transpose_tile(src + c0 * hw + i0, hw, nch, ni, dst + i0 * c + c0, c);
        else
          transpose_tile(src + i0 * c + c0, c, ni, nch, dst + c0 * hw + i0, hw);
      }
    }
  });
}

void reorder_nhwc(const void* from, void* to, int64_t n, int64_t c, int64_t hw, size_t elem, bool to_nhwc) {
  switch (elem) {
    case 2:
      return reorder_nhwc_t<uint16_t>(from, to, n, c, hw, to_nhwc);
    case 4:
      return reorder_nhwc_t<uint32_t>(from, to, n, c, hw, to_nhwc);
    default:
      return reorder_nhwc_t<uint64_t>(from, to, n, c, hw, to_nhwc);
  }
}

void reorder(const KernelCtx& c) {
  const Shape& s = *c.in[0].shape;
  const size_t elem = dtype_size(c.in[0].dtype);
  const Attrs& a = c.attrs();
  const bool to_blocked = !a.is("to", "nchw");
  if (a.is("to", "nhwc") || a.is("from", "nhwc"))
    return reorder_nhwc(c.in[0].data, c.out[0].data, s[0], s[1], s[2] * s[3], elem, to_blocked);
  const int64_t lanes = a.is("to", "nchw8c") || a.is("from", "nchw8c") ? 8 : 16;
  reorder_blocked(c.in[0].data, c.out[0].data, s[0], s[1], s[2] * s[3], elem, lanes, to_blocked);
}

}  // namespace flowrun::cpu
