// The f32 weight gradient over input channels in multiples of 8 (conv_wgrad8_f32.h says what it computes).
//
// dw[o][c][i][j] = sum over images n and output pixels (y, x) of dy[n][o][y][x] * xpad[n][c][y sh + i dh]
// [x sw + j dw], for each kernel row i a product of dy's pixels with x's shifted ones. Register tile: two
// vectors of 8 output channels x two input channels x the row's three taps, 12 accumulators; per output
// pixel two loads of dy and six broadcasts of x feed 12 FMAs (gemm_avx2's micro-kernel's ratio). x is copied
// once per image into zero-padded planes of 8-channel pixels, so that no tap needs a bounds test and a
// pixel's channels lie side by side; dy is read where it lies (a pixel's 8 channels are contiguous in every
// blocked layout and in NHWC) and blocked first where it is NCHW.
#include "ops/cpu/conv_wgrad8_f32.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#define FR_AVX2 __attribute__((target("avx2,fma")))

namespace flowrun::cpu {

namespace {

constexpr int64_t kLanes = 8;

// Image n of x into xpad ([C/8][hp][wp][8]); the borders are left as they are (zero).
void pad_image(const ConvGeom& g, const float* x, int64_t n, float* xpad) {
  const int64_t hp = g.padded_h(), wp = g.padded_w(), hw = g.h * g.w;
  for (int64_t cb = 0; cb < g.c / kLanes; ++cb)
    for (int64_t y = 0; y < g.h; ++y) {
      float* out = xpad + ((cb * hp + y + g.ph) * wp + g.pw) * kLanes;
      for (int64_t xx = 0; xx < g.w; ++xx) {
        const int64_t p = y * g.w + xx;
        if (!g.x_blocked) {
          for (int64_t l = 0; l < kLanes; ++l) out[xx * kLanes + l] = x[(n * g.c + cb * kLanes + l) * hw + p];
          continue;
        }
        const float* src = g.nhwc     ? x + (n * hw + p) * g.c + cb * kLanes
                           : g.nchw8c ? x + ((n * (g.c / 8) + cb) * hw + p) * 8
                                      : x + ((n * (g.c / 16) + cb / 2) * hw + p) * 16 + cb % 2 * 8;
        std::memcpy(out + xx * kLanes, src, kLanes * sizeof(float));
      }
    }
}

// Pixel 0 of dy's 8 output channels ob * 8.. of image n (dy8: the image blocked, where dy is NCHW), and the
// step from one pixel to the next.
struct DyBlock {
  const float* base;
  int64_t step;
};
DyBlock dy_block(const ConvGeom& g, const float* dy, const float* dy8, int64_t n, int64_t ob) {
  const int64_t pixels = g.plane();
  if (!g.y_blocked) return {dy8 + ob * pixels * kLanes, kLanes};
  if (g.nhwc) return {dy + n * pixels * g.o + ob * kLanes, g.o};
  if (g.nchw8c) return {dy + (n * (g.o / 8) + ob) * pixels * 8, 8};
  return {dy + (n * (g.o / 16) + ob / 2) * pixels * 16 + ob % 2 * 8, 16};
}

struct Row {
  int64_t oh, ow, sh, sw, dw, wp;  // output plane, strides, tap dilation, padded row length (pixels)
};

// One image's sums of kernel row i for output blocks d0, d1 and input channels c, c + 1: x0 is channel c of
// the padded row i dh of its 8-channel plane; acc0/acc1 hold (or receive, when `first`) the 2 x 3 tap vectors
// of each output block, channel c + 1's `cstride` floats after channel c's.
FR_AVX2 void row3(const Row& r, DyBlock d0, DyBlock d1, const float* x0, float* acc0, float* acc1,
                  int64_t cstride, bool first) {
  __m256 a[2][2][3];
  float* acc[2] = {acc0, acc1};
#pragma GCC unroll 2
  for (int o = 0; o < 2; ++o)
#pragma GCC unroll 2
    for (int c = 0; c < 2; ++c)
#pragma GCC unroll 3
      for (int j = 0; j < 3; ++j)
        a[o][c][j] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc[o] + c * cstride + j * kLanes);
  const int64_t tap = r.dw * kLanes, xstep = r.sw * kLanes;
  for (int64_t oy = 0; oy < r.oh; ++oy) {
    const float* xr = x0 + oy * r.sh * r.wp * kLanes;
    const float* y0 = d0.base + oy * r.ow * d0.step;
    const float* y1 = d1.base + oy * r.ow * d1.step;
    for (int64_t ox = 0; ox < r.ow; ++ox) {
      const __m256 v0 = _mm256_loadu_ps(y0 + ox * d0.step), v1 = _mm256_loadu_ps(y1 + ox * d1.step);
      const float* xp = xr + ox * xstep;
#pragma GCC unroll 3
      for (int j = 0; j < 3; ++j)
#pragma GCC unroll 2
        for (int c = 0; c < 2; ++c) {
          const __m256 b = _mm256_broadcast_ss(xp + j * tap + c);
          a[0][c][j] = _mm256_fmadd_ps(b, v0, a[0][c][j]);
          a[1][c][j] = _mm256_fmadd_ps(b, v1, a[1][c][j]);
        }
    }
  }
#pragma GCC unroll 2
  for (int o = 0; o < 2; ++o)
#pragma GCC unroll 2
    for (int c = 0; c < 2; ++c)
#pragma GCC unroll 3
      for (int j = 0; j < 3; ++j) _mm256_storeu_ps(acc[o] + c * cstride + j * kLanes, a[o][c][j]);
}

}  // namespace

