// f32 3x3 direct convolutions on nChw16c (conv_direct_f32.h). An item is one output row of one image; for
// each block of 16 output channels the row is cut into tiles of at most kTile pixels, each tile's outputs in
// as many registers. Per input channel i of a tap row, the three weight vectors v[kw][i] sit in registers
// and each input pixel of the row is broadcast once and multiplied into the three outputs it reaches:
// y[p] += x[p][i] v[0][i], y[p - 1] += x[p][i] v[1][i], y[p - 2] += x[p][i] v[2][i] (p counted from the
// tile's left neighbour). That is one load for three multiply-adds, where a tap at a time (oneDNN's
// direct kernel) loads one per multiply-add. The padding pixels left and right of the plane are read from a
// zero vector, so the kernel reads x in place and checks no bounds per tap.
#include "ops/cpu/conv_direct_f32.h"

#include <algorithm>

#include "core/error.h"
#include "ops/cpu/conv_direct_weights.h"
#include "ops/cpu/parallel.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace flowrun::cpu {

#if defined(__AVX512F__)

namespace {

constexpr int kTile = 16;  // output pixels per tile: 16 accumulators, 3 weight registers and spares

// A pass as a convolution of `ci` input channels on an h x w plane into `co` output channels on an oh x ow
// one (the same plane but in a stride-2 weight gradient).
struct Dims {
  int64_t ci, co, h, w, oh, ow;
  Dims(const ConvGeom& g, bool grad_input)
      : ci(grad_input ? g.o : g.c), co(grad_input ? g.c : g.o), h(g.h), w(g.w), oh(g.oh), ow(g.ow) {}
};

// UR pixels from `x0` of one output row and one block of output channels: `rows[kh]` the input rows
// (nChw16c: channel block cb at rows[kh] + cb * plane * 16; null outside the image), `vb` the block's weights
// ([ci/16][3][3][16][16]). Each output sums bias, then over kh, input block, input channel, kw.
template <int UR>
void tile(const Dims& d, const float* const* rows, const float* vb, const float* bias, float* out,
          int64_t x0) {
  alignas(64) static const float kZeros[16] = {};
  __m512 acc[UR];
  const __m512 b0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  for (int u = 0; u < UR; ++u) acc[u] = b0;
  const int64_t cbs = d.ci / 16, plane = d.h * d.w;
  const bool left = x0 == 0, right = x0 + UR == d.w;
  for (int kh = 0; kh < 3; ++kh) {
    if (!rows[kh]) continue;
    for (int64_t cb = 0; cb < cbs; ++cb) {
      // Pixel x0 - 1 + p of the row is xt[(p - 1) * 16] for p in [1, UR], and at xl (p = 0) and xr (p = UR +
      // 1), which are the zero vector at the plane's edges; all three walk the channels with i.
      const float* xt = rows[kh] + (cb * plane + x0) * 16;
      const float* xl = left ? kZeros : xt - 16;
      const float* xr = right ? kZeros : xt + UR * 16;
      const float* wt = vb + (cb * 9 + kh * 3) * 256;
#pragma GCC unroll 1
      for (int i = 0; i < 16; ++i, ++xt, ++xl, ++xr, wt += 16) {
        const __m512 w0 = _mm512_load_ps(wt), w1 = _mm512_load_ps(wt + 256), w2 = _mm512_load_ps(wt + 512);
#pragma GCC unroll 18
        for (int p = 0; p < UR + 2; ++p) {
          const __m512 x = _mm512_set1_ps(p == 0 ? *xl : p == UR + 1 ? *xr : xt[(p - 1) * 16]);
          if (p < UR) acc[p] = _mm512_fmadd_ps(x, w0, acc[p]);
          if (p >= 1 && p <= UR) acc[p - 1] = _mm512_fmadd_ps(x, w1, acc[p - 1]);
          if (p >= 2) acc[p - 2] = _mm512_fmadd_ps(x, w2, acc[p - 2]);
        }
      }
    }
  }
  for (int u = 0; u < UR; ++u) _mm512_storeu_ps(out + u * 16, acc[u]);
}

using TileFn = void (*)(const Dims&, const float* const*, const float*, const float*, float*, int64_t);

// kTiles[k]: the tile of k + 1 pixels.
constexpr auto kTiles = kernel_table<TileFn, kTile>([](auto u) -> TileFn { return &tile<u()>; });

// The next chunk's dy and x prefetched into L2, a few lines per row of the current chunk's passes, so that
// they arrive from memory while this chunk multiplies: ResNet-20's six 16-channel weight gradients (8 MB of
// operands each, past the L3 cache's share) took 5.8-6.0 ms a step with it, 6.3-6.5 without (alternating
// profiled runs); the hardware prefetchers start only once a pass reads the chunk.
struct Ahead {
  const char* p[2] = {nullptr, nullptr};
  int64_t left[2] = {0, 0};  // lines
  int64_t per_row = 0;
  void row() {
    for (int64_t i = 0; i < per_row; ++i) {
      const int r = left[0] > 0 ? 0 : 1;
      if (left[r] <= 0) return;
      _mm_prefetch(p[r], _MM_HINT_T1);
      p[r] += 64;
      --left[r];
    }
  }
};

// Images [0, count) of a chunk's contribution to the partial sums of one output block, tap row kh and the 8
// input channels from c0, at stride S (1 or 2); 24 accumulators (kw x channel) in registers. dy and x point
// at the chunk's first image's output block and image, `dy_step` and `x_step` elements apart.
// Stride 1: per input pixel q of a row, the 8 channels are broadcast once each and multiplied into the three
// taps they reach, with dy at q + 1 (kw 0), q (kw 1) and q - 1 (kw 2), zero past the plane's edges, three dy
// registers rolling along the row.
// Stride 2, where output pixel q reads input pixels 2q - 1, 2q and 2q + 1: the even input pixel 2q reaches
// output q alone (kw 1), the odd one 2q + 1 outputs q (kw 2) and q + 1 (kw 0), so each output pixel costs
// two broadcasts of the 8 channels for three multiply-adds each (pixel -1 is padding, and 2q + 1 past an
// odd-width plane's edge too).
// Either way each accumulator sums in pixel order.
template <int S>
void wgrad_rows(const Dims& d, int64_t count, const float* dy, int64_t dy_step, const float* x,
                int64_t x_step, int64_t kh, int64_t c0, float* acc_out, Ahead& ahead) {
  const int64_t plane = d.h * d.w;
  __m512 acc[3][8];
  for (int kw = 0; kw < 3; ++kw)
    for (int c = 0; c < 8; ++c) acc[kw][c] = _mm512_loadu_ps(acc_out + (kw * d.ci + c0 + c) * 16);
  for (int64_t n = 0; n < count; ++n)
    for (int64_t y = 0; y < d.oh; ++y) {
      const int64_t iy = S * y + kh - 1;
      if (iy < 0 || iy >= d.h) continue;
      ahead.row();
      const float* dr = dy + n * dy_step + y * d.ow * 16;
      const float* xr = x + n * x_step + (c0 / 16 * plane + iy * d.w) * 16 + c0 % 16;
      __m512 prev = _mm512_setzero_ps(), cur = _mm512_loadu_ps(dr);
      for (int64_t q = 0; q < d.ow; ++q) {
        const __m512 next = q + 1 < d.ow ? _mm512_loadu_ps(dr + (q + 1) * 16) : _mm512_setzero_ps();
        if constexpr (S == 1) {
          const float* xq = xr + q * 16;
#pragma GCC unroll 8
          for (int c = 0; c < 8; ++c) {
            const __m512 b = _mm512_set1_ps(xq[c]);
            acc[0][c] = _mm512_fmadd_ps(b, next, acc[0][c]);
            acc[1][c] = _mm512_fmadd_ps(b, cur, acc[1][c]);
            acc[2][c] = _mm512_fmadd_ps(b, prev, acc[2][c]);
          }
          prev = cur;
        } else {
          const float* xe = xr + 2 * q * 16;
#pragma GCC unroll 8
          for (int c = 0; c < 8; ++c) acc[1][c] = _mm512_fmadd_ps(_mm512_set1_ps(xe[c]), cur, acc[1][c]);
          if (2 * q + 1 < d.w) {
            const float* xo = xe + 16;
#pragma GCC unroll 8
            for (int c = 0; c < 8; ++c) {
              const __m512 b = _mm512_set1_ps(xo[c]);
              acc[2][c] = _mm512_fmadd_ps(b, cur, acc[2][c]);
              acc[0][c] = _mm512_fmadd_ps(b, next, acc[0][c]);
            }
          }
        }
        cur = next;
      }
    }
  for (int kw = 0; kw < 3; ++kw)
    for (int c = 0; c < 8; ++c) _mm512_storeu_ps(acc_out + (kw * d.ci + c0 + c) * 16, acc[kw][c]);
}

}  // namespace

