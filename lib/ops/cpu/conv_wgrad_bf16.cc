// bf16 weight gradient of 3x3, stride-1, padding-1 convolutions:
//   dw[o][c][kh][kw] = sum over (n, h, w) of dy[n][o][h][w] x[n][c][h + kh - 1][w + kw - 1].
// vdpbf16ps adds the products of a pair of bf16 values per f32 lane, so the sum runs over pairs of columns
// (w, w + 1) of a row. A register holds 16 output channels (lanes) of one (c, kh, kw); per column pair it
// takes dy's pair vector of those 16 channels and x's pair (x[w + kw - 1], x[w + kw]) of channel c,
// broadcast. Each image is repacked first (its scratch is cache-resident):
//  - x with a zero border, so that the pair of every column (odd and even shifts kw alike) is one 32-bit
//    word: from NCHW, padded NCHW rows (a pair is the word at its column); from nChw16c, every two adjacent
//    pixels interleaved ([C/16][H + 2][W + 1][16 words], word c = (pixel w's c, pixel w + 1's c)), which
//    costs a load, a permute and a store per pixel where transposing to rows cost three times the time;
//  - dy into pair vectors [O/16][H][W/2][16 words], word o = (dy[o][h][2p], dy[o][h][2p + 1]).
// Two input channels per pass: 18 accumulators, one dy load and up to 18 broadcasts per 18 dot products.
// (Three channels, 27 accumulators, spilled registers and ran at two thirds the rate.)
//
// Bits: each partial element sums image by image, each image over its rows and column pairs in order, so the
// result depends on neither the layouts (the repack is exact) nor the thread count (the caller fixes the
// images of each partial and adds the partials in order).
#include "ops/cpu/conv_wgrad_bf16.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "ops/cpu/parallel.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>

#include "ops/cpu/attention.h"
#include "ops/cpu/simd16.h"
#endif

