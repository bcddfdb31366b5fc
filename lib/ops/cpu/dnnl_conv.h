// f32 and bf16 conv2d forward and backward through oneDNN (kept in its own file: dnnl.hpp is heavy to
// compile).
#pragma once

#include "ops/cpu/conv.h"

namespace flowrun::cpu {

// Plain NCHW / OIHW tensors of dtype f32, or bf16 (bf16 storage, f32 accumulation; needs has_native_bf16()).
// y = conv(x, w) + bias; bias may be null.
void dnnl_conv2d(DType t, const ConvGeom& g, const void* x, const void* w, const void* bias, void* y);
// dx = the adjoint of conv(., w) applied to dy.
void dnnl_conv2d_grad_input(DType t, const ConvGeom& g, const void* dy, const void* w, void* dx);
// dw = the gradient of conv(x, .) for output gradient dy, summed over the batch.
void dnnl_conv2d_grad_weight(DType t, const ConvGeom& g, const void* dy, const void* x, void* dw);

}  // namespace flowrun::cpu
