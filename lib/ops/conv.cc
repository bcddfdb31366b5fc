// Convolution and pooling ops over NCHW tensors (PyTorch semantics): conv2d, maxpool2d, avgpool2d,
// global_avgpool and their backward helpers. CPU kernels are in ops/cpu/conv.cc.
#include "ops/cpu/conv.h"

#include <algorithm>
#include <limits>

#include "graph/builder.h"
#include "ops/cpu/dnnl_conv.h"
#include "ops/cpu/dnnl_matmul.h"
#include "ops/registry.h"

namespace flowrun {

namespace {

const std::vector<DType> kF = {DType::f32, DType::f64};

void check_nchw(const std::string& op, const char* what, const TensorType& t) {
  if (t.shape.size() != 4)
    throw input_error(cat(op, ": ", what, " must be rank 4 (N, C, H, W), got ", shape_str(t.shape)));
  if (!is_floating(t.dtype))
    throw input_error(cat(op, ": ", what, " must be floating, got ", dtype_name(t.dtype)));
}

// A [h, w] attribute (or a single value for both) with a lower bound, or an input_error.
void pair_attr(const std::string& op, const Attrs& a, const char* key, int64_t dflt, int64_t min, int64_t& h,
               int64_t& w) {
  if (!cpu::attr_pair(a, key, dflt, h, w))
    throw input_error(cat(op, ": attribute '", key, "' must be an int or a list of 1 or 2 ints"));
  if (h < min || w < min)
    throw input_error(cat(op, ": attribute '", key, "' must be >= ", min, ", got [", h, ", ", w, "]"));
}

Shape attr_shape(const std::string& op, const Attrs& a, const char* key) {
  if (!a.has(key)) throw input_error(cat(op, ": missing attribute '", key, "'"));
  const Shape& s = a.ints(key);
  if (s.size() != 4 || std::any_of(s.begin(), s.end(), [](int64_t d) { return d < 1; }))
    throw input_error(cat(op, ": attribute '", key, "' must be 4 positive dims, got ", shape_str(s)));
  return s;
}

// Validates a conv2d of input x and weight w; returns the output shape (N, O, OH, OW).
Shape conv_out_shape(const std::string& op, const Shape& x, const Shape& w, const Attrs& a) {
  int64_t sh, sw, ph, pw, dh, dw;
  pair_attr(op, a, "stride", 1, 1, sh, sw);
  pair_attr(op, a, "padding", 0, 0, ph, pw);
  pair_attr(op, a, "dilation", 1, 1, dh, dw);
  const int64_t groups = a.i("groups", 1);
  if (groups < 1) throw input_error(cat(op, ": groups must be >= 1, got ", groups));
  if (x[1] % groups != 0 || w[0] % groups != 0)
    throw input_error(cat(op, ": input channels ", x[1], " and output channels ", w[0],
                          " must be divisible by groups ", groups));
  if (w[1] != x[1] / groups || w[2] < 1 || w[3] < 1)
    throw input_error(cat(op, ": weight ", shape_str(w), " should be (O, ", x[1] / groups,
                          ", KH, KW) for input ", shape_str(x), " and groups ", groups));
  const int64_t eh = dh * (w[2] - 1) + 1, ew = dw * (w[3] - 1) + 1;
  if (x[2] + 2 * ph < eh || x[3] + 2 * pw < ew)
    throw input_error(cat(op, ": dilated kernel ", eh, "x", ew, " is larger than the padded input ",
                          x[2] + 2 * ph, "x", x[3] + 2 * pw));
  return {x[0], w[0], (x[2] + 2 * ph - eh) / sh + 1, (x[3] + 2 * pw - ew) / sw + 1};
}

// Validates pooling attributes over input x; returns the output shape (N, C, OH, OW).
Shape pool_out_shape(const std::string& op, const Shape& x, const Attrs& a) {
  if (!a.has("kernel")) throw input_error(cat(op, ": missing attribute 'kernel'"));
  int64_t kh, kw, sh, sw, ph, pw;
  pair_attr(op, a, "kernel", 1, 1, kh, kw);
  pair_attr(op, a, "stride", 1, 1, sh, sw);
  if (!a.has("stride")) sh = kh, sw = kw;
  pair_attr(op, a, "padding", 0, 0, ph, pw);
  // Larger padding would allow windows entirely in the padding (PyTorch rejects it too).
  if (2 * ph > kh || 2 * pw > kw)
    throw input_error(
        cat(op, ": padding [", ph, ", ", pw, "] must be at most half the kernel [", kh, ", ", kw, "]"));
  if (x[2] + 2 * ph < kh || x[3] + 2 * pw < kw)
    throw input_error(
        cat(op, ": kernel [", kh, ", ", kw, "] is larger than the padded input ", shape_str(x)));
  return {x[0], x[1], (x[2] + 2 * ph - kh) / sh + 1, (x[3] + 2 * pw - kw) / sw + 1};
}

double bytes_of(const std::vector<TensorType>& ts) {
  double b = 0;
  for (const auto& t : ts)
    b += static_cast<double>(numel(t.shape)) * static_cast<double>(dtype_size(t.dtype));
  return b;
}

// The im2col buffer of one image, all groups; none for a pointwise conv, nor for f32, whose oneDNN kernels
// hold their own buffers next to their cached primitives.
size_t col_bytes(const Shape& x, const Shape& w, const Attrs& a, DType t) {
  if (t == DType::f32) return 0;
  return static_cast<size_t>(cpu::conv_geom(x, w, a).col_elems()) * dtype_size(t);
}

// The oneDNN kernels' buffers (the f64 kernels are loops of ours and keep none).
std::vector<std::pair<std::string, size_t>> conv_buffers(DType t, const cpu::ConvGeom& g, cpu::ConvPass pass,
                                                         bool bias) {
  if (t == DType::f64 || g.n == 0) return {};
  return cpu::dnnl_conv2d_buffers(t, g, pass, bias);
}

// ---- references: direct loops, deliberately independent of the kernels' im2col formulation ----

std::vector<Tensor> conv_reference(const std::vector<Tensor>& in, const Attrs& a) {
  const Shape &xs = in[0].shape(), &ws = in[1].shape();
  const Shape ys = conv_out_shape("conv2d", xs, ws, a);
  int64_t sh, sw, ph, pw, dh, dw;
  cpu::attr_pair(a, "stride", 1, sh, sw);
  cpu::attr_pair(a, "padding", 0, ph, pw);
  cpu::attr_pair(a, "dilation", 1, dh, dw);
  const int64_t groups = a.i("groups", 1), cg = xs[1] / groups, og = ws[0] / groups;
  Tensor y = Tensor::zeros(ys, DType::f64);
  const double *x = in[0].data<double>(), *w = in[1].data<double>();
  double* py = y.data<double>();
  for (int64_t n = 0; n < ys[0]; ++n)
    for (int64_t o = 0; o < ys[1]; ++o)
      for (int64_t oy = 0; oy < ys[2]; ++oy)
        for (int64_t ox = 0; ox < ys[3]; ++ox) {
          double acc = in.size() > 2 ? in[2].data<double>()[o] : 0.0;
          for (int64_t ci = 0; ci < cg; ++ci) {
            const int64_t c = (o / og) * cg + ci;
            for (int64_t ki = 0; ki < ws[2]; ++ki)
              for (int64_t kj = 0; kj < ws[3]; ++kj) {
                const int64_t iy = oy * sh - ph + ki * dh, ix = ox * sw - pw + kj * dw;
                if (iy < 0 || iy >= xs[2] || ix < 0 || ix >= xs[3]) continue;
                acc += x[((n * xs[1] + c) * xs[2] + iy) * xs[3] + ix] *
                       w[((o * cg + ci) * ws[2] + ki) * ws[3] + kj];
              }
          }
          py[((n * ys[1] + o) * ys[2] + oy) * ys[3] + ox] = acc;
        }
  return {y};
}

struct RefPool {
  int64_t kh, kw, sh, sw, ph, pw;
};

RefPool ref_pool(const Attrs& a) {
  RefPool p{};
  cpu::attr_pair(a, "kernel", 1, p.kh, p.kw);
  cpu::attr_pair(a, "stride", 1, p.sh, p.sw);
  if (!a.has("stride")) p.sh = p.kh, p.sw = p.kw;
  cpu::attr_pair(a, "padding", 0, p.ph, p.pw);
  return p;
}

std::vector<Tensor> maxpool_reference(const std::vector<Tensor>& in, const Attrs& a) {
  const Shape& xs = in[0].shape();
  const Shape ys = pool_out_shape("maxpool2d", xs, a);
  const RefPool p = ref_pool(a);
  Tensor y = Tensor::zeros(ys, DType::f64), idx = Tensor::zeros(ys, DType::i64);
  const double* x = in[0].data<double>();
  int64_t k = 0;
  for (int64_t pl = 0; pl < xs[0] * xs[1]; ++pl)
    for (int64_t oy = 0; oy < ys[2]; ++oy)
      for (int64_t ox = 0; ox < ys[3]; ++ox, ++k) {
        double best = -std::numeric_limits<double>::infinity();
        int64_t bi = -1;
        for (int64_t ki = 0; ki < p.kh; ++ki)
          for (int64_t kj = 0; kj < p.kw; ++kj) {
            const int64_t iy = oy * p.sh - p.ph + ki, ix = ox * p.sw - p.pw + kj;
            if (iy < 0 || iy >= xs[2] || ix < 0 || ix >= xs[3]) continue;
            const double u = x[(pl * xs[2] + iy) * xs[3] + ix];
            const double v = a.b("relu") ? std::max(u, 0.0) : u;
            if (v > best) best = v, bi = iy * xs[3] + ix;
          }
        y.data<double>()[k] = best;
        idx.data<int64_t>()[k] = bi;
      }
  return {y, idx};
}

std::vector<Tensor> avgpool_reference(const std::vector<Tensor>& in, const Attrs& a) {
  const Shape& xs = in[0].shape();
  const Shape ys = pool_out_shape("avgpool2d", xs, a);
  const RefPool p = ref_pool(a);
  const bool include_pad = a.b("count_include_pad", true);
  Tensor y = Tensor::zeros(ys, DType::f64);
  const double* x = in[0].data<double>();
  int64_t k = 0;
  for (int64_t pl = 0; pl < xs[0] * xs[1]; ++pl)
    for (int64_t oy = 0; oy < ys[2]; ++oy)
      for (int64_t ox = 0; ox < ys[3]; ++ox, ++k) {
        double sum = 0;
        int64_t count = 0;
        for (int64_t ki = 0; ki < p.kh; ++ki)
          for (int64_t kj = 0; kj < p.kw; ++kj) {
            const int64_t iy = oy * p.sh - p.ph + ki, ix = ox * p.sw - p.pw + kj;
            if (iy < 0 || iy >= xs[2] || ix < 0 || ix >= xs[3]) continue;
            sum += x[(pl * xs[2] + iy) * xs[3] + ix];
            ++count;
          }
        y.data<double>()[k] = sum / static_cast<double>(include_pad ? p.kh * p.kw : count);
      }
  return {y};
}

// ---- samples ----

std::vector<OpSample> conv_samples() {
  struct Case {
    std::string label;
    Shape x, w;
    bool bias;
    Attrs attrs;
  };
  const std::vector<Case> cases = {
      {"stride 2 pad 1 bias",
       {2, 3, 7, 6},
       {4, 3, 3, 3},
       true,
       {{"stride", Shape{2, 2}}, {"padding", Shape{1, 1}}}},
      {"stride 2 pad 1",
       {2, 3, 7, 6},
       {4, 3, 3, 3},
       false,
       {{"stride", Shape{2, 2}}, {"padding", Shape{1, 1}}}},
      {"dilation 2 pad 2",
       {2, 3, 7, 6},
       {4, 3, 3, 3},
       true,
       {{"padding", Shape{2, 2}}, {"dilation", Shape{2, 2}}}},
      {"asymmetric stride/pad/dilation",
       {1, 2, 8, 7},
       {3, 2, 2, 3},
       false,
       {{"stride", Shape{1, 2}}, {"padding", Shape{2, 0}}, {"dilation", Shape{3, 1}}}},
      {"depthwise groups 3",
       {2, 3, 7, 6},
       {6, 1, 3, 3},
       true,
       {{"padding", Shape{1, 1}}, {"groups", int64_t{3}}}},
      {"groups 2 stride [2,1]",
       {1, 4, 5, 5},
       {4, 2, 2, 3},
       false,
       {{"stride", Shape{2, 1}}, {"padding", Shape{0, 1}}, {"groups", int64_t{2}}}},
      {"winograd", {2, 32, 6, 5}, {32, 32, 3, 3}, false, {{"padding", Shape{1, 1}}}},
      // cpu/conv_direct_f32.cc: a plane wider than a tile (16 + 2), more output than input blocks, and a
      // one-pixel row whose tile touches both edges.
      {"direct 3x3 bias", {2, 16, 3, 18}, {16, 16, 3, 3}, true, {{"padding", Shape{1, 1}}}},
      {"direct 3x3 16 to 32", {1, 16, 4, 5}, {32, 16, 3, 3}, false, {{"padding", Shape{1, 1}}}},
      {"direct 3x3 one column", {1, 32, 3, 1}, {16, 32, 3, 3}, false, {{"padding", Shape{1, 1}}}},
      // cpu/conv_direct8_f32.cc (AVX2 hosts): a row in one tile that touches both edges, with one input and
      // three output blocks of 8; a row in three tiles of unequal width (10, 11, 11).
      {"direct 3x3 eight lanes one tile", {1, 8, 3, 9}, {24, 8, 3, 3}, true, {{"padding", Shape{1, 1}}}},
      {"direct 3x3 eight lanes three tiles",
       {1, 16, 2, 32},
       {8, 16, 3, 3},
       false,
       {{"padding", Shape{1, 1}}}},
      // conv_direct_f32.cc's stride-2 weight gradient: an odd-height plane (the last output row's kh = 2 row
      // past the edge), then an odd-width one (the last output pixel's kw = 2 pixel past the edge).
      {"direct 3x3 stride 2",
       {2, 16, 7, 6},
       {32, 16, 3, 3},
       true,
       {{"padding", Shape{1, 1}}, {"stride", Shape{2, 2}}}},
      {"direct 3x3 stride 2 odd width",
       {1, 32, 4, 5},
       {16, 32, 3, 3},
       false,
       {{"padding", Shape{1, 1}}, {"stride", Shape{2, 2}}}},
      {"1x1 bias", {2, 4, 5, 3}, {3, 4, 1, 1}, true, {}},
      {"1x1 groups 2", {2, 4, 3, 5}, {6, 2, 1, 1}, false, {{"groups", int64_t{2}}}},
      {"1x1 stride 2", {2, 3, 5, 6}, {2, 3, 1, 1}, true, {{"stride", Shape{2, 2}}}},
      {"scalar attrs", {1, 2, 5, 4}, {3, 2, 2, 2}, false, {{"stride", int64_t{1}}, {"padding", int64_t{1}}}},
  };
  std::vector<OpSample> s;
  for (const Case& k : cases) {
    OpSample o;
    o.label = k.label + " x" + shape_str(k.x) + " w" + shape_str(k.w);
    o.inputs = {{k.x, DType::f64}, {k.w, DType::f64}};
    if (k.bias) o.inputs.push_back({{k.w[0]}, DType::f64});
    o.attrs = k.attrs;
    o.reference = conv_reference;
    s.push_back(o);
  }
  return s;
}

// Distinct, well-separated values (a shuffled ramp with step 0.01 around `offset`), so max pooling has no
// ties or kinks within a finite-difference step.
void distinct_fill(int i, Tensor& t, uint64_t seed, double offset = 0) {
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<double> v(n);
  for (size_t k = 0; k < n; ++k)
    v[k] = offset + 0.01 * (static_cast<double>(k) - 0.5 * static_cast<double>(n));
  const RngStream r{seed, 3000 + static_cast<uint64_t>(i)};
  for (size_t k = n; k > 1; --k) {
    const size_t j = std::min(k - 1, static_cast<size_t>(r.uniform(k) * static_cast<double>(k)));
    std::swap(v[k - 1], v[j]);
  }
  t.fill_from(v);
}

std::vector<OpSample> pool_samples(bool max) {
  struct Case {
    Shape x;
    Attrs attrs;
  };
  std::vector<Case> cases = {
      {{2, 3, 7, 7}, {{"kernel", Shape{3, 3}}, {"stride", Shape{2, 2}}, {"padding", Shape{1, 1}}}},
      {{1, 2, 6, 7}, {{"kernel", Shape{2, 3}}, {"stride", Shape{2, 2}}}},
      {{2, 2, 5, 5},
       {{"kernel", Shape{2, 2}}}},  // stride defaults to the kernel; the last row/col is dropped
      {{1, 3, 6, 5}, {{"kernel", Shape{3, 2}}, {"stride", Shape{1, 2}}, {"padding", Shape{1, 1}}}},
      {{2, 1, 4, 6}, {{"kernel", int64_t{3}}, {"stride", int64_t{1}}, {"padding", int64_t{1}}}},
  };
  std::vector<OpSample> s;
  for (const Case& k : cases)
    for (int inc = 0; inc < (max ? 1 : 2); ++inc) {
      OpSample o;
      o.label = shape_str(k.x) + " " + k.attrs.str();
      o.inputs = {{k.x, DType::f64}};
      o.attrs = k.attrs;
      if (max) {
        o.fill = [](int i, Tensor& t, uint64_t seed) { distinct_fill(i, t, seed); };
        o.reference = maxpool_reference;
      } else {
        o.attrs.set("count_include_pad", inc == 0);
        o.label += inc == 0 ? " count_include_pad" : " exclude pad";
        o.reference = avgpool_reference;
      }
      s.push_back(o);
    }
  // maxpool2d with its fused relu: overlapping padded windows, and 2x2 ones (the unrolled kernels). Most
  // values negative, so that windows of relu's zeros (tied, no gradient) occur, and none within 0.0025 of
  // relu's kink at 0, where a finite difference sees half a slope.
  if (max)
    for (const size_t c : {size_t{0}, size_t{2}}) {
      OpSample o = s[c];
      o.attrs.set("relu", true);
      o.label += " relu";
      o.fill = [](int i, Tensor& t, uint64_t seed) { distinct_fill(i, t, seed, -0.1975); };
      s.push_back(o);
    }
  return s;
}

Cost pool_cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a) {
  int64_t kh = 1, kw = 1;
  cpu::attr_pair(a, "kernel", 1, kh, kw);
  return {static_cast<double>(numel(out[0].shape) * kh * kw), bytes_of(in) + bytes_of(out)};
}

Cost pool_grad_cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a) {
  int64_t kh = 1, kw = 1;
  cpu::attr_pair(a, "kernel", 1, kh, kw);
  return {static_cast<double>(numel(in[0].shape) * kh * kw), bytes_of(in) + bytes_of(out)};
}

