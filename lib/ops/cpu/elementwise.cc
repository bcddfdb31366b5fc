// CPU elementwise kernels: contiguous loops the compiler vectorises, OpenMP-parallel with static chunks so
// results are bitwise reproducible for a given thread count.
#include "ops/cpu/elementwise.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "ops/cpu/f8.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/prefetch.h"
#include "ops/cpu/reduce.h"
#include "ops/cpu/simd16.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace flowrun::cpu {

namespace {

constexpr int64_t kGrain = 1 << 14;

// Binary op with broadcasting. Fast paths: equal shapes, and b repeating over a's leading dimensions (bias).
// T is the storage type; f computes in Compute<T>.
template <typename T, typename F>
void binary_kernel(const KernelCtx& c, F f) {
  const TensorView &a = c.in[0], &b = c.in[1], &y = c.out[0];
  const T* pa = a.as<T>();
  const T* pb = b.as<T>();
  T* py = y.as<T>();
  const int64_t n = y.numel();
  const int64_t na = a.numel(), nb = b.numel();
  if (na == n && nb == n) {
    parallel_for(n, kGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) py[i] = st<T>(f(ld(pa[i]), ld(pb[i])));
    });
    return;
  }
  if (na == n && nb > 0 && n % nb == 0) {
    // b (leading 1s dropped) equals y's trailing dimensions: y[i] = f(a[i], b[i % nb]).
    const Shape& ys = *y.shape;
    const Shape& bs = *b.shape;
    size_t lead = 0;
    while (lead < bs.size() && bs[lead] == 1) ++lead;
    const size_t nt = bs.size() - lead;
    const bool trailing = nt <= ys.size() && std::equal(bs.begin() + static_cast<std::ptrdiff_t>(lead),
                                                        bs.end(), ys.end() - static_cast<std::ptrdiff_t>(nt));
    const int64_t tail = nb;
    if (trailing && tail == nb) {
      const int64_t rows = n / nb;
      parallel_for(rows, kGrain / std::max<int64_t>(nb, 1), [&](int64_t s, int64_t e) {
        for (int64_t r = s; r < e; ++r)
          for (int64_t j = 0; j < nb; ++j) py[r * nb + j] = st<T>(f(ld(pa[r * nb + j]), ld(pb[j])));
      });
      return;
    }
  }
  // General broadcasting: strides of 0 along stretched dimensions.
  const Shape& ys = *y.shape;
  const size_t r = ys.size();
  std::array<int64_t, 8> sa{}, sb{}, dims{};
  FR_CHECK(r <= 8, "broadcast of rank ", r, " is not supported");
  auto strides = [&](const Shape& s, std::array<int64_t, 8>& out) {
    int64_t st = 1;
    for (size_t k = 0; k < r; ++k) {
      const size_t axis = r - 1 - k;
      const int64_t d = k < s.size() ? s[s.size() - 1 - k] : 1;
      out[axis] = d == 1 ? 0 : st;
      st *= d;
    }
  };
  strides(*a.shape, sa);
  strides(*b.shape, sb);
  for (size_t k = 0; k < r; ++k) dims[k] = ys[k];
  parallel_for(n, kGrain, [&](int64_t s, int64_t e) {
    std::array<int64_t, 8> idx{};
    int64_t rem = s, ia = 0, ib = 0;
    for (size_t k = r; k-- > 0;) {
      idx[k] = rem % dims[k];
      rem /= dims[k];
      ia += idx[k] * sa[k];
      ib += idx[k] * sb[k];
    }
    for (int64_t i = s; i < e; ++i) {
      py[i] = st<T>(f(ld(pa[ia]), ld(pb[ib])));
      for (size_t k = r; k-- > 0;) {
        ia += sa[k];
        ib += sb[k];
        if (++idx[k] < dims[k]) break;
        ia -= sa[k] * dims[k];
        ib -= sb[k] * dims[k];
        idx[k] = 0;
      }
    }
  });
}

template <typename F>
void binary(const KernelCtx& c, F f) {
  dispatch_storage(c.in[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using C = Compute<T>;
    binary_kernel<T>(c, [&](C x, C y) { return static_cast<C>(f(x, y)); });
  });
}

// y[i] = f(x[i]) for a unary op, or f(in0[i], in1[i]) for a gradient op over two same-shape inputs.
template <typename F>
void unary(const TensorView& xv, const TensorView& yv, F f) {
  dispatch_storage(xv.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* x = xv.as<T>();
    T* y = yv.as<T>();
    parallel_for(yv.numel(), kGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) y[i] = st<T>(static_cast<Compute<T>>(f(ld(x[i]))));
    });
  });
}
template <typename F>
void unary(const KernelCtx& c, F f) {
  unary(c.in[0], c.out[0], f);
}

template <typename F>
void grad2(const KernelCtx& c, F f) {
  dispatch_storage(c.in[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* dy = c.in[0].as<T>();
    const T* x = c.in[1].as<T>();
    T* dx = c.out[0].as<T>();
    parallel_for(c.out[0].numel(), kGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) dx[i] = st<T>(static_cast<Compute<T>>(f(ld(dy[i]), ld(x[i]))));
    });
  });
}

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;

bool tanh_approx(const KernelCtx& c) {
  return c.attrs().is("approximate", "tanh");
}

// exp(x) for f32 from arithmetic and bit operations only, so that GCC vectorises the loops that call it
// (std::exp and std::tanh stay scalar libm calls, which made GELU a third of a GPT step). Cody-Waite
// reduction x = n ln2 + r, |r| <= ln2/2, and a degree-6 Taylor polynomial: relative error < 2e-7.
inline float exp_f32(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low bits
  const float n = (x * 1.44269504088896341f + kMagic) - kMagic;
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return p * scale;
}

