// bf16 3x3 convolutions, stride 1, padding 1, through Winograd's F(2x2, 3x3) (Lavin and Gray, 2016):
//   Y = A^T [ (G g G^T) . (B^T d B) ] A
// for each 2x2 output tile, d the tile's 4x4 input window (zero outside the image), g a 3x3 filter, with
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],  G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
//   A^T = [1 1 1 0; 0 1 -1 -1].
// Summed over the input channels, the elementwise product is 16 matrix products, one per position p of the
// 4x4 transformed tile: M_p[tile][o] = sum over c of U_p[tile][c] V_p[c][o]. They run as vdpbf16ps dot
// products on pairs of channels, so U and V are rounded to bf16; the transforms and M are f32. The input
// gradient is the same convolution of dy with the filters flipped and transposed; the weight gradient is
// the transposed form, F(3x3, 2x2) (its section below).
//
// An item is one image's block of 16 tiles (kTiles): its input transform fills U (16 positions x 16 tiles x
// C bf16, each (p, tile) 16 channels at a time from one nChw16c pixel vector), then per block of 16 output
// channels the 16 products accumulate 16 tiles' registers (one V pair vector and 16 broadcast U pairs per
// step) into M, which the output transform turns into 2x2 pixels. U and M stay in the L1/L2 cache.
//
// Rounding: U and V are rounded once from f32 (to nearest-even), the products are exact in f32 and summed
// pair by pair in channel order, and each output is computed by one item: the bits depend on neither the
// thread count nor the item split. The error is bf16's relative 2^-9 on the transformed values, which can be
// larger than the convolution's own terms (sums of up to four inputs and nine weights); the test bounds it
// by the transformed magnitudes (tests/unit/test_lowp_kernels.cc). oneDNN's int8 Winograd and cuDNN's fp16
// one use the same F(2x2, 3x3) for that reason: its transforms have coefficients 0, +-1 and 1/2.
#include "ops/cpu/conv_wino_bf16.h"

#include <algorithm>

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

constexpr int kTiles = 16;  // tiles per item: 16 accumulators and a V register per step

// f32 to bf16 to nearest-even in one vcvtneps2bf16, which flushes denormals to zero as oneDNN's bf16 kernels
// do (simd16::bf16_words checks every register for them, which cost a tenth of the input transform).
inline __m256i to_bf16(__m512 v) {
  return (__m256i)_mm512_cvtneps_pbh(v);
}

// A pass as a convolution of `ci` input channels into `co` output channels on an h x w plane.
struct Dims {
  int64_t ci, co, h, w, tw, tiles, blocks;
  Dims(const ConvGeom& g, bool grad_input)
      : ci(grad_input ? g.o : g.c),
        co(grad_input ? g.c : g.o),
        h(g.h),
        w(g.w),
        tw(g.w / 2),
        tiles(g.h / 2 * (g.w / 2)),
        blocks((tiles + kTiles - 1) / kTiles) {}
};

// Elements between U's (channels) or W's positions of T tiles: a cache line more than their tiles, since
// positions a multiple of 4 KiB apart share L1 sets, and the transforms, which store to all 16, ran at two
// thirds of the rate with the weight gradient's 8 KiB (a whole 32 x 32 image's 256 tiles of 16 channels).
int64_t position_stride(int64_t channels, int64_t T) {
  return channels * T + 32;
}

// One thread's scratch: U [16 positions, position_stride apart][channels / 16][kTiles][16] bf16, M [16
// positions][kTiles][16] f32, then a zero row (W pixels of 16 channels) for the windows' rows above and below
// the image.
size_t u_bytes(const ConvGeom& g) {
  return static_cast<size_t>(16 * position_stride(std::max(g.c, g.o), kTiles) * 2);
}
constexpr size_t kMBytes = 16 * kTiles * 16 * 4;

