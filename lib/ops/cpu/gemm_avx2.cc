// flowrun's f32 GEMM for AVX2 (gemm_avx2.h says why and what it computes).
//
// BLIS's loop order: y is cut into kTileM x kTileN tiles, one thread each (narrower ones where there would be
// fewer than two per thread; a tile's shape changes no element's sum); a tile's K sum runs in blocks of kKC,
// and each block in 6 x 16 register tiles (kMR x kNR: 12 ymm accumulators, one broadcast of a and two loads
// of b per k), which sum into the tile's f32 accumulator rows (an exact store and reload between blocks, so
// the chain is the same). Both operands are packed k-major: op(b) once per call in panels of 16 columns,
// zero-padded, read by every tile; op(a) in strips of 6 rows, a tile row's strips by the thread that runs
// them, into its own buffer, right before its tiles (packed up front, a's strips went to memory and back in a
// pass that only moved memory: with it in the tiles, gpt-tiny's products rose 4-10%, 1024^3 153 -> 169
// GFLOP/s on 2 threads, best of 3 alternating). A k block of a panel (kKC x 16
// floats, 16 KiB) stays in L1 while the tile's strips pass over it, the tile's strips (132 x kKC, 132 KiB) in
// L2: 132 rows are 22 whole strips (with 128 the last strip held 2 rows, and 4 accumulator chains could not
// hide the FMA latency: 1024^3 ran at 75 GFLOP/s on one thread against 83 with 132, best of 5 alternating
// runs). Read in place instead, a's rows (4 KiB apart in a 1024^3 product) fell into one L1 set and a
// transposed a took a page per k: single-thread rates on Zen 3 rose from 50-65 to 57-75 GFLOP/s
// (flowrun_bench, best of 3 alternating).
#include "ops/cpu/gemm_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/cpu/dnnl_matmul.h"
#include "ops/cpu/grow_buffer.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/transpose8.h"

// Compiled for AVX2 and FMA whatever the build's -march, and run only where the CPU has them.
#define FR_AVX2 __attribute__((target("avx2,fma")))

namespace flowrun::cpu {

namespace {

constexpr int64_t kMR = 6, kNR = 16, kTileM = 132, kTileN = 128, kKC = 256;
constexpr int64_t kAccN = 256;  // the widest tile (blockwise below)
// Floats from one packed strip of op(a) to the next, and from one panel of op(b) to the next: a line more
// than the data. Without it strips of k = 2048 were 48 KiB apart, and the 22 written together, a few bytes
// each per k, all fell into one L1 set (panels likewise from k = 64 on).
constexpr int64_t strip_stride(int64_t k) {
  return k * kMR + 16;
}
constexpr int64_t panel_stride(int64_t k) {
  return k * kNR + 16;
}
// Panels of a b that is not transposed packed by one task: 128 columns, eight lines of each of b's rows.
constexpr int64_t kGroupB = 8;

// Rows i.. of op(a) (m x k) as k rows of kMR floats at out: `rows` (<= kMR) of them, the rest unused.
FR_AVX2 void pack_strip(const float* a, int64_t lda, bool ta, int64_t k, int64_t i, int64_t rows,
                        float* out) {
  int64_t q = 0;
  if (ta) {
    // Row i of op(a) is column i of a: the strip's rows are adjacent in each of a's rows. A whole strip moves
    // as 4 + 2 floats per k (a memcpy of its variable length was a library call per k: the packing took a
    // fifth of a weight gradient's product on Zen 3).
    if (rows == kMR)
      for (; q < k; ++q) {
        const float* s = a + q * lda + i;
        _mm_storeu_ps(out + q * kMR, _mm_loadu_ps(s));
        _mm_storel_pi(reinterpret_cast<__m64*>(out + q * kMR + 4),
                      _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(s + 4))));
      }
    for (; q < k; ++q) std::memcpy(out + q * kMR, a + q * lda + i, static_cast<size_t>(rows) * sizeof(float));
    return;
  }
  if (rows == kMR)
    for (; q + 8 <= k; q += 8) {
      __m256 r[8];
      for (int j = 0; j < kMR; ++j) r[j] = _mm256_loadu_ps(a + (i + j) * lda + q);
      r[6] = r[7] = _mm256_setzero_ps();
      transpose8(r);
      for (int j = 0; j < 8; ++j) {  // the first 6 of each row of 8
        _mm_storeu_ps(out + (q + j) * kMR, _mm256_castps256_ps128(r[j]));
        _mm_storel_pi(reinterpret_cast<__m64*>(out + (q + j) * kMR + 4), _mm256_extractf128_ps(r[j], 1));
      }
    }
  for (; q < k; ++q)
    for (int64_t j = 0; j < rows; ++j) out[q * kMR + j] = a[(i + j) * lda + q];
}

