// CPU kernels of the reductions and broadcast_to (ops/reduce.cc).
#pragma once

#include "ops/registry.h"

namespace flowrun::cpu {

void reduce_sum(const KernelCtx& c);
void reduce_mean(const KernelCtx& c);
void reduce_max(const KernelCtx& c);
void reduce_max_grad(const KernelCtx& c);
void broadcast_to(const KernelCtx& c);

}  // namespace flowrun::cpu
