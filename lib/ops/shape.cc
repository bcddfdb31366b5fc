// Shape ops: reshape and the layout ops transpose, permute, slice (+ slice_grad), concat and split.
#include "ops/cpu/shape.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>
#include <tuple>

#include "graph/builder.h"
#include "ops/cpu/elementwise.h"
#include "ops/registry.h"

namespace flowrun {

namespace {
const std::vector<DType> kAnyFloat = {DType::f32, DType::f64, DType::f16, DType::bf16};
// Layout kernels move bytes, so they serve integer tensors (ids, masks) as well.
const std::vector<DType> kAnyDType(std::begin(kAllDTypes), std::end(kAllDTypes));

Cost copy_cost(const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
  return {0, 2.0 * static_cast<double>(numel(in[0].shape)) * static_cast<double>(dtype_size(in[0].dtype))};
}

double nbytes(const TensorType& t) {
  return static_cast<double>(numel(t.shape)) * static_cast<double>(dtype_size(t.dtype));
}

// Reads every input and writes every output once.
Cost move_cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
  double b = 0;
  for (const auto& t : in) b += nbytes(t);
  for (const auto& t : out) b += nbytes(t);
  return {0, b};
}

// A slice reads only its window.
Cost slice_cost(const std::vector<TensorType>&, const std::vector<TensorType>& out, const Attrs&) {
  return {0, 2.0 * nbytes(out[0])};
}

void check_rank(const char* op, const Shape& s) {
  if (s.size() > static_cast<size_t>(cpu::kMaxLayoutRank))
    throw input_error(cat(op, ": rank ", s.size(), " is above the supported ", cpu::kMaxLayoutRank));
}

// Normalised permutation; throws unless it holds each axis of a rank-`rank` tensor exactly once.
std::vector<int> checked_perm(const std::vector<int64_t>& p, size_t rank) {
  if (p.size() != rank)
    throw input_error(
        cat("permute: perm ", shape_str(p), " has ", p.size(), " entries for a tensor of rank ", rank));
  std::vector<int> perm;
  std::vector<bool> seen(rank, false);
  for (int64_t a : p) {
    const int ax = normalize_axis(a, rank);
    if (seen[static_cast<size_t>(ax)])
      throw input_error(cat("permute: perm ", shape_str(p), " repeats axis ", ax));
    seen[static_cast<size_t>(ax)] = true;
    perm.push_back(ax);
  }
  return perm;
}

Shape permuted(const Shape& s, const std::vector<int>& perm) {
  Shape out;
  for (int a : perm) out.push_back(s[static_cast<size_t>(a)]);
  return out;
}

// Normalised axis and resolved [start, end) of a slice of shape s.
struct SliceSpec {
  int axis;
  int64_t start, end;
};
SliceSpec slice_spec(const Shape& s, const Attrs& a) {
  if (s.empty()) throw input_error("slice: cannot slice a scalar");
  SliceSpec sp{normalize_axis(a.i("axis"), s.size()), 0, 0};
  std::tie(sp.start, sp.end) =
      cpu::resolve_slice(a.i("start", 0), a.i("end", INT64_MAX), s[static_cast<size_t>(sp.axis)]);
  return sp;
}

// --- plain references over Tensors (any dtype, through f64) ---

// Row-major multi-index of linear index k.
std::vector<int64_t> unravel(int64_t k, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (size_t i = s.size(); i-- > 0;) {
    idx[i] = k % s[i];
    k /= s[i];
  }
  return idx;
}

int64_t ravel(const std::vector<int64_t>& idx, const Shape& s) {
  int64_t k = 0;
  for (size_t i = 0; i < s.size(); ++i) k = k * s[i] + idx[i];
  return k;
}

// y[i_0..i_{r-1}] = x[j] with j[perm[d]] = i_d.
Tensor ref_permute(const Tensor& x, const std::vector<int>& perm) {
  Tensor y = Tensor::empty(permuted(x.shape(), perm), x.dtype());
  for (int64_t k = 0; k < y.numel(); ++k) {
    const auto oi = unravel(k, y.shape());
    std::vector<int64_t> ii(oi.size());
    for (size_t d = 0; d < perm.size(); ++d) ii[static_cast<size_t>(perm[d])] = oi[d];
    store_from_f64(y.raw(), y.dtype(), k, load_as_f64(x.raw(), x.dtype(), ravel(ii, x.shape())));
  }
  return y;
}

// y = x[..., start:end, ...] along axis.
Tensor ref_slice(const Tensor& x, int axis, int64_t start, int64_t end) {
  Shape ys = x.shape();
  ys[static_cast<size_t>(axis)] = end - start;
  Tensor y = Tensor::empty(ys, x.dtype());
  for (int64_t k = 0; k < y.numel(); ++k) {
    auto idx = unravel(k, ys);
    idx[static_cast<size_t>(axis)] += start;
    store_from_f64(y.raw(), y.dtype(), k, load_as_f64(x.raw(), x.dtype(), ravel(idx, x.shape())));
  }
  return y;
}

// Each output element found by walking the inputs' extents along axis.
Tensor ref_concat(const std::vector<Tensor>& xs, int axis) {
  Shape ys = xs[0].shape();
  ys[static_cast<size_t>(axis)] = 0;
  for (const Tensor& x : xs) ys[static_cast<size_t>(axis)] += x.shape()[static_cast<size_t>(axis)];
  Tensor y = Tensor::empty(ys, xs[0].dtype());
  for (int64_t k = 0; k < y.numel(); ++k) {
    auto idx = unravel(k, ys);
    size_t which = 0;
    while (idx[static_cast<size_t>(axis)] >= xs[which].shape()[static_cast<size_t>(axis)]) {
      idx[static_cast<size_t>(axis)] -= xs[which].shape()[static_cast<size_t>(axis)];
      ++which;
    }
    const Tensor& x = xs[which];
    store_from_f64(y.raw(), y.dtype(), k, load_as_f64(x.raw(), x.dtype(), ravel(idx, x.shape())));
  }
  return y;
}

OpSample sample(const std::string& label, std::vector<TensorType> inputs, Attrs attrs) {
  OpSample o;
  o.label = label;
  o.inputs = std::move(inputs);
  o.attrs = std::move(attrs);
  return o;
}

// A forward-only sample in another dtype: the byte kernels take the 2- or 8-byte element paths.
OpSample typed_sample(OpSample o, DType t) {
  for (auto& in : o.inputs) in.dtype = t;
  o.label += cat(" ", dtype_name(t));
  o.gradcheck = false;
  return o;
}

// A contiguous split of axis a of `from` is a split of axis b of `to` when the axes before them hold as
// many elements and b divides evenly (the rank's elements stay one block per leading index).
std::optional<int> reshaped_axis(const Shape& from, const Shape& to, const Sbp& s, int64_t parts) {
  int64_t before = 1;
  for (int i = 0; i < s.axis; ++i) before *= from[static_cast<size_t>(i)];
  int64_t p = 1;
  for (size_t b = 0; b < to.size(); ++b) {
    if (p == before && to[b] > 1 && to[b] % (parts * s.groups) == 0) return static_cast<int>(b);
    p *= to[b];
    if (p > before) break;
  }
  return std::nullopt;
}

// Ops that move elements without changing them pass partial sums through.
void partial_passes(const SbpQuery& q, std::vector<SbpSignature>& sigs) {
  if (q.cur[0] && q.cur[0]->kind == Sbp::P) sigs.push_back({{Sbp::partial()}, {Sbp::partial()}});
}

void register_reshape(OpRegistry& r) {
  OpDef d;
  d.name = "reshape";
  d.doc = "same elements, new shape (one dimension may be -1); a view: planned to share its input's memory";
  d.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    Shape s = a.ints("shape");
    int64_t known = 1, infer_at = -1;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == -1) {
        if (infer_at >= 0) throw input_error("reshape: more than one -1");
        infer_at = static_cast<int64_t>(i);
      } else {
        known *= s[i];
      }
    }
    const int64_t n = numel(in[0].shape);
    if (infer_at >= 0 && known > 0 && n % known == 0) s[static_cast<size_t>(infer_at)] = n / known;
    if (numel(s) != n)
      throw input_error(
          cat("reshape: cannot view ", shape_str(in[0].shape), " as ", shape_str(a.ints("shape"))));
    return {{s, in[0].dtype}};
  };
  d.grad = [](GradCtx& c) -> std::vector<ValueId> { return {c.b.reshape(c.dout(0), c.b.shape(c.in(0)))}; };
  // A split the new shape keeps as one block per leading index (the local graph's attr shape is one rank's).
  d.sbp = [](const SbpQuery& q) {
    std::vector<SbpSignature> sigs;
    if (q.cur[0] && q.cur[0]->kind == Sbp::S)
      if (auto b = reshaped_axis(q.in[0].shape, q.out[0].shape, *q.cur[0], q.parts))
        sigs.push_back({{*q.cur[0]}, {Sbp::split(*b, q.cur[0]->groups)}});
    partial_passes(q, sigs);
    return sigs;
  };
  d.cost = copy_cost;
  d.inplace_input = 0;
  d.view = true;
  d.kernels = {{DeviceKind::cpu, kAnyFloat, cpu::copy}};
  d.samples = [] {
    OpSample a, b;
    a.label = "[3,4]->[2,6]";
    a.inputs = {{{3, 4}, DType::f64}};
    a.attrs = Attrs{{"shape", Shape{2, 6}}};
    b.label = "[2,3,4]->[-1,4]";
    b.inputs = {{{2, 3, 4}, DType::f64}};
    b.attrs = Attrs{{"shape", Shape{-1, 4}}};
    return std::vector<OpSample>{a, b};
  };
  r.add(d);
}

