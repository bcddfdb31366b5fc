// CPU kernels of the convolution and pooling ops (ops/conv.cc), and the geometry both sides share.
#pragma once

#include <string_view>
#include <type_traits>

#include "core/error.h"
#include "ops/registry.h"

namespace flowrun::cpu {

// Reads a 2-d attribute given as [h, w], [v] or a scalar v; `dflt` for both when absent. Returns false when
// the attribute has another type or length (infer reports it). Never allocates, so kernels may call it.
bool attr_pair(const Attrs& a, std::string_view key, int64_t dflt, int64_t& h, int64_t& w);

// Where a blocked activation's pixels lie (graph/layout.cc): block pl = (n, channel block of `lanes`) holds
// a plane's pixels of `lanes` channels each, a pixel's lanes contiguous, pixel i at base + i * step. In
// nChw16c (16 lanes) and nChw8c (8, attr `nchw8c`) a block is contiguous; in NHWC (16, attr `nhwc`) its
// pixels are C apart. Batchnorm, max pooling and the per-channel sum address them through it.
struct PixelBlocks {
  int64_t c;
  bool nhwc = false;
  int64_t lanes = 16;
  PixelBlocks(int64_t channels, bool in_nhwc, int64_t block_lanes)
      : c(channels), nhwc(in_nhwc), lanes(block_lanes) {}
  PixelBlocks(int64_t channels, const Attrs& a)
      : PixelBlocks(channels, a.b("nhwc"), a.b("nchw8c") ? 8 : 16) {}
  int64_t blocks() const { return c / lanes; }  // per image
  int64_t base(int64_t pl, int64_t pixels) const {
    return nhwc ? (pl / blocks()) * pixels * c + (pl % blocks()) * lanes : pl * pixels * lanes;
  }
  int64_t step() const { return nhwc ? c : lanes; }
  // f(std::integral_constant<int64_t, L>{}) with L = lanes, so that a kernel knows its lanes at compile
  // time; C must be a multiple of them.
  template <typename F>
  void with_lanes(F&& f) const {
    FR_CHECK(c % lanes == 0, "blocked activations need channels in multiples of ", lanes, ", got ", c);
    if (lanes == 8) return f(std::integral_constant<int64_t, 8>{});
    f(std::integral_constant<int64_t, 16>{});
  }
  // f(offset, count) over a block's contiguous runs of elements from its base: one of lanes * pixels in
  // nChw16c and nChw8c, one of 16 per pixel in NHWC.
  template <typename F>
  void each_run(int64_t pixels, F&& f) const {
    if (!nhwc) return f(int64_t{0}, lanes * pixels);
    for (int64_t i = 0; i < pixels; ++i) f(i * c, lanes);
  }
};

// Everything a conv2d kernel needs: input (n, c, h, w), weight (o, c/groups, kh, kw), output (oh, ow).
struct ConvGeom {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t o = 0, kh = 0, kw = 0;
  int64_t oh = 0, ow = 0;
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  int64_t groups = 1;
  // The activations' layouts (attributes x_blocked, y_blocked, set by the layout pass, graph/layout.cc):
  // nChw16c instead of NCHW for the input-shaped tensor (x, or dx) and the output-shaped one (y, or dy);
  // with nchw8c (attribute nchw8c: oneDNN's AVX2 kernels) they are nChw8c, with nhwc (attribute nhwc: bf16
  // on AMX) NHWC instead.
  bool x_blocked = false, y_blocked = false, nchw8c = false, nhwc = false;
  int64_t cg() const { return c / groups; }
  int64_t og() const { return o / groups; }
  int64_t kdim() const { return cg() * kh * kw; }  // GEMM inner dimension per group
  int64_t plane() const { return oh * ow; }
  // The input plane zero-padded on both sides, as the own weight-gradient kernels copy it.
  int64_t padded_h() const { return h + 2 * ph; }
  int64_t padded_w() const { return w + 2 * pw; }
  // A 1x1, stride-1, unpadded convolution reads the input image as its own column matrix.
  bool pointwise() const { return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }
  // Elements of the im2col buffer for one image (all groups), 0 when pointwise.
  int64_t col_elems() const { return pointwise() ? 0 : c * kh * kw * oh * ow; }
};

// Geometry from the input shape (n, c, h, w), weight shape (o, c/groups, kh, kw) and the op's attributes.
// Only FR_CHECKs: the op's infer validates with user-facing messages first.
ConvGeom conv_geom(const Shape& x, const Shape& w, const Attrs& a);

// Pooling geometry: input (n, c, h, w), window (kh, kw), output (oh, ow).
struct PoolGeom {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0;
  int64_t oh = 0, ow = 0;
};

PoolGeom pool_geom(const Shape& x, const Attrs& a);

void conv2d(const KernelCtx& c);
void conv2d_grad_input(const KernelCtx& c);
void conv2d_grad_weight(const KernelCtx& c);
void maxpool2d(const KernelCtx& c);
void maxpool2d_grad(const KernelCtx& c);
void avgpool2d(const KernelCtx& c);
void avgpool2d_grad(const KernelCtx& c);
void global_avgpool(const KernelCtx& c);
// attr to = nchw16c, nchw8c or nhwc: NCHW -> that; nchw: back (graph/layout.cc).
void reorder(const KernelCtx& c);
// NCHW <-> nChw{lanes}c on raw memory: n images of c channels (a multiple of lanes, 8 or 16) and hw pixels,
// `elem`-byte elements.
void reorder_blocked(const void* from, void* to, int64_t n, int64_t c, int64_t hw, size_t elem, int64_t lanes,
                     bool to_blocked);
// nChw{from_lanes}c -> nChw{to_lanes}c on raw memory (lanes 8 and 16, either way; c a multiple of 16).
void regroup_blocked(const void* from, void* to, int64_t n, int64_t c, int64_t hw, size_t elem,
                     int64_t from_lanes, int64_t to_lanes);

}  // namespace flowrun::cpu
