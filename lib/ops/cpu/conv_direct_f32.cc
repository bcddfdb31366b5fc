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
#include <array>
#include <utility>

#include "core/error.h"
#include "ops/cpu/parallel.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace flowrun::cpu {

#if defined(__AVX512F__)

namespace {

constexpr int kTile = 16;  // output pixels per tile: 16 accumulators, 3 weight registers and spares

// A pass as a convolution of `ci` input channels into `co` output channels on an h x w plane.
struct Dims {
  int64_t ci, co, h, w;
  Dims(const ConvGeom& g, bool grad_input)
      : ci(grad_input ? g.o : g.c), co(grad_input ? g.c : g.o), h(g.h), w(g.w) {}
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

template <int... U>
constexpr std::array<TileFn, sizeof...(U)> tiles_of(std::integer_sequence<int, U...>) {
  return {&tile<U + 1>...};
}
// kTiles[k]: the tile of k + 1 pixels.
constexpr auto kTiles = tiles_of(std::make_integer_sequence<int, kTile>{});

}  // namespace

bool direct3x3_f32_serves(const ConvGeom& g) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  return avx512 && g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.ph == 1 && g.pw == 1 && g.dh == 1 &&
         g.dw == 1 && g.groups == 1 && g.c % 16 == 0 && g.o % 16 == 0 && g.oh == g.h && g.ow == g.w;
}

size_t direct3x3_f32_weight_bytes(const ConvGeom& g) {
  return static_cast<size_t>(9 * g.o * g.c) * 4;
}

void direct3x3_f32_weights(const ConvGeom& g, bool grad_input, const float* w, float* v) {
  FR_CHECK(direct3x3_f32_serves(g), "direct3x3_f32: unsupported geometry");
  const Dims d(g, grad_input);
  const int64_t cbs = d.ci / 16;
  // v[ob][cb][kh][kw][i][j] multiplies pass input channel cb*16 + i into pass output channel ob*16 + j: the
  // forward's w[ob*16 + j][cb*16 + i][kh][kw], the input gradient's w[cb*16 + i][ob*16 + j][2 - kh][2 - kw].
  parallel_for(d.co / 16 * cbs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t ob = p / cbs, cb = p % cbs;
      float* out = v + p * 9 * 256;
      for (int64_t k = 0; k < 9; ++k)
        for (int64_t i = 0; i < 16; ++i)
          for (int64_t j = 0; j < 16; ++j) {
            const int64_t pi = cb * 16 + i, pj = ob * 16 + j;
            out[(k * 16 + i) * 16 + j] =
                grad_input ? w[(pi * g.c + pj) * 9 + (8 - k)] : w[(pj * g.c + pi) * 9 + k];
          }
    }
  });
}

int64_t direct3x3_f32_items(const ConvGeom& g) {
  return g.n * g.h;
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

#else

bool direct3x3_f32_serves(const ConvGeom&) {
  return false;
}
size_t direct3x3_f32_weight_bytes(const ConvGeom&) {
  return 0;
}
void direct3x3_f32_weights(const ConvGeom&, bool, const float*, float*) {
  FR_CHECK(false, "direct3x3_f32: built without AVX-512");
}
int64_t direct3x3_f32_items(const ConvGeom&) {
  return 0;
}
void direct3x3_f32(const ConvGeom&, bool, const float*, const float*, const float*, float*, int64_t,
                   int64_t) {
  FR_CHECK(false, "direct3x3_f32: built without AVX-512");
}

#endif

}  // namespace flowrun::cpu
