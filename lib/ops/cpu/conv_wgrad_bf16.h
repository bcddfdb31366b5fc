// The bf16 weight gradient of a 3x3, stride-1, padding-1 convolution as vdpbf16ps dot products
// (conv_wgrad_bf16.cc), in place of oneDNN 2.6's kernel for those layers (ResNet's). On this Zen 4 host
// oneDNN ran ResNet-20's blocks of 8 images at 171-175 GFLOP/s per thread (ONEDNN_VERBOSE: 0.21-0.23 ms a
// block); this kernel's loop runs them at 190-198 (0.19 ms).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "ops/cpu/conv.h"

namespace flowrun::cpu {

// Whether wgrad3x3_bf16 computes this geometry's weight gradient: 3x3, stride 1, padding 1, no dilation, one
// group, O a multiple of 16, an even width, and a build and CPU with avx512_bf16.
bool wgrad3x3_bf16_serves(const ConvGeom& g);

// Scratch bytes of one wgrad3x3_bf16 call (one image's repacked x and dy), and the f32 elements of a partial.
size_t wgrad3x3_bf16_scratch_bytes(const ConvGeom& g);
int64_t wgrad3x3_bf16_partial_elems(const ConvGeom& g);

// The weight gradient of images [n0, n1) into `partial` (f32, o-blocks of 16 innermost: [O/16][C][3][3][16]),
// summed image by image in order and over each image's rows and column pairs in order. dy and x are the
// whole batch's, in nChw16c where g.y_blocked / g.x_blocked, else NCHW. `scratch` holds at least
// wgrad3x3_bf16_scratch_bytes, 64-byte aligned.
void wgrad3x3_bf16(const ConvGeom& g, int64_t n0, int64_t n1, const bf16* dy, const bf16* x, float* partial,
                   void* scratch);

// dw (O, C, 3, 3) in bf16 from `count` partials `stride` elements apart, added in order in f32, then rounded.
void wgrad3x3_bf16_finish(const ConvGeom& g, const float* partials, int64_t count, int64_t stride, bf16* dw);

}  // namespace flowrun::cpu
