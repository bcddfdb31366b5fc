// CPU kernels of the collective ops (ops/comm.cc).
#pragma once

#include "ops/registry.h"

namespace flowrun::cpu {

void all_reduce(const KernelCtx& c);
void local_shard(const KernelCtx& c);
void all_gather_into(const KernelCtx& c);

}  // namespace flowrun::cpu
