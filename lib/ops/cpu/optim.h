// CPU kernels of the optimizer update ops (ops/optim.cc).
#pragma once

#include "ops/registry.h"

namespace flowrun::cpu {

void sgd_update(const KernelCtx& c);

}  // namespace flowrun::cpu
