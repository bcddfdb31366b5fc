// CPU kernels of the normalisation ops (ops/norm.cc): layernorm, rmsnorm, batchnorm and their gradients.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ops/registry.h"

namespace flowrun::cpu {

// The gamma/beta gradients of the row norms are summed per block of rows into workspace partials, then the
// blocks are added in order: a fixed block count keeps the sums bitwise identical for any thread count.
inline int64_t norm_row_blocks(int64_t rows) {
  return std::clamp<int64_t>(rows, 1, 64);
}

// Scratch elements of the batchnorm kernels' per-channel sums (`sums` at once) over x viewed as (n, c, s):
// per-plane sums with spatial dims, per-row-block partials for (N, C).
inline int64_t batchnorm_workspace_elems(int64_t n, int64_t c, int64_t s, int64_t sums) {
  if (s > 1) return n * c * sums;
  const int64_t blocks = norm_row_blocks(n);
  return blocks == 1 ? 0 : blocks * c * sums;
}

void layernorm(const KernelCtx& c);
void layernorm_grad(const KernelCtx& c);
void rmsnorm(const KernelCtx& c);
void rmsnorm_grad(const KernelCtx& c);
void batchnorm(const KernelCtx& c);
void batchnorm_grad(const KernelCtx& c);

}  // namespace flowrun::cpu