// The 4 input rows of tile row ty's windows (rows 2 ty - 1 .. 2 ty + 2 of one nChw16c plane, `zeros`
// outside the image), and B^T's combination of them at column xx, (d0 - d2, d1 + d2, d2 - d1, d1 - d3), zero
// outside. Each column's is made once and shared by the neighbouring tiles whose windows hold it.
struct WindowRows {
  const bf16* rows[4];
  int64_t w;
  WindowRows(const Dims& d, const bf16* plane, int64_t ty, const bf16* zeros) : w(d.w) {
    for (int r = 0; r < 4; ++r) {
      const int64_t yy = 2 * ty - 1 + r;
      rows[r] = yy >= 0 && yy < d.h ? plane + yy * d.w * 16 : zeros;
    }
  }
  void column(int64_t xx, __m512 e[4]) const {
    if (xx < 0 || xx >= w) {
      for (int r = 0; r < 4; ++r) e[r] = _mm512_setzero_ps();
      return;
    }
    const __m512 d0 = simd16::load(rows[0] + xx * 16), d1 = simd16::load(rows[1] + xx * 16),
                 d2 = simd16::load(rows[2] + xx * 16), d3 = simd16::load(rows[3] + xx * 16);
    e[0] = _mm512_sub_ps(d0, d2);
    e[1] = _mm512_add_ps(d1, d2);
    e[2] = _mm512_sub_ps(d2, d1);
    e[3] = _mm512_sub_ps(d1, d3);
  }
};

// Row r of B^T d B for the tile whose window's columns combine to c0..c3: (c0 - c2, c1 + c2, c2 - c1, c1 -
// c3).
inline void tile_row(const __m512 c0[4], const __m512 c1[4], const __m512 c2[4], const __m512 c3[4], int r,
                     __m512 v[4]) {
  v[0] = _mm512_sub_ps(c0[r], c2[r]);
  v[1] = _mm512_add_ps(c1[r], c2[r]);
  v[2] = _mm512_sub_ps(c2[r], c1[r]);
  v[3] = _mm512_sub_ps(c1[r], c3[r]);
}

// B^T d B of the tiles [t0, t0 + nt) of one image (nChw16c), into U [16 positions, position_stride apart][ci
// / 16][kTiles][16]; U's tiles past nt are zero.
void transform_input(const Dims& d, const bf16* img, int64_t t0, int64_t nt, const bf16* zeros, bf16* u) {
  const int64_t stride = position_stride(d.ci, kTiles);
  for (int64_t t = nt; t < kTiles; ++t)
    for (int p = 0; p < 16; ++p)
      for (int64_t cb = 0; cb < d.ci / 16; ++cb)
        _mm256_store_si256(reinterpret_cast<__m256i*>(u + p * stride + (cb * kTiles + t) * 16),
                           _mm256_setzero_si256());
  for (int64_t cb = 0; cb < d.ci / 16; ++cb) {
    const bf16* plane = img + cb * d.h * d.w * 16;
    for (int64_t t = 0; t < nt;) {
      const int64_t ty = (t0 + t) / d.tw, tx0 = (t0 + t) % d.tw;
      const int64_t run = std::min(nt - t, d.tw - tx0);  // tiles of this item in tile row ty
      const WindowRows rows(d, plane, ty, zeros);
      __m512 c0[4], c1[4], c2[4], c3[4];
      rows.column(2 * tx0 - 1, c0);
      rows.column(2 * tx0, c1);
      for (int64_t i = 0; i < run; ++i, ++t) {
        rows.column(2 * (tx0 + i) + 1, c2);
        rows.column(2 * (tx0 + i) + 2, c3);
        bf16* ut = u + (cb * kTiles + t) * 16;
        for (int r = 0; r < 4; ++r) {
          __m512 v[4];
          tile_row(c0, c1, c2, c3, r, v);
          for (int c = 0; c < 4; ++c)
            _mm256_store_si256(reinterpret_cast<__m256i*>(ut + (r * 4 + c) * stride), to_bf16(v[c]));
          c0[r] = c2[r];
          c1[r] = c3[r];
        }
      }
    }
  }
}