// tanh(u) = 1 - 2 / (exp(2u) + 1): absolute error ~1e-7 (enough inside GELU's 1 + tanh); f64 keeps libm.
template <typename T>
inline T gelu_tanh(T u) {
  if constexpr (std::is_same_v<T, float>)
    return 1.0f - 2.0f / (exp_f32(2.0f * u) + 1.0f);
  else
    return std::tanh(u);
}

#if defined(__AVX512F__)
// Activations in AVX-512, 16 f32 lanes at a time from f32 or bf16 storage: GELU (tanh and erf), SiLU and
// sigmoid, each with its gradient. The tanh GELU goes through the same identity in both directions:
//   gelu(x) = x (1 + tanh(u)) / 2 = x sigmoid(2u) = x / (1 + e),  e = exp(-2u),  u = sqrt(2/pi) (x + c x^3),
//   gelu'(x) = s (1 + x (1 - s) v'),  s = 1 / (1 + e),  1 - s = e s,  v' = 2 sqrt(2/pi) (1 + 3c x^2).
// exp is exp_f32's reduction and polynomial, rounded by vrndscaleps and scaled by vscalefps; 1 / (1 + e) is
// vrcp14ps and one Newton step (about 1 ulp). Some 20 instructions per 16 values where the scalar-written
// loop (tanh by division) took over 30 and a divide: GELU and its gradient were bound by arithmetic, not
// memory. The last partial vector is masked, so every element is computed alike wherever a thread's chunk
// ends: results do not depend on the thread count.
namespace act16 {

constexpr float kK = static_cast<float>(kSqrt2OverPi), kC = 0.044715f;
using simd16::kAll;

inline __m512 exp(__m512 z) {
  z = _mm512_maskz_min_ps(kAll, _mm512_maskz_max_ps(kAll, z, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_maskz_roundscale_ps(kAll, _mm512_mul_ps(z, _mm512_set1_ps(1.44269504088896341f)),
                                              _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), z);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  for (const float k : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(k));
  return _mm512_maskz_scalef_ps(kAll, p, n);
}

// 1 / d: vrcp14ps and one Newton step (about 1 ulp).
inline __m512 reciprocal(__m512 d) {
  const __m512 r = _mm512_maskz_rcp14_ps(kAll, d);
  return _mm512_fmadd_ps(_mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.0f)), r, r);
}

// s = 1 / (1 + e) with e = exp(-2u), for x.
inline __m512 sigmoid_2u(__m512 x, __m512& e) {
  const __m512 x2 = _mm512_mul_ps(x, x);
  const __m512 w = _mm512_fmadd_ps(x2, _mm512_set1_ps(-2 * kK * kC), _mm512_set1_ps(-2 * kK));
  e = exp(_mm512_mul_ps(x, w));
  return reciprocal(_mm512_add_ps(e, _mm512_set1_ps(1.0f)));
}

inline __m512 forward(__m512 x) {
  __m512 e;
  return _mm512_mul_ps(x, sigmoid_2u(x, e));
}

inline __m512 backward(__m512 dy, __m512 x) {
  __m512 e;
  const __m512 s = sigmoid_2u(x, e);
  const __m512 q = _mm512_fmadd_ps(_mm512_mul_ps(x, x), _mm512_set1_ps(6 * kK * kC), _mm512_set1_ps(2 * kK));
  const __m512 t = _mm512_mul_ps(_mm512_mul_ps(x, _mm512_mul_ps(e, s)), q);
  return _mm512_mul_ps(dy, _mm512_fmadd_ps(s, t, s));
}

// The exact (erf) GELU, x Phi(x), and its gradient Phi(x) + x phi(x). Phi comes from erfc in the form of
// Numerical Recipes' erfcc, a Chebyshev fit with relative error below 1.2e-7 for every z >= 0:
//   erfc(z) = t exp(P(t) - z^2),  t = 1 / (1 + z / 2),
// and Phi(x) = 1 - erfc(z) / 2 for x >= 0, erfc(z) / 2 below, z = |x| / sqrt(2): the lower tail keeps its
// relative accuracy, where 1 + erf(x / sqrt(2)) in f32 cancels it away. Scalar libm erf took a fifth of a
// BERT or ViT step.
namespace erf_gelu {

constexpr float kP[] = {0.17087277f,  -0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f,
                        -0.18628806f, 0.09678418f,  0.37409196f, 1.00002368f,  -1.26551223f};

// Phi(x); z2 = z^2 = x^2 / 2 for the caller's phi.
inline __m512 phi_cdf(__m512 x, __m512& z2) {
  const __m512 z = _mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(static_cast<float>(kInvSqrt2)));
  z2 = _mm512_mul_ps(z, z);
  const __m512 t = reciprocal(_mm512_fmadd_ps(z, _mm512_set1_ps(0.5f), _mm512_set1_ps(1.0f)));
  __m512 p = _mm512_set1_ps(kP[0]);
  for (size_t i = 1; i < std::size(kP); ++i) p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(kP[i]));
  const __m512 half_erfc = _mm512_mul_ps(_mm512_mul_ps(t, _mm512_set1_ps(0.5f)), exp(_mm512_sub_ps(p, z2)));
  const __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ);
  return _mm512_mask_sub_ps(half_erfc, pos, _mm512_set1_ps(1.0f), half_erfc);
}

inline __m512 forward(__m512 x) {
  __m512 z2;
  return _mm512_mul_ps(x, phi_cdf(x, z2));
}

inline __m512 backward(__m512 dy, __m512 x) {
  __m512 z2;
  const __m512 cdf = phi_cdf(x, z2);
  const __m512 pdf = _mm512_mul_ps(exp(_mm512_sub_ps(_mm512_setzero_ps(), z2)),
                                   _mm512_set1_ps(static_cast<float>(kInvSqrt2Pi)));
  return _mm512_mul_ps(dy, _mm512_fmadd_ps(x, pdf, cdf));
}

}  // namespace erf_gelu

