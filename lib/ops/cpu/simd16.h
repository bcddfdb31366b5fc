// 16 f32 lanes loaded from f32 or bf16 storage and stored back, for the AVX-512 kernels that serve both
// (GELU, max pooling): bf16 widens exactly and rounds as bf16_bits_of does (nearest-even, NaNs quieted), so
// such a kernel computes what its f32 kernel computes on widened inputs.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace flowrun::cpu::simd16 {

// GCC 12's unmasked forms of some intrinsics start from _mm512_undefined_*, which -Wmaybe-uninitialized
// rejects; the zero-masked forms over all lanes are the same instructions.
constexpr __mmask16 kAll = 0xffff;
constexpr __mmask8 kAll8 = 0xff;

// The first min(n, 16) lanes: the mask of a loop's last, partial register.
inline __mmask16 lanes(int64_t n) {
  return n >= 16 ? kAll : static_cast<__mmask16>((1u << n) - 1);
}

inline __m512 load(const float* p, __mmask16 m = kAll) {
  return _mm512_maskz_loadu_ps(m, p);
}
inline __m512 load(const bf16* p, __mmask16 m = kAll) {
  const __m512i h = _mm512_maskz_cvtepu16_epi32(kAll, _mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll, h, 16));
}
inline void store(float* p, __m512 v, __mmask16 m = kAll) {
  _mm512_mask_storeu_ps(p, m, v);
}
// The 16 lanes rounded to bf16 bits (bf16_bits_of), in the 32-bit lanes' low halves.
inline __m512i bf16_bits(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_maskz_srli_epi32(kAll, u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_maskz_srli_epi32(
      kAll, _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(r, nan, _mm512_maskz_srli_epi32(kAll, u, 16), _mm512_set1_epi32(0x40));
}

#if defined(__AVX512BF16__)
// The same bits packed into 16 words: vcvtneps2bf16 rounds to nearest-even and quiets NaNs as bf16_bits_of
// does, in one instruction where the integer sequence takes eight, but flushes denormals to zero: those
// (rare) vectors take the sequence.
inline __m256i bf16_words(__m512 v) {
  if (_mm512_fpclass_ps_mask(v, 0x20) == 0) [[likely]]
    return (__m256i)_mm512_cvtneps_pbh(v);
  return _mm512_maskz_cvtepi32_epi16(kAll, bf16_bits(v));
}
#endif

inline void store(bf16* p, __m512 v, __mmask16 m = kAll) {
#if defined(__AVX512BF16__)
  _mm256_mask_storeu_epi16(p, m, bf16_words(v));
#else
  _mm512_mask_cvtepi32_storeu_epi16(p, m, bf16_bits(v));
#endif
}

// v as storage S would hold it, widened back: rounded to bf16 (store's bits), or f32 unchanged.
template <typename S>
inline __m512 rounded(__m512 v) {
  if constexpr (std::is_same_v<S, bf16>) {
#if defined(__AVX512BF16__)
    const __m512i bits = _mm512_maskz_cvtepu16_epi32(kAll, bf16_words(v));
#else
    const __m512i bits = bf16_bits(v);
#endif
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll, bits, 16));
  } else {
    return v;
  }
}

// dst[j] = src[j] * scale rounded to bf16 (bf16_bits_of's bits), j < n, 16 at a time.
inline void round_to_bf16(const float* src, bf16* dst, int64_t n, float scale = 1.0f) {
  const __m512 s = _mm512_set1_ps(scale);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = lanes(n - j);
    store(dst + j, _mm512_mul_ps(load(src + j, m), s), m);
  }
}