int64_t need_i(const Attrs& a, const char* op, const char* k) {
  if (!a.has(k)) throw input_error(cat(op, ": missing integer attribute '", k, "'"));
  return a.i(k);
}

void register_transpose(OpRegistry& r) {
  OpDef d;
  d.name = "transpose";
  d.doc = "swaps axes dim0 and dim1 (negative axes count from the end); rank <= 8";
  d.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    Shape s = in[0].shape;
    check_rank("transpose", s);
    std::swap(s[static_cast<size_t>(normalize_axis(need_i(a, "transpose", "dim0"), s.size()))],
              s[static_cast<size_t>(normalize_axis(need_i(a, "transpose", "dim1"), s.size()))]);
    return {{s, in[0].dtype}};
  };
  // Swapping two axes is its own inverse.
  d.grad = [](GradCtx& c) -> std::vector<ValueId> { return {c.b.op1("transpose", {c.dout(0)}, c.attrs())}; };
  // A split moves with its axis.
  d.sbp = [](const SbpQuery& q) {
    std::vector<SbpSignature> sigs;
    const size_t r = q.in[0].shape.size();
    const int d0 = normalize_axis(q.attrs.i("dim0"), r), d1 = normalize_axis(q.attrs.i("dim1"), r);
    if (q.cur[0] && q.cur[0]->kind == Sbp::S) {
      const Sbp s = *q.cur[0];
      const int a = s.axis == d0 ? d1 : s.axis == d1 ? d0 : s.axis;
      sigs.push_back({{s}, {Sbp::split(a, s.groups)}});
    }
    partial_passes(q, sigs);
    return sigs;
  };
  d.cost = copy_cost;
  d.kernels = {{DeviceKind::cpu, kAnyDType, cpu::transpose}};
  d.samples = [] {
    auto ref = [](const std::vector<Tensor>& in, const Attrs& a) {
      const size_t rank = in[0].shape().size();
      std::vector<int> perm(rank);
      for (size_t i = 0; i < rank; ++i) perm[i] = static_cast<int>(i);
      std::swap(perm[static_cast<size_t>(normalize_axis(a.i("dim0"), rank))],
                perm[static_cast<size_t>(normalize_axis(a.i("dim1"), rank))]);
      return std::vector<Tensor>{ref_permute(in[0], perm)};
    };
    auto t = [](Shape s, int64_t d0, int64_t d1) {
      return sample(cat(shape_str(s), " dims ", d0, ",", d1), {{s, DType::f64}},
                    Attrs{{"dim0", d0}, {"dim1", d1}});
    };
    std::vector<OpSample> v = {t({3, 5, 7}, 0, 2), t({3, 5, 7}, -1, -2), t({37, 41}, 0, 1),
                               t({2, 3, 1, 5}, 1, 3), t({4, 6}, 1, -1)};
    v.push_back(typed_sample(t({37, 41}, 0, 1), DType::bf16));
    for (auto& o : v) o.reference = ref;
    return v;
  };
  r.add(d);
}