bool direct3x3_f32_wgrad_serves(const ConvGeom& g) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool same = g.sh == 1 && g.sw == 1 && g.oh == g.h && g.ow == g.w;
  const bool half = g.sh == 2 && g.sw == 2 && g.oh == (g.h + 1) / 2 && g.ow == (g.w + 1) / 2;
  return avx512 && g.kh == 3 && g.kw == 3 && (same || half) && g.ph == 1 && g.pw == 1 && g.dh == 1 &&
         g.dw == 1 && g.groups == 1 && g.c % 16 == 0 && g.o % 16 == 0;
}

// The weight gradient's geometries at stride 1.
bool direct3x3_f32_serves(const ConvGeom& g) {
  return g.sh == 1 && direct3x3_f32_wgrad_serves(g);
}

void direct3x3_f32_weights(const ConvGeom& g, bool grad_input, const float* w, float* v) {
  FR_CHECK(direct3x3_f32_serves(g), "direct3x3_f32: unsupported geometry");
  direct3x3_rearrange_weights<16>(g, grad_input, w, v);
}

void direct3x3_f32(const ConvGeom& g, bool grad_input, const float* in, const float* v, const float* bias,
                   float* out, int64_t i0, int64_t i1) {
  FR_CHECK(direct3x3_f32_serves(g), "direct3x3_f32: unsupported geometry");
  FR_CHECK(!grad_input || !bias, "direct3x3_f32: a bias in the input gradient");
  const Dims d(g, grad_input);
  const int64_t cbs = d.ci / 16, obs = d.co / 16, plane = d.h * d.w;
  for (int64_t item = i0; item < i1; ++item) {
    const int64_t n = item / d.h, y = item % d.h;
    const float* rows[3];
    for (int64_t kh = 0; kh < 3; ++kh) {
      const int64_t iy = y + kh - 1;
      rows[kh] = iy < 0 || iy >= d.h ? nullptr : in + (n * cbs * plane + iy * d.w) * 16;
    }
    for (int64_t ob = 0; ob < obs; ++ob) {
      const float* vb = v + ob * cbs * 9 * 256;
      const float* b = bias ? bias + ob * 16 : nullptr;
      float* o = out + ((n * obs + ob) * plane + y * d.w) * 16;
      for (int64_t x0 = 0; x0 < d.w; x0 += kTile) {
        const int64_t ur = std::min<int64_t>(kTile, d.w - x0);
        kTiles[static_cast<size_t>(ur - 1)](d, rows, vb, b, o + x0 * 16, x0);
      }
    }
  }
}