// The packings that read a few hundred bytes from each of many rows (a page or more apart, so the hardware's
// stream prefetch, which stays within a page, does not follow) ask for the row kAhead ahead. With it and the
// strides above, the packing's share of gpt-tiny's 1024 x 2048 x 256 weight gradient (one thread, perf) went
// from 22% to 12%; 2 threads 138 -> 151 GFLOP/s (best of 3 alternating).
constexpr int64_t kAhead = 8;
FR_AVX2 void prefetch_lines(const float* p, int64_t floats) {
  for (int64_t c = 0; c < floats; c += 16) _mm_prefetch(reinterpret_cast<const char*>(p + c), _MM_HINT_T0);
}

// n whole strips from row i of op(a) = a^T (a's columns i.. as k rows of kMR floats each), q-major: each of
// a's rows is read once for all n strips, as whole cache lines. Strip by strip, a weight gradient's packing
// read 24 bytes of a line and touched a page per k (rows 4 KiB apart): a fifth of dy^T x's time (gpt-tiny's
// 1024 x 2048 x 256 on one thread, perf).
FR_AVX2 void pack_strips_t(const float* a, int64_t lda, int64_t k, int64_t i, int64_t n, float* out) {
  for (int64_t q = 0; q < k; ++q) {
    const float* s = a + q * lda + i;
    if (q + kAhead < k) prefetch_lines(s + kAhead * lda, n * kMR);
    for (int64_t p = 0; p < n; ++p) {
      float* o = out + p * strip_stride(k) + q * kMR;
      _mm_storeu_ps(o, _mm_loadu_ps(s + p * kMR));
      _mm_storel_pi(reinterpret_cast<__m64*>(o + 4),
                    _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(s + p * kMR + 4))));
    }
  }
}

// Whole panels [p0, p1) of op(b) = b (k x n, not transposed), row-major: each of b's rows read once for all
// of them, as pack_strips_t reads a's; a panel at a time read 64 bytes from rows 4 KiB apart.
FR_AVX2 void pack_panels(const float* b, int64_t ldb, int64_t k, int64_t p0, int64_t p1, float* out) {
  for (int64_t r = 0; r < k; ++r) {
    if (r + kAhead < k) prefetch_lines(b + (r + kAhead) * ldb + p0 * kNR, (p1 - p0) * kNR);
    for (int64_t p = p0; p < p1; ++p) {
      const float* s = b + r * ldb + p * kNR;
      float* o = out + (p - p0) * panel_stride(k) + r * kNR;
      _mm256_store_ps(o, _mm256_loadu_ps(s));
      _mm256_store_ps(o + 8, _mm256_loadu_ps(s + 8));
    }
  }
}

// Panel p of op(b) (k x n): its columns 16p.. as k rows of kNR floats, the columns past n zero.
FR_AVX2 void pack_panel(const float* b, int64_t ldb, bool tb, int64_t k, int64_t n, int64_t p, float* out) {
  const int64_t j0 = p * kNR, w = std::min(kNR, n - j0);
  int64_t r = 0;
  if (!tb && w == kNR) {
    for (; r < k; ++r) {
      _mm256_store_ps(out + r * kNR, _mm256_loadu_ps(b + r * ldb + j0));
      _mm256_store_ps(out + r * kNR + 8, _mm256_loadu_ps(b + r * ldb + j0 + 8));
    }
  } else if (tb && w == kNR) {
    // Column j of op(b) is row j of b.
    for (; r + 8 <= k; r += 8)
      for (int64_t h = 0; h < kNR; h += 8) {
        __m256 t[8];
        for (int j = 0; j < 8; ++j) t[j] = _mm256_loadu_ps(b + (j0 + h + j) * ldb + r);
        transpose8(t);
        for (int j = 0; j < 8; ++j) _mm256_store_ps(out + (r + j) * kNR + h, t[j]);
      }
  }
  for (; r < k; ++r)
    for (int64_t c = 0; c < kNR; ++c)
      out[r * kNR + c] = c >= w ? 0.0f : tb ? b[(j0 + c) * ldb + r] : b[r * ldb + j0 + c];
}

