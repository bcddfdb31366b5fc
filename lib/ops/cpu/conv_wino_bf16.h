// bf16 3x3 convolutions (stride 1, padding 1) and their input and weight gradients through Winograd's F(2x2,
// 3x3) and F(3x3, 2x2) with vdpbf16ps products (conv_wino_bf16.cc), in place of oneDNN 2.6's direct bf16
// kernels, which ran ResNet-20's layers at 420-490 GFLOP/s on 2 threads here, near the machine's bf16
// dot-product rate: the transformed domain does 16 multiplies per 2x2 tile where the direct sum does 36.
// oneDNN has no bf16 Winograd, and its f32 one (F(4x4, 3x3)) made the f32 step nearly as fast as the bf16
// one.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "ops/cpu/conv.h"

namespace flowrun::cpu {

// Whether wino3x3_bf16 computes this geometry's forward pass and gradients: 3x3, stride 1, padding 1, no
// dilation, one group, C and O multiples of 16, even H and W, and a build and CPU with avx512_bf16. The
// kernels read and write activations in nChw16c only, whatever g.x_blocked and g.y_blocked say (dnnl_conv.cc
// copies NCHW ones).
bool wino3x3_bf16_serves(const ConvGeom& g);

// Bytes of the transformed weights, and of one thread's tile buffers.
size_t wino3x3_bf16_weight_bytes(const ConvGeom& g);
size_t wino3x3_bf16_scratch_bytes(const ConvGeom& g);

// The weights (O, C, 3, 3) transformed into `v` (wino3x3_bf16_weight_bytes, 64-byte aligned): for the
// forward pass, or flipped and transposed for the input gradient.
void wino3x3_bf16_weights(const ConvGeom& g, bool grad_input, const bf16* w, void* v);

// Work items (an image's block of 16 tiles each) and the outputs of items [i0, i1): y from x (forward, plus
// `bias` (O) when not null, added to the f32 sums as oneDNN's kernels add it), or dx from dy (grad_input,
// bias null), with the weights `v` transformed for that pass. `scratch` holds at least
// wino3x3_bf16_scratch_bytes, 64-byte aligned. Each output is computed by one item in a fixed order, so the
// bits depend on no thread count.
int64_t wino3x3_bf16_items(const ConvGeom& g);
void wino3x3_bf16(const ConvGeom& g, bool grad_input, const bf16* in, const void* v, const bf16* bias,
                  bf16* out, int64_t i0, int64_t i1, void* scratch);

// The weight gradient of the same geometries, as wgrad3x3_bf16's interface (conv_wgrad_bf16.h) for
// dnnl_conv.cc's fixed batch blocks: the gradient of images [n0, n1) into `partial` (f32, in the transformed
// domain: [16 positions][O/16][C][16]), summed image by image and over each image's tile pairs in order; then
// the partials added in order, transformed back and rounded into dw (O, C, 3, 3).
size_t wino3x3_bf16_wgrad_scratch_bytes(const ConvGeom& g);
int64_t wino3x3_bf16_wgrad_partial_elems(const ConvGeom& g);
void wino3x3_bf16_wgrad(const ConvGeom& g, int64_t n0, int64_t n1, const bf16* dy, const bf16* x,
                        float* partial, void* scratch);
void wino3x3_bf16_wgrad_finish(const ConvGeom& g, const float* partials, int64_t count, int64_t stride,
                               bf16* dw);

}  // namespace flowrun::cpu
