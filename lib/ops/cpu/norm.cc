// CPU normalisation kernels: layernorm and rmsnorm one contiguous row at a time (rows in parallel, the row
// re-read from cache), batchnorm per channel. Every reduction runs in a fixed order, independent of the
// thread count, so results are bitwise reproducible.
#include "ops/cpu/norm.h"

#include <cmath>
#include <cstddef>
#include <type_traits>

#include "ops/cpu/conv.h"
#include "ops/cpu/elementwise.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/prefetch.h"
#include "ops/cpu/simd16.h"

namespace flowrun::cpu {

namespace {

// The elementwise loops carry `omp simd`: outputs never alias inputs (no in-place reuse is declared), and
// without it GCC's runtime alias checks send some of them to scalar code.

// Elements of work below which a parallel loop runs inline.
constexpr int64_t kGrain = 1 << 14;

// Adds the lanes of acc in a fixed pairwise order.
template <typename T, int L>
inline T fold(T (&acc)[L]) {
  for (int w = L / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}

// sum_{i<n} f(i) into independent lanes (four vector registers): the loop vectorises and pipelines
// without -ffast-math, and the fixed fold keeps the result deterministic.
template <typename T, typename F>
inline T lane_sum(int64_t n, F f) {
  constexpr int L = 4 * 64 / static_cast<int>(sizeof(T));
  T acc[L] = {};
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int k = 0; k < L; ++k) acc[k] += f(i + k);
  for (int k = 0; i + k < n; ++k) acc[k] += f(i + k);
  return fold(acc);
}

// Two sums in one pass over the data (the grads need sum(g dy) and sum(g dy xhat) of the same row).
template <typename T, typename F, typename G>
inline void lane_sum2(int64_t n, F f, G g, T& sf, T& sg) {
  constexpr int L = 2 * 64 / static_cast<int>(sizeof(T));
  T a[L] = {}, b[L] = {};
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int k = 0; k < L; ++k) {
      a[k] += f(i + k);
      b[k] += g(i + k);
    }
  for (int k = 0; i + k < n; ++k) {
    a[k] += f(i + k);
    b[k] += g(i + k);
  }
  sf = fold(a);
  sg = fold(b);
}

// Rows of at least ~kGrain elements per thread.
int64_t row_grain(int64_t d) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(d, 1));
}

template <typename T>
T eps_of(const KernelCtx& c, double dflt) {
  return static_cast<T>(c.attrs().f("eps", dflt));
}

// The parameters, statistics and parameter gradients of a norm kernel whose activations are stored as S:
// S's compute type (f32 for bf16: the mixed-precision kernels' KernelDef::f32_inputs).
template <typename S>
Compute<S>* param_data(const TensorView& t) {
  FR_CHECK(t.dtype == dtype_of<Compute<S>>(), "a norm kernel got parameters or statistics of dtype ",
           dtype_name(t.dtype));
  return t.as<Compute<S>>();
}

// y = (x - mean) * rstd * gamma (+ beta); kCentered: layernorm, else rmsnorm (mean 0, no beta). Activations
// stored as S (rounded once per output for bf16), arithmetic in T.
// Y: y's storage, S's or (out_dtype) bf16 from f32.
template <typename S, bool kCentered, typename Y = S, typename T = Compute<S>>
void row_norm(const KernelCtx& c) {
  const int64_t d = c.in[0].dim(-1), rows = c.in[0].numel() / std::max<int64_t>(d, 1);
  const S* x = c.in[0].as<S>();
  const T* g = param_data<S>(c.in[1]);
  const T* b = kCentered ? param_data<S>(c.in[2]) : nullptr;
  Y* __restrict y = c.out[0].as<Y>();
  T* __restrict mean = kCentered ? param_data<S>(c.out[1]) : nullptr;
  T* __restrict rstd = param_data<S>(c.out[kCentered ? 2 : 1]);
  // Attr residual (fuse_residual_norm): x is in[0] + the last input, written as the last output.
  const int own_inputs = kCentered ? 3 : 2, own_outputs = kCentered ? 3 : 2;
  const S* add = c.num_in > own_inputs ? c.in[own_inputs].as<S>() : nullptr;
  S* sum = c.num_out > own_outputs ? c.out[own_outputs].as<S>() : nullptr;
  FR_CHECK(!add == !sum && (!add || std::is_same_v<S, float>), "a row norm's residual sum: f32 x and sum");
  const T eps = eps_of<T>(c, kCentered ? 1e-5 : 1e-6), inv_d = T(1) / static_cast<T>(d);
  parallel_for(rows, row_grain(d), [&](int64_t s, int64_t e) {
    for (int64_t r = s; r < e; ++r) {
      const S* xr = x + r * d;
      prefetch_span_ahead(xr, static_cast<size_t>(d) * sizeof(S));
      if (add) prefetch_span_ahead(add + r * d, static_cast<size_t>(d) * sizeof(S));
      if constexpr (std::is_same_v<S, float>) {
        if (add) {
          // The add kernel's a + b, stored, then normalised from the stored row while it is in L1.
          const float* ar = add + r * d;
          float* __restrict sr = sum + r * d;
#pragma omp simd
          for (int64_t j = 0; j < d; ++j) sr[j] = xr[j] + ar[j];
          xr = sr;
        }
      }
      Y* __restrict yr = y + r * d;
      T mu = T(0);
      if constexpr (kCentered) mu = lane_sum<T>(d, [xr](int64_t j) { return ld(xr[j]); }) * inv_d;
      // Variance of the centred values: no cancellation when |mean| >> std.
      const T var = lane_sum<T>(d,
                                [xr, mu](int64_t j) {
                                  const T v = ld(xr[j]) - mu;
                                  return v * v;
                                }) *
                    inv_d;
      const T rs = T(1) / std::sqrt(var + eps);
      if constexpr (kCentered) {
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) yr[j] = st<Y>((ld(xr[j]) - mu) * rs * g[j] + b[j]);
        mean[r] = mu;
      } else {
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) yr[j] = st<Y>(ld(xr[j]) * rs * g[j]);
      }
      rstd[r] = rs;
    }
  });
}

