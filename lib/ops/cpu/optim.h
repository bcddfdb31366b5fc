// CPU kernels of the optimizer ops (ops/optim.cc): updates, gradient norm and clipping, accumulation.
#pragma once

#include "ops/registry.h"

namespace flowrun::cpu {

// Elements per partial sum of global_norm: the blocks are fixed, so the sum does not depend on threads.
inline constexpr int64_t kNormBlock = 1 << 14;

void sgd_update(const KernelCtx& c);
void sgd_product_update(const KernelCtx& c);
void adamw_update(const KernelCtx& c);
void sgd_update_multi(const KernelCtx& c);
void adamw_update_multi(const KernelCtx& c);
void global_norm(const KernelCtx& c);
void clip_coef(const KernelCtx& c);
void unscale_coef(const KernelCtx& c);
void loss_scale_update(const KernelCtx& c);
void grad_accumulate(const KernelCtx& c);

}  // namespace flowrun::cpu