namespace flowrun::cpu {

#if defined(__AVX512BF16__)

namespace {

// One image's scratch, xt then dyp. The pair of channel c at padded row r and padded column pair q (columns
// q and q + 1) is the 32-bit word at xt + c's offset + r * row + q * col (bytes); channels c and c + 1 (c
// even) are `chan` apart.
struct Layout {
  int64_t hp, xt_bytes, dyp_words;
  int64_t row, col, chan;
  Layout(const ConvGeom& g, bool blocked) : hp(g.h + 2) {
    if (blocked) {
      col = 64;
      row = (g.w + 1) * col;
      chan = 4;
    } else {
      col = 2;
      row = (g.w + 2) * col;
      chan = hp * row;
    }
    xt_bytes = (g.c * hp * row / (blocked ? 16 : 1) + 63) / 64 * 64;  // whole lines: dyp starts aligned
    dyp_words = g.o * g.h * g.w / 2;
  }
  size_t bytes() const { return static_cast<size_t>(xt_bytes) + static_cast<size_t>(dyp_words) * 4; }
  int64_t channel(int64_t c) const { return col == 2 ? c * chan : (c / 16) * hp * row + (c % 16) * chan; }
};

// The parts of the border that the repacks do not write: every padded row 0 and H + 1, and in NCHW the
// columns 0 and W + 1.
void zero_borders(const ConvGeom& g, const Layout& l, char* xt) {
  const int64_t planes = l.col == 2 ? g.c : g.c / 16, plane = l.hp * l.row;
  for (int64_t c = 0; c < planes; ++c) {
    char* p = xt + c * plane;
    std::memset(p, 0, static_cast<size_t>(l.row));
    std::memset(p + (l.hp - 1) * l.row, 0, static_cast<size_t>(l.row));
    if (l.col == 2)
      for (int64_t h = 1; h < l.hp - 1; ++h) {
        std::memset(p + h * l.row, 0, 2);
        std::memset(p + h * l.row + l.row - 2, 0, 2);
      }
  }
}

// Image x (C, H, W), NCHW or nChw16c, into xt's interior.
void repack_x(const ConvGeom& g, const Layout& l, const uint16_t* x, char* xt) {
  if (l.col == 2) {
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t h = 0; h < g.h; ++h)
        std::memcpy(xt + l.channel(c) + (h + 1) * l.row + 2, x + (c * g.h + h) * g.w,
                    static_cast<size_t>(g.w) * 2);
    return;
  }
  // Pair q of a row holds pixels q - 1 and q (the border's zero outside 0..W-1): masked loads fetch only
  // the pixels inside the row.
  for (int64_t cb = 0; cb < g.c / 16; ++cb)
    for (int64_t h = 0; h < g.h; ++h) {
      const uint16_t* px = x + (cb * g.h + h) * g.w * 16;
      char* dst = xt + l.channel(cb * 16) + (h + 1) * l.row;
      for (int64_t q = 0; q <= g.w; ++q) {
        const __mmask32 m = q == 0 ? 0xffff0000u : q == g.w ? 0x0000ffffu : ~__mmask32{0};
        _mm512_store_si512(dst + q * l.col,
                           simd16::join_pairs(_mm512_maskz_loadu_epi16(m, px + (q - 1) * 16)));
      }
    }
}

// Image dy (O, H, W), NCHW or nChw16c, into pair vectors.
void repack_dy(const ConvGeom& g, const uint16_t* dy, bool blocked, uint32_t* dyp) {
  const int64_t pairs = g.w / 2;
  if (blocked) {
    const int64_t n = g.o / 16 * g.h * pairs;
    for (int64_t i = 0; i < n; ++i)
      _mm512_store_si512(dyp + 16 * i, simd16::join_pairs(_mm512_loadu_si512(dy + 32 * i)));
    return;
  }
  // Each channel's row is `pairs` words; 16 channels' rows transposed, 16 pairs at a time.
  const auto* words = reinterpret_cast<const uint32_t*>(dy);
  const int64_t plane = g.h * pairs;
  for (int64_t ob = 0; ob < g.o / 16; ++ob)
    for (int64_t h = 0; h < g.h; ++h)
      for (int64_t p0 = 0; p0 < pairs; p0 += 16)
        simd16::transpose16(words + ob * 16 * plane + h * pairs + p0, plane, 16,
                            std::min<int64_t>(16, pairs - p0), dyp + ((ob * g.h + h) * pairs + p0) * 16, 16);
}

// Adds one image's products for input channels [c0, c0 + CR) and output block ob to their 9 CR registers
// of `part` (ob's block; set when `fresh`).
template <int CR>
void accumulate(const ConvGeom& g, const Layout& l, const char* xt, const uint32_t* dyp, int64_t ob,
                int64_t c0, float* part, bool fresh) {
  const int64_t pairs = g.w / 2;
  float* p = part + (ob * g.c + c0) * 9 * 16;
  __m512 acc[CR][9];
  for (int r = 0; r < CR; ++r)
    for (int t = 0; t < 9; ++t)
      acc[r][t] = fresh ? _mm512_setzero_ps() : _mm512_load_ps(p + (r * 9 + t) * 16);
  const uint32_t* dyb = dyp + ob * g.h * pairs * 16;
  const char* xc = xt + l.channel(c0);
  for (int64_t h = 0; h < g.h; ++h)
    for (int64_t q = 0; q < pairs; ++q) {
      const __m512bh b = (__m512bh)_mm512_load_si512(dyb + (h * pairs + q) * 16);
      for (int r = 0; r < CR; ++r) {
        const char* xr = xc + r * l.chan + h * l.row + 2 * q * l.col;
        for (int kh = 0; kh < 3; ++kh)
          for (int kw = 0; kw < 3; ++kw) {
            int32_t pair;
            std::memcpy(&pair, xr + kh * l.row + kw * l.col, sizeof(pair));
            acc[r][kh * 3 + kw] = _mm512_dpbf16_ps(acc[r][kh * 3 + kw], (__m512bh)_mm512_set1_epi32(pair), b);
          }
      }
    }
  for (int r = 0; r < CR; ++r)
    for (int t = 0; t < 9; ++t) _mm512_store_ps(p + (r * 9 + t) * 16, acc[r][t]);
}

const uint16_t* bits(const bf16* p) {
  return reinterpret_cast<const uint16_t*>(p);
}

}  // namespace

