// f32 3x3 convolutions (stride 1, padding 1) and their input gradients as direct sums on nChw8c activations
// with AVX2 FMAs (conv_direct8_f32.cc): conv_direct_f32's kernel with 8 lanes, for hosts without AVX-512,
// where oneDNN 2.6's AVX2 kernels and nChw8c serve the other convolutions (convs_take_nchw8c).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/cpu/conv.h"

namespace flowrun::cpu {

// Whether direct3x3_f32x8 computes this geometry's forward pass and input gradient: 3x3, stride 1, padding
// 1, no dilation, one group, C and O multiples of 8, activations not in NHWC, and a CPU with AVX2 and FMA.
// The kernels read and write each activation in nChw8c or nChw16c as g's attributes say (nchw8c), and an
// NCHW one (x_blocked, y_blocked false) in nChw8c: dnnl_conv.cc copies those.
bool direct3x3_f32x8_serves(const ConvGeom& g);

// The weights (O, C, 3, 3) rearranged into `v` (direct3x3_weight_bytes, 32-byte aligned) as one vector
// of 8 output channels per (output block, input block, kh, kw, input channel): for the forward pass, or
// flipped and transposed for the input gradient (the convolution of dy by those filters).
void direct3x3_f32x8_weights(const ConvGeom& g, bool grad_input, const float* w, float* v);

// The outputs of work items [i0, i1) (direct3x3_items: an image's output row each): y from x (forward, plus
// `bias` (O) when not null), or dx from dy (grad_input, bias null), with the weights `v` of that pass.
// Each output is one sum in a fixed order (bias, then kh, input block, input channel, kw), so the bits
// depend on no thread count or item split.
void direct3x3_f32x8(const ConvGeom& g, bool grad_input, const float* in, const float* v, const float* bias,
                     float* out, int64_t i0, int64_t i1);

}  // namespace flowrun::cpu