// dst[j] = src[j] rounded to bf16 (bf16_bits_of's bits), j < n.
void round_row_to_bf16(const float* src, bf16* dst, int64_t n) {
#if defined(__AVX512F__)
  simd16::round_to_bf16(src, dst, n);
#else
  auto* bits = reinterpret_cast<uint16_t*>(dst);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) bits[j] = bf16_bits_of(src[j]);
#endif
}

// dx = rstd * (g dy - mean(g dy) - xhat mean(g dy xhat)) (rmsnorm: without the mean(g dy) term);
// dgamma = sum_rows dy xhat, dbeta = sum_rows dy, through per-block partials (see norm_row_blocks).
template <typename S, bool kCentered, typename T = Compute<S>>
void row_norm_grad(const KernelCtx& c) {
  const int64_t d = c.in[1].dim(-1), rows = c.in[1].numel() / std::max<int64_t>(d, 1);
  const S* dy = c.in[0].as<S>();
  const S* x = c.in[1].as<S>();
  const T* g = param_data<S>(c.in[2]);
  const T* mean = kCentered ? param_data<S>(c.in[3]) : nullptr;
  const T* rstd = param_data<S>(c.in[kCentered ? 4 : 3]);
  S* dx = c.out[0].as<S>();
  T* dgamma = param_data<S>(c.out[1]);
  T* dbeta = kCentered ? param_data<S>(c.out[2]) : nullptr;
  const int own_inputs = kCentered ? 5 : 4, own_outputs = kCentered ? 3 : 2;
  const float* res = c.num_in > own_inputs ? c.in[own_inputs].as<float>() : nullptr;
  bf16* low = c.num_out > own_outputs ? c.out[own_outputs].as<bf16>() : nullptr;
  constexpr bool kF32 = std::is_same_v<S, float>;
  FR_CHECK((!res && !low) || kF32, "a row norm gradient fuses its residual on f32 only");
  const int64_t blocks = norm_row_blocks(rows), parts = kCentered ? 2 : 1;
  T* ws = static_cast<T*>(c.workspace);
  // One block accumulates straight into the outputs; otherwise block k owns ws[(k * parts + p) * d, +d).
  auto part = [&](int64_t k, int64_t p) {
    return blocks == 1 ? (p == 0 ? dgamma : dbeta) : ws + (k * parts + p) * d;
  };
  const T inv_d = T(1) / static_cast<T>(d);
  // Rows whose dy and x stay in L1 between the two passes, and columns of partials held in registers.
  constexpr int64_t kGroup = 8, kCols = 4 * 64 / static_cast<int64_t>(sizeof(T));
  const int64_t block_elems = std::max<int64_t>(1, rows / blocks * d);
  parallel_for(blocks, std::max<int64_t>(1, kGrain / block_elems), [&](int64_t s, int64_t e) {
    for (int64_t k = s; k < e; ++k) {
      T* __restrict pg = part(k, 0);
      T* __restrict pb = kCentered ? part(k, 1) : nullptr;
      for (int64_t j = 0; j < d; ++j) pg[j] = T(0);
      if constexpr (kCentered)
        for (int64_t j = 0; j < d; ++j) pb[j] = T(0);
      const int64_t r0 = k * rows / blocks, r1 = (k + 1) * rows / blocks;
      for (int64_t g0 = r0; g0 < r1; g0 += kGroup) {
        const int64_t nr = std::min(kGroup, r1 - g0);
        T mu[kGroup], rs[kGroup];
        for (int64_t i = 0; i < nr; ++i) {
          const int64_t r = g0 + i;
          const S* dyr = dy + r * d;
          const S* xr = x + r * d;
          S* __restrict dxr = dx + r * d;
          prefetch_span_ahead(dyr, static_cast<size_t>(d) * sizeof(S));
          prefetch_span_ahead(xr, static_cast<size_t>(d) * sizeof(S));
          if (res) prefetch_span_ahead(res + r * d, static_cast<size_t>(d) * sizeof(float));
          mu[i] = kCentered ? mean[r] : T(0);
          rs[i] = rstd[r];
          const T m = mu[i], q = rs[i];
          auto gdy = [dyr, g](int64_t j) { return g[j] * ld(dyr[j]); };
          auto gdy_xhat = [dyr, g, xr, m, q](int64_t j) { return g[j] * ld(dyr[j]) * ((ld(xr[j]) - m) * q); };
          T sum_gdy = T(0), sum_gdy_xhat;
          if constexpr (kCentered)
            lane_sum2<T>(d, gdy, gdy_xhat, sum_gdy, sum_gdy_xhat);
          else
            sum_gdy_xhat = lane_sum<T>(d, gdy_xhat);
          const T a = sum_gdy * inv_d, bb = sum_gdy_xhat * inv_d;
#pragma omp simd
          for (int64_t j = 0; j < d; ++j) {
            const T xh = (ld(xr[j]) - m) * q;
            dxr[j] = st<S>(q * (g[j] * ld(dyr[j]) - a - xh * bb));
          }
          if constexpr (std::is_same_v<S, float>) {
            // The fused residual add and bf16 copy (fuse_norm_grad_residual), on the stored row while it is
            // in L1: the add kernel's a + b and the cast's rounding, so the unfused program's bits.
            if (res) {
              const float* rr = res + r * d;
#pragma omp simd
              for (int64_t j = 0; j < d; ++j) dxr[j] = dxr[j] + rr[j];
            }
            if (low) round_row_to_bf16(dxr, low + r * d, d);
          }
        }
        // The group's parameter gradients, kCols columns at a time in registers, rows in order, so the
        // partials are loaded and stored once per group. Loaded once per row right behind the row's stores
        // of dx, as before, they made the kernel 4-9x slower in a GPT step (0.6-1.1 ms against 0.13 for the
        // same shapes), depending on where the planner put dx: a load whose address matches an in-flight
        // store's low 12 bits waits for that store, and arena tensors sit multiples of 4 KiB apart.
        auto columns = [&]<int64_t W>(int64_t j0) {
          T ag[W], ab[W];
#pragma omp simd
          for (int64_t j = 0; j < W; ++j) {
            ag[j] = pg[j0 + j];
            if constexpr (kCentered) ab[j] = pb[j0 + j];
          }
          for (int64_t i = 0; i < nr; ++i) {
            const S* dyr = dy + (g0 + i) * d + j0;
            const S* xr = x + (g0 + i) * d + j0;
            const T m = mu[i], q = rs[i];
#pragma omp simd
            for (int64_t j = 0; j < W; ++j) {
              const T dyj = ld(dyr[j]);
              // An explicit fma, as GCC contracts the vector loop's product and sum, so that the tail
              // columns' scalar code sums alike.
              ag[j] = std::fma(dyj, (ld(xr[j]) - m) * q, ag[j]);
              if constexpr (kCentered) ab[j] += dyj;
            }
          }
#pragma omp simd
          for (int64_t j = 0; j < W; ++j) {
            pg[j0 + j] = ag[j];
            if constexpr (kCentered) pb[j0 + j] = ab[j];
          }
        };
        int64_t j0 = 0;
        for (; j0 + kCols <= d; j0 += kCols) columns.template operator()<kCols>(j0);
        for (; j0 < d; ++j0) columns.template operator()<1>(j0);
      }
    }
  });
  if (blocks == 1) return;
  // Blocks added in index order for every column.
  parallel_for(d, std::max<int64_t>(1, kGrain / blocks), [&](int64_t s, int64_t e) {
    for (int64_t p = 0; p < parts; ++p) {
      T* __restrict out = p == 0 ? dgamma : dbeta;
      for (int64_t j = s; j < e; ++j) out[j] = part(0, p)[j];
      for (int64_t k = 1; k < blocks; ++k) {
        const T* src = part(k, p);
#pragma omp simd
        for (int64_t j = s; j < e; ++j) out[j] += src[j];
      }
    }
  });
}

