// The few-channel f32 weight gradient (conv_wgrad_few_f32.h says why and what it computes).
//
// dw[o][c][i][j] = sum over images n and output pixels (y, x) of dy[n][o][y][x] * xpad[n][c][y sh + i dh]
// [x sw + j dw]. A vector holds 8 output channels; per output pixel one load of dy's 8 channels and, per tap,
// a broadcast of the input element and an FMA into that tap's accumulator: kh x kw independent chains (9 for
// 3x3), enough to keep both FMA pipes busy. x is copied once per image into zero-padded planes, so that no
// tap needs a bounds test.
#include "ops/cpu/conv_wgrad_few_f32.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "ops/cpu/parallel.h"

#define FR_AVX2 __attribute__((target("avx2,fma")))

namespace flowrun::cpu {

namespace {

constexpr int64_t kLanes = 8;

int64_t taps(const ConvGeom& g) {
  return g.kh * g.kw;
}

// Where dy's 8 output channels from o0 lie for pixel p of image n: base + p * step.
struct DyView {
  const float* base;
  int64_t step;
};
DyView dy_view(const ConvGeom& g, const float* dy, int64_t n, int64_t o0) {
  const int64_t pixels = g.plane();
  if (g.y_blocked && g.nhwc) return {dy + n * pixels * g.o + o0, g.o};
  if (g.y_blocked && g.nchw8c) return {dy + (n * (g.o / 8) + o0 / 8) * pixels * 8, 8};
  if (g.y_blocked) return {dy + (n * (g.o / 16) + o0 / 16) * pixels * 16 + o0 % 16, 16};
  return {nullptr, 0};  // NCHW: the caller blocks the image first
}

// One (output block, input channel) of one image: acc[t] += dy(p) * xpad(p, tap t) over the pixels in order.
template <int T>
FR_AVX2 void accumulate(const ConvGeom& g, const DyView& d, const float* plane, const int64_t* off,
                        float* acc, bool first) {
  __m256 a[T];
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) a[t] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + t * kLanes);
  const int64_t wp = g.padded_w();
  for (int64_t oy = 0; oy < g.oh; ++oy) {
    const float* row = plane + oy * g.sh * wp;
    const float* dr = d.base + oy * g.ow * d.step;
    for (int64_t ox = 0; ox < g.ow; ++ox) {
      const __m256 v = _mm256_loadu_ps(dr + ox * d.step);
      const float* xr = row + ox * g.sw;
#pragma GCC unroll 12
      for (int t = 0; t < T; ++t) a[t] = _mm256_fmadd_ps(_mm256_broadcast_ss(xr + off[t]), v, a[t]);
    }
  }
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(acc + t * kLanes, a[t]);
}

using Accumulate = void (*)(const ConvGeom&, const DyView&, const float*, const int64_t*, float*, bool);
constexpr std::array<Accumulate, kWgradFewTaps> kAccumulate = kernel_table<Accumulate, kWgradFewTaps>(
    [](auto t) -> Accumulate { return &accumulate<decltype(t)::value>; });

}  // namespace

bool wgrad_few_f32_fits(const ConvGeom& g) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return avx2 && g.groups == 1 && g.c < 8 && g.o % kLanes == 0 && taps(g) <= kWgradFewTaps && !g.x_blocked;
}

size_t wgrad_few_f32_scratch_bytes(const ConvGeom& g) {
  const int64_t planes = g.c * g.padded_h() * g.padded_w(), dy = g.y_blocked ? 0 : g.o * g.plane();
  return static_cast<size_t>((planes + 7) / 8 * 8 + dy) * sizeof(float);
}

int64_t wgrad_few_f32_partial_elems(const ConvGeom& g) {
  return g.o * g.c * taps(g);
}

void wgrad_few_f32(const ConvGeom& g, int64_t n0, int64_t n1, const float* dy, const float* x, float* partial,
                   void* scratch) {
  const int64_t hp = g.padded_h(), wp = g.padded_w(), t = taps(g);
  float* xpad = static_cast<float*>(scratch);
  float* dy8 = xpad + (g.c * hp * wp + 7) / 8 * 8;  // 32-byte aligned
  int64_t off[kWgradFewTaps];
  for (int64_t i = 0; i < g.kh; ++i)
    for (int64_t j = 0; j < g.kw; ++j) off[i * g.kw + j] = i * g.dh * wp + j * g.dw;
  std::memset(xpad, 0, static_cast<size_t>(g.c * hp * wp) * sizeof(float));
  if (n0 == n1) std::fill(partial, partial + wgrad_few_f32_partial_elems(g), 0.0f);
  const Accumulate run = kAccumulate[static_cast<size_t>(t - 1)];
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t c = 0; c < g.c; ++c)  // the borders stay zero
      for (int64_t y = 0; y < g.h; ++y)
        std::memcpy(xpad + (c * hp + y + g.ph) * wp + g.pw, x + ((n * g.c + c) * g.h + y) * g.w,
                    static_cast<size_t>(g.w) * sizeof(float));
    if (!g.y_blocked)
      reorder_blocked(dy + n * g.o * g.plane(), dy8, 1, g.o, g.plane(), sizeof(float), 8, true);
    for (int64_t o0 = 0; o0 < g.o; o0 += kLanes) {
      const DyView d = g.y_blocked ? dy_view(g, dy, n, o0) : DyView{dy8 + o0 * g.plane(), kLanes};
      for (int64_t c = 0; c < g.c; ++c)
        run(g, d, xpad + c * hp * wp, off, partial + (o0 / kLanes * g.c + c) * t * kLanes, n == n0);
    }
  }
}

void wgrad_few_f32_finish(const ConvGeom& g, const float* partials, int64_t count, int64_t stride,
                          float* dw) {
  const int64_t t = taps(g);
  parallel_for(g.o, 1, [&](int64_t s, int64_t e) {
    for (int64_t o = s; o < e; ++o)
      for (int64_t c = 0; c < g.c; ++c)
        for (int64_t k = 0; k < t; ++k) {
          const int64_t at = ((o / kLanes * g.c + c) * t + k) * kLanes + o % kLanes;
          float sum = partials[at];
          for (int64_t b = 1; b < count; ++b) sum += partials[b * stride + at];
          dw[(o * g.c + c) * t + k] = sum;
        }
  });
}

}  // namespace flowrun::cpu