// s = sigmoid(x) = 1 / (1 + e), e = exp(-x); SiLU x s and its gradient s (1 + x (1 - s)), with 1 - s taken
// as e s: subtracted from 1 it lost the gradient's accuracy for large x.
inline __m512 sigmoid(__m512 x, __m512& e) {
  e = exp(_mm512_sub_ps(_mm512_setzero_ps(), x));
  return reciprocal(_mm512_add_ps(e, _mm512_set1_ps(1.0f)));
}
inline __m512 sigmoid(__m512 x) {
  __m512 e;
  return sigmoid(x, e);
}
inline __m512 silu(__m512 x) {
  return _mm512_mul_ps(x, sigmoid(x));
}
// From s = sigmoid(x, e) already taken.
inline __m512 silu_backward(__m512 dy, __m512 x, __m512 s, __m512 e) {
  return _mm512_mul_ps(_mm512_mul_ps(dy, s), _mm512_fmadd_ps(x, _mm512_mul_ps(e, s), _mm512_set1_ps(1.0f)));
}
inline __m512 silu_backward(__m512 dy, __m512 x) {
  __m512 e;
  const __m512 s = sigmoid(x, e);
  return silu_backward(dy, x, s, e);
}

using simd16::load;
using simd16::store;

// out[i] = op(in[0][i], ...) for i in [s, e), 16 at a time, the last register masked. bf16 runs 32 values
// at a time (load_pairs, store_pairs) and the rest as above: the 16-value widening and rounding took a
// sixth of the bf16 GELU's time. Each value is computed alike either way, so the bits do not depend on
// where a thread's range starts or ends.
template <typename S, size_t N, typename Op>
void map_range(int64_t s, int64_t e, S* out, const std::array<const S*, N>& in, Op op) {
  static_assert(N == 1 || N == 2);
  auto apply = [&](const __m512* v) {
    if constexpr (N == 1)
      return op(v[0]);
    else
      return op(v[0], v[1]);
  };
  auto run16 = [&](int64_t i, __mmask16 m) {
    __m512 v[N];
    for (size_t k = 0; k < N; ++k) {
      prefetch_ahead(in[k] + i);
      v[k] = load(in[k] + i, m);
    }
    prefetch_ahead_for_write(out + i);
    store(out + i, apply(v), m);
  };
  int64_t i = s;
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<S, bf16>) {
    for (; i + 32 <= e; i += 32) {
      __m512 ev[N], od[N];
      for (size_t k = 0; k < N; ++k) {
        prefetch_ahead(in[k] + i);
        simd16::load_pairs(in[k] + i, ev[k], od[k]);
      }
      simd16::store_pairs(out + i, apply(ev), apply(od));
    }
  }
#endif
  for (; i < e; i += 16) run16(i, simd16::lanes(e - i));
}

// Whether the AVX-512 path serves this dtype (f32, bf16); f64 keeps the scalar-written loops.
inline bool serves(DType t) {
  return t == DType::f32 || t == DType::bf16;
}

// y = op(x) over a whole tensor, f32 or bf16.
template <typename Op>
void map1(const TensorView& x, const TensorView& y, Op op) {
  auto run = [&](auto* tag) {
    using S = std::remove_pointer_t<decltype(tag)>;
    const std::array<const S*, 1> in = {x.as<S>()};
    S* out = y.as<S>();
    parallel_for(y.numel(), kGrain, [&](int64_t s, int64_t e) { map_range(s, e, out, in, op); });
  };
  if (x.dtype == DType::bf16)
    run(static_cast<bf16*>(nullptr));
  else
    run(static_cast<float*>(nullptr));
}

// dx[i] = op(dy[i], x[i]) for i in [s, e).
template <typename S, typename Op>
void map2_range(const S* dy, const S* x, S* dx, int64_t s, int64_t e, Op op) {
  map_range(s, e, dx, std::array<const S*, 2>{dy, x}, op);
}