// Batchnorm's order over the elements of one channel in one image (a plane of NCHW, a channel of an nChw16c
// block): element i into lane i % kPlaneLanes (lane = f(lane, i)), the lanes folded pairwise as fold()
// does. 16 lanes, so that a blocked block keeps one register per lane for its 16 channels (block_sum).
constexpr int kPlaneLanes = 16;
template <typename T, typename F>
inline T plane_sum(int64_t n, F f) {
  T acc[kPlaneLanes] = {};
  int64_t i = 0;
  for (; i + kPlaneLanes <= n; i += kPlaneLanes)
    for (int k = 0; k < kPlaneLanes; ++k) acc[k] = f(acc[k], i + k);
  for (int k = 0; i + k < n; ++k) acc[k] = f(acc[k], i + k);
  return fold(acc);
}

// The terms batchnorm sums per channel, added to a running sum: add(a, k, ch) for element k of channel ch,
// and with AVX-512 add16(a, k, c0) for the 16 channels from c0 of the blocked pixel at element k, each lane
// as add() computes it. A product's add is an explicit fma in both, so that the plain (eager) and blocked
// programs agree whatever the compiler contracts. ahead(k) prefetches the pixel's lines 2 KiB on.
template <typename S, typename T>
struct XTerm {
  const S* x;
  T add(T a, int64_t k, int64_t) const { return a + ld(x[k]); }
#if defined(__AVX512F__)
  __m512 add16(__m512 a, int64_t k, int64_t) const {
    return _mm512_add_ps(a, simd16::load(x + k));
  }
  void ahead(int64_t k) const {
    prefetch_ahead(x + k);
  }
#endif
};
// (x - mean[ch - c_base])^2: the squares about a plane's own mean (c_base its first channel) or the batch's.
template <typename S, typename T>
struct SquaredDeviationTerm {
  const S* x;
  const T* mean;
  int64_t c_base;
  T add(T a, int64_t k, int64_t ch) const {
    const T d = ld(x[k]) - mean[ch - c_base];
    return std::fma(d, d, a);
  }
#if defined(__AVX512F__)
  __m512 add16(__m512 a, int64_t k, int64_t c0) const {
    const __m512 d = _mm512_sub_ps(simd16::load(x + k), _mm512_loadu_ps(mean + (c0 - c_base)));
    return _mm512_fmadd_ps(d, d, a);
  }
  void ahead(int64_t k) const {
    prefetch_ahead(x + k);
  }
#endif
};
// The gradient dy, 0 where the mask (a fused relu_grad's relu output) is not > 0; with kXc times x - mean.
template <typename S, typename T, bool kMask, bool kXc>
struct GradTerm {
  const S* dy;
  const S* mask;
  const S* x;
  const T* mean;
  // Element k's gradient (the dx pass reads it too). Both loads unconditional, so that the select vectorises.
  T dy_at(int64_t k) const {
    const T d = ld(dy[k]);
    if constexpr (kMask)
      return ld(mask[k]) > T(0) ? d : T(0);
    else
      return d;
  }
  T add(T a, int64_t k, int64_t ch) const {
    if constexpr (kXc)
      return std::fma(dy_at(k), ld(x[k]) - mean[ch], a);
    else
      return a + dy_at(k);
  }
#if defined(__AVX512F__)
  __m512 dy16(int64_t k) const {
    const __m512 d = simd16::load(dy + k);
    if constexpr (kMask)
      return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(simd16::load(mask + k), _mm512_setzero_ps(), _CMP_GT_OQ),
                                 d);
    else
      return d;
  }
  __m512 add16(__m512 a, int64_t k, int64_t c0) const {
    const __m512 d = dy16(k);
    if constexpr (kXc)
      return _mm512_fmadd_ps(d, _mm512_sub_ps(simd16::load(x + k), _mm512_loadu_ps(mean + c0)), a);
    else
      return _mm512_add_ps(a, d);
  }
  void ahead(int64_t k) const {
    prefetch_ahead(dy + k);
    if constexpr (kMask) prefetch_ahead(mask + k);
    if constexpr (kXc) prefetch_ahead(x + k);
  }