void register_permute(OpRegistry& r) {
  OpDef d;
  d.name = "permute";
  d.doc =
      "reorders axes: output axis j is input axis perm[j] (negative entries count from the end); rank <= 8";
  d.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    check_rank("permute", in[0].shape);
    if (!a.has("perm")) throw input_error("permute: missing attribute 'perm'");
    return {{permuted(in[0].shape, checked_perm(a.ints("perm"), in[0].shape.size())), in[0].dtype}};
  };
  d.grad = [](GradCtx& c) -> std::vector<ValueId> {
    const std::vector<int> perm = checked_perm(c.attrs().ints("perm"), c.b.shape(c.in(0)).size());
    std::vector<int64_t> inverse(perm.size());
    for (size_t j = 0; j < perm.size(); ++j) inverse[static_cast<size_t>(perm[j])] = static_cast<int64_t>(j);
    return {c.b.op1("permute", {c.dout(0)}, {{"perm", inverse}})};
  };
  d.sbp = [](const SbpQuery& q) {
    std::vector<SbpSignature> sigs;
    if (q.cur[0] && q.cur[0]->kind == Sbp::S) {
      const std::vector<int> perm = checked_perm(q.attrs.ints("perm"), q.in[0].shape.size());
      const Sbp s = *q.cur[0];
      for (size_t j = 0; j < perm.size(); ++j)
        if (perm[j] == s.axis) sigs.push_back({{s}, {Sbp::split(static_cast<int>(j), s.groups)}});
    }
    partial_passes(q, sigs);
    return sigs;
  };
  d.cost = copy_cost;
  d.kernels = {{DeviceKind::cpu, kAnyDType, cpu::permute}};
  d.samples = [] {
    auto ref = [](const std::vector<Tensor>& in, const Attrs& a) {
      return std::vector<Tensor>{ref_permute(in[0], checked_perm(a.ints("perm"), in[0].shape().size()))};
    };
    auto p = [](Shape s, std::vector<int64_t> perm) {
      return sample(cat(shape_str(s), " perm ", shape_str(perm)), {{s, DType::f64}}, Attrs{{"perm", perm}});
    };
    std::vector<OpSample> v = {
        p({2, 3, 4, 5}, {2, 0, 3, 1}),                            // 4-D, innermost axis moves: tiled path
        p({3, 5, 7}, {2, 1, 0}),        p({3, 5, 7}, {1, 0, 2}),  // innermost axis stays: contiguous runs
        p({2, 3, 4, 5}, {0, 2, 3, 1}),                            // NCHW -> NHWC: merges H,W
        p({3, 1, 5, 2}, {3, -2, 0, 1}),                           // negative entry, size-1 axis dropped
        p({2, 3, 4}, {0, 1, 2}),                                  // identity
        p({40, 3, 36}, {2, 1, 0}),  // several tiles per block, partial edge tiles
    };
    v.push_back(typed_sample(p({2, 3, 4, 5}, {2, 0, 3, 1}), DType::bf16));
    v.push_back(typed_sample(p({3, 5, 7}, {2, 1, 0}), DType::u8));
    v.push_back(typed_sample(p({3, 5, 7}, {1, 0, 2}), DType::i64));
    for (auto& o : v) o.reference = ref;
    return v;
  };
  r.add(d);
}