// M_p = U_p V_p for output block ob, every position p: a register per tile, one pair of channels a step.
// U's blocks of 16 channels keep the 16 tiles' broadcasts at fixed offsets from one pointer (with a
// pointer per tile, GCC ran out of registers and spilled them).
void multiply(const Dims& d, const uint32_t* u, const uint32_t* v, int64_t ob, float* m) {
  const int64_t cbs = d.ci / 16, pairs = d.ci / 2;
  for (int p = 0; p < 16; ++p) {
    __m512 acc[kTiles];
    for (int t = 0; t < kTiles; ++t) acc[t] = _mm512_setzero_ps();
    const uint32_t* vp = v + (p * (d.co / 16) + ob) * pairs * 16;
    for (int64_t cb = 0; cb < cbs; ++cb) {
      const uint32_t* uc = u + p * position_stride(d.ci, kTiles) / 2 + cb * kTiles * 8;
      for (int k = 0; k < 8; ++k) {
        const __m512bh b = (__m512bh)_mm512_load_si512(vp + (cb * 8 + k) * 16);
        for (int t = 0; t < kTiles; ++t)
          acc[t] = _mm512_dpbf16_ps(acc[t], (__m512bh)_mm512_set1_epi32(static_cast<int>(uc[t * 8 + k])), b);
      }
    }
    for (int t = 0; t < kTiles; ++t) _mm512_store_ps(m + (p * kTiles + t) * 16, acc[t]);
  }
}

// A^T M A of tiles [t0, t0 + nt), plus the block's bias (when given), into output block ob of one image
// (nChw16c), rounded to bf16.
void transform_output(const Dims& d, const float* m, int64_t t0, int64_t nt, int64_t ob, const bf16* bias,
                      bf16* img) {
  bf16* plane = img + ob * d.h * d.w * 16;
  const __m512 bv = bias ? simd16::load(bias + ob * 16) : _mm512_setzero_ps();
  for (int64_t t = 0; t < nt; ++t) {
    __m512 q[16];
    for (int p = 0; p < 16; ++p) q[p] = _mm512_load_ps(m + (p * kTiles + t) * 16);
    __m512 s[2][4];
    for (int j = 0; j < 4; ++j) {
      s[0][j] = _mm512_add_ps(_mm512_add_ps(q[j], q[4 + j]), q[8 + j]);
      s[1][j] = _mm512_sub_ps(_mm512_sub_ps(q[4 + j], q[8 + j]), q[12 + j]);
    }
    const int64_t y0 = (t0 + t) / d.tw * 2, x0 = (t0 + t) % d.tw * 2;
    for (int i = 0; i < 2; ++i) {
      __m512 a = _mm512_add_ps(_mm512_add_ps(s[i][0], s[i][1]), s[i][2]);
      __m512 b = _mm512_sub_ps(_mm512_sub_ps(s[i][1], s[i][2]), s[i][3]);
      if (bias) {
        a = _mm512_add_ps(a, bv);
        b = _mm512_add_ps(b, bv);
      }
      auto* row = reinterpret_cast<__m256i*>(plane + ((y0 + i) * d.w + x0) * 16);
      _mm256_storeu_si256(row, to_bf16(a));
      _mm256_storeu_si256(row + 1, to_bf16(b));
    }
  }
}

// ---- weight gradient: dW = G^T [ (B^T x B) . (A dy A^T) ] G summed over every tile, the transposed form
// (F(3x3, 2x2)) of the forward pass's F(2x2, 3x3), with A = (A^T)^T. vdpbf16ps sums over pairs of tiles, so
// U = B^T x B and W = A dy A^T are made two neighbouring tiles of a row at a time, rounded together
// (vcvtne2ps2bf16) and interleaved into pair words: tile (ty, tx) of an image has slot ty * tw2 + tx, tw2 =
// tw rounded up to even, and the slot after an odd row's last tile is zero. Then M_p[c][o] += U_p W_p.

// Tile slots per row (tw rounded up to even) and per image.
int64_t row_slots(const Dims& d) {
  return (d.tw + 1) / 2 * 2;
}
int64_t slots_per_image(const Dims& d) {
  return d.h / 2 * row_slots(d);
}

// Images transformed together before their products: as many as keep U and W within a 32 x 32 image's 16
// channels in and out (256 KiB, in L2), at least one. More tiles per accumulator load and store: with one
// 8 x 8 image (16 tiles) at a time, 64 channels ran at three quarters of the products' rate.
int64_t images_per_chunk(const ConvGeom& g) {
  return std::max<int64_t>(1, 8192 / (g.c + g.o) / slots_per_image(Dims(g, false)));
}

// Two tiles' 16 lanes each, rounded to bf16 and interleaved into 16 pair words (word j: lane j of a, of b).
inline void store_pair(bf16* dst, __m512 a, __m512 b) {
  _mm512_store_si512(dst, simd16::join_pairs((__m512i)_mm512_cvtne2ps_pbh(b, a)));
}

