// Reductions over axes (sum, mean, max) and broadcast_to, their adjoint.
#include <algorithm>

#include "graph/builder.h"
#include "ops/cpu/reduce.h"
#include "ops/registry.h"

namespace flowrun {

namespace {

// bf16 runs natively: f32 accumulation, one rounding per output.
const std::vector<DType> kF = {DType::f32, DType::f64, DType::bf16};

// Sorted, normalised reduction axes; empty attribute = all axes.
std::vector<int> reduce_axes(const Shape& s, const Attrs& a) {
  std::vector<int> axes;
  const auto raw = a.ints("axes", {});
  if (raw.empty())
    for (size_t i = 0; i < s.size(); ++i) axes.push_back(static_cast<int>(i));
  for (int64_t ax : raw) axes.push_back(normalize_axis(ax, s.size()));
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) throw input_error("repeated reduction axis");
  return axes;
}

Shape reduced_shape(const Shape& s, const Attrs& a, bool keepdims) {
  const auto axes = reduce_axes(s, a);
  Shape out;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool r = std::binary_search(axes.begin(), axes.end(), static_cast<int>(i));
    if (!r) out.push_back(s[i]);
    else if (keepdims) out.push_back(1);
  }
  return out;
}

std::vector<TensorType> infer_reduce(const std::vector<TensorType>& in, const Attrs& a) {
  return {{reduced_shape(in[0].shape, a, a.b("keepdims")), result_dtype(in[0].dtype, a)}};
}

Cost reduce_cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
  const double n = static_cast<double>(numel(in[0].shape));
  return {n, (n + static_cast<double>(numel(out[0].shape))) * static_cast<double>(dtype_size(in[0].dtype))};
}

// Two ping-pong halves of partial results, in the accumulator type (f32 for bf16 storage).
size_t reduce_workspace(const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
  const DType acc = in[0].dtype == DType::bf16 ? DType::f32 : in[0].dtype;
  return static_cast<size_t>(numel(in[0].shape)) * dtype_size(acc);
}

// dy of a reduction, broadcast back over the input's shape.
ValueId expand_back(GradCtx& c) {
  const Shape& xs = c.b.shape(c.in(0));
  const ValueId dy = c.b.reshape(c.dout(0), reduced_shape(xs, c.attrs(), true));
  return c.b.op1("broadcast_to", {dy}, {{"shape", xs}});
}

std::vector<OpSample> reduce_samples() {
  std::vector<OpSample> s;
  struct Case {
    Shape x;
    std::vector<int64_t> axes;
    bool keep;
  };
  for (const Case& k : std::vector<Case>{{{4, 5}, {0}, false},
                                         {{4, 5}, {1}, true},
                                         {{3, 4, 5}, {1}, false},
                                         {{2, 3, 4, 5}, {0, 2, 3}, false},
                                         {{3, 4, 5}, {0, 2}, true},
                                         {{3, 7}, {}, false},
                                         {{3, 4, 5}, {-1}, false},
                                         // Long reductions summed in chunks of rows (ops/cpu/reduce.cc).
                                         {{300, 3}, {0}, false},
                                         {{2, 150, 2, 3}, {1, 2}, true},
                                         {{3, 2, 260, 4}, {0, 2}, false}}) {
    OpSample o;
    o.label = shape_str(k.x) + " axes " + shape_str(k.axes);
    o.inputs = {{k.x, DType::f64}};
    o.attrs = Attrs{{"axes", k.axes}, {"keepdims", k.keep}};
    s.push_back(o);
  }
  return s;
}

OpDef reduce_op(const std::string& name, const std::string& doc, KernelFn fn,
                std::function<std::vector<ValueId>(GradCtx&)> grad) {
  OpDef d;
  d.name = name;
  d.doc =
      doc +
      " over attribute axes (empty = all), keepdims optional; out_dtype: f32 on bf16 input writes the f32 "
      "result (CPU)";
  d.infer = infer_reduce;
  d.cost = reduce_cost;
  d.workspace = reduce_workspace;
  d.grad = std::move(grad);
  d.kernels = {{DeviceKind::cpu, kF, fn}};
  d.samples = reduce_samples;
  return d;
}

}  // namespace

