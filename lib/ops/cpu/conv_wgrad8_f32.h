// The f32 weight gradient of a convolution over input channels in multiples of 8, with kernel rows of 3 taps,
// as AVX2 FMAs (conv_wgrad8_f32.cc), in place of oneDNN 2.6's AVX2 kernel on hosts without AVX-512.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/cpu/conv.h"

namespace flowrun::cpu {

// Whether wgrad8_f32 can compute this geometry's weight gradient: one group, input channels in multiples of
// 8, output channels in multiples of 16, kw = 3 (any kh, stride, padding and dilation), a CPU with AVX2 and
// FMA; x and dy in NCHW, nChw8c, nChw16c or NHWC.
bool wgrad8_f32_fits(const ConvGeom& g);

// Scratch bytes of one call (one image's x in zero-padded planes of 8-channel pixels, and its dy in 8-channel
// blocks when dy is NCHW), and the f32 elements of a partial.
size_t wgrad8_f32_scratch_bytes(const ConvGeom& g);
int64_t wgrad8_f32_partial_elems(const ConvGeom& g);

// The weight gradient of images [n0, n1) into `partial` (wgrad_few_f32's layout, [O/8][C][kh][kw][8], and
// finished by wgrad_few_f32_finish): each element one fma chain over the images in order and each image's
// output pixels in row-major order, whatever the layouts, so that an eager (NCHW) step and a blocked one give
// the same bits. `scratch` holds at least wgrad8_f32_scratch_bytes.
void wgrad8_f32(const ConvGeom& g, int64_t n0, int64_t n1, const float* dy, const float* x, float* partial,
                void* scratch);

}  // namespace flowrun::cpu
