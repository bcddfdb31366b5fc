// CPU kernels of the neural-network ops (ops/nn.cc): softmax, log_softmax, losses, dropout, embedding.
#pragma once

#include <cstdint>

#include "ops/registry.h"

namespace flowrun::cpu {

void softmax(const KernelCtx& c);
void softmax_grad(const KernelCtx& c);
void log_softmax(const KernelCtx& c);
void log_softmax_grad(const KernelCtx& c);
void cross_entropy(const KernelCtx& c);
void cross_entropy_grad(const KernelCtx& c);
void nll_loss(const KernelCtx& c);
void nll_loss_grad(const KernelCtx& c);
void mse_loss(const KernelCtx& c);
void dropout(const KernelCtx& c);
void dropout_grad(const KernelCtx& c);
void mlm_mask(const KernelCtx& c);
void embedding(const KernelCtx& c);
void embedding_grad(const KernelCtx& c);

// Elements per partial sum of mse_loss: its workspace holds one double per chunk of this many elements.
inline constexpr int64_t kMseChunk = 4096;

}  // namespace flowrun::cpu