#endif
};

// x viewed as (n, c, s): s = product of the spatial dims (1 for (N, C)).
struct NCS {
  int64_t n, c, s;
  // A blocked tensor's (attr `blocked`) layout (ops/cpu/conv.h's PixelBlocks): its blocks p = (n, channel
  // block) hold s pixels of `lanes` channels each (16, 8 in nChw8c), a pixel's lanes contiguous; in nChw16c
  // and nChw8c the block is contiguous, in NHWC its pixels are C apart.
  bool nhwc = false;
  int64_t lanes = 16;
  PixelBlocks blocks() const { return {c, nhwc, lanes}; }
  int64_t block_base(int64_t p) const { return blocks().base(p, s); }
  int64_t pixel_step() const { return blocks().step(); }
};
NCS ncs_of(const TensorView& x) {
  const int64_t n = x.dim(0), c = x.dim(1);
  return {n, c, n * c == 0 ? 0 : x.numel() / (n * c)};
}

// Per-channel sums of the term f0 (and f1) over the elements k of each channel, into out0[ch] (out1[ch]).
// (N, C): blocks of rows (norm_row_blocks) sum into partials in ws, added in block order; with spatial
// dims: one sum per (n, ch) plane into ws, added over n in order. Either way independent of the thread count.
template <typename T, typename F0, typename F1 = std::nullptr_t>
void channel_sums(const NCS& v, T* ws, T* out0, F0 f0, T* out1 = nullptr, F1 f1 = nullptr) {
  constexpr bool kTwo = !std::is_same_v<F1, std::nullptr_t>;
  constexpr int64_t kSums = kTwo ? 2 : 1;
  if (v.s == 1) {
    const int64_t blocks = norm_row_blocks(v.n), c = v.c;
    auto part = [&](int64_t k, int64_t q) {
      return blocks == 1 ? (q == 0 ? out0 : out1) : ws + (k * kSums + q) * c;
    };
    const int64_t block_elems = std::max<int64_t>(1, v.n / blocks * c);
    parallel_for(blocks, std::max<int64_t>(1, kGrain / block_elems), [&](int64_t s, int64_t e) {
      for (int64_t k = s; k < e; ++k) {
        T* __restrict p0 = part(k, 0);
        T* __restrict p1 = kTwo ? part(k, 1) : nullptr;
        for (int64_t ch = 0; ch < c; ++ch) p0[ch] = T(0);
        if constexpr (kTwo)
          for (int64_t ch = 0; ch < c; ++ch) p1[ch] = T(0);
        for (int64_t n = k * v.n / blocks, n1 = (k + 1) * v.n / blocks; n < n1; ++n) {
          const int64_t k0 = n * c;
#pragma omp simd
          for (int64_t ch = 0; ch < c; ++ch) {
            p0[ch] = f0.add(p0[ch], k0 + ch, ch);
            if constexpr (kTwo) p1[ch] = f1.add(p1[ch], k0 + ch, ch);
          }
        }
      }
    });
    if (blocks == 1) return;
    for (int64_t q = 0; q < kSums; ++q) {
      T* __restrict out = q == 0 ? out0 : out1;
      for (int64_t ch = 0; ch < c; ++ch) out[ch] = part(0, q)[ch];
      for (int64_t k = 1; k < blocks; ++k) {
        const T* src = part(k, q);
#pragma omp simd
        for (int64_t ch = 0; ch < c; ++ch) out[ch] += src[ch];
      }
    }
    return;
  }
  parallel_for(v.n * v.c, row_grain(v.s), [&](int64_t s, int64_t e) {
    for (int64_t p = s; p < e; ++p) {
      const int64_t ch = p % v.c, k0 = p * v.s;
      ws[kSums * p] = plane_sum<T>(v.s, [&f0, k0, ch](T a, int64_t i) { return f0.add(a, k0 + i, ch); });
      if constexpr (kTwo)
        ws[2 * p + 1] = plane_sum<T>(v.s, [&f1, k0, ch](T a, int64_t i) { return f1.add(a, k0 + i, ch); });
    }
  });
  for (int64_t q = 0; q < kSums; ++q) {
    T* out = q == 0 ? out0 : out1;
    for (int64_t ch = 0; ch < v.c; ++ch) out[ch] = T(0);
    for (int64_t n = 0; n < v.n; ++n)
      for (int64_t ch = 0; ch < v.c; ++ch) out[ch] += ws[(n * v.c + ch) * kSums + q];
  }
}