bool wgrad8_f32_fits(const ConvGeom& g) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return avx2 && g.groups == 1 && g.c % kLanes == 0 && g.o % (2 * kLanes) == 0 && g.kw == 3;
}

size_t wgrad8_f32_scratch_bytes(const ConvGeom& g) {
  const int64_t planes = g.c * g.padded_h() * g.padded_w(), dy = g.y_blocked ? 0 : g.o * g.plane();
  return static_cast<size_t>(planes + dy) * sizeof(float);
}

int64_t wgrad8_f32_partial_elems(const ConvGeom& g) {
  return g.o * g.c * g.kh * g.kw;
}

void wgrad8_f32(const ConvGeom& g, int64_t n0, int64_t n1, const float* dy, const float* x, float* partial,
                void* scratch) {
  const int64_t hp = g.padded_h(), wp = g.padded_w(), taps = g.kh * g.kw, cstride = taps * kLanes;
  float* xpad = static_cast<float*>(scratch);
  float* dy8 = xpad + g.c * hp * wp;
  std::memset(xpad, 0, static_cast<size_t>(g.c * hp * wp) * sizeof(float));
  if (n0 == n1) std::fill(partial, partial + wgrad8_f32_partial_elems(g), 0.0f);
  const Row r{g.oh, g.ow, g.sh, g.sw, g.dw, wp};
  for (int64_t n = n0; n < n1; ++n) {
    pad_image(g, x, n, xpad);
    if (!g.y_blocked)
      reorder_blocked(dy + n * g.o * g.plane(), dy8, 1, g.o, g.plane(), sizeof(float), kLanes, true);
    for (int64_t ob = 0; ob < g.o / kLanes; ob += 2) {
      const DyBlock d0 = dy_block(g, dy, dy8, n, ob), d1 = dy_block(g, dy, dy8, n, ob + 1);
      for (int64_t c = 0; c < g.c; c += 2)
        for (int64_t i = 0; i < g.kh; ++i) {
          const float* x0 = xpad + ((c / kLanes * hp + i * g.dh) * wp) * kLanes + c % kLanes;
          float* acc0 = partial + ((ob * g.c + c) * taps + i * g.kw) * kLanes;
          row3(r, d0, d1, x0, acc0, acc0 + g.c * cstride, cstride, n == n0);
        }
    }
  }
}

}  // namespace flowrun::cpu
