// What the direct 3x3 kernels (conv_direct_f32.cc with 16 lanes, conv_direct8_f32.cc with 8) share: their
// work items and the rearrangement of the weights for a forward pass or an input gradient.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/cpu/conv.h"
#include "ops/cpu/parallel.h"

namespace flowrun::cpu {

// Work items of a pass (an image's output row each), and the bytes of its rearranged weights.
inline int64_t direct3x3_items(const ConvGeom& g) {
  return g.n * g.h;
}
inline size_t direct3x3_weight_bytes(const ConvGeom& g) {
  return static_cast<size_t>(9 * g.o * g.c) * sizeof(float);
}

// w (O, C, 3, 3) into v as one vector of L pass output channels per (output block, input block, kh, kw,
// input channel): v[ob][cb][kh][kw][i][j] multiplies pass input channel cb*L + i into pass output channel
// ob*L + j, the forward's w[ob*L + j][cb*L + i][kh][kw], the input gradient's w[cb*L + i][ob*L + j][2 - kh]
// [2 - kw] (the convolution of dy by the flipped, transposed filters).
template <int64_t L>
void direct3x3_rearrange_weights(const ConvGeom& g, bool grad_input, const float* w, float* v) {
  const int64_t ci = grad_input ? g.o : g.c, co = grad_input ? g.c : g.o, cbs = ci / L;
  parallel_for(co / L * cbs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t ob = p / cbs, cb = p % cbs;
      float* out = v + p * 9 * L * L;
      for (int64_t k = 0; k < 9; ++k)
        for (int64_t i = 0; i < L; ++i)
          for (int64_t j = 0; j < L; ++j) {
            const int64_t pi = cb * L + i, pj = ob * L + j;
            out[(k * L + i) * L + j] =
                grad_input ? w[(pi * g.c + pj) * 9 + (8 - k)] : w[(pj * g.c + pi) * 9 + k];
          }
    }
  });
}

}  // namespace flowrun::cpu
