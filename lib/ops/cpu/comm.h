// CPU kernels of the collective ops (ops/comm.cc).
#pragma once

#include "ops/registry.h"

namespace flowrun::cpu {

void all_reduce(const KernelCtx& c);
void local_shard(const KernelCtx& c);
void all_gather_into(const KernelCtx& c);
void gather_shards(const KernelCtx& c);
void reduce_scatter_shard(const KernelCtx& c);
void all_reduce_start(const KernelCtx& c);
void all_reduce_wait(const KernelCtx& c);

}  // namespace flowrun::cpu

namespace flowrun::cpu {

// SBP boxing (ops/comm.cc, "sbp_*"): over the group of the mesh axis named by attr mesh (KernelCtx::comm
// for "data", KernelCtx::tp for "tensor").
void sbp_all_reduce(const KernelCtx& c);
void sbp_copy(const KernelCtx& c);  // sbp_enter: the identity forward
void sbp_all_gather(const KernelCtx& c);
void sbp_slice(const KernelCtx& c);
void sbp_reduce_scatter(const KernelCtx& c);

}  // namespace flowrun::cpu