bool wgrad3x3_bf16_serves(const ConvGeom& g) {
  return has_avx512_bf16() && g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.ph == 1 && g.pw == 1 &&
         g.dh == 1 && g.dw == 1 && g.groups == 1 && g.o % 16 == 0 && g.w % 2 == 0 && g.oh == g.h &&
         g.ow == g.w;
}

size_t wgrad3x3_bf16_scratch_bytes(const ConvGeom& g) {
  return Layout(g, g.x_blocked).bytes();
}

int64_t wgrad3x3_bf16_partial_elems(const ConvGeom& g) {
  return g.o * g.c * 9;
}

void wgrad3x3_bf16(const ConvGeom& g, int64_t n0, int64_t n1, const bf16* dy, const bf16* x, float* partial,
                   void* scratch) {
  FR_CHECK(wgrad3x3_bf16_serves(g), "wgrad3x3_bf16: unsupported geometry");
  const Layout l(g, g.x_blocked);
  auto* xt = static_cast<char*>(scratch);
  auto* dyp = reinterpret_cast<uint32_t*>(xt + l.xt_bytes);
  zero_borders(g, l, xt);
  const int64_t ximg = g.c * g.h * g.w, yimg = g.o * g.h * g.w;
  for (int64_t n = n0; n < n1; ++n) {
    repack_x(g, l, bits(x) + n * ximg, xt);
    repack_dy(g, bits(dy) + n * yimg, g.y_blocked, dyp);
    for (int64_t ob = 0; ob < g.o / 16; ++ob) {
      int64_t c0 = 0;
      for (; c0 + 2 <= g.c; c0 += 2) accumulate<2>(g, l, xt, dyp, ob, c0, partial, n == n0);
      if (c0 < g.c) accumulate<1>(g, l, xt, dyp, ob, c0, partial, n == n0);
    }
  }
}

void wgrad3x3_bf16_finish(const ConvGeom& g, const float* partials, int64_t count, int64_t stride, bf16* dw) {
  // One (o-block, c) run of 9 x 16 values at a time: summed over the partials, then written to OIHW.
  parallel_for(g.o / 16 * g.c, 16, [&](int64_t s, int64_t e) {
    alignas(64) float sum[9 * 16];
    for (int64_t i = s; i < e; ++i) {
      const int64_t ob = i / g.c, c = i % g.c;
      std::copy_n(partials + i * 144, 144, sum);
      for (int64_t b = 1; b < count; ++b) {
        const float* p = partials + b * stride + i * 144;
        for (int64_t j = 0; j < 144; ++j) sum[j] += p[j];
      }
      for (int64_t t = 0; t < 9; ++t)
        for (int64_t oi = 0; oi < 16; ++oi)
          dw[((ob * 16 + oi) * g.c + c) * 9 + t] = float_to_bf16(sum[t * 16 + oi]);
    }
  });
}

#else  // no avx512_bf16 in this build: oneDNN computes every weight gradient

bool wgrad3x3_bf16_serves(const ConvGeom&) {
  return false;
}
size_t wgrad3x3_bf16_scratch_bytes(const ConvGeom&) {
  return 0;
}
int64_t wgrad3x3_bf16_partial_elems(const ConvGeom&) {
  return 0;
}
void wgrad3x3_bf16(const ConvGeom&, int64_t, int64_t, const bf16*, const bf16*, float*, void*) {
  FR_CHECK(false, "wgrad3x3_bf16: not built (needs avx512_bf16)");
}
void wgrad3x3_bf16_finish(const ConvGeom&, const float*, int64_t, int64_t, bf16*) {
  FR_CHECK(false, "wgrad3x3_bf16: not built (needs avx512_bf16)");
}

#endif

}  // namespace flowrun::cpu
