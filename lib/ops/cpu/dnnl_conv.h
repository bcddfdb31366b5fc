// f32 and bf16 conv2d forward and backward through oneDNN (kept in its own file: dnnl.hpp is heavy to
// compile).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ops/cpu/conv.h"

namespace flowrun::cpu {

// Plain NCHW / OIHW tensors of dtype f32, or bf16 (bf16 storage, f32 accumulation; needs has_native_bf16()).
// y = conv(x, w) + bias; bias may be null.
void dnnl_conv2d(DType t, const ConvGeom& g, const void* x, const void* w, const void* bias, void* y);
// dx = the adjoint of conv(., w) applied to dy.
void dnnl_conv2d_grad_input(DType t, const ConvGeom& g, const void* dy, const void* w, void* dx);
// dw = the gradient of conv(x, .) for output gradient dy, summed over the batch.
void dnnl_conv2d_grad_weight(DType t, const ConvGeom& g, const void* dy, const void* x, void* dw);

enum class ConvPass { forward, grad_input, grad_weight };

// The buffers the calls above keep outside the arena for this convolution, as (pool, bytes): its scratchpad
// and the reorder targets of the tensors oneDNN wants in its blocked layout. Every convolution shares each
// pool, which grows to the largest need (`flowrun plan` predicts it from this). Builds the primitive
// descriptors only, not the primitives.
std::vector<std::pair<std::string, size_t>> dnnl_conv2d_buffers(DType t, const ConvGeom& g, ConvPass pass,
                                                                bool bias);
// The bytes those pools hold now (for the test that checks dnnl_conv2d_buffers against them).
size_t dnnl_conv2d_held_bytes();

// Whether bf16 3x3 convolutions run through flowrun's own avx512_bf16 kernels (Winograd, and the direct
// weight gradient) where their geometry allows, rather than through oneDNN. By default they do where oneDNN
// has no AMX: on avx512_bf16 CPUs without it (Zen 4, Cooper Lake) the own kernels are 1.5-2x faster than
// oneDNN's direct bf16 ones, and on AMX CPUs (Sapphire Rapids and later) oneDNN's AMX kernels are 1.5x
// faster than the own ones. Tests and benchmarks set it to run the other path on the same machine.
bool own_bf16_convs();
void set_own_bf16_convs(bool on);
// Whether bf16 convolutions run oneDNN's AMX kernels, which take NHWC activations only: the layout pass then
// keeps them in NHWC rather than nChw16c (graph/layout.cc).
bool bf16_convs_take_nhwc();
// Whether oneDNN's f32 convolutions block channels by 8 (nChw8c: its AVX2 and SSE4.1 kernels) rather than
// by 16 (AVX-512) on this CPU, as it answers for a 3x3 convolution of 16 channels: the layout pass then keeps
// activations in nChw8c. flowrun's own convolution kernels (AVX-512) read nChw16c only and do not run there.
bool convs_take_nchw8c();

}  // namespace flowrun::cpu