// The sum of the term f over one block of a blocked tensor (the layout pass's, graph/layout.cc; s > 1): L
// channels from c0, s pixels from element k0, pixel i's L at k0 + i * step, into out[j] for channel c0 + j:
// each channel in plane_sum's order, so that a blocked step computes bitwise what a plain (eager) one does.
// With AVX-512 a pixel's 16 channels are one register (the term's add16), and the 16 lanes of all of them
// 16 registers.
template <typename T, int64_t L, typename Term>
void block_sum(int64_t s, int64_t k0, int64_t step, int64_t c0, T* out, const Term& f) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float> && L == 16) {
    __m512 a[kPlaneLanes];
    for (auto& r : a) r = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + kPlaneLanes <= s; i += kPlaneLanes) {
#pragma GCC unroll 16
      for (int l = 0; l < kPlaneLanes; ++l) {
        f.ahead(k0 + (i + l) * step);
        a[l] = f.add16(a[l], k0 + (i + l) * step, c0);
      }
    }
#pragma GCC unroll 16
    for (int l = 0; l < kPlaneLanes; ++l)
      if (i + l < s) a[l] = f.add16(a[l], k0 + (i + l) * step, c0);
#pragma GCC unroll 8
    for (int w = kPlaneLanes / 2; w > 0; w /= 2)
      for (int l = 0; l < w; ++l) a[l] = _mm512_add_ps(a[l], a[l + w]);
    _mm512_storeu_ps(out, a[0]);
    return;
  }
#endif
  T a[kPlaneLanes][L] = {};
  for (int64_t i = 0; i < s; ++i) {
    T* __restrict ai = a[i % kPlaneLanes];
#pragma omp simd
    for (int64_t j = 0; j < L; ++j) ai[j] = f.add(ai[j], k0 + i * step + j, c0 + j);
  }
  for (int w = kPlaneLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k)
#pragma omp simd
      for (int64_t j = 0; j < L; ++j) a[k][j] += a[k + w][j];
  for (int64_t j = 0; j < L; ++j) out[j] = a[0][j];
}

// Runs block(p, std::integral_constant<int64_t, L>) for each (n, channel block) p of a blocked tensor, with
// L its lanes (16, or 8 in nChw8c) known to the compiler.
template <typename Block>
void for_each_block_of(const NCS& v, Block block) {
  v.blocks().with_lanes([&](auto lanes) {
    parallel_for(v.n * (v.c / lanes), row_grain(lanes * v.s), [&](int64_t s, int64_t e) {
      for (int64_t p = s; p < e; ++p) block(p, lanes);
    });
  });
}

// channel_sums over a blocked tensor: block_sum per (n, channel block) and term (a second term's pass finds
// the block in cache).
template <typename T, typename F0, typename F1 = std::nullptr_t>
void channel_sums_blocked(const NCS& v, T* ws, T* out0, F0 f0, T* out1 = nullptr, F1 f1 = nullptr) {
  constexpr bool kTwo = !std::is_same_v<F1, std::nullptr_t>;
  constexpr int64_t kSums = kTwo ? 2 : 1;
  for_each_block_of(v, [&](int64_t p, auto lanes) {
    constexpr int64_t L = decltype(lanes)::value;
    T s0[L], s1[L];
    const int64_t cb = v.c / L, c0 = (p % cb) * L;
    block_sum<T, L>(v.s, v.block_base(p), v.pixel_step(), c0, s0, f0);
    if constexpr (kTwo) block_sum<T, L>(v.s, v.block_base(p), v.pixel_step(), c0, s1, f1);
    T* to = ws + ((p / cb) * v.c + c0) * kSums;
    for (int64_t j = 0; j < L; ++j) {
      to[j * kSums] = s0[j];
      if constexpr (kTwo) to[j * kSums + 1] = s1[j];
    }
  });
  for (int64_t q = 0; q < kSums; ++q) {
    T* out = q == 0 ? out0 : out1;
    for (int64_t ch = 0; ch < v.c; ++ch) out[ch] = T(0);
    for (int64_t n = 0; n < v.n; ++n)
      for (int64_t ch = 0; ch < v.c; ++ch) out[ch] += ws[(n * v.c + ch) * kSums + q];
  }
}