// B^T x B of every tile of one image (nChw16c) into U [16 positions, `stride` apart][C / 16][T slots / 2][16
// pair words], the image's slots from 0: a tile pair's 6 columns a step.
void transform_input_pairs(const Dims& d, const bf16* img, int64_t T, int64_t stride, const bf16* zeros,
                           bf16* u) {
  const int64_t tw2 = row_slots(d);
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t cb = 0; cb < d.ci / 16; ++cb) {
    const bf16* plane = img + cb * d.h * d.w * 16;
    for (int64_t ty = 0; ty < d.h / 2; ++ty) {
      const WindowRows rows(d, plane, ty, zeros);
      __m512 c[6][4];
      rows.column(-1, c[0]);
      rows.column(0, c[1]);
      for (int64_t tx = 0; tx < d.tw; tx += 2) {
        const bool second = tx + 1 < d.tw;  // else the zero slot after an odd row's last tile
        for (int k = 2; k < 6; ++k) rows.column(2 * tx - 1 + k, c[k]);
        bf16* ut = u + (cb * T + ty * tw2 + tx) * 16;
        for (int r = 0; r < 4; ++r) {
          __m512 a[4], b[4] = {zero, zero, zero, zero};
          tile_row(c[0], c[1], c[2], c[3], r, a);
          if (second) tile_row(c[2], c[3], c[4], c[5], r, b);
          for (int k = 0; k < 4; ++k) store_pair(ut + (r * 4 + k) * stride, a[k], b[k]);
        }
        for (int r = 0; r < 4; ++r) {
          c[0][r] = c[4][r];
          c[1][r] = c[5][r];
        }
      }
    }
  }
}

// A dy A^T of one tile (16 lanes of channels) at r0 (its first row; the second one row down): 16 positions.
inline void grad_tile(const bf16* r0, int64_t row, __m512 v[16]) {
  const __m512 zero = _mm512_setzero_ps();
  // A's rows on each row of the tile (x0, x0 + x1, x0 - x1, -x1), then on each column.
  __m512 c[2][4];
  for (int i = 0; i < 2; ++i) {
    const __m512 a = simd16::load(r0 + i * row), b = simd16::load(r0 + i * row + 16);
    c[i][0] = a;
    c[i][1] = _mm512_add_ps(a, b);
    c[i][2] = _mm512_sub_ps(a, b);
    c[i][3] = _mm512_sub_ps(zero, b);
  }
  for (int j = 0; j < 4; ++j) {
    v[j] = c[0][j];
    v[4 + j] = _mm512_add_ps(c[0][j], c[1][j]);
    v[8 + j] = _mm512_sub_ps(c[0][j], c[1][j]);
    v[12 + j] = _mm512_sub_ps(zero, c[1][j]);
  }
}

// A dy A^T of every 2x2 tile of one image's dy (nChw16c) into W [16 positions][O / 16][T slots / 2][16 pair
// words], the image's slots from 0.
void transform_grad_pairs(const Dims& d, const bf16* img, int64_t T, bf16* w) {
  const int64_t obs = d.co / 16, stride = position_stride(d.co, T), tw2 = row_slots(d);
  for (int64_t ob = 0; ob < obs; ++ob) {
    const bf16* plane = img + ob * d.h * d.w * 16;
    for (int64_t ty = 0; ty < d.h / 2; ++ty)
      for (int64_t tx = 0; tx < d.tw; tx += 2) {
        const bf16* r0 = plane + (2 * ty * d.w + 2 * tx) * 16;
        __m512 a[16], b[16];
        grad_tile(r0, d.w * 16, a);
        if (tx + 1 < d.tw)
          grad_tile(r0 + 32, d.w * 16, b);
        else
          for (int p = 0; p < 16; ++p) b[p] = _mm512_setzero_ps();
        bf16* wt = w + (ob * T + ty * tw2 + tx) * 16;
        for (int p = 0; p < 16; ++p) store_pair(wt + p * stride, a[p], b[p]);
      }
  }
}