// dx = op(dy, x) over a whole tensor, f32 or bf16.
template <typename Op>
void map2(const KernelCtx& c, Op op) {
  auto run = [&](auto* tag) {
    using S = std::remove_pointer_t<decltype(tag)>;
    const S *dy = c.in[0].as<S>(), *x = c.in[1].as<S>();
    S* dx = c.out[0].as<S>();
    parallel_for(c.out[0].numel(), kGrain, [&](int64_t s, int64_t e) { map2_range(dy, x, dx, s, e, op); });
  };
  if (c.in[0].dtype == DType::bf16)
    run(static_cast<bf16*>(nullptr));
  else
    run(static_cast<float*>(nullptr));
}

}  // namespace act16
#elif defined(__AVX2__) && defined(__FMA__)
// GELU (tanh and erf) and its gradient in AVX2, 8 f32 lanes at a time from f32 or bf16 storage (bf16 widens
// exactly and rounds as bf16_bits_of does), for hosts without AVX-512: the
// scalar-written loops ran gpt-tiny's GELU and its gradient at 0.3-0.5 GFLOP/s, 57 ms of its 465 ms step
// on a 2-core Zen 3 host. The formulas are act16's; exp is act16's too, bit for bit (2^n put in the
// exponent bits, n in [-126, 127], is the product vscalefps makes), and 1 / d is a division where act16
// takes vrcp14ps and a Newton step. The last partial vector is computed alike, through a copy.
namespace act8 {

constexpr float kK = static_cast<float>(kSqrt2OverPi), kC = 0.044715f;

inline __m256 set1(float v) {
  return _mm256_set1_ps(v);
}

inline __m256 exp(__m256 z) {
  z = _mm256_min_ps(_mm256_max_ps(z, set1(-87.0f)), set1(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(z, set1(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, set1(0.693145751953125f), z);
  r = _mm256_fnmadd_ps(n, set1(1.428606765330187e-06f), r);
  __m256 p = set1(1.0f / 720);
  for (const float k : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    p = _mm256_fmadd_ps(p, r, set1(k));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// s = 1 / (1 + e) with e = exp(-2u), for x.
inline __m256 sigmoid_2u(__m256 x, __m256& e) {
  const __m256 w = _mm256_fmadd_ps(_mm256_mul_ps(x, x), set1(-2 * kK * kC), set1(-2 * kK));
  e = exp(_mm256_mul_ps(x, w));
  return _mm256_div_ps(set1(1.0f), _mm256_add_ps(e, set1(1.0f)));
}

inline __m256 forward(__m256 x) {
  __m256 e;
  return _mm256_mul_ps(x, sigmoid_2u(x, e));
}

inline __m256 backward(__m256 dy, __m256 x) {
  __m256 e;
  const __m256 s = sigmoid_2u(x, e);
  const __m256 q = _mm256_fmadd_ps(_mm256_mul_ps(x, x), set1(6 * kK * kC), set1(2 * kK));
  const __m256 t = _mm256_mul_ps(_mm256_mul_ps(x, _mm256_mul_ps(e, s)), q);
  return _mm256_mul_ps(dy, _mm256_fmadd_ps(s, t, s));
}

// s = sigmoid(x) = 1 / (1 + e), e = exp(-x); SiLU x s and its gradient s (1 + x (1 - s)) with 1 - s taken as
// e s: act16's formulas. The scalar loops ran kjv_llama's SwiGLU and its gradient at 0.2-0.3 GFLOP/s, 75-90
// ms of its 460-600 ms step on a 2-core Zen 3 host; these 10-11 ms.
inline __m256 sigmoid(__m256 x, __m256& e) {
  e = exp(_mm256_sub_ps(_mm256_setzero_ps(), x));
  return _mm256_div_ps(set1(1.0f), _mm256_add_ps(e, set1(1.0f)));
}
inline __m256 sigmoid(__m256 x) {
  __m256 e;
  return sigmoid(x, e);
}
inline __m256 silu(__m256 x) {
  return _mm256_mul_ps(x, sigmoid(x));
}
// From s = sigmoid(x, e) already taken.
inline __m256 silu_backward(__m256 dy, __m256 x, __m256 s, __m256 e) {
  return _mm256_mul_ps(_mm256_mul_ps(dy, s), _mm256_fmadd_ps(x, _mm256_mul_ps(e, s), set1(1.0f)));
}
inline __m256 silu_backward(__m256 dy, __m256 x) {
  __m256 e;
  const __m256 s = sigmoid(x, e);
  return silu_backward(dy, x, s, e);
}

// The exact GELU through act16::erf_gelu's erfc fit.
namespace erf_gelu {

constexpr float kP[] = {0.17087277f,  -0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f,
                        -0.18628806f, 0.09678418f,  0.37409196f, 1.00002368f,  -1.26551223f};

inline __m256 phi_cdf(__m256 x, __m256& z2) {
  const __m256 ax = _mm256_andnot_ps(set1(-0.0f), x);
  const __m256 z = _mm256_mul_ps(ax, set1(static_cast<float>(kInvSqrt2)));
  z2 = _mm256_mul_ps(z, z);
  const __m256 t = _mm256_div_ps(set1(1.0f), _mm256_fmadd_ps(z, set1(0.5f), set1(1.0f)));
  __m256 p = set1(kP[0]);
  for (size_t i = 1; i < std::size(kP); ++i) p = _mm256_fmadd_ps(p, t, set1(kP[i]));
  const __m256 half_erfc = _mm256_mul_ps(_mm256_mul_ps(t, set1(0.5f)), exp(_mm256_sub_ps(p, z2)));
  const __m256 pos = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ);
  return _mm256_blendv_ps(half_erfc, _mm256_sub_ps(set1(1.0f), half_erfc), pos);
}

inline __m256 forward(__m256 x) {
  __m256 z2;
  return _mm256_mul_ps(x, phi_cdf(x, z2));
}

inline __m256 backward(__m256 dy, __m256 x) {
  __m256 z2;
  const __m256 cdf = phi_cdf(x, z2);
  const __m256 pdf =
      _mm256_mul_ps(exp(_mm256_sub_ps(_mm256_setzero_ps(), z2)), set1(static_cast<float>(kInvSqrt2Pi)));
  return _mm256_mul_ps(dy, _mm256_fmadd_ps(x, pdf, cdf));
}

}  // namespace erf_gelu

inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 load8(const bf16* p) {  // widened exactly
  const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}
inline void store8(float* p, __m256 v) {
  _mm256_storeu_ps(p, v);
}
inline void store8(bf16* p, __m256 v) {  // rounded as bf16_bits_of: nearest-even, NaNs quieted
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i w =
      _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
}

// out[i] = op(in[0][i], ...) for i in [s, e), f32 or bf16 storage; the last partial vector through a copy.
template <typename S, size_t N, typename Op>
void map_range(int64_t s, int64_t e, S* out, const std::array<const S*, N>& in, Op op) {
  auto apply = [&](const std::array<const S*, N>& src, S* dst) {
    __m256 v[N];
    for (size_t k = 0; k < N; ++k) v[k] = load8(src[k]);
    if constexpr (N == 1)
      store8(dst, op(v[0]));
    else
      store8(dst, op(v[0], v[1]));
  };
  int64_t i = s;
  for (; i + 8 <= e; i += 8) {
    std::array<const S*, N> at;
    for (size_t k = 0; k < N; ++k) at[k] = in[k] + i;
    apply(at, out + i);
  }
  if (i == e) return;
  S tail[N + 1][8] = {};
  std::array<const S*, N> at;
  for (size_t k = 0; k < N; ++k) {
    std::copy(in[k] + i, in[k] + e, tail[k]);
    at[k] = tail[k];
  }
  apply(at, tail[N]);
  std::copy(tail[N], tail[N] + (e - i), out + i);
}

// c.out[0] = op(c.in[0]) (N = 1) or op(c.in[0], c.in[1]) (N = 2) in f32; false for other dtypes. Not bf16:
// bf16 nodes run widened below AVX-512, and swiglu's fused bf16 loops (which round as the unfused ops would)
// are the scalar ones there, whose bits the unfused bf16 SiLU must give.
template <size_t N, typename Op>
bool map(const KernelCtx& c, Op op) {
  if (c.in[0].dtype != DType::f32) return false;
  std::array<const float*, N> in;
  for (size_t k = 0; k < N; ++k) in[k] = c.in[k].as<float>();
  float* out = c.out[0].as<float>();
  parallel_for(c.out[0].numel(), kGrain, [&](int64_t s, int64_t e) { map_range(s, e, out, in, op); });
  return true;
}

}  // namespace act8
#endif  // __AVX512F__

}  // namespace

void add(const KernelCtx& c) {
  binary(c, [](auto a, auto b) { return a + b; });
}
void sub(const KernelCtx& c) {
  binary(c, [](auto a, auto b) { return a - b; });
}
void mul(const KernelCtx& c) {
  binary(c, [](auto a, auto b) { return a * b; });
}
void div(const KernelCtx& c) {
  binary(c, [](auto a, auto b) { return a / b; });
}

void add_scalar(const KernelCtx& c) {
  const double v = c.attrs().f("value");
  unary(c, [v](auto x) { return x + static_cast<decltype(x)>(v); });
}
void mul_scalar(const KernelCtx& c) {
  const double v = c.attrs().f("value");
  unary(c, [v](auto x) { return x * static_cast<decltype(x)>(v); });
}
void pow_scalar(const KernelCtx& c) {
  const double v = c.attrs().f("value");
  unary(c, [v](auto x) { return std::pow(x, static_cast<decltype(x)>(v)); });
}

void relu(const KernelCtx& c) {
  unary(c, [](auto x) { return x > 0 ? x : decltype(x){0}; });
}
void relu_grad(const KernelCtx& c) {
  if (c.num_in == 2) {
    grad2(c, [](auto dy, auto y) { return y > 0 ? dy : decltype(dy){0}; });
    return;
  }
  // dy + dy2 rounded to storage, as add writes it, then masked as relu_grad reads it: the unfused bits.
  dispatch_storage(c.in[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using C = Compute<T>;
    const T *dy = c.in[0].as<T>(), *y = c.in[1].as<T>(), *dy2 = c.in[2].as<T>();
    T* dx = c.out[0].as<T>();
    parallel_for(c.out[0].numel(), kGrain, [&](int64_t s, int64_t e) {
#if defined(__AVX512F__)
      // The generic loop's bf16 rounding does not vectorise: 16 times slower than f32 in a ResNet step. The
      // sum is masked, then rounded once: the same bits, as rounding keeps 0. The three inputs come from L3
      // (a ResNet block's gradients and its forward output): asked for 2 KiB ahead, with the output line for
      // writing, ResNet-20's 9 took 1.25-1.30 ms a step rather than 1.53-1.61 in f32, 0.67 rather than 0.89
      // in bf16 (alternating profiled runs).
      if constexpr (std::is_same_v<C, float>) {
        for (int64_t i = s; i < e; i += 16) {
          const __mmask16 m = simd16::lanes(e - i);
          prefetch_ahead(dy + i);
          prefetch_ahead(dy2 + i);
          prefetch_ahead(y + i);
          prefetch_ahead_for_write(dx + i);
          const __m512 sum = _mm512_add_ps(simd16::load(dy + i, m), simd16::load(dy2 + i, m));
          const __mmask16 pos = _mm512_cmp_ps_mask(simd16::load(y + i, m), _mm512_setzero_ps(), _CMP_GT_OQ);
          simd16::store(dx + i, _mm512_maskz_mov_ps(pos, sum), m);
        }
        return;
      }
#endif
      int64_t i = s;
      if constexpr (std::is_same_v<T, float>) {
        // Whole registers of 8 (f8.h): the loop below stays scalar, a branch per element. ResNet-20's 9 on a
        // Zen 3 host: 8.7 -> 1.4 ms a step (profiled).
        for (; i + 16 <= e; i += 16) {
          prefetch_ahead(dy + i);
          prefetch_ahead(dy2 + i);
          prefetch_ahead(y + i);
          prefetch_ahead_for_write(dx + i);
          for (int64_t h = i; h < i + 16; h += 8) {
            const F8 sum = load8(dy + h) + load8(dy2 + h);
            store8(dx + h, load8(y + h) > 0 ? sum : F8{});
          }
        }
      }
      for (; i < e; ++i) {
        const T sum = st<T>(static_cast<C>(ld(dy[i]) + ld(dy2[i])));
        dx[i] = ld(y[i]) > C(0) ? sum : st<T>(C(0));
      }
    });
  });
}

void gelu(const TensorView& x, const TensorView& y, bool tanh) {
#if defined(__AVX512F__)
  if (act16::serves(x.dtype)) {
    if (tanh)
      act16::map1(x, y, [](__m512 v) { return act16::forward(v); });
    else
      act16::map1(x, y, [](__m512 v) { return act16::erf_gelu::forward(v); });
    return;
  }
#elif defined(__AVX2__) && defined(__FMA__)
  if (x.dtype == DType::f32 || x.dtype == DType::bf16) {
    auto run = [&](auto* tag) {
      using S = std::remove_pointer_t<decltype(tag)>;
      const std::array<const S*, 1> in = {x.as<S>()};
      S* out = y.as<S>();
      parallel_for(y.numel(), kGrain, [&](int64_t s, int64_t e) {
        if (tanh)
          act8::map_range(s, e, out, in, [](__m256 v) { return act8::forward(v); });
        else
          act8::map_range(s, e, out, in, [](__m256 v) { return act8::erf_gelu::forward(v); });
      });
    };
    if (x.dtype == DType::bf16)
      run(static_cast<bf16*>(nullptr));
    else
      run(static_cast<float*>(nullptr));
    return;
  }
#endif
  if (tanh)
    unary(x, y, [](auto v) {
      using T = decltype(v);
      return T(0.5) * v * (T(1) + gelu_tanh(T(kSqrt2OverPi) * (v + T(0.044715) * v * v * v)));
    });
  else
    unary(x, y, [](auto v) {
      using T = decltype(v);
      return T(0.5) * v * std::erfc(-v * T(kInvSqrt2));  // Phi as erfc: 1 + erf cancels the lower tail
    });
}
void gelu(const KernelCtx& c) {
  gelu(c.in[0], c.out[0], tanh_approx(c));
}
namespace {

// gelu_grad's elements [s, e): dx = dy * gelu'(x) (tanh: approximate=tanh). Not inlined, so that gelu_grad
// and gelu_bias_grad run this one compiled loop and compute the same bits.
template <typename S>
[[gnu::noinline]] void gelu_grad_range(bool tanh, const S* dy, const S* x, S* dx, int64_t s, int64_t e) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<S, float> || std::is_same_v<S, bf16>) {
    if (tanh)
      act16::map2_range(dy, x, dx, s, e, [](__m512 g, __m512 v) { return act16::backward(g, v); });
    else
      act16::map2_range(dy, x, dx, s, e, [](__m512 g, __m512 v) { return act16::erf_gelu::backward(g, v); });
    return;
  }
#elif defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same_v<S, float> || std::is_same_v<S, bf16>) {
    const std::array<const S*, 2> in = {dy, x};
    if (tanh)
      act8::map_range(s, e, dx, in, [](__m256 g, __m256 v) { return act8::backward(g, v); });
    else
      act8::map_range(s, e, dx, in, [](__m256 g, __m256 v) { return act8::erf_gelu::backward(g, v); });
    return;
  }
#endif
  using T = Compute<S>;
  if (tanh) {
    for (int64_t i = s; i < e; ++i) {
      const T v = ld(x[i]);
      const T u = T(kSqrt2OverPi) * (v + T(0.044715) * v * v * v);
      const T t = gelu_tanh(u);
      const T du = T(kSqrt2OverPi) * (T(1) + T(3 * 0.044715) * v * v);
      dx[i] = st<S>(ld(dy[i]) * (T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * du));
    }
  } else {
    for (int64_t i = s; i < e; ++i) {
      const T v = ld(x[i]);
      dx[i] = st<S>(ld(dy[i]) *
                    (T(0.5) * std::erfc(-v * T(kInvSqrt2)) + v * T(kInvSqrt2Pi) * std::exp(T(-0.5) * v * v)));
    }
  }
}

}  // namespace