// Per-channel mean and sum of squared deviations from it (ss) of an activation with spatial dims (s > 1),
// reading it from memory once: each (n, ch) plane's sum, then its squares about its own mean with the plane
// still in cache, into ws; the planes merge over n in order (Chan, Golub and LeVeque's pairwise update):
// ss = sum_n [M2_n + s (mean_n - mean)^2], without the cancellation of a sum of squares. A separate pass for
// the squares about the batch mean took a third of ResNet-20's batchnorm time. Both layouts give the same
// bits (block_sum).
template <typename T, typename S>
void channel_moments(const NCS& v, bool blocked, const S* x, T* ws, T* mean, T* ss) {
  const T s = static_cast<T>(v.s);
  if (blocked) {
    for_each_block_of(v, [&](int64_t p, auto lanes) {
      constexpr int64_t L = decltype(lanes)::value;
      T sum[L], m2[L], mp[L];
      const int64_t cb = v.c / L, k0 = v.block_base(p), step = v.pixel_step(), c0 = (p % cb) * L;
      block_sum<T, L>(v.s, k0, step, c0, sum, XTerm<S, T>{x});
      for (int64_t j = 0; j < L; ++j) mp[j] = sum[j] / s;
      block_sum<T, L>(v.s, k0, step, c0, m2, SquaredDeviationTerm<S, T>{x, mp, c0});
      T* to = ws + ((p / cb) * v.c + c0) * 2;
      for (int64_t j = 0; j < L; ++j) {
        to[2 * j] = sum[j];
        to[2 * j + 1] = m2[j];
      }
    });
  } else {
    parallel_for(v.n * v.c, row_grain(v.s), [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        const int64_t k0 = p * v.s, ch = p % v.c;
        const XTerm<S, T> value{x};
        const T sum = plane_sum<T>(v.s, [&](T a, int64_t i) { return value.add(a, k0 + i, ch); });
        const T mp = sum / s;
        const SquaredDeviationTerm<S, T> square{x, &mp, ch};
        ws[2 * p] = sum;
        ws[2 * p + 1] = plane_sum<T>(v.s, [&](T a, int64_t i) { return square.add(a, k0 + i, ch); });
      }
    });
  }
  const T m = static_cast<T>(v.n) * s;
  for (int64_t ch = 0; ch < v.c; ++ch) mean[ch] = ss[ch] = T(0);
  for (int64_t n = 0; n < v.n; ++n)
    for (int64_t ch = 0; ch < v.c; ++ch) mean[ch] += ws[(n * v.c + ch) * 2];
  for (int64_t ch = 0; ch < v.c; ++ch) mean[ch] /= m;
  for (int64_t n = 0; n < v.n; ++n)
    for (int64_t ch = 0; ch < v.c; ++ch) {
      const T* w = ws + (n * v.c + ch) * 2;
      const T d = w[0] / s - mean[ch];
      ss[ch] += w[1] + s * d * d;
    }
}

// Runs row(k0) for each row of an (N, C) tensor (the caller vectorises over its channels), or
// plane(k0, ch) for each (n, ch) plane of s elements; k0 is the first element's index.
template <typename Row, typename Plane>
void for_each_ncs(const NCS& v, Row row, Plane plane) {
  if (v.s == 1) {
    parallel_for(v.n, row_grain(v.c), [&](int64_t s, int64_t e) {
      for (int64_t n = s; n < e; ++n) row(n * v.c);
    });
    return;
  }
  parallel_for(v.n * v.c, row_grain(v.s), [&](int64_t s, int64_t e) {
    for (int64_t p = s; p < e; ++p) plane(p * v.s, p % v.c);
  });
}

// Runs block(k0, c0, lanes) for each (n, channel block) of a blocked tensor: s pixels of channels c0 to
// c0 + L - 1 (L = lanes' value), pixel i's at k0 + i * v.pixel_step().
template <typename Block>
void for_each_blocked(const NCS& v, Block block) {
  for_each_block_of(
      v, [&](int64_t p, auto lanes) { block(v.block_base(p), (p % (v.c / lanes)) * lanes, lanes); });
}

// Whether a batchnorm node's activations are blocked (attr `blocked`: nChw16c, nChw8c with attr `nchw8c`,
// NHWC with attr `nhwc`; graph/layout.cc), and which. With one element per plane the layouts are the same
// bytes, and the plain path runs.
bool blocked_planes(const KernelCtx& c, NCS& v) {
  if (!c.attrs().b("blocked")) return false;
  const PixelBlocks pb{v.c, c.attrs()};
  v.nhwc = pb.nhwc;
  v.lanes = pb.lanes;
  FR_CHECK(v.c % v.lanes == 0, "a blocked batchnorm needs channels in multiples of ", v.lanes);
  return v.s > 1;
}

// y = (x - mean) rstd gamma + beta, then with kRes + r (y rounded to S first, as the add of an unfused graph
// reads it), then with kRelu max(y, 0) as relu computes it (NaN to 0), before the one rounding to S: the bits
// of relu applied to the rounded sum, since rounding is monotonic and keeps 0 (an add and a relu fused by
// graph/passes.cc). The multiply-add is an explicit fma in every path (the blocked AVX-512 one, the plain
// one of an eager step), so that they agree whatever the compiler contracts.
template <typename S, bool kRelu, bool kRes, typename T = Compute<S>>
void normalise(const NCS& v, bool blocked, const S* x, const S* r, S* y, const T* g, const T* b,
               const T* mean, const T* rstd) {
  const auto out = [r](T u, int64_t k) {
    if constexpr (kRes) u = ld(st<S>(u)) + ld(r[k]);
    if constexpr (kRelu) u = u > T(0) ? u : T(0);
    return st<S>(u);
  };
  if (blocked) {
    for_each_blocked(v, [&](int64_t k0, int64_t c0, auto lanes) {
      constexpr int64_t L = decltype(lanes)::value;
      T mu[L], a[L], bb[L];
      for (int64_t j = 0; j < L; ++j) {
        mu[j] = mean[c0 + j];
        a[j] = rstd[c0 + j] * g[c0 + j];
        bb[j] = b[c0 + j];
      }
#if defined(__AVX512F__)
      // A pixel's 16 channels in one register: the generic loop's bf16 rounding and half-width vectors made
      // the bf16 pass slower than the f32 one.
      if constexpr (std::is_same_v<T, float> && L == 16) {
        const __m512 vm = _mm512_loadu_ps(mu), va = _mm512_loadu_ps(a), vb = _mm512_loadu_ps(bb);
        for (int64_t i = 0; i < v.s; ++i) {
          const int64_t k = k0 + i * v.pixel_step();
          prefetch_ahead(x + k);
          if constexpr (kRes) prefetch_ahead(r + k);
          prefetch_ahead_for_write(y + k);
          __m512 u = _mm512_fmadd_ps(_mm512_sub_ps(simd16::load(x + k), vm), va, vb);
          if constexpr (kRes) u = _mm512_add_ps(simd16::rounded<S>(u), simd16::load(r + k));
          // max returns its second operand for a NaN: 0, as relu does.
          if constexpr (kRelu) u = _mm512_maskz_max_ps(simd16::kAll, u, _mm512_setzero_ps());
          simd16::store(y + k, u);
        }
        return;
      }
#endif
      for (int64_t i = 0; i < v.s; ++i) {
        const int64_t k = k0 + i * v.pixel_step();
        const S* xp = x + k;
        S* __restrict yp = y + k;
#pragma omp simd
        for (int64_t j = 0; j < L; ++j) yp[j] = out(std::fma(ld(xp[j]) - mu[j], a[j], bb[j]), k + j);
      }
    });
    return;
  }
  for_each_ncs(
      v,
      [&](int64_t k0) {
        const S* xr = x + k0;
        S* __restrict yr = y + k0;
#pragma omp simd
        for (int64_t ch = 0; ch < v.c; ++ch)
          yr[ch] = out(std::fma(ld(xr[ch]) - mean[ch], rstd[ch] * g[ch], b[ch]), k0 + ch);
      },
      [&](int64_t k0, int64_t ch) {
        const T mu = mean[ch], a = rstd[ch] * g[ch], bb = b[ch];
        const S* xp = x + k0;
        S* __restrict yp = y + k0;
#pragma omp simd
        for (int64_t i = 0; i < v.s; ++i) yp[i] = out(std::fma(ld(xp[i]) - mu, a, bb), k0 + i);
      });
}