// The block of up to 16 x 16 32-bit words at src (row stride lds) transposed into dst (row stride ldd):
// `nr` rows and `nc` columns are read, the rest of the 16 x 16 registers is zero; nc rows of nr words are
// written. Four rounds of unpacks and 128-bit lane shuffles, where element-wise copies would take 256 loads
// and stores.
inline void transpose16(const void* src, int64_t lds, int64_t nr, int64_t nc, uint32_t* dst, int64_t ldd) {
  const __mmask16 cmask = lanes(nc), rmask = lanes(nr);
  const auto* s = static_cast<const uint32_t*>(src);
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i)
    r[i] = i < nr ? _mm512_maskz_loadu_epi32(cmask, s + i * lds) : _mm512_setzero_si512();
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_maskz_unpacklo_epi32(kAll, r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_maskz_unpackhi_epi32(kAll, r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_maskz_unpacklo_epi64(kAll8, t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_maskz_unpackhi_epi64(kAll8, t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_maskz_unpacklo_epi64(kAll8, t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_maskz_unpackhi_epi64(kAll8, t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_maskz_shuffle_i32x4(kAll, r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_maskz_shuffle_i32x4(kAll, r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_maskz_shuffle_i32x4(kAll, r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_maskz_shuffle_i32x4(kAll, r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_maskz_shuffle_i32x4(kAll, t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_maskz_shuffle_i32x4(kAll, t[i], t[i + 8], 0xdd);
    r[i + 4] = _mm512_maskz_shuffle_i32x4(kAll, t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_maskz_shuffle_i32x4(kAll, t[i + 4], t[i + 12], 0xdd);
  }
  for (int i = 0; i < nc; ++i) _mm512_mask_storeu_epi32(dst + i * ldd, rmask, r[i]);
}

#if defined(__AVX512BW__)
// The two 16-lane halves of 32 16-bit values (two pixels' 16 channels of bf16) interleaved into 16 32-bit
// words, word j = (lane j, lane 16 + j): the pair layout vdpbf16ps multiplies. split_pairs is its inverse.
alignas(64) inline constexpr uint16_t kJoinPairs[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                        21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                        11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
alignas(64) inline constexpr uint16_t kSplitPairs[32] = {0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20,
                                                         22, 24, 26, 28, 30, 1,  3,  5,  7,  9,  11,
                                                         13, 15, 17, 19, 21, 23, 25, 27, 29, 31};

inline __m512i join_pairs(__m512i halves) {
  return _mm512_maskz_permutexvar_epi16(~__mmask32{0}, _mm512_load_si512(kJoinPairs), halves);
}
inline __m512i split_pairs(__m512i words) {
  return _mm512_maskz_permutexvar_epi16(~__mmask32{0}, _mm512_load_si512(kSplitPairs), words);
}

#if defined(__AVX512BF16__)
// 32 bf16 values at p (p[2k], p[2k + 1] in 32-bit word k) widened into two registers: lane k of `even` is
// p[2k], of `odd` p[2k + 1]. One load, a shift and a mask, where two 16-value loads widen through vpmovzxwd.
// An elementwise kernel computes on both and stores them with store_pairs, which puts every value back in
// its place, so the bits are those of load and store.
inline void load_pairs(const bf16* p, __m512& even, __m512& odd) {
  const __m512i w = _mm512_loadu_si512(p);
  even = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll, w, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}
// store's rounding of 32 values, lo's 16 then hi's: one vcvtne2ps2bf16, or where a value is denormal (which
// it flushes) bf16_bits' pairs split back into halves.
inline __m512i round_halves(__m512 lo, __m512 hi) {
  if ((_mm512_fpclass_ps_mask(lo, 0x20) | _mm512_fpclass_ps_mask(hi, 0x20)) == 0) [[likely]]
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
  return split_pairs(_mm512_or_si512(bf16_bits(lo), _mm512_maskz_slli_epi32(kAll, bf16_bits(hi), 16)));
}
// store's rounding of 32 values, interleaved back: one vcvtne2ps2bf16 and one permute for the 32.
inline void store_pairs(bf16* p, __m512 even, __m512 odd) {
  _mm512_storeu_si512(p, join_pairs(round_halves(even, odd)));
}
#endif
#endif

}  // namespace flowrun::cpu::simd16
#endif  // __AVX512F__