int64_t direct3x3_f32_wgrad_partial_elems(const ConvGeom& g) {
  return 9 * g.o * g.c;
}

void direct3x3_f32_wgrad(const ConvGeom& g, int64_t n0, int64_t n1, const float* dy, const float* x,
                         float* partial) {
  FR_CHECK(direct3x3_f32_wgrad_serves(g), "direct3x3_f32_wgrad: unsupported geometry");
  const Dims d(g, false);
  const int64_t obs = d.co / 16, cbs = d.ci / 16, plane = d.h * d.w, oplane = d.oh * d.ow;
  const auto rows = g.sh == 1 ? wgrad_rows<1> : wgrad_rows<2>;
  std::fill(partial, partial + direct3x3_f32_wgrad_partial_elems(g), 0.f);
  // Chunks of images whose dy and x fit half of a 2 MiB L2 cache, read once per (output block, kh, 8 input
  // channels) with the accumulators in registers: one image at a time, ResNet-20's 64-channel 8x8 layers
  // spent as long loading and storing accumulators as multiplying. Each partial still sums image by image,
  // row by row and pixel by pixel, whatever the chunk.
  const int64_t image_bytes = (d.ci * plane + d.co * oplane) * 4;
  const int64_t chunk = std::max<int64_t>(1, (int64_t{256} << 10) / image_bytes);
  for (int64_t n = n0; n < n1; n += chunk) {
    const int64_t count = std::min(chunk, n1 - n);
    Ahead ahead;
    if (n + count < n1) {
      // A 16-float pixel vector is one cache line.
      const int64_t next = std::min(chunk, n1 - n - count);
      ahead.p[0] = reinterpret_cast<const char*>(dy + (n + count) * obs * oplane * 16);
      ahead.p[1] = reinterpret_cast<const char*>(x + (n + count) * cbs * plane * 16);
      ahead.left[0] = next * obs * oplane;
      ahead.left[1] = next * cbs * plane;
      const int64_t visits = std::max<int64_t>(1, obs * 3 * (d.ci / 8) * count * (d.oh - 1));
      ahead.per_row = (ahead.left[0] + ahead.left[1] + visits - 1) / visits;
    }
    for (int64_t ob = 0; ob < obs; ++ob)
      for (int64_t kh = 0; kh < 3; ++kh)
        for (int64_t c0 = 0; c0 < d.ci; c0 += 8)
          rows(d, count, dy + (n * obs + ob) * oplane * 16, obs * oplane * 16, x + n * cbs * plane * 16,
               cbs * plane * 16, kh, c0, partial + (ob * 3 + kh) * 3 * d.ci * 16, ahead);
  }
}

