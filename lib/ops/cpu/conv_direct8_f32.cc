// f32 3x3 direct convolutions on nChw8c with AVX2 (conv_direct8_f32.h), conv_direct_f32.cc's scheme with 8
// lanes. An item is one output row of one image; for each block of 8 output channels the row is cut into
// tiles of at most kTile pixels, each tile's outputs in as many registers. Per input channel i of a tap row
// the three weight vectors v[kw][i] sit in registers and each input pixel of the row is broadcast once and
// multiplied into the three outputs it reaches: one load for three multiply-adds, where oneDNN's AVX2 direct
// kernel loads one per multiply-add or two. The padding pixels left and right of the plane are read from a
// zero vector, so the kernel reads x in place and checks no bounds per tap. Activations in nChw16c are read
// and written as pairs of 8-channel blocks in place, so that a step in either layout (and an eager one,
// through nChw8c copies) gives the same bits.
#include "ops/cpu/conv_direct8_f32.h"

#include <immintrin.h>

#include <algorithm>

#include "core/error.h"
#include "ops/cpu/conv_direct_weights.h"
#include "ops/cpu/parallel.h"

// Compiled for AVX2 and FMA whatever the build's -march, and run only where the CPU has them.
#define FR_AVX2 __attribute__((target("avx2,fma")))

namespace flowrun::cpu {

namespace {

constexpr int64_t kLanes = 8;
// Output pixels per tile at most: 11 accumulators, 3 weight registers and the broadcast, one of AVX2's 16
// registers to spare (with 12 GCC spilled accumulators in the inner loop). A row is cut into tiles of equal
// width (a 32-pixel row into 11, 11 and 10), and served only where they are at least kMinTile wide: each
// accumulator takes its three taps' multiply-adds in a chain, so fewer than 8 chains leave the FMA pipes
// idle (2 x 4 cycles of latency). The bench CNN's 14 x 14 planes (tiles of 7) ran at 138 GFLOP/s against
// oneDNN's 154 (2 threads, Zen 3, best of 3 alternating).
constexpr int kTile = 11, kMinTile = 8;

int64_t tiles_in(int64_t w) {
  return (w + kTile - 1) / kTile;
}

// A pass as a convolution of `ci` input channels into `co` output channels on an h x w plane.
struct Dims {
  int64_t ci, co, h, w;
  Dims(const ConvGeom& g, bool grad_input)
      : ci(grad_input ? g.o : g.c), co(grad_input ? g.c : g.o), h(g.h), w(g.w) {}
};

// An activation of `channels` channels on `plane` pixels per image, in nChw8c (lanes 8) or nChw16c (16),
// as 8-channel vectors: that of block cb (channels 8 cb..) of image n at pixel p is at
// n * image + base(cb) + p * lanes.
struct Act8 {
  int64_t lanes, plane, image;
  Act8(int64_t channels, int64_t pixels, int64_t block_lanes)
      : lanes(block_lanes), plane(pixels), image(channels * pixels) {}
  int64_t base(int64_t cb) const { return cb * kLanes / lanes * plane * lanes + cb * kLanes % lanes; }
};

// UR pixels from `x0` of one output row and one block of output channels, at `out` (pixels `out_step`
// apart): `rows[kh]` the input rows (an Act8 of S lanes: channel block cb at rows[kh] + in.base(cb); null
// outside the image), `vb` the block's weights ([ci/8][3][3][8][8]). Each output sums bias, then over kh,
// input block, input channel, kw.
template <int UR, int S>
FR_AVX2 void tile(const Dims& d, const float* const* rows, const Act8& in, const float* vb, const float* bias,
                  float* out, int64_t out_step, int64_t x0) {
  alignas(32) static const float kZeros[kLanes] = {};
  __m256 acc[UR];
  const __m256 b0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
#pragma GCC unroll 16
  for (int u = 0; u < UR; ++u) acc[u] = b0;
  const int64_t cbs = d.ci / kLanes;
  const bool left = x0 == 0, right = x0 + UR == d.w;
  for (int kh = 0; kh < 3; ++kh) {
    if (!rows[kh]) continue;
    for (int64_t cb = 0; cb < cbs; ++cb) {
      // Pixel x0 - 1 + p of the row is xt[(p - 1) * S] for p in [1, UR], and at xl (p = 0) and xr (p = UR +
      // 1), which are the zero vector at the plane's edges; all three walk the channels with i.
      const float* xt = rows[kh] + in.base(cb) + x0 * S;
      const float* xl = left ? kZeros : xt - S;
      const float* xr = right ? kZeros : xt + UR * S;
      const float* wt = vb + (cb * 9 + kh * 3) * kLanes * kLanes;
#pragma GCC unroll 1
      for (int i = 0; i < kLanes; ++i, ++xt, ++xl, ++xr, wt += kLanes) {
        const __m256 w0 = _mm256_load_ps(wt), w1 = _mm256_load_ps(wt + 64), w2 = _mm256_load_ps(wt + 128);
#pragma GCC unroll 14
        for (int p = 0; p < UR + 2; ++p) {
          const __m256 x = _mm256_broadcast_ss(p == 0 ? xl : p == UR + 1 ? xr : xt + (p - 1) * S);
          if (p < UR) acc[p] = _mm256_fmadd_ps(x, w0, acc[p]);
          if (p >= 1 && p <= UR) acc[p - 1] = _mm256_fmadd_ps(x, w1, acc[p - 1]);
          if (p >= 2) acc[p - 2] = _mm256_fmadd_ps(x, w2, acc[p - 2]);
        }
      }
    }
  }
#pragma GCC unroll 16
  for (int u = 0; u < UR; ++u) _mm256_storeu_ps(out + u * out_step, acc[u]);
}

using TileFn = void (*)(const Dims&, const float* const*, const Act8&, const float*, const float*, float*,
                        int64_t, int64_t);

// kTiles8[k], kTiles16[k]: the tile of k + 1 pixels reading nChw8c, nChw16c.
constexpr auto kTiles8 = kernel_table<TileFn, kTile>([](auto u) -> TileFn { return &tile<u(), 8>; });
constexpr auto kTiles16 = kernel_table<TileFn, kTile>([](auto u) -> TileFn { return &tile<u(), 16>; });

// The lanes of a pass's input or output: those of g's blocked layout, or 8 for an NCHW one (its copy).
int64_t lanes_of(const ConvGeom& g, bool blocked) {
  return blocked && !g.nchw8c ? 16 : 8;
}

}  // namespace

bool direct3x3_f32x8_serves(const ConvGeom& g) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return avx2 && !g.nhwc && g.w / tiles_in(g.w) >= kMinTile && g.kh == 3 && g.kw == 3 && g.sh == 1 &&
         g.sw == 1 && g.oh == g.h && g.ow == g.w && g.ph == 1 && g.pw == 1 && g.dh == 1 && g.dw == 1 &&
         g.groups == 1 && g.c % kLanes == 0 && g.o % kLanes == 0;
}