void register_reduce_ops(OpRegistry& r) {
  r.add(reduce_op(
      "reduce_sum",
      "sum (attr blocked, false: an nChw16c input, nChw8c with attr nchw8c, summed over axes 0, 2, 3)",
      cpu::reduce_sum, [](GradCtx& c) -> std::vector<ValueId> { return {expand_back(c)}; }));
  r.add(reduce_op("reduce_mean", "mean", cpu::reduce_mean, [](GradCtx& c) -> std::vector<ValueId> {
    const double count = static_cast<double>(numel(c.b.shape(c.in(0))) / std::max<int64_t>(1, numel(c.b.shape(c.out(0)))));
    return {c.b.mul_scalar(expand_back(c), 1.0 / count)};
  }));
  r.add(reduce_op("reduce_max", "maximum", cpu::reduce_max, [](GradCtx& c) -> std::vector<ValueId> {
    return {c.b.op1("reduce_max_grad", {c.dout(0), c.in(0), c.out(0)}, c.attrs())};
  }));

  OpDef mg;
  mg.name = "reduce_max_grad";
  mg.doc = "gradient of reduce_max: dy flows to every element equal to the maximum";
  mg.num_inputs = 3;
  mg.infer = [](const std::vector<TensorType>& in, const Attrs&) -> std::vector<TensorType> { return {in[1]}; };
  mg.cost = reduce_cost;
  mg.kernels = {{DeviceKind::cpu, kF, cpu::reduce_max_grad}};
  mg.covered_by = {"reduce_max"};
  r.add(mg);

  OpDef bt;
  bt.name = "broadcast_to";
  bt.doc = "broadcast to attribute shape (NumPy rules)";
  bt.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    const Shape target = a.ints("shape");
    auto s = broadcast_shapes(in[0].shape, target);
    if (!s || *s != target)
      throw input_error(cat("cannot broadcast ", shape_str(in[0].shape), " to ", shape_str(target)));
    return {{target, in[0].dtype}};
  };
  // A split of the input passes to the same axis counted from the right (grouped-query attention's k/v
  // heads, split on the tensor axis, broadcast over their groups). On the data axis a value broadcast
  // along the batch (a class token over the batch) may come out split: each rank makes its rows, and the
  // parameter is read by a split node, so its gradient is summed over the ranks like any other's.
  bt.sbp = [](const SbpQuery& q) {
    std::vector<SbpSignature> sigs = elementwise_signatures(q, true);
    const Shape& x = q.in[0].shape;
    const bool batch_broadcast = x.size() < q.out[0].shape.size() || x[0] == 1;
    if (q.axis == MeshAxis::data && batch_broadcast && (!q.cur[0] || q.cur[0]->kind == Sbp::B))
      sigs.push_back({{Sbp::broadcast()}, {Sbp::split(0)}});
    return sigs;
  };
  bt.cost = reduce_cost;
  bt.grad = [](GradCtx& c) -> std::vector<ValueId> { return {c.b.reduce_to_shape(c.dout(0), c.b.shape(c.in(0)))}; };
  bt.kernels = {{DeviceKind::cpu, kF, cpu::broadcast_to}};
  bt.samples = [] {
    std::vector<OpSample> s;
    // Copy runs, fill runs (one axis, two merged: a pooled gradient's planes, all of y) and strided rows.
    for (auto [x, t] : std::vector<std::pair<Shape, Shape>>{{{5}, {3, 5}},
                                                            {{3, 1}, {3, 4}},
                                                            {{2, 1, 3}, {4, 2, 5, 3}},
                                                            {{2, 3, 1, 1}, {2, 3, 2, 4}},
                                                            {{1}, {2, 3}}}) {
      OpSample o;
      o.label = shape_str(x) + "->" + shape_str(t);
      o.inputs = {{x, DType::f64}};
      o.attrs = Attrs{{"shape", t}};
      s.push_back(o);
    }
    return s;
  };
  r.add(bt);
}

}  // namespace flowrun