void gelu_grad(const KernelCtx& c) {
  const bool tanh = tanh_approx(c);
  dispatch_storage(c.in[0].dtype, [&](auto* tag) {
    using S = std::remove_pointer_t<decltype(tag)>;
    const S *dy = c.in[0].as<S>(), *x = c.in[1].as<S>();
    S* dx = c.out[0].as<S>();
    parallel_for(c.out[0].numel(), kGrain,
                 [&](int64_t s, int64_t e) { gelu_grad_range(tanh, dy, x, dx, s, e); });
  });
}

namespace {

// relu_grad's elements [s, e): dx = dy where y > 0, else 0, as relu_grad (grad2) writes it. dy is loaded
// whatever y is: read only where y > 0 the loop became masked loads, 1.3x slower.
template <typename S>
[[gnu::noinline]] void relu_grad_range(const S* dy, const S* y, S* dx, int64_t s, int64_t e) {
  using T = Compute<S>;
  for (int64_t i = s; i < e; ++i) {
    const T d = ld(dy[i]);
    dx[i] = st<S>(ld(y[i]) > T(0) ? d : T(0));
  }
}

// An activation's gradient (dy, x or y) -> dx by `range(dy, x, dx, s, e)` over elements [s, e), and the sum
// of dx over its leading rows in reduce_sum's order (reduce.h): tasks of (chunk of rows, block of columns),
// each row's segment computed and then added to the chunk's partial sums while it is still in L1, where the
// unfused reduce_sum read the whole gradient back from memory. The partials sum the stored (rounded) dx, as
// reduce_sum reads it. (How columns are split into tasks does not change any column's order of additions.)
template <typename Range>
void bias_grad(const KernelCtx& c, const Range& range) {
  const int64_t n = c.in[0].shape->back(), rows = c.in[0].numel() / std::max<int64_t>(n, 1);
  const int64_t chunks = reduce_row_chunks(rows);
  // Whole rows per task when there are chunks to share out (the rows stream from memory in order; blocks of
  // columns from rows 4 KiB apart ran at half the speed), column blocks otherwise.
  const int64_t block = chunks > 1 ? n : 256, blocks = (n + block - 1) / block;
  dispatch_storage(c.in[0].dtype, [&](auto* tag) {
    using S = std::remove_pointer_t<decltype(tag)>;
    using T = Compute<S>;
    const S *dy = c.in[0].as<S>(), *x = c.in[1].as<S>();
    S* dx = c.out[0].as<S>();
    T* part = static_cast<T*>(c.workspace);
    FR_CHECK(c.workspace_bytes >= static_cast<size_t>(chunks * n) * sizeof(T), c.node->op,
             " workspace too small");
    parallel_for(chunks * blocks, 1, [&](int64_t s, int64_t e) {
      for (int64_t t = s; t < e; ++t) {
        const int64_t ch = t % chunks, k0 = t / chunks * block, k1 = std::min(n, k0 + block);
        const int64_t r0 = ch * rows / chunks, r1 = (ch + 1) * rows / chunks;
        T* p = part + ch * n;
        for (int64_t r = r0; r < r1; ++r) {
          range(dy, x, dx, r * n + k0, r * n + k1);
          const S* row = dx + r * n;
          if (r == r0)
            for (int64_t k = k0; k < k1; ++k) p[k] = ld(row[k]);
          else
            for (int64_t k = k0; k < k1; ++k) p[k] += ld(row[k]);
        }
      }
    });
    // The chunks in order, into the result's type: T, f32 from bf16 (out_dtype), or rounded to S.
    const DType out = c.out[1].dtype;
    parallel_for(n, 4096, [&](int64_t s, int64_t e) {
      for (int64_t k = s; k < e; ++k) {
        T sum = part[k];
        for (int64_t ch = 1; ch < chunks; ++ch) sum += part[ch * n + k];
        if (out == c.in[0].dtype)
          c.out[1].as<S>()[k] = st<S>(sum);
        else
          c.out[1].as<float>()[k] = static_cast<float>(sum);
      }
    });
  });
}

}  // namespace

