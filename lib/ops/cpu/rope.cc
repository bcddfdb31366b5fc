// CPU kernel of the rotary position embedding (ops/attention.cc): Hugging Face's rotate_half convention,
// pair (i, i + D/2) of each row of x (B, H, T, D) rotated by the angle of (offset + t, i).
//
// The cos/sin of every (t, i) are computed once into the workspace (T x D of the compute type, f32 for bf16
// storage: cos in the first half of a row, sin in the second, sin negated for the inverse rotation), then
// every (batch, head) row reads its position's table row: the B x H rows share T x D/2 pairs of
// trigonometric calls. bf16 runs natively (f32 arithmetic, one rounding per output) rather than widened into
// f32 copies and back (the bf16 Llama step 0.98x).
#include <algorithm>
#include <cmath>

#include "ops/cpu/attention.h"
#include "ops/cpu/elementwise.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/simd16.h"

namespace flowrun::cpu {

namespace {

// Rotates n pairs: ya = a cos - b sin, yb = b cos + a sin, from storage S (f32 or bf16) in f32 with the
// products and sums written out (one rounding each, then the storage's), so that a bf16 row gets exactly the
// f32 kernel's result on its widened values, rounded.
#if defined(__AVX512F__)
template <typename S>
void rotate_pairs(const S* a, const S* b, const float* cs, const float* sn, S* ya, S* yb, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = simd16::lanes(n - i);
    const __m512 av = simd16::load(a + i, m), bv = simd16::load(b + i, m);
    const __m512 c = simd16::load(cs + i, m), s = simd16::load(sn + i, m);
    const __m512 lo = _mm512_fmsub_ps(av, c, _mm512_mul_ps(bv, s));
    const __m512 hi = _mm512_fmadd_ps(bv, c, _mm512_mul_ps(av, s));
    simd16::store(ya + i, lo, m);
    simd16::store(yb + i, hi, m);
  }
}
#endif

template <typename T>
void rotate_pairs_scalar(const T* a, const T* b, const Compute<T>* cs, const Compute<T>* sn, T* ya, T* yb,
                         int64_t n) {
  using C = Compute<T>;
  for (int64_t i = 0; i < n; ++i) {
    const C av = ld(a[i]), bv = ld(b[i]);
    ya[i] = st<T>(static_cast<C>(av * cs[i] - bv * sn[i]));
    yb[i] = st<T>(static_cast<C>(bv * cs[i] + av * sn[i]));
  }
}

}  // namespace

void rope(const KernelCtx& c) {
  dispatch_storage(c.in[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using C = Compute<T>;  // the table's type: f32 for bf16 storage
    const TensorView& xv = c.in[0];
    const int64_t rows = xv.dim(0) * xv.dim(1), len = xv.dim(2), d = xv.dim(3), half = d / 2;
    const double theta = c.attrs().f("theta", 10000.0);
    const int64_t offset = c.attrs().i("offset", 0) + (c.num_in == 2 ? c.in[1].as<int64_t>()[0] : 0);
    const C sign = c.attrs().b("inverse", false) ? C(-1) : C(1);
    FR_CHECK(c.workspace_bytes >= static_cast<size_t>(len * d) * sizeof(C), "rope workspace too small");
    C* table = static_cast<C*>(c.workspace);
    parallel_for(len, 16, [&](int64_t s, int64_t e) {
      for (int64_t t = s; t < e; ++t)
        for (int64_t i = 0; i < half; ++i) {
          const double a = static_cast<double>(rope_angle(offset + t, i, d, theta));
          table[t * d + i] = static_cast<C>(std::cos(a));
          table[t * d + half + i] = sign * static_cast<C>(std::sin(a));
        }
    });
    const T* x = xv.as<T>();
    T* y = c.out[0].as<T>();  // may be x: each pair is read whole before it is written
    parallel_for(rows * len, std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1)),
                 [&](int64_t s, int64_t e) {
                   for (int64_t r = s; r < e; ++r) {
                     const C* cs = table + (r % len) * d;
                     const T* xr = x + r * d;
                     T* yr = y + r * d;
#if defined(__AVX512F__)
                     if constexpr (!std::is_same_v<T, double>) {
                       rotate_pairs(xr, xr + half, cs, cs + half, yr, yr + half, half);
                       continue;
                     }
#endif
                     rotate_pairs_scalar(xr, xr + half, cs, cs + half, yr, yr + half, half);
                   }
                 });
  });
}

}  // namespace flowrun::cpu