// Activations stored as S (f32, f64, or bf16 rounded once per output), arithmetic in T.
template <typename S, typename T = Compute<S>>
void batchnorm_kernel(const KernelCtx& c) {
  NCS v = ncs_of(c.in[0]);
  const bool blocked = blocked_planes(c, v);
  const S* x = c.in[0].as<S>();
  const T* g = param_data<S>(c.in[1]);
  const T* b = param_data<S>(c.in[2]);
  T* running_mean = param_data<S>(c.in[3]);
  T* running_var = param_data<S>(c.in[4]);
  S* y = c.out[0].as<S>();
  T* mean = param_data<S>(c.out[1]);
  T* rstd = param_data<S>(c.out[2]);
  const T eps = eps_of<T>(c, 1e-5), momentum = static_cast<T>(c.attrs().f("momentum", 0.1));
  if (c.attrs().b("training", true)) {
    const int64_t m = v.n * v.s;
    T* ws = static_cast<T*>(c.workspace);
    // The sum of squared centred values (no cancellation) goes through rstd's buffer.
    if (v.s > 1) {
      channel_moments<T>(v, blocked, x, ws, mean, rstd);
    } else {
      channel_sums<T>(v, ws, mean, XTerm<S, T>{x});
      for (int64_t ch = 0; ch < v.c; ++ch) mean[ch] /= static_cast<T>(m);
      channel_sums<T>(v, ws, rstd, SquaredDeviationTerm<S, T>{x, mean, 0});
    }
    for (int64_t ch = 0; ch < v.c; ++ch) {
      const T ss = rstd[ch];
      // PyTorch's update; the running variance is the unbiased estimate (infer rejects m == 1).
      running_mean[ch] = (T(1) - momentum) * running_mean[ch] + momentum * mean[ch];
      running_var[ch] = (T(1) - momentum) * running_var[ch] + momentum * (ss / static_cast<T>(m - 1));
      rstd[ch] = T(1) / std::sqrt(ss / static_cast<T>(m) + eps);
    }
  } else {
    for (int64_t ch = 0; ch < v.c; ++ch) {
      mean[ch] = running_mean[ch];
      rstd[ch] = T(1) / std::sqrt(running_var[ch] + eps);
    }
  }
  const S* r = c.attrs().b("residual") ? c.in[5].as<S>() : nullptr;
  if (c.attrs().b("relu"))
    r ? normalise<S, true, true>(v, blocked, x, r, y, g, b, mean, rstd)
      : normalise<S, true, false>(v, blocked, x, r, y, g, b, mean, rstd);
  else
    r ? normalise<S, false, true>(v, blocked, x, r, y, g, b, mean, rstd)
      : normalise<S, false, false>(v, blocked, x, r, y, g, b, mean, rstd);
}