void gelu_bias_grad(const KernelCtx& c) {
  const bool tanh = tanh_approx(c);
  bias_grad(c, [tanh](const auto* dy, const auto* x, auto* dx, int64_t s, int64_t e) {
    gelu_grad_range(tanh, dy, x, dx, s, e);
  });
}

void relu_bias_grad(const KernelCtx& c) {
  bias_grad(c, [](const auto* dy, const auto* y, auto* dx, int64_t s, int64_t e) {
    relu_grad_range(dy, y, dx, s, e);
  });
}

void silu(const KernelCtx& c) {
#if defined(__AVX512F__)
  if (act16::serves(c.in[0].dtype)) {
    act16::map1(c.in[0], c.out[0], [](__m512 v) { return act16::silu(v); });
    return;
  }
#elif defined(__AVX2__) && defined(__FMA__)
  if (act8::map<1>(c, [](__m256 v) { return act8::silu(v); })) return;
#endif
  unary(c, [](auto x) { return x / (decltype(x)(1) + std::exp(-x)); });
}
void silu_grad(const KernelCtx& c) {
#if defined(__AVX512F__)
  if (act16::serves(c.in[0].dtype)) {
    act16::map2(c, [](__m512 g, __m512 v) { return act16::silu_backward(g, v); });
    return;
  }
#elif defined(__AVX2__) && defined(__FMA__)
  if (act8::map<2>(c, [](__m256 g, __m256 v) { return act8::silu_backward(g, v); })) return;
#endif
  grad2(c, [](auto dy, auto x) {
    using T = decltype(x);
    const T e = std::exp(-x), s = T(1) / (T(1) + e);
    return dy * s * (T(1) + x * (e * s));  // 1 - s as e s, as act16::silu_backward: no cancellation
  });
}

