// f32 conv2d forward and backward through oneDNN (kept in its own file: dnnl.hpp is heavy to compile).
#pragma once

#include "ops/cpu/conv.h"

namespace flowrun::cpu {

// y = conv(x, w) + bias over plain NCHW / OIHW tensors; bias may be null.
void dnnl_conv2d_f32(const ConvGeom& g, const float* x, const float* w, const float* bias, float* y);
// dx = the adjoint of conv(., w) applied to dy.
void dnnl_conv2d_grad_input_f32(const ConvGeom& g, const float* dy, const float* w, float* dx);
// dw = the gradient of conv(x, .) for output gradient dy, summed over the batch.
void dnnl_conv2d_grad_weight_f32(const ConvGeom& g, const float* dy, const float* x, float* dw);

}  // namespace flowrun::cpu