// M_p[c][o] += U_p W_p over the chunk's tile pairs (M set when `fresh`), M [16 positions][O / 16][C][16 lanes
// of o]: 16 input channels' registers, one W pair vector and 16 broadcast U pairs a step.
void accumulate_grad(const ConvGeom& g, const uint32_t* u, const uint32_t* w, int64_t T, float* m,
                     bool fresh) {
  const int64_t cbs = g.c / 16, obs = g.o / 16, pairs = T / 2;
  const int64_t ustride = position_stride(g.c, T) / 2, wstride = position_stride(g.o, T) / 2;  // words
  for (int p = 0; p < 16; ++p)
    for (int64_t ob = 0; ob < obs; ++ob) {
      const uint32_t* wp = w + p * wstride + ob * pairs * 16;
      for (int64_t cb = 0; cb < cbs; ++cb) {
        float* mp = m + ((p * obs + ob) * g.c + cb * 16) * 16;
        const uint32_t* up = u + p * ustride + cb * pairs * 16;
        __m512 acc[16];
        for (int c = 0; c < 16; ++c) acc[c] = fresh ? _mm512_setzero_ps() : _mm512_load_ps(mp + c * 16);
        for (int64_t k = 0; k < pairs; ++k) {
          const __m512bh b = (__m512bh)_mm512_load_si512(wp + k * 16);
          for (int c = 0; c < 16; ++c)
            acc[c] =
                _mm512_dpbf16_ps(acc[c], (__m512bh)_mm512_set1_epi32(static_cast<int>(up[k * 16 + c])), b);
        }
        for (int c = 0; c < 16; ++c) _mm512_store_ps(mp + c * 16, acc[c]);
      }
    }
}

}  // namespace

bool wino3x3_bf16_serves(const ConvGeom& g) {
  return has_avx512_bf16() && g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.ph == 1 && g.pw == 1 &&
         g.dh == 1 && g.dw == 1 && g.groups == 1 && g.c % 16 == 0 && g.o % 16 == 0 && g.h % 2 == 0 &&
         g.w % 2 == 0 && g.oh == g.h && g.ow == g.w;
}

size_t wino3x3_bf16_weight_bytes(const ConvGeom& g) {
  return static_cast<size_t>(16 * g.o * g.c * 2);
}

size_t wino3x3_bf16_scratch_bytes(const ConvGeom& g) {
  return u_bytes(g) + kMBytes + static_cast<size_t>(g.w * 16 * 2);
}

int64_t wino3x3_bf16_items(const ConvGeom& g) {
  return g.n * Dims(g, false).blocks;
}

// V_p = (G g G^T)_p for every (co, ci), as [16 positions][co / 16][ci / 2][16 lanes of co][2 of ci] bf16.
// A task is 16 output channels (lanes) by 16 input channels: their filters are first widened into
// f[ci][tap][lane] by contiguous reads (a gather per value took 6 cycles an element), then transformed 16
// lanes a register.
void wino3x3_bf16_weights(const ConvGeom& g, bool grad_input, const bf16* w, void* v) {
  FR_CHECK(wino3x3_bf16_serves(g), "wino3x3_bf16: unsupported geometry");
  const Dims d(g, grad_input);
  const int64_t pairs = d.ci / 2, obs = d.co / 16, cbs = d.ci / 16;
  auto* out = static_cast<uint32_t*>(v);
  parallel_for(obs * cbs, 1, [&](int64_t begin, int64_t end) {
    const __m512 half = _mm512_set1_ps(0.5f);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t ob = i / cbs, cb = i % cbs;
      alignas(64) float f[16][9][16];
      for (int64_t a = 0; a < 16; ++a)
        for (int64_t b = 0; b < 16; ++b) {
          // Forward: w[co][ci], co = ob * 16 + a (lane a), ci = cb * 16 + b. Input gradient: filter (co, ci)
          // is w[ci][co] flipped, so the run of 9 taps read is w[o = cb * 16 + a][c = ob * 16 + b] reversed.
          const int64_t lane = grad_input ? b : a, c = grad_input ? a : b;
          const bf16* src = grad_input ? w + ((cb * 16 + a) * g.c + ob * 16 + b) * 9
                                       : w + ((ob * 16 + a) * g.c + cb * 16 + b) * 9;
          for (int tap = 0; tap < 9; ++tap) f[c][grad_input ? 8 - tap : tap][lane] = bf16_to_float(src[tap]);
        }
      for (int64_t k = 0; k < 8; ++k) {
        alignas(64) uint16_t words[16][32];  // per position: ci = 2k's 16 lanes, then 2k + 1's
        for (int h = 0; h < 2; ++h) {
          const float(*fc)[16] = f[2 * k + h];
          __m512 a[4][3];
          for (int j = 0; j < 3; ++j) {
            const __m512 g0 = _mm512_load_ps(fc[j]), g1 = _mm512_load_ps(fc[3 + j]),
                         g2 = _mm512_load_ps(fc[6 + j]);
            a[0][j] = g0;
            a[1][j] = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(g0, g1), g2), half);
            a[2][j] = _mm512_mul_ps(_mm512_add_ps(_mm512_sub_ps(g0, g1), g2), half);
            a[3][j] = g2;
          }
          for (int r = 0; r < 4; ++r) {
            const __m512 b[4] = {
                a[r][0], _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(a[r][0], a[r][1]), a[r][2]), half),
                _mm512_mul_ps(_mm512_add_ps(_mm512_sub_ps(a[r][0], a[r][1]), a[r][2]), half), a[r][2]};
            for (int c = 0; c < 4; ++c)
              _mm256_store_si256(reinterpret_cast<__m256i*>(words[r * 4 + c] + 16 * h), to_bf16(b[c]));
          }
        }
        for (int p = 0; p < 16; ++p)
          _mm512_store_si512(out + ((p * obs + ob) * pairs + cb * 8 + k) * 16,
                             simd16::join_pairs(_mm512_load_si512(words[p])));
      }
    }
  });
}