namespace {

// SwiGLU's product and gradient, elements [s, e): h = silu(g) u, and (dg, du) from dh. Every intermediate is
// rounded to the storage type where the unfused silu -> mul (and mul's and silu's gradients) would store it,
// so the fused op computes their bits: s = silu(g) and ds = dh u as stored, du = dh s, dg = silu_grad(ds, g).
template <typename S>
void swiglu_range(const S* g, const S* u, S* h, int64_t s, int64_t e) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<S, float> || std::is_same_v<S, bf16>) {
    for (int64_t i = s; i < e; i += 16) {
      const __mmask16 m = simd16::lanes(e - i);
      const __m512 sv = simd16::rounded<S>(act16::silu(simd16::load(g + i, m)));
      simd16::store(h + i, _mm512_mul_ps(sv, simd16::load(u + i, m)), m);
    }
    return;
  }
#elif defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same_v<S, float>) {  // bf16 runs widened there
    const std::array<const float*, 2> in = {g, u};
    act8::map_range(s, e, h, in, [](__m256 x, __m256 v) { return _mm256_mul_ps(act8::silu(x), v); });
    return;
  }
#endif
  using T = Compute<S>;
  for (int64_t i = s; i < e; ++i) {
    const T x = ld(g[i]);
    h[i] = st<S>(ld(st<S>(x / (T(1) + std::exp(-x)))) * ld(u[i]));
  }
}

template <typename S>
void swiglu_grad_range(const S* dh, const S* g, const S* u, S* dg, S* du, int64_t s, int64_t e) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<S, float> || std::is_same_v<S, bf16>) {
    for (int64_t i = s; i < e; i += 16) {
      const __mmask16 m = simd16::lanes(e - i);
      const __m512 d = simd16::load(dh + i, m), x = simd16::load(g + i, m);
      __m512 e;
      const __m512 sg = act16::sigmoid(x, e);  // once, for silu(g) and its gradient
      const __m512 sv = simd16::rounded<S>(_mm512_mul_ps(x, sg));
      const __m512 ds = simd16::rounded<S>(_mm512_mul_ps(d, simd16::load(u + i, m)));
      simd16::store(du + i, _mm512_mul_ps(d, sv), m);
      simd16::store(dg + i, act16::silu_backward(ds, x, sg, e), m);
    }
    return;
  }
#elif defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same_v<S, float>) {  // bf16 runs widened there
    auto eight = [](const float* dh8, const float* g8, const float* u8, float* dg8, float* du8) {
      const __m256 d = _mm256_loadu_ps(dh8), x = _mm256_loadu_ps(g8);
      __m256 ex;
      const __m256 sg = act8::sigmoid(x, ex);  // once, for silu(g) and its gradient
      const __m256 ds = _mm256_mul_ps(d, _mm256_loadu_ps(u8));
      _mm256_storeu_ps(du8, _mm256_mul_ps(d, _mm256_mul_ps(x, sg)));
      _mm256_storeu_ps(dg8, act8::silu_backward(ds, x, sg, ex));
    };
    int64_t i = s;
    for (; i + 8 <= e; i += 8) eight(dh + i, g + i, u + i, dg + i, du + i);
    if (i < e) {  // the last partial vector through copies, computed alike
      float t[5][8] = {};
      std::copy(dh + i, dh + e, t[0]);
      std::copy(g + i, g + e, t[1]);
      std::copy(u + i, u + e, t[2]);
      eight(t[0], t[1], t[2], t[3], t[4]);
      std::copy(t[3], t[3] + (e - i), dg + i);
      std::copy(t[4], t[4] + (e - i), du + i);
    }
    return;
  }
