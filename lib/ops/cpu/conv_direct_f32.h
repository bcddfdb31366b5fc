// f32 3x3 convolutions (stride 1, padding 1) and their input and weight gradients as direct sums on nChw16c
// activations (conv_direct_f32.cc), where dnnl_conv.cc finds them faster than oneDNN's: the forward pass and
// input gradient where its Winograd does not serve (fewer than 32 channels, winograd_fits), the weight
// gradient below 64 channels, also at stride 2. oneDNN 2.6's direct AVX-512 kernel ran ResNet-20's 16-channel
// forward pass at 244 GFLOP/s on 2 threads here (54% of the FMA peak), in cache as in the step.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/cpu/conv.h"

namespace flowrun::cpu {

// Whether direct3x3_f32 computes this geometry's forward pass and input gradient: 3x3, stride 1, padding
// 1, no dilation, one group, C and O multiples of 16, and a build and CPU with AVX-512. The kernels read and
// write activations in nChw16c only, whatever g.x_blocked and g.y_blocked say (dnnl_conv.cc copies NCHW
// ones).
bool direct3x3_f32_serves(const ConvGeom& g);

// The weights (O, C, 3, 3) rearranged into `v` (direct3x3_weight_bytes, 64-byte aligned) as one vector
// of 16 output channels per (output block, input block, kh, kw, input channel): for the forward pass, or
// flipped and transposed for the input gradient (the convolution of dy by those filters).
void direct3x3_f32_weights(const ConvGeom& g, bool grad_input, const float* w, float* v);

// The outputs of work items [i0, i1) (direct3x3_items: an image's output row each): y from x (forward, plus
// `bias` (O) when not null), or dx from dy (grad_input, bias null), with the weights `v` of that pass. Each
// output is one sum in a fixed order (bias, then kh, input block, input channel, kw), so the bits depend on
// no thread count or item split.
void direct3x3_f32(const ConvGeom& g, bool grad_input, const float* in, const float* v, const float* bias,
                   float* out, int64_t i0, int64_t i1);

// Whether direct3x3_f32_wgrad computes this geometry's weight gradient: those of direct3x3_f32_serves, and
// the same at stride 2 (output planes of ceil(h / 2) x ceil(w / 2)).
bool direct3x3_f32_wgrad_serves(const ConvGeom& g);

// The weight gradient of those geometries, as wgrad3x3_bf16's interface (conv_wgrad_bf16.h) for
// dnnl_conv.cc's fixed batch blocks: the gradient of images [n0, n1) (dy and x in nChw16c) into `partial`
// (f32, [O/16][3][3][C][16]: a vector of 16 output channels per (output block, kh, kw, input channel)),
// summed image by image, row by row and pixel by pixel in order; then the partials added in order into dw
// (O, C, 3, 3).
int64_t direct3x3_f32_wgrad_partial_elems(const ConvGeom& g);
void direct3x3_f32_wgrad(const ConvGeom& g, int64_t n0, int64_t n1, const float* dy, const float* x,
                         float* partial);
void direct3x3_f32_wgrad_finish(const ConvGeom& g, const float* partials, int64_t count, int64_t stride,
                                float* dw);

}  // namespace flowrun::cpu
