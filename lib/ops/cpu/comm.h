// CPU kernels of the collective ops (ops/comm.cc).
#pragma once

#include "ops/registry.h"

namespace flowrun::cpu {

void all_reduce(const KernelCtx& c);
void local_shard(const KernelCtx& c);
void all_gather_into(const KernelCtx& c);
void reduce_scatter_shard(const KernelCtx& c);
void all_reduce_start(const KernelCtx& c);
void all_reduce_wait(const KernelCtx& c);

}  // namespace flowrun::cpu

namespace flowrun::cpu {

// Tensor-parallel boxing (ops/comm.cc, "tp_*"): over KernelCtx::tp, the tensor axis's group.
void tp_all_reduce(const KernelCtx& c);
void tp_copy(const KernelCtx& c);  // tp_enter: the identity forward
void tp_all_gather(const KernelCtx& c);
void tp_slice(const KernelCtx& c);
void tp_reduce_scatter(const KernelCtx& c);

}  // namespace flowrun::cpu
