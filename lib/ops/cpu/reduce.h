// CPU kernels of the reductions and broadcast_to (ops/reduce.cc).
#pragma once

#include "ops/registry.h"

namespace flowrun::cpu {

// Whether a reduction of x over `axes` is a per-channel sum of an (N, C, H, W) tensor (axes 0, 2, 3): the
// one the layout pass lets read nChw16c (attr `blocked`).
bool sums_per_channel(const Shape& x, const std::vector<int64_t>& axes);

void reduce_sum(const KernelCtx& c);
void reduce_mean(const KernelCtx& c);
void reduce_max(const KernelCtx& c);
void reduce_max_grad(const KernelCtx& c);
void broadcast_to(const KernelCtx& c);

}  // namespace flowrun::cpu