void direct3x3_f32_wgrad_finish(const ConvGeom& g, const float* partials, int64_t count, int64_t stride,
                                float* dw) {
  parallel_for(g.o / 16 * 9, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t ob = p / 9, k = p % 9;
      for (int64_t c = 0; c < g.c; ++c) {
        const int64_t at = (p * g.c + c) * 16;
        __m512 sum = _mm512_load_ps(partials + at);
        for (int64_t b = 1; b < count; ++b)
          sum = _mm512_add_ps(sum, _mm512_load_ps(partials + b * stride + at));
        alignas(64) float v[16];
        _mm512_store_ps(v, sum);
        for (int64_t j = 0; j < 16; ++j) dw[((ob * 16 + j) * g.c + c) * 9 + k] = v[j];
      }
    }
  });
}

#else

bool direct3x3_f32_serves(const ConvGeom&) {
  return false;
}
void direct3x3_f32_weights(const ConvGeom&, bool, const float*, float*) {
  FR_CHECK(false, "direct3x3_f32: built without AVX-512");
}
void direct3x3_f32(const ConvGeom&, bool, const float*, const float*, const float*, float*, int64_t,
                   int64_t) {
  FR_CHECK(false, "direct3x3_f32: built without AVX-512");
}
bool direct3x3_f32_wgrad_serves(const ConvGeom&) {
  return false;
}
int64_t direct3x3_f32_wgrad_partial_elems(const ConvGeom&) {
  return 0;
}
void direct3x3_f32_wgrad(const ConvGeom&, int64_t, int64_t, const float*, const float*, float*) {
  FR_CHECK(false, "direct3x3_f32_wgrad: built without AVX-512");
}
void direct3x3_f32_wgrad_finish(const ConvGeom&, const float*, int64_t, int64_t, float*) {
  FR_CHECK(false, "direct3x3_f32_wgrad: built without AVX-512");
}

#endif

}  // namespace flowrun::cpu