void wino3x3_bf16(const ConvGeom& g, bool grad_input, const bf16* in, const void* v, const bf16* bias,
                  bf16* out, int64_t i0, int64_t i1, void* scratch) {
  FR_CHECK(wino3x3_bf16_serves(g), "wino3x3_bf16: unsupported geometry");
  FR_CHECK(!grad_input || !bias, "wino3x3_bf16: a bias in the input gradient");
  const Dims d(g, grad_input);
  auto* u = static_cast<bf16*>(scratch);
  auto* m = reinterpret_cast<float*>(static_cast<char*>(scratch) + u_bytes(g));
  auto* zeros = reinterpret_cast<bf16*>(static_cast<char*>(scratch) + u_bytes(g) + kMBytes);
  std::fill_n(reinterpret_cast<uint16_t*>(zeros), d.w * 16, uint16_t{0});
  const int64_t in_img = d.ci * d.h * d.w, out_img = d.co * d.h * d.w;
  for (int64_t item = i0; item < i1; ++item) {
    const int64_t n = item / d.blocks, t0 = item % d.blocks * kTiles,
                  nt = std::min<int64_t>(kTiles, d.tiles - t0);
    transform_input(d, in + n * in_img, t0, nt, zeros, u);
    for (int64_t ob = 0; ob < d.co / 16; ++ob) {
      multiply(d, reinterpret_cast<const uint32_t*>(u), static_cast<const uint32_t*>(v), ob, m);
      transform_output(d, m, t0, nt, ob, bias, out + n * out_img);
    }
  }
}

size_t wino3x3_bf16_wgrad_scratch_bytes(const ConvGeom& g) {
  const int64_t T = slots_per_image(Dims(g, false)) * images_per_chunk(g);
  return static_cast<size_t>(16 * (position_stride(g.c, T) + position_stride(g.o, T)) * 2 + g.w * 16 * 2);
}

int64_t wino3x3_bf16_wgrad_partial_elems(const ConvGeom& g) {
  return 16 * g.c * g.o;
}

void wino3x3_bf16_wgrad(const ConvGeom& g, int64_t n0, int64_t n1, const bf16* dy, const bf16* x,
                        float* partial, void* scratch) {
  FR_CHECK(wino3x3_bf16_serves(g), "wino3x3_bf16_wgrad: unsupported geometry");
  const Dims d(g, false);
  const int64_t per = images_per_chunk(g), T1 = slots_per_image(d);
  auto* u = static_cast<bf16*>(scratch);
  bf16* w = u + 16 * position_stride(g.c, T1 * per);
  bf16* zeros = w + 16 * position_stride(g.o, T1 * per);
  std::fill_n(reinterpret_cast<uint16_t*>(zeros), g.w * 16, uint16_t{0});
  const int64_t ximg = g.c * g.h * g.w, yimg = g.o * g.h * g.w;
  for (int64_t n = n0; n < n1; n += per) {
    const int64_t count = std::min(per, n1 - n), T = T1 * count;
    for (int64_t i = 0; i < count; ++i) {
      transform_input_pairs(d, x + (n + i) * ximg, T, position_stride(g.c, T), zeros, u + i * T1 * 16);
      transform_grad_pairs(d, dy + (n + i) * yimg, T, w + i * T1 * 16);
    }
    accumulate_grad(g, reinterpret_cast<const uint32_t*>(u), reinterpret_cast<const uint32_t*>(w), T, partial,
                    n == n0);
  }
}

