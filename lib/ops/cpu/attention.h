// CPU kernels of fused scaled-dot-product attention (ops/attention.cc): flash-attention forward and backward.
#pragma once

#include "ops/registry.h"

namespace flowrun::cpu {

// (q, k, v) -> (out, lse): online-softmax attention over key blocks, never materialising the T x S scores.
void sdpa(const KernelCtx& c);
// (dout, q, k, v, out, lse) -> (dq, dk, dv): FlashAttention-2 backward, probabilities recomputed from lse.
void sdpa_grad(const KernelCtx& c);

}  // namespace flowrun::cpu