void register_slice(OpRegistry& r) {
  OpDef d;
  d.name = "slice";
  d.doc =
      "x[start:end] along axis (step 1; negative bounds count from the end and clamp like Python; start "
      "defaults to 0, end to the axis length)";
  d.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    need_i(a, "slice", "axis");
    const SliceSpec sp = slice_spec(in[0].shape, a);
    Shape s = in[0].shape;
    s[static_cast<size_t>(sp.axis)] = sp.end - sp.start;
    return {{s, in[0].dtype}};
  };
  d.grad = [](GradCtx& c) -> std::vector<ValueId> {
    const Shape& xs = c.b.shape(c.in(0));
    const SliceSpec sp = slice_spec(xs, c.attrs());
    return {c.b.op1("slice_grad", {c.dout(0)},
                    {{"axis", int64_t{sp.axis}}, {"start", sp.start}, {"end", sp.end}, {"in_shape", xs}})};
  };
  // A split of another axis passes through (the batch, when a ViT selects its class token).
  d.sbp = [](const SbpQuery& q) {
    std::vector<SbpSignature> sigs;
    if (q.cur[0] && q.cur[0]->kind == Sbp::S && q.cur[0]->axis != slice_spec(q.in[0].shape, q.attrs).axis)
      sigs.push_back({{*q.cur[0]}, {*q.cur[0]}});
    partial_passes(q, sigs);
    return sigs;
  };
  d.cost = slice_cost;
  d.kernels = {{DeviceKind::cpu, kAnyDType, cpu::slice}};
  d.samples = [] {
    auto ref = [](const std::vector<Tensor>& in, const Attrs& a) {
      const SliceSpec sp = slice_spec(in[0].shape(), a);
      return std::vector<Tensor>{ref_slice(in[0], sp.axis, sp.start, sp.end)};
    };
    auto s = [](Shape x, Attrs a) { return sample(cat(shape_str(x), " ", a.str()), {{x, DType::f64}}, a); };
    std::vector<OpSample> v = {
        s({3, 5, 7}, {{"axis", int64_t{1}}, {"start", int64_t{1}}, {"end", int64_t{4}}}),
        s({3, 5, 7}, {{"axis", int64_t{-1}}, {"start", int64_t{-3}}}),  // negative start, end defaulted
        s({3, 5, 7}, {{"axis", int64_t{0}}, {"start", int64_t{-2}}, {"end", int64_t{-1}}}),
        s({3, 5, 7}, {{"axis", int64_t{2}}, {"start", int64_t{2}}, {"end", int64_t{100}}}),  // end clamps
        s({4, 6}, {{"axis", int64_t{1}}, {"start", int64_t{-100}}, {"end", int64_t{3}}}),    // start clamps
        s({3, 5, 7}, {{"axis", int64_t{1}}, {"start", int64_t{0}}, {"end", int64_t{5}}}),    // whole axis
    };
    v.push_back(typed_sample(v[0], DType::i64));
    v.push_back(typed_sample(v[1], DType::f16));
    for (auto& o : v) o.reference = ref;
    return v;
  };
  r.add(d);

  // The window of a decode step: which rows is known only when it runs (the position embedding of the
  // tokens a KV-cache step feeds), so that one compiled program serves every position.
  OpDef w;
  w.name = "slice_at";
  w.doc =
      "x[start : start + length] along axis, start read at run time from input 1 (1) i64 (must keep the "
      "window inside the axis); attrs axis, length. Not differentiable (inference programs)";
  w.num_inputs = 2;
  w.nondiff_inputs = {1};
  w.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    const int axis = normalize_axis(need_i(a, "slice_at", "axis"), in[0].shape.size());
    const int64_t len = need_i(a, "slice_at", "length");
    Shape s = in[0].shape;
    if (len < 1 || len > s[static_cast<size_t>(axis)])
      throw input_error(cat("slice_at: length ", len, " must be in [1, ", s[static_cast<size_t>(axis)],
                            "] (axis ", axis, " of ", shape_str(s), ")"));
    if (in[1].dtype != DType::i64 || in[1].shape != Shape{1})
      throw input_error(
          cat("slice_at: start must be i64 (1), got ", shape_str(in[1].shape), ":", dtype_name(in[1].dtype)));
    s[static_cast<size_t>(axis)] = len;
    return {{s, in[0].dtype}};
  };
  w.cost = slice_cost;
  w.kernels = {{DeviceKind::cpu, kAnyDType, cpu::slice_at}};
  w.samples = [] {
    auto ref = [](const std::vector<Tensor>& in, const Attrs& a) {
      const int axis = normalize_axis(a.i("axis"), in[0].shape().size());
      const int64_t start = in[1].data<int64_t>()[0];
      return std::vector<Tensor>{ref_slice(in[0], axis, start, start + a.i("length"))};
    };
    auto s = [&](Shape x, int64_t axis, int64_t length, int64_t start, DType t) {
      OpSample o = sample(cat(shape_str(x), " axis ", axis, " [", start, ", +", length, ") ", dtype_name(t)),
                          {{x, t}, {{1}, DType::i64}}, {{"axis", axis}, {"length", length}});
      o.fill = sample_fill({{1, static_cast<double>(start)}});
      o.reference = ref;
      o.gradcheck = false;
      return o;
    };
    return std::vector<OpSample>{s({7, 5}, 0, 3, 4, DType::f64), s({2, 6, 3}, 1, 1, 0, DType::f64),
                                 s({2, 6, 3}, -2, 2, 3, DType::bf16), s({9, 4}, 0, 9, 0, DType::f64)};
  };
  r.add(w);

  OpDef g;
  g.name = "slice_grad";
  g.doc = "gradient of slice: zeros of in_shape with dy copied into the window [start, end) along axis";
  g.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    if (!a.has("in_shape")) throw input_error("slice_grad: missing attribute 'in_shape'");
    need_i(a, "slice_grad", "axis");
    const Shape& xs = a.ints("in_shape");
    const SliceSpec sp = slice_spec(xs, a);
    Shape expect = xs;
    expect[static_cast<size_t>(sp.axis)] = sp.end - sp.start;
    if (in[0].shape != expect)
      throw input_error(cat("slice_grad: dy is ", shape_str(in[0].shape), ", expected ", shape_str(expect)));
    return {{xs, in[0].dtype}};
  };
  // Linear in dy: its adjoint is the forward slice.
  g.grad = [](GradCtx& c) -> std::vector<ValueId> {
    return {c.b.op1(
        "slice", {c.dout(0)},
        {{"axis", c.attrs().i("axis")}, {"start", c.attrs().i("start")}, {"end", c.attrs().i("end")}})};
  };
  g.cost = move_cost;
  g.kernels = {{DeviceKind::cpu, kAnyDType, cpu::slice_grad}};
  g.covered_by = {"slice"};
  r.add(g);
}