// dgamma = sum dy xhat, dbeta = sum dy per channel; dx = g rstd (dy - dbeta/m - xhat dgamma/m) in training
// (the batch statistics depend on x), g rstd dy in inference.
// With kMask (a fused relu_grad, graph/passes.cc) element k's gradient is dy where mask > 0 and 0 elsewhere,
// exactly what relu_grad would have passed. The dx pass's fma is explicit, as in normalise.
template <typename S, bool kMask, typename T = Compute<S>>
void batchnorm_grad_with(const KernelCtx& c) {
  NCS v = ncs_of(c.in[1]);
  const bool blocked = blocked_planes(c, v);
  const S* dy = c.in[0].as<S>();
  const S* mask = kMask ? c.in[5].as<S>() : nullptr;
  const S* x = c.in[1].as<S>();
  const T* g = param_data<S>(c.in[2]);
  const T* mean = param_data<S>(c.in[3]);
  const T* rstd = param_data<S>(c.in[4]);
  S* dx = c.out[0].as<S>();
  T* dgamma = param_data<S>(c.out[1]);
  T* dbeta = param_data<S>(c.out[2]);
  T* ws = static_cast<T*>(c.workspace);
  const GradTerm<S, T, kMask, false> grad{dy, mask, x, mean};
  const GradTerm<S, T, kMask, true> grad_xc{dy, mask, x, mean};
  if (blocked)
    channel_sums_blocked<T>(v, ws, dbeta, grad, dgamma, grad_xc);
  else
    channel_sums<T>(v, ws, dbeta, grad, dgamma, grad_xc);
  for (int64_t ch = 0; ch < v.c; ++ch) dgamma[ch] *= rstd[ch];
  // dx = g rstd (dy - t dbeta - t (x - mean) rstd dgamma): t = 1/m in training, 0 in inference.
  const T t = c.attrs().b("training", true) ? T(1) / static_cast<T>(std::max<int64_t>(1, v.n * v.s)) : T(0);
  if (blocked) {
    for_each_blocked(v, [&](int64_t k0, int64_t c0, auto lanes) {
      constexpr int64_t L = decltype(lanes)::value;
      T p[L], mu[L], bt[L], gt[L];
      for (int64_t j = 0; j < L; ++j) {
        const int64_t ch = c0 + j;
        p[j] = g[ch] * rstd[ch];
        mu[j] = mean[ch];
        bt[j] = t * dbeta[ch];
        gt[j] = t * rstd[ch] * dgamma[ch];
      }
#if defined(__AVX512F__)
      if constexpr (std::is_same_v<T, float> && L == 16) {
        const __m512 vp = _mm512_loadu_ps(p), vm = _mm512_loadu_ps(mu), vbt = _mm512_loadu_ps(bt),
                     vgt = _mm512_loadu_ps(gt);
        for (int64_t i = 0; i < v.s; ++i) {
          const int64_t k = k0 + i * v.pixel_step();
          grad_xc.ahead(k);
          prefetch_ahead_for_write(dx + k);
          const __m512 d = grad.dy16(k);
          const __m512 xc = _mm512_sub_ps(simd16::load(x + k), vm);
          simd16::store(dx + k, _mm512_mul_ps(vp, _mm512_fnmadd_ps(xc, vgt, _mm512_sub_ps(d, vbt))));
        }
        return;
      }
#endif
      for (int64_t i = 0; i < v.s; ++i) {
        const int64_t k = k0 + i * v.pixel_step();
        const S* xp = x + k;
        S* __restrict dxp = dx + k;
#pragma omp simd
        for (int64_t j = 0; j < L; ++j)
          dxp[j] = st<S>(p[j] * std::fma(-(ld(xp[j]) - mu[j]), gt[j], grad.dy_at(k + j) - bt[j]));
      }
    });
    return;
  }
  for_each_ncs(
      v,
      [&](int64_t k0) {
        const S* xr = x + k0;
        S* __restrict dxr = dx + k0;
#pragma omp simd
        for (int64_t ch = 0; ch < v.c; ++ch)
          dxr[ch] = st<S>(g[ch] * rstd[ch] *
                          std::fma(-(ld(xr[ch]) - mean[ch]), t * rstd[ch] * dgamma[ch],
                                   grad.dy_at(k0 + ch) - t * dbeta[ch]));
      },
      [&](int64_t k0, int64_t ch) {
        const T p = g[ch] * rstd[ch], mu = mean[ch], bt = t * dbeta[ch], gt = t * rstd[ch] * dgamma[ch];
        const S* xp = x + k0;
        S* __restrict dxp = dx + k0;
#pragma omp simd
        for (int64_t i = 0; i < v.s; ++i)
          dxp[i] = st<S>(p * std::fma(-(ld(xp[i]) - mu), gt, grad.dy_at(k0 + i) - bt));
      });
}

template <typename S>
void batchnorm_grad_kernel(const KernelCtx& c) {
  if (c.num_in > 5)
    batchnorm_grad_with<S, true>(c);
  else
    batchnorm_grad_with<S, false>(c);
}

// A row norm on x's storage, or from f32 x to bf16 y under out_dtype.
template <bool kCentered>
void row_norm_of(const KernelCtx& c) {
  if (c.out[0].dtype != c.in[0].dtype) {
    FR_CHECK(c.in[0].dtype == DType::f32 && c.out[0].dtype == DType::bf16, "a row norm from ",
             dtype_name(c.in[0].dtype), " to ", dtype_name(c.out[0].dtype));
    return row_norm<float, kCentered, bf16>(c);
  }
  dispatch_storage(c.in[0].dtype,
                   [&](auto* t) { row_norm<std::remove_pointer_t<decltype(t)>, kCentered>(c); });
}

}  // namespace

void layernorm(const KernelCtx& c) {
  row_norm_of<true>(c);
}
void layernorm_grad(const KernelCtx& c) {
  dispatch_storage(c.in[1].dtype,
                   [&](auto* t) { row_norm_grad<std::remove_pointer_t<decltype(t)>, true>(c); });
}
void rmsnorm(const KernelCtx& c) {
  row_norm_of<false>(c);
}
void rmsnorm_grad(const KernelCtx& c) {
  dispatch_storage(c.in[1].dtype,
                   [&](auto* t) { row_norm_grad<std::remove_pointer_t<decltype(t)>, false>(c); });
}
void batchnorm(const KernelCtx& c) {
  dispatch_storage(c.in[0].dtype, [&](auto* t) { batchnorm_kernel<std::remove_pointer_t<decltype(t)>>(c); });
}
void batchnorm_grad(const KernelCtx& c) {
  dispatch_storage(c.in[1].dtype,
                   [&](auto* t) { batchnorm_grad_kernel<std::remove_pointer_t<decltype(t)>>(c); });
}

}  // namespace flowrun::cpu