// The partials added in order, then G^T M G per (c, o), 16 output channels a register.
void wino3x3_bf16_wgrad_finish(const ConvGeom& g, const float* partials, int64_t count, int64_t stride,
                               bf16* dw) {
  const int64_t obs = g.o / 16;
  parallel_for(obs * g.c, 16, [&](int64_t begin, int64_t end) {
    const __m512 half = _mm512_set1_ps(0.5f);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t ob = i / g.c, c = i % g.c;
      __m512 m[16];
      for (int p = 0; p < 16; ++p) {
        const int64_t at = ((p * obs + ob) * g.c + c) * 16;
        m[p] = _mm512_load_ps(partials + at);
        for (int64_t b = 1; b < count; ++b)
          m[p] = _mm512_add_ps(m[p], _mm512_load_ps(partials + b * stride + at));
      }
      // G^T's rows (m0 + (m1 + m2) / 2, (m1 - m2) / 2, (m1 + m2) / 2 + m3) down the columns, then along rows.
      __m512 s[3][4];
      for (int j = 0; j < 4; ++j) {
        const __m512 sum = _mm512_mul_ps(_mm512_add_ps(m[4 + j], m[8 + j]), half);
        s[0][j] = _mm512_add_ps(m[j], sum);
        s[1][j] = _mm512_mul_ps(_mm512_sub_ps(m[4 + j], m[8 + j]), half);
        s[2][j] = _mm512_add_ps(sum, m[12 + j]);
      }
      alignas(64) float r[9][16];
      for (int k = 0; k < 3; ++k) {
        const __m512 sum = _mm512_mul_ps(_mm512_add_ps(s[k][1], s[k][2]), half);
        _mm512_store_ps(r[k * 3], _mm512_add_ps(s[k][0], sum));
        _mm512_store_ps(r[k * 3 + 1], _mm512_mul_ps(_mm512_sub_ps(s[k][1], s[k][2]), half));
        _mm512_store_ps(r[k * 3 + 2], _mm512_add_ps(sum, s[k][3]));
      }
      for (int lane = 0; lane < 16; ++lane)
        for (int tap = 0; tap < 9; ++tap)
          dw[((ob * 16 + lane) * g.c + c) * 9 + tap] = float_to_bf16(r[tap][lane]);
    }
  });
}

#else  // no avx512_bf16 in this build: oneDNN computes every bf16 convolution

bool wino3x3_bf16_serves(const ConvGeom&) {
  return false;
}
size_t wino3x3_bf16_weight_bytes(const ConvGeom&) {
  return 0;
}
size_t wino3x3_bf16_scratch_bytes(const ConvGeom&) {
  return 0;
}
int64_t wino3x3_bf16_items(const ConvGeom&) {
  return 0;
}
void wino3x3_bf16_weights(const ConvGeom&, bool, const bf16*, void*) {
  FR_CHECK(false, "wino3x3_bf16: not built (needs avx512_bf16)");
}
void wino3x3_bf16(const ConvGeom&, bool, const bf16*, const void*, const bf16*, bf16*, int64_t, int64_t,
                  void*) {
  FR_CHECK(false, "wino3x3_bf16: not built (needs avx512_bf16)");
}

size_t wino3x3_bf16_wgrad_scratch_bytes(const ConvGeom&) {
  return 0;
}
int64_t wino3x3_bf16_wgrad_partial_elems(const ConvGeom&) {
  return 0;
}
void wino3x3_bf16_wgrad(const ConvGeom&, int64_t, int64_t, const bf16*, const bf16*, float*, void*) {
  FR_CHECK(false, "wino3x3_bf16_wgrad: not built (needs avx512_bf16)");
}
void wino3x3_bf16_wgrad_finish(const ConvGeom&, const float*, int64_t, int64_t, bf16*) {
  FR_CHECK(false, "wino3x3_bf16_wgrad: not built (needs avx512_bf16)");
}

#endif

}  // namespace flowrun::cpu
