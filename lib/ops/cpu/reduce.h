// CPU kernels of the reductions and broadcast_to (ops/reduce.cc).
#pragma once

#include "ops/registry.h"

namespace flowrun::cpu {

// Whether a reduction of x over `axes` is a per-channel sum of an (N, C, H, W) tensor (axes 0, 2, 3): the
// one the layout pass lets read nChw16c or nChw8c (attr `blocked`).
bool sums_per_channel(const Shape& x, const std::vector<int64_t>& axes);

// A sum over R leading rows (reduce_sum of an (R, N) view over R, a bias gradient) runs in fixed chunks of
// rows, each summed in row order, then the chunks summed in order: chunk ch of reduce_row_chunks(R) holds
// rows [ch R / chunks, (ch + 1) R / chunks). Fixed by R alone, so the bits do not depend on the thread count;
// gelu_bias_grad sums its bias gradient in the same order, to give reduce_sum's bits.
inline int64_t reduce_row_chunks(int64_t rows) {
  constexpr int64_t kChunkRows = 128;
  return rows >= 2 * kChunkRows ? (rows + kChunkRows - 1) / kChunkRows : 1;
}

void reduce_sum(const KernelCtx& c);
void reduce_mean(const KernelCtx& c);
void reduce_max(const KernelCtx& c);
void reduce_max_grad(const KernelCtx& c);
void broadcast_to(const KernelCtx& c);

}  // namespace flowrun::cpu