// Forward attributes plus the input shape, for the backward helpers.
Attrs with_shape(const Attrs& a, const char* key, const Shape& s) {
  Attrs r = a;
  r.set(key, s);
  return r;
}

// Images split by the batch (axis 0), the weights whole.
std::vector<SbpSignature> batch_split(const SbpQuery& q) {
  SbpSignature s{{Sbp::split(0)}, std::vector<Sbp>(q.out.size(), Sbp::split(0))};
  s.in.resize(q.in.size(), Sbp::broadcast());
  return {s};
}

}  // namespace

void register_conv_ops(OpRegistry& r) {
  OpDef conv;
  conv.name = "conv2d";
  conv.doc =
      "2-d convolution (cross-correlation), NCHW: x (N, C, H, W), w (O, C/groups, KH, KW), optional bias "
      "(O); "
      "attrs stride [1,1], padding [0,0], dilation [1,1], groups 1; x_blocked, y_blocked (false): x or y "
      "in nChw16c, or nChw8c with nchw8c (false), or NHWC with nhwc (false) (graph/layout.cc; the gradient "
      "ops take them too, for dx and dy)";
  conv.num_inputs = -1;
  conv.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    if (in.size() != 2 && in.size() != 3) throw input_error("conv2d takes (x, w) or (x, w, bias)");
    check_nchw("conv2d", "input", in[0]);
    check_nchw("conv2d", "weight", in[1]);
    if (in[1].dtype != in[0].dtype) throw input_error("conv2d: input and weight have different dtypes");
    const Shape y = conv_out_shape("conv2d", in[0].shape, in[1].shape, a);
    if (in.size() == 3 && (in[2].shape != Shape{in[1].shape[0]} || in[2].dtype != in[0].dtype))
      throw input_error(cat("conv2d: bias ", shape_str(in[2].shape), " should be [", in[1].shape[0], "] of ",
                            dtype_name(in[0].dtype)));
    return {{y, in[0].dtype}};
  };
  conv.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
    const Shape& w = in[1].shape;
    const double outn = static_cast<double>(numel(out[0].shape));
    const double flops = 2.0 * outn * static_cast<double>(w[1] * w[2] * w[3]) + (in.size() > 2 ? outn : 0.0);
    return Cost{flops, bytes_of(in) + bytes_of(out)};
  };
  conv.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs& a) {
    return col_bytes(in[0].shape, in[1].shape, a, in[0].dtype);
  };
  conv.grad = [](GradCtx& c) -> std::vector<ValueId> {
    GraphBuilder& b = c.b;
    const ValueId dy = c.dout(0);
    const ValueId dx =
        b.op1("conv2d_grad_input", {dy, c.in(1)}, with_shape(c.attrs(), "in_shape", b.shape(c.in(0))));
    const ValueId dw =
        b.op1("conv2d_grad_weight", {dy, c.in(0)}, with_shape(c.attrs(), "w_shape", b.shape(c.in(1))));
    std::vector<ValueId> g = {dx, dw};
    if (c.node.inputs.size() == 3) g.push_back(b.reduce_sum(dy, {0, 2, 3}));
    return g;
  };
  conv.sbp = batch_split;
  conv.kernels = {{DeviceKind::cpu, kF, cpu::conv2d},
                  {DeviceKind::cpu, {DType::bf16}, cpu::conv2d, cpu::has_native_bf16}};
  for (KernelDef& k : conv.kernels)
    if (k.device == DeviceKind::cpu)
      k.host_buffers = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs& a) {
        return conv_buffers(in[0].dtype, cpu::conv_geom(in[0].shape, in[1].shape, a), cpu::ConvPass::forward,
                            in.size() > 2);
      };
  conv.samples = conv_samples;
  r.add(conv);

  OpDef gi;
  gi.name = "conv2d_grad_input";
  gi.doc =
      "gradient of conv2d with respect to its input: (dy, w) -> dx of attribute in_shape (W^T dy, col2im)";
  gi.num_inputs = 2;
  gi.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    check_nchw("conv2d_grad_input", "dy", in[0]);
    check_nchw("conv2d_grad_input", "weight", in[1]);
    const Shape xs = attr_shape("conv2d_grad_input", a, "in_shape");
    if (conv_out_shape("conv2d_grad_input", xs, in[1].shape, a) != in[0].shape || in[1].dtype != in[0].dtype)
      throw input_error(cat("conv2d_grad_input: dy ", shape_str(in[0].shape), " does not match input ",
                            shape_str(xs), " and weight ", shape_str(in[1].shape)));
    return {{xs, in[0].dtype}};
  };
  gi.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
    const Shape& w = in[1].shape;
    return Cost{2.0 * static_cast<double>(numel(in[0].shape) * w[1] * w[2] * w[3]),
                bytes_of(in) + bytes_of(out)};
  };
  gi.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a) {
    return col_bytes(out[0].shape, in[1].shape, a, in[0].dtype);
  };
  gi.kernels = {{DeviceKind::cpu, kF, cpu::conv2d_grad_input},
                {DeviceKind::cpu, {DType::bf16}, cpu::conv2d_grad_input, cpu::has_native_bf16}};
  for (KernelDef& k : gi.kernels)
    if (k.device == DeviceKind::cpu)
      k.host_buffers = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out,
                          const Attrs& a) {
        return conv_buffers(in[0].dtype, cpu::conv_geom(out[0].shape, in[1].shape, a),
                            cpu::ConvPass::grad_input, false);
      };
  gi.covered_by = {"conv2d"};
  r.add(gi);

  OpDef gw;
  gw.name = "conv2d_grad_weight";
  gw.doc =
      "gradient of conv2d with respect to its weight: (dy, x) -> dw of attribute w_shape (dy im2col(x)^T, "
      "summed over the batch in order)";
  gw.num_inputs = 2;
  gw.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    check_nchw("conv2d_grad_weight", "dy", in[0]);
    check_nchw("conv2d_grad_weight", "input", in[1]);
    const Shape ws = attr_shape("conv2d_grad_weight", a, "w_shape");
    if (conv_out_shape("conv2d_grad_weight", in[1].shape, ws, a) != in[0].shape || in[1].dtype != in[0].dtype)
      throw input_error(cat("conv2d_grad_weight: dy ", shape_str(in[0].shape), " does not match input ",
                            shape_str(in[1].shape), " and weight ", shape_str(ws)));
    return {{ws, in[0].dtype}};
  };
  gw.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
    const Shape& w = out[0].shape;
    return Cost{2.0 * static_cast<double>(numel(in[0].shape) * w[1] * w[2] * w[3]),
                bytes_of(in) + bytes_of(out)};
  };
  gw.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a) {
    return col_bytes(in[1].shape, out[0].shape, a, in[0].dtype);
  };
  gw.kernels = {{DeviceKind::cpu, kF, cpu::conv2d_grad_weight},
                {DeviceKind::cpu, {DType::bf16}, cpu::conv2d_grad_weight, cpu::has_native_bf16}};
  for (KernelDef& k : gw.kernels)
    if (k.device == DeviceKind::cpu)
      k.host_buffers = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out,
                          const Attrs& a) {
        return conv_buffers(in[0].dtype, cpu::conv_geom(in[1].shape, out[0].shape, a),
                            cpu::ConvPass::grad_weight, false);
      };
  gw.covered_by = {"conv2d"};
  r.add(gw);

  OpDef mp;
  mp.name = "maxpool2d";
  mp.doc =
      "2-d max pooling, NCHW: attrs kernel [kh,kw], stride (default kernel), padding [0,0] (as -inf); "
      "outputs "
      "y and i64 indices of each maximum within its (n, c) plane (ih * W + iw); attr relu (false): pools "
      "relu(x) (a relu that only the pooling reads, fused by the CPU's backward fusion, graph/passes.cc); "
      "attr blocked (false): x, y and the indices in nChw16c, nChw8c with attr nchw8c, NHWC with attr nhwc";
  mp.num_outputs = [](const Attrs&) { return 2; };
  mp.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    check_nchw("maxpool2d", "input", in[0]);
    const Shape y = pool_out_shape("maxpool2d", in[0].shape, a);
    return {{y, in[0].dtype}, {y, DType::i64}};
  };
  mp.cost = pool_cost;
  mp.nondiff_outputs = {1};
  mp.grad = [](GradCtx& c) -> std::vector<ValueId> {
    std::vector<ValueId> in = {c.dout(0), c.out(1)};
    if (c.attrs().b("relu")) in.push_back(c.out(0));  // relu's gradient: the pooled value as the mask
    Attrs a = with_shape(c.attrs(), "in_shape", c.b.shape(c.in(0)));
    a.erase("relu");
    return {c.b.op1("maxpool2d_grad", in, a)};
  };
  mp.sbp = batch_split;
  // bf16: the maximum is one of the inputs, so the native kernel picks exactly what the f32 one would.
  mp.kernels = {{DeviceKind::cpu, kF, cpu::maxpool2d}, {DeviceKind::cpu, {DType::bf16}, cpu::maxpool2d}};
  mp.samples = [] { return pool_samples(true); };
  r.add(mp);

  OpDef mg;
  mg.name = "maxpool2d_grad";
  mg.doc =
      "gradient of maxpool2d: (dy, indices[, mask]) -> dx of attribute in_shape, dy scattered to each "
      "argmax; "
      "with a mask (maxpool2d's output y, shaped like dy: the fused relu_grad of the CPU's backward fusion, "
      "graph/passes.cc), a window adds its dy only where y > 0; attr blocked (false): all in nChw16c, "
      "nChw8c with attr nchw8c, NHWC with attr nhwc";
  mg.num_inputs = -1;
  mg.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    if (in.size() != 2 && in.size() != 3)
      throw input_error(cat("maxpool2d_grad takes (dy, indices[, mask]), got ", in.size(), " inputs"));
    check_nchw("maxpool2d_grad", "dy", in[0]);
    const Shape xs = attr_shape("maxpool2d_grad", a, "in_shape");
    if (in.size() == 3 && (in[2].shape != in[0].shape || in[2].dtype != in[0].dtype))
      throw input_error(cat("maxpool2d_grad: the mask ", shape_str(in[2].shape), " ", dtype_name(in[2].dtype),
                            " must be shaped and typed like dy ", shape_str(in[0].shape), " ",
                            dtype_name(in[0].dtype)));
    if (in[1].dtype != DType::i64 || in[1].shape != in[0].shape)
      throw input_error(cat("maxpool2d_grad: indices must be i64 shaped like dy ", shape_str(in[0].shape)));
    if (pool_out_shape("maxpool2d_grad", xs, a) != in[0].shape)
      throw input_error(
          cat("maxpool2d_grad: dy ", shape_str(in[0].shape), " does not match input ", shape_str(xs)));
    return {{xs, in[0].dtype}};
  };
  mg.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
    return Cost{static_cast<double>(numel(in[0].shape)), bytes_of(in) + bytes_of(out)};
  };
  mg.nondiff_inputs = {1, 2};
  mg.kernels = {{DeviceKind::cpu, kF, cpu::maxpool2d_grad},
                {DeviceKind::cpu, {DType::bf16}, cpu::maxpool2d_grad}};
  mg.covered_by = {"maxpool2d"};
  r.add(mg);

  OpDef ap;
  ap.name = "avgpool2d";
  ap.doc =
      "2-d average pooling, NCHW: attrs kernel [kh,kw], stride (default kernel), padding [0,0], "
      "count_include_pad (default true: padded zeros count in the divisor)";
  ap.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    check_nchw("avgpool2d", "input", in[0]);
    return {{pool_out_shape("avgpool2d", in[0].shape, a), in[0].dtype}};
  };
  ap.cost = pool_cost;
  ap.grad = [](GradCtx& c) -> std::vector<ValueId> {
    return {c.b.op1("avgpool2d_grad", {c.dout(0)}, with_shape(c.attrs(), "in_shape", c.b.shape(c.in(0))))};
  };
  ap.sbp = batch_split;
  ap.kernels = {{DeviceKind::cpu, kF, cpu::avgpool2d}};
  ap.samples = [] { return pool_samples(false); };
  r.add(ap);

  OpDef ag;
  ag.name = "avgpool2d_grad";
  ag.doc = "gradient of avgpool2d: dy -> dx of attribute in_shape, each dy spread evenly over its window";
  ag.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    check_nchw("avgpool2d_grad", "dy", in[0]);
    const Shape xs = attr_shape("avgpool2d_grad", a, "in_shape");
    if (pool_out_shape("avgpool2d_grad", xs, a) != in[0].shape)
      throw input_error(
          cat("avgpool2d_grad: dy ", shape_str(in[0].shape), " does not match input ", shape_str(xs)));
    return {{xs, in[0].dtype}};
  };
  ag.cost = pool_grad_cost;
  ag.kernels = {{DeviceKind::cpu, kF, cpu::avgpool2d_grad}};
  ag.covered_by = {"avgpool2d"};
  r.add(ag);

  OpDef gp;
  gp.name = "global_avgpool";
  gp.doc = "mean over H and W: (N, C, H, W) -> (N, C)";
  gp.infer = [](const std::vector<TensorType>& in, const Attrs&) -> std::vector<TensorType> {
    check_nchw("global_avgpool", "input", in[0]);
    return {{{in[0].shape[0], in[0].shape[1]}, in[0].dtype}};
  };
  gp.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
    return Cost{static_cast<double>(numel(in[0].shape)), bytes_of(in) + bytes_of(out)};
  };
  gp.grad = [](GradCtx& c) -> std::vector<ValueId> {
    GraphBuilder& b = c.b;
    const Shape xs = b.shape(c.in(0));
    const ValueId dy = b.reshape(c.dout(0), {xs[0], xs[1], 1, 1});
    const ValueId full = b.op1("broadcast_to", {dy}, {{"shape", xs}});
    return {b.mul_scalar(full, 1.0 / static_cast<double>(xs[2] * xs[3]))};
  };
  gp.sbp = batch_split;
  gp.kernels = {{DeviceKind::cpu, kF, cpu::global_avgpool}};
  gp.samples = [] {
    std::vector<OpSample> s;
    for (const Shape& x : std::vector<Shape>{{2, 3, 5, 4}, {1, 4, 1, 1}, {3, 2, 7, 3}}) {
      OpSample o;
      o.label = shape_str(x);
      o.inputs = {{x, DType::f64}};
      o.reference = [](const std::vector<Tensor>& in, const Attrs&) {
        const Shape& xs = in[0].shape();
        Tensor y = Tensor::zeros({xs[0], xs[1]}, DType::f64);
        const int64_t hw = xs[2] * xs[3];
        for (int64_t pl = 0; pl < xs[0] * xs[1]; ++pl) {
          double sum = 0;
          for (int64_t i = 0; i < hw; ++i) sum += in[0].data<double>()[pl * hw + i];
          y.data<double>()[pl] = sum / static_cast<double>(hw);
        }
        return std::vector<Tensor>{y};
      };
      s.push_back(o);
    }
    return s;
  };
  r.add(gp);

  OpDef ro;
  ro.name = "reorder";
  ro.doc =
      "the same (N, C, H, W) tensor in another memory layout: attr to = nchw16c (channel blocks of 16 "
      "innermost, oneDNN's nChw16c; C a multiple of 16), nchw8c (blocks of 8, C a multiple of 8), nhwc "
      "(channels innermost) or nchw (plain, from nChw16c, or from the layout attr from names: nchw8c or "
      "nhwc); the layout pass (graph/layout.cc) puts it where a value kept blocked between convolutions "
      "meets a reader of plain tensors";
  ro.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    check_nchw("reorder", "input", in[0]);
    if (!a.is("to", "nchw16c") && !a.is("to", "nchw8c") && !a.is("to", "nchw") && !a.is("to", "nhwc"))
      throw input_error("reorder: attribute 'to' must be nchw16c, nchw8c, nhwc or nchw");
    if (a.has("from") && !((a.is("from", "nhwc") || a.is("from", "nchw8c")) && a.is("to", "nchw")))
      throw input_error("reorder: attribute 'from' is nchw8c or nhwc, with to = nchw");
    const int64_t block = a.is("to", "nchw8c") || a.is("from", "nchw8c") ? 8 : 16;
    if (in[0].shape[1] % block != 0)
      throw input_error(
          cat("reorder: channels must be a multiple of ", block, ", got ", shape_str(in[0].shape)));
    return {in[0]};
  };
  ro.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
    return Cost{0.0, bytes_of(in) + bytes_of(out)};
  };
  // The gradient is the reorder back: to = L <-> to = nchw from L (nChw16c without from).
  ro.grad = [](GradCtx& c) -> std::vector<ValueId> {
    if (!c.attrs().is("to", "nchw")) {
      Attrs back{{"to", std::string("nchw")}};
      if (!c.attrs().is("to", "nchw16c")) back.set("from", c.attrs().s("to"));
      return {c.b.op1("reorder", {c.dout(0)}, back)};
    }
    return {c.b.op1("reorder", {c.dout(0)}, {{"to", c.attrs().s("from", "nchw16c")}})};
  };
  ro.sbp = batch_split;
  ro.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64, DType::f16, DType::bf16}, cpu::reorder}};
  ro.samples = [] {
    std::vector<OpSample> s;
    for (const char* layout : {"nchw16c", "nchw8c", "nhwc"})
      for (const bool to_blocked : {true, false})
        for (const Shape& x :
             std::vector<Shape>{{2, 32, 3, 5}, {1, 16, 6, 7}, {1, 16, 1, 1}, {2, 32, 6, 7}}) {
          const std::string l = layout;
          OpSample o;
          o.label = cat(to_blocked ? "to " : "from ", l, " ", shape_str(x));
          o.inputs = {{x, DType::f64}};
          o.attrs = {{"to", to_blocked ? l : std::string("nchw")}};
          if (!to_blocked && l != "nchw16c") o.attrs.set("from", l);
          // Element (n, c, i) of the plain tensor is element ((n * C/B + c/B) * HW + i) * B + c % B of the
          // nChw{B}c one, and (n * HW + i) * C + c of the NHWC one.
          const int64_t b = l == "nchw8c" ? 8 : 16;
          const bool nhwc = l == "nhwc";
          o.reference = [to_blocked, nhwc, b](const std::vector<Tensor>& in, const Attrs&) {
            const Shape& xs = in[0].shape();
            Tensor y = Tensor::zeros(xs, DType::f64);
            const int64_t hw = xs[2] * xs[3];
            for (int64_t n = 0; n < xs[0]; ++n)
              for (int64_t c = 0; c < xs[1]; ++c)
                for (int64_t i = 0; i < hw; ++i) {
                  const int64_t plain = (n * xs[1] + c) * hw + i,
                                blk = nhwc ? (n * hw + i) * xs[1] + c
                                           : ((n * (xs[1] / b) + c / b) * hw + i) * b + c % b;
                  y.data<double>()[to_blocked ? blk : plain] = in[0].data<double>()[to_blocked ? plain : blk];
                }
            return std::vector<Tensor>{y};
          };
          s.push_back(o);
        }
    return s;
  };
  r.add(ro);
}

}  // namespace flowrun
