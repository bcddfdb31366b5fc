// An 8 x 8 f32 block transposed in AVX2 registers, for the AVX2 kernels that move blocks between row- and
// column-major (gemm_avx2's packing, the attention's K and V transposes).
#pragma once

#include <immintrin.h>

namespace flowrun::cpu {

// r[i] (row i of the block) becomes column i: pairs of rows interleaved, then groups of 4 within each 128-bit
// lane, then the lanes exchanged. Compiled for AVX2 whatever the build's -march; called only where the CPU
// has it.
[[gnu::always_inline]] __attribute__((target("avx2"))) inline void transpose8(__m256* r) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  __m256 u[8];
  for (int h = 0; h < 8; h += 4) {
    u[h] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

}  // namespace flowrun::cpu