// R rows (R <= kMR) of a strip's kc-row block times that of a panel, into R x kNR accumulators at acc (rows
// lda apart), which start at zero on the first block and hold the sums so far after it.
template <int R>
FR_AVX2 void micro(int64_t kc, const float* a, const float* bp, float* acc, int64_t lda, bool first) {
  __m256 c0[R], c1[R];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    c0[r] = first ? _mm256_setzero_ps() : _mm256_load_ps(acc + r * lda);
    c1[r] = first ? _mm256_setzero_ps() : _mm256_load_ps(acc + r * lda + 8);
  }
#pragma GCC unroll 4
  for (int64_t q = 0; q < kc; ++q) {
    const __m256 b0 = _mm256_load_ps(bp + q * kNR), b1 = _mm256_load_ps(bp + q * kNR + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_broadcast_ss(a + q * kMR + r);
      c0[r] = _mm256_fmadd_ps(x, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(x, b1, c1[r]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(acc + r * lda, c0[r]);
    _mm256_store_ps(acc + r * lda + 8, c1[r]);
  }
}

using Micro = void (*)(int64_t, const float*, const float*, float*, int64_t, bool);
constexpr std::array<Micro, kMR> kMicros =
    kernel_table<Micro, kMR>([](auto r) -> Micro { return &micro<decltype(r)::value>; });

// A tile's rows as strips of kMR: a tile row's kStrips strips, packed together by the thread that runs it.
constexpr int64_t kStrips = (kTileM + kMR - 1) / kMR;

struct Job {
  int64_t m, n, k, ldy;
  int64_t tile_n;  // columns of a tile: kTileN (kAccN, blockwise), or fewer (a multiple of kNR) to give every
                   // thread tiles
  float alpha, beta;
  const float* bias;
  float* y;
  const float* b;    // op(b) in panels: per matrix, (n / kNR rounded up) panels of k x kNR
  int64_t b_stride;  // floats from one matrix's panels to the next's (0: shared)
  // op(a) packed a k block at a time in the tile (blockwise) rather than a tile row at a time before it.
  const float* a;
  int64_t lda, a_stride;
  bool ta, blockwise;
};

// The strips of op(a)'s tile row `row` (rows kTileM row.. of m) at out, strip_stride(k) floats apart.
FR_AVX2 void pack_tile_row(const float* a, int64_t lda, bool ta, int64_t m, int64_t k, int64_t row,
                           float* out) {
  static_assert(kTileM % kMR == 0);
  const int64_t s0 = row * kStrips, s1 = std::min(s0 + kStrips, (m + kMR - 1) / kMR);
  int64_t strip = s0;
  if (ta) {
    const int64_t whole = std::clamp(m / kMR, s0, s1);
    if (whole > s0) pack_strips_t(a, lda, k, s0 * kMR, whole - s0, out);
    strip = whole;
  }
  for (; strip < s1; ++strip)
    pack_strip(a, lda, ta, k, strip * kMR, std::min(kMR, m - strip * kMR),
               out + (strip - s0) * strip_stride(k));
}

// Tile (row, j0) of matrix `mat`: mt x nt of y, through the accumulator rows `acc`, from `strips`: its tile
// row's strips (pack_tile_row), or where blockwise the buffer each k block of them is packed into.
FR_AVX2 void run_tile(const Job& g, int64_t mat, int64_t row, int64_t j0, float* strips, float* acc) {
  const int64_t i0 = row * kTileM;
  const int64_t mt = std::min(kTileM, g.m - i0), nt = std::min(g.tile_n, g.n - j0),
                panels = (nt + kNR - 1) / kNR;
  // The accumulator rows as wide as the tile, so that a narrow tile's take no more cache than its data.
  const int64_t ld = g.tile_n;
  const float* b = g.b + mat * g.b_stride + j0 / kNR * panel_stride(g.k);  // j0 / kNR panels of k x kNR in
  if (g.k == 0)
    for (int64_t r = 0; r < mt; ++r)
      std::memset(acc + r * ld, 0, static_cast<size_t>(panels * kNR) * sizeof(float));
  for (int64_t k0 = 0; k0 < g.k; k0 += kKC) {
    const int64_t kc = std::min(kKC, g.k - k0);
    const float* ak = strips + k0 * kMR;
    int64_t astride = strip_stride(g.k);
    if (g.blockwise) {
      pack_tile_row(g.a + mat * g.a_stride + (g.ta ? k0 * g.lda : k0), g.lda, g.ta, g.m, kc, row, strips);
      ak = strips;
      astride = strip_stride(kc);
    }
    for (int64_t p = 0; p < panels; ++p) {
      const float* bp = b + p * panel_stride(g.k) + k0 * kNR;
      for (int64_t ir = 0; ir < mt; ir += kMR)
        kMicros[static_cast<size_t>(std::min(kMR, mt - ir) - 1)](kc, ak + ir / kMR * astride, bp,
                                                                 acc + ir * ld + p * kNR, ld, k0 == 0);
    }
  }
  // y = fma(beta, y, alpha * acc + bias), 8 columns at a time and the rest one by one, with the same
  // roundings.
  const __m256 va = _mm256_set1_ps(g.alpha), vb = _mm256_set1_ps(g.beta);
  for (int64_t r = 0; r < mt; ++r) {
    const float* s = acc + r * ld;
    float* y = g.y + mat * g.m * g.ldy + (i0 + r) * g.ldy + j0;
    const float* bias = g.bias ? g.bias + j0 : nullptr;
    int64_t c = 0;
    for (; c + 8 <= nt; c += 8) {
      __m256 v = _mm256_load_ps(s + c);
      if (g.alpha != 1.0f) v = _mm256_mul_ps(v, va);
      if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + c));
      if (g.beta != 0.0f) v = _mm256_fmadd_ps(vb, _mm256_loadu_ps(y + c), v);
      _mm256_storeu_ps(y + c, v);
    }
    for (; c < nt; ++c) {
      float v = s[c];
      if (g.alpha != 1.0f) v *= g.alpha;
      if (bias) v += bias[c];
      if (g.beta != 0.0f) v = std::fma(g.beta, y[c], v);
      y[c] = v;
    }
  }
}

}  // namespace