void register_concat(OpRegistry& r) {
  OpDef d;
  d.name = "concat";
  d.doc = "joins one or more tensors along axis; all share dtype and every other dimension";
  d.num_inputs = -1;
  d.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    if (in.empty()) throw input_error("concat: needs at least one input");
    const Shape& s0 = in[0].shape;
    const int axis = normalize_axis(need_i(a, "concat", "axis"), s0.size());
    Shape out = s0;
    out[static_cast<size_t>(axis)] = 0;
    for (size_t k = 0; k < in.size(); ++k) {
      const Shape& s = in[k].shape;
      if (in[k].dtype != in[0].dtype)
        throw input_error(cat("concat: input ", k, " is ", dtype_name(in[k].dtype), ", input 0 is ",
                              dtype_name(in[0].dtype)));
      bool ok = s.size() == s0.size();
      for (size_t i = 0; ok && i < s.size(); ++i) ok = i == static_cast<size_t>(axis) || s[i] == s0[i];
      if (!ok)
        throw input_error(cat("concat: input ", k, " ", shape_str(s), " does not match input 0 ",
                              shape_str(s0), " outside axis ", axis));
      out[static_cast<size_t>(axis)] += s[static_cast<size_t>(axis)];
    }
    return {{out, in[0].dtype}};
  };
  d.grad = [](GradCtx& c) -> std::vector<ValueId> {
    const ValueId dy = c.dout(0);
    const int64_t axis = normalize_axis(c.attrs().i("axis"), c.b.shape(dy).size());
    std::vector<ValueId> dx;
    int64_t off = 0;
    for (ValueId x : c.node.inputs) {
      const int64_t len = c.b.shape(x)[static_cast<size_t>(axis)];
      dx.push_back(c.b.op1("slice", {dy}, {{"axis", axis}, {"start", off}, {"end", off + len}}));
      off += len;
    }
    return dx;
  };
  // A split of another axis, the same on every input, passes through (a class token prepended to a
  // batch-split sequence).
  d.sbp = [](const SbpQuery& q) {
    std::vector<SbpSignature> sigs;
    const int axis = normalize_axis(q.attrs.i("axis"), q.in[0].shape.size());
    for (const auto& c : q.cur)
      if (c && c->kind == Sbp::S && c->axis != axis) {
        SbpSignature s{std::vector<Sbp>(q.in.size(), *c), {*c}};
        if (std::find_if(sigs.begin(), sigs.end(), [&](const SbpSignature& o) { return o.out == s.out; }) ==
            sigs.end())
          sigs.push_back(s);
      }
    return sigs;
  };
  d.cost = move_cost;
  d.kernels = {{DeviceKind::cpu, kAnyDType, cpu::concat}};
  d.samples = [] {
    auto ref = [](const std::vector<Tensor>& in, const Attrs& a) {
      return std::vector<Tensor>{ref_concat(in, normalize_axis(a.i("axis"), in[0].shape().size()))};
    };
    auto k = [](std::vector<Shape> xs, int64_t axis) {
      std::vector<TensorType> in;
      std::string label;
      for (const Shape& s : xs) {
        in.push_back({s, DType::f64});
        label += shape_str(s);
      }
      return sample(cat(label, " axis ", axis), in, Attrs{{"axis", axis}});
    };
    std::vector<OpSample> v = {
        k({{2, 3, 4}, {2, 1, 4}, {2, 5, 4}}, 1),  // three inputs, middle axis
        k({{3, 2}, {3, 5}, {3, 1}}, -1),          // innermost axis, negative
        k({{1, 4}, {3, 4}}, 0), k({{3, 5}}, 0),   // a single input is a copy
    };
    v.push_back(typed_sample(v[0], DType::i64));
    v.push_back(typed_sample(v[1], DType::bf16));
    for (auto& o : v) o.reference = ref;
    return v;
  };
  r.add(d);
}

