// The f32 weight gradient of a convolution over few input channels (fewer than 8: a CNN's first layer on
// grey or RGB images) as AVX2 FMAs (conv_wgrad_few_f32.cc), in place of oneDNN 2.6's AVX2 kernel, which pads
// the input channels to its block of 8 and ran the bench CNN's 1-channel 3x3 layer (64 x 28 x 28, 32
// filters) at 12.7 GFLOP/s on 2 threads (2.28 ms; this kernel 75.7, 0.38 ms) on a Zen 3 host.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/cpu/conv.h"

namespace flowrun::cpu {

// Whether wgrad_few_f32 can compute this geometry's weight gradient: one group, fewer than 8 input channels,
// output channels in multiples of 8, at most kWgradFewTaps kernel taps (kh x kw), a CPU with AVX2 and FMA,
// and dy in NCHW, nChw8c, nChw16c or NHWC (x is NCHW: fewer than 8 channels are never blocked).
constexpr int64_t kWgradFewTaps = 12;
bool wgrad_few_f32_fits(const ConvGeom& g);

// Scratch bytes of one call (one image's zero-padded x planes, and its dy in 8-channel blocks when dy is
// NCHW), and the f32 elements of a partial.
size_t wgrad_few_f32_scratch_bytes(const ConvGeom& g);
int64_t wgrad_few_f32_partial_elems(const ConvGeom& g);

// The weight gradient of images [n0, n1) into `partial` ([O/8][C][kh][kw][8]: a vector of 8 output channels
// per input channel and tap): each element one fma chain over the images in order and each image's output
// pixels in row-major order, whatever dy's layout, so that an eager (NCHW) step and a blocked one give the
// same bits. `scratch` holds at least wgrad_few_f32_scratch_bytes.
void wgrad_few_f32(const ConvGeom& g, int64_t n0, int64_t n1, const float* dy, const float* x, float* partial,
                   void* scratch);

// dw (O, C, kh, kw) from `count` partials `stride` elements apart, added in order.
void wgrad_few_f32_finish(const ConvGeom& g, const float* partials, int64_t count, int64_t stride, float* dw);

}  // namespace flowrun::cpu