bool gemm_avx2_applies() {
  static const bool yes =
      dnnl_gemm_driver() && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

void gemm_avx2(int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb, int64_t a_stride,
               int64_t b_stride, float alpha, float beta, const float* a, int64_t lda, const float* b,
               int64_t ldb, const float* bias, float* y, int64_t ldy) {
  if (batch == 0 || m == 0 || n == 0) return;
  const int64_t rows = (m + kTileM - 1) / kTileM, panels = (n + kNR - 1) / kNR;
  const int64_t b_mats = b_stride == 0 ? 1 : batch, b_size = panels * panel_stride(k);
  // op(b)'s panels, packed once for every tile. One buffer for every call: dnnl_matmul's callers hold its
  // mutex, so calls run one at a time. A task packs one panel, or kGroupB of a b that is not transposed.
  static GrowBuffer packed;
  auto* bp = static_cast<float*>(packed.reserve(static_cast<size_t>(b_mats * b_size) * sizeof(float)));
  const int64_t bgroup = tb ? 1 : kGroupB, btasks = (panels + bgroup - 1) / bgroup;
  parallel_for_units(b_mats * btasks, [&](int64_t u) {
    const int64_t mat = u / btasks, p0 = u % btasks * bgroup, p1 = std::min(p0 + bgroup, panels),
                  whole = tb ? p0 : std::clamp(n / kNR, p0, p1);
    const float* bm = b + mat * b_stride;
    float* out = bp + mat * b_size;
    if (whole > p0) pack_panels(bm, ldb, k, p0, whole, out + p0 * panel_stride(k));
    for (int64_t p = whole; p < p1; ++p) pack_panel(bm, ldb, tb, k, n, p, out + p * panel_stride(k));
  });
  // Narrower tiles where the product has fewer tiles than twice the threads (the bench CNN's classifier,
  // 64 x 3136 x 128, was one tile: one thread ran it at 47 GFLOP/s). A tile's shape changes no element's sum.
  // A transposed a with K over one block (a weight gradient, dy^T x) is packed a k block at a time in the
  // tile, into 132 x kKC floats that stay in L2, where its tile row is one tile wide (n <= kAccN): packed
  // whole, a row of gpt-tiny's (132 x 2048, 1 MiB) went to L3 and back, and its reads of dy (a few hundred
  // bytes of each of K rows) waited on memory. gpt-tiny's 768 x 2048 x 256, 2 threads, operands out of
  // cache: 125-132 -> 133-140 GFLOP/s; its step faster in 4 of 4 alternating pairs (medians 311-356 ->
  // 307-321 ms). Not for an a that is not transposed: no gain (its strips are read along a's rows). Such rows
  // stay whole while every thread has one: gpt-tiny's 256 x 2048 x 256, narrowed to four tiles that each
  // packed its row whole, ran at 73-100 GFLOP/s out of cache, at 82-119 as two (3 of 3 alternating). For n up
  // to 1024 with 132 x n accumulators: 256 x 2048 x 1024 106-121 -> 84-108, so not past kAccN.
  const bool wide = ta && k > kKC && n <= kAccN;
  int64_t tile_n = wide ? kAccN : kTileN;
  const int64_t threads = omp_get_max_threads();
  if (!wide || batch * rows < threads)
    while (tile_n > kNR && batch * rows * ((n + tile_n - 1) / tile_n) < 2 * threads) tile_n /= 2;
  const int64_t cols = (n + tile_n - 1) / tile_n;
  const Job g{m, n,   k,        ldy, tile_n,           alpha, beta, bias, y, bp, b_stride == 0 ? 0 : b_size,
              a, lda, a_stride, ta,  wide && cols == 1};
  // op(a)'s strips: a thread packs a tile row's when its tiles reach it (the comment at the top says why); a
  // row whose tiles two threads share is packed by both. Tiles are handed out as parallel_for_units does:
  // each thread's share row by row, then the others' from their ends.
  // Each team member's accumulator rows and strips, by thread number (calls run one at a time, as above),
  // reserved here: a thread that took no tile in the first steps would allocate in a later one.
  struct Scratch {
    GrowBuffer acc, strips;
    int64_t have = -1;  // the tile row in strips, as a_mat * rows + row, in this call
  };
  static std::vector<Scratch> scratch;
  const auto slots = static_cast<size_t>(std::max<int64_t>(threads, omp_get_thread_num() + 1));
  if (scratch.size() < slots) scratch.resize(slots);
  constexpr size_t acc_bytes = static_cast<size_t>(kTileM * kAccN) * sizeof(float);
  const size_t strip_floats = static_cast<size_t>(kStrips * strip_stride(g.blockwise ? kKC : k));
  for (Scratch& sc : scratch) {
    sc.acc.reserve(acc_bytes);
    sc.strips.reserve(strip_floats * sizeof(float));
    sc.have = -1;
  }
  parallel_for_units(batch * rows * cols, [&](int64_t t) {
    Scratch& sc = scratch[static_cast<size_t>(omp_get_thread_num())];
    auto* ap = static_cast<float*>(sc.strips.data());
    const int64_t mat = t / (rows * cols), row = t % (rows * cols) / cols,
                  key = (a_stride == 0 ? 0 : mat) * rows + row;
    if (!g.blockwise && key != sc.have) {
      pack_tile_row(a + mat * a_stride, lda, ta, m, k, row, ap);
      sc.have = key;
    }
    run_tile(g, mat, row, t % cols * tile_n, ap, static_cast<float*>(sc.acc.data()));
  });
}

}  // namespace flowrun::cpu