void register_split(OpRegistry& r) {
  OpDef d;
  d.name = "split";
  d.doc = "splits along axis into pieces of the given sizes (one output each; they sum to the axis length)";
  d.num_outputs = [](const Attrs& a) { return static_cast<int>(a.ints_or_empty("sizes").size()); };
  d.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    const Shape& s = in[0].shape;
    const int axis = normalize_axis(need_i(a, "split", "axis"), s.size());
    const std::vector<int64_t>& sizes = a.ints_or_empty("sizes");
    if (sizes.empty()) throw input_error("split: attribute 'sizes' must list at least one size");
    int64_t sum = 0;
    std::vector<TensorType> out;
    for (int64_t n : sizes) {
      if (n < 0) throw input_error(cat("split: negative size in ", shape_str(sizes)));
      sum += n;
      Shape o = s;
      o[static_cast<size_t>(axis)] = n;
      out.push_back({o, in[0].dtype});
    }
    if (sum != s[static_cast<size_t>(axis)])
      throw input_error(cat("split: sizes ", shape_str(sizes), " sum to ", sum, ", axis ", axis, " of ",
                            shape_str(s), " has ", s[static_cast<size_t>(axis)]));
    return out;
  };
  d.grad = [](GradCtx& c) -> std::vector<ValueId> {
    std::vector<ValueId> dys;
    for (size_t i = 0; i < c.node.outputs.size(); ++i) dys.push_back(c.dout(static_cast<int>(i)));
    return {c.b.op1("concat", dys, {{"axis", c.attrs().i("axis")}})};
  };
  // A split of another axis passes to every piece; a grouped split cut along its groups (q|k|v) gives each
  // piece a plain split (the local graph's sizes are one rank's).
  d.sbp = [](const SbpQuery& q) {
    std::vector<SbpSignature> sigs;
    if (!q.cur[0] || q.cur[0]->kind != Sbp::S) return sigs;
    const Sbp s = *q.cur[0];
    const int axis = normalize_axis(q.attrs.i("axis"), q.in[0].shape.size());
    const std::vector<int64_t>& sizes = q.attrs.ints("sizes");
    if (s.axis != axis) {
      sigs.push_back({{s}, std::vector<Sbp>(q.out.size(), s)});
    } else if (s.groups == static_cast<int>(sizes.size()) &&
               std::all_of(sizes.begin(), sizes.end(), [&](int64_t v) { return v == sizes[0]; })) {
      sigs.push_back({{s}, std::vector<Sbp>(q.out.size(), Sbp::split(axis))});
    }
    return sigs;
  };
  d.cost = move_cost;
  d.kernels = {{DeviceKind::cpu, kAnyDType, cpu::split}};
  d.samples = [] {
    auto ref = [](const std::vector<Tensor>& in, const Attrs& a) {
      const int axis = normalize_axis(a.i("axis"), in[0].shape().size());
      std::vector<Tensor> out;
      int64_t off = 0;
      for (int64_t n : a.ints("sizes")) {
        out.push_back(ref_slice(in[0], axis, off, off + n));
        off += n;
      }
      return out;
    };
    auto k = [](Shape x, int64_t axis, std::vector<int64_t> sizes) {
      return sample(cat(shape_str(x), " axis ", axis, " sizes ", shape_str(sizes)), {{x, DType::f64}},
                    Attrs{{"axis", axis}, {"sizes", sizes}});
    };
    std::vector<OpSample> v = {
        k({3, 9, 2}, 1, {2, 3, 4}),                  // three uneven parts
        k({4, 7}, -1, {1, 4, 2}),                    // innermost axis, negative
        k({5, 3}, 0, {3, 2}), k({2, 6, 3}, 2, {3}),  // a single part is a copy
    };
    v.push_back(typed_sample(v[0], DType::bf16));
    v.push_back(typed_sample(v[1], DType::i32));
    for (auto& o : v) o.reference = ref;
    return v;
  };
  r.add(d);
}

}  // namespace

void register_shape_ops(OpRegistry& r) {
  register_reshape(r);
  register_transpose(r);
  register_permute(r);
  register_slice(r);
  register_concat(r);
  register_split(r);
}

}  // namespace flowrun
