// 8 f32 lanes in GCC's vector extension (one AVX register on AVX2 hosts, two SSE registers elsewhere), for
// the loops that stayed scalar with a branch per element where the build has no AVX-512 path: cross
// entropy's exps and maxima (nn.cc), relu_grad of a sum (elementwise.cc). Lane arithmetic is the scalar
// arithmetic, so a lane gives the bits of the scalar loop.
#pragma once

#include <cstdint>
#include <cstring>

namespace flowrun::cpu {

typedef float F8 __attribute__((vector_size(32)));
typedef uint32_t U8 __attribute__((vector_size(32)));

inline F8 load8(const float* p) {
  F8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, F8 v) {
  std::memcpy(p, &v, sizeof v);
}

}  // namespace flowrun::cpu