#endif
  using T = Compute<S>;
  for (int64_t i = s; i < e; ++i) {
    const T d = ld(dh[i]), x = ld(g[i]);
    const T sv = ld(st<S>(x / (T(1) + std::exp(-x)))), ds = ld(st<S>(d * ld(u[i])));
    const T eg = std::exp(-x), sg = T(1) / (T(1) + eg);
    du[i] = st<S>(d * sv);
    dg[i] = st<S>(ds * sg * (T(1) + x * (eg * sg)));
  }
}

}  // namespace

void swiglu(const KernelCtx& c) {
  dispatch_storage(c.in[0].dtype, [&](auto* tag) {
    using S = std::remove_pointer_t<decltype(tag)>;
    const S *g = c.in[0].as<S>(), *u = c.in[1].as<S>();
    S* h = c.out[0].as<S>();
    parallel_for(c.out[0].numel(), kGrain, [&](int64_t s, int64_t e) { swiglu_range(g, u, h, s, e); });
  });
}

void swiglu_grad(const KernelCtx& c) {
  dispatch_storage(c.in[0].dtype, [&](auto* tag) {
    using S = std::remove_pointer_t<decltype(tag)>;
    const S *dh = c.in[0].as<S>(), *g = c.in[1].as<S>(), *u = c.in[2].as<S>();
    S *dg = c.out[0].as<S>(), *du = c.out[1].as<S>();
    parallel_for(c.out[0].numel(), kGrain,
                 [&](int64_t s, int64_t e) { swiglu_grad_range(dh, g, u, dg, du, s, e); });
  });
}

void tanh(const KernelCtx& c) {
  unary(c, [](auto x) { return std::tanh(x); });
}
void tanh_grad(const KernelCtx& c) {
  grad2(c, [](auto dy, auto y) { return dy * (decltype(y)(1) - y * y); });
}

void sigmoid(const KernelCtx& c) {
#if defined(__AVX512F__)
  if (act16::serves(c.in[0].dtype)) {
    act16::map1(c.in[0], c.out[0], [](__m512 v) { return act16::sigmoid(v); });
    return;
  }
#elif defined(__AVX2__) && defined(__FMA__)
  if (act8::map<1>(c, [](__m256 v) { return act8::sigmoid(v); })) return;
#endif
  unary(c, [](auto x) { return decltype(x)(1) / (decltype(x)(1) + std::exp(-x)); });
}
void sigmoid_grad(const KernelCtx& c) {
  grad2(c, [](auto dy, auto y) { return dy * y * (decltype(y)(1) - y); });
}

void fill_like(const KernelCtx& c) {
  const double v = c.attrs().f("value");
  const TensorView& y = c.out[0];
  const int64_t n = y.numel();
  switch (y.dtype) {
    case DType::f32:
      std::fill_n(y.as<float>(), n, static_cast<float>(v));
      break;
    case DType::f64:
      std::fill_n(y.as<double>(), n, v);
      break;
    case DType::f16:
      std::fill_n(y.as<f16>(), n, float_to_f16(static_cast<float>(v)));
      break;
    case DType::bf16:
      std::fill_n(y.as<bf16>(), n, float_to_bf16(static_cast<float>(v)));
      break;
    default:
      FR_CHECK(false, "fill_like: dtype ", dtype_name(y.dtype));
  }
}

void copy(const KernelCtx& c) {
  if (c.out[0].data != c.in[0].data)
    std::memcpy(c.out[0].data, c.in[0].data,
                static_cast<size_t>(c.out[0].numel()) * dtype_size(c.out[0].dtype));
}

void convert(const void* src, DType from, void* dst, DType to, int64_t n) {
  if (from == to) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(to));
    return;
  }
  // Common low-precision paths use the branch-free converters of elementwise.h, which GCC vectorises; the
  // rest go through the generic f64 converter.
  auto each = [n](auto f) {
    parallel_for(n, kGrain, [&](int64_t s, int64_t e) {
#pragma omp simd
      for (int64_t i = s; i < e; ++i) f(i);
    });
  };
  const auto* fs = static_cast<const float*>(src);
  auto* fd = static_cast<float*>(dst);
  const auto* hs = static_cast<const uint16_t*>(src);
  auto* hd = static_cast<uint16_t*>(dst);
  if (from == DType::f32 && to == DType::bf16) {
#if defined(__AVX512F__)
    // simd16's rounding (vcvtneps2bf16 on avx512_bf16 CPUs): a third of the instructions of the vectorised
    // bf16_bits_of, the same bits.
    auto* d = reinterpret_cast<bf16*>(hd);
    parallel_for(n, kGrain, [&](int64_t s, int64_t e) { simd16::round_to_bf16(fs + s, d + s, e - s); });
#else
    each([&](int64_t i) { hd[i] = bf16_bits_of(fs[i]); });
#endif
  } else if (from == DType::bf16 && to == DType::f32) {
    each([&](int64_t i) { fd[i] = float_of_bf16_bits(hs[i]); });
  } else if (from == DType::f32 && to == DType::f16) {
    each([&](int64_t i) { hd[i] = f16_bits_of(fs[i]); });
  } else if (from == DType::f16 && to == DType::f32) {
    each([&](int64_t i) { fd[i] = float_of_f16_bits(hs[i]); });
  } else {
    parallel_for(n, kGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) store_from_f64(dst, to, i, load_as_f64(src, from, i));
    });
  }
}

void cast(const KernelCtx& c) {
  const TensorView &x = c.in[0], &y = c.out[0];
  if (x.data == y.data && x.dtype == y.dtype) return;
  convert(x.data, x.dtype, y.data, y.dtype, x.numel());
}

}  // namespace flowrun::cpu