void direct3x3_f32x8_weights(const ConvGeom& g, bool grad_input, const float* w, float* v) {
  FR_CHECK(direct3x3_f32x8_serves(g), "direct3x3_f32x8: unsupported geometry");
  direct3x3_rearrange_weights<kLanes>(g, grad_input, w, v);
}

void direct3x3_f32x8(const ConvGeom& g, bool grad_input, const float* in, const float* v, const float* bias,
                     float* out, int64_t i0, int64_t i1) {
  FR_CHECK(direct3x3_f32x8_serves(g), "direct3x3_f32x8: unsupported geometry");
  FR_CHECK(!grad_input || !bias, "direct3x3_f32x8: a bias in the input gradient");
  const Dims d(g, grad_input);
  const int64_t cbs = d.ci / kLanes, obs = d.co / kLanes, plane = d.h * d.w;
  const Act8 ia(d.ci, plane, lanes_of(g, grad_input ? g.y_blocked : g.x_blocked)),
      oa(d.co, plane, lanes_of(g, grad_input ? g.x_blocked : g.y_blocked));
  const auto& tiles_of = ia.lanes == 8 ? kTiles8 : kTiles16;
  const int64_t tiles = tiles_in(d.w);
  for (int64_t item = i0; item < i1; ++item) {
    const int64_t n = item / d.h, y = item % d.h;
    const float* rows[3];
    for (int64_t kh = 0; kh < 3; ++kh) {
      const int64_t iy = y + kh - 1;
      rows[kh] = iy < 0 || iy >= d.h ? nullptr : in + n * ia.image + iy * d.w * ia.lanes;
    }
    for (int64_t ob = 0; ob < obs; ++ob) {
      const float* vb = v + ob * cbs * 9 * kLanes * kLanes;
      const float* b = bias ? bias + ob * kLanes : nullptr;
      float* o = out + n * oa.image + oa.base(ob) + y * d.w * oa.lanes;
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t x0 = t * d.w / tiles, x1 = (t + 1) * d.w / tiles;
        tiles_of[static_cast<size_t>(x1 - x0 - 1)](d, rows, ia, vb, b, o + x0 * oa.lanes, oa.lanes, x0);
      }
    }
  }
}

}  // namespace flowrun::cpu
