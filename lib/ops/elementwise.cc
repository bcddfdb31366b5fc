// Elementwise ops: broadcasting binary arithmetic, scalar ops, activations and their gradients, fill, cast
// and stop_gradient. CPU kernels are in ops/cpu/elementwise.cc.
#include "ops/cpu/elementwise.h"

#include <cmath>

#include "graph/builder.h"
#include "ops/cpu/reduce.h"
#include "ops/registry.h"

namespace flowrun {

namespace {

// Arithmetic and activation kernels also run natively on bf16 storage (f32 arithmetic, one rounding per
// output); f16 runs them widened.
const std::vector<DType> kF = {DType::f32, DType::f64, DType::bf16};

std::vector<TensorType> infer_broadcast(const std::vector<TensorType>& in, const Attrs&) {
  if (in[0].dtype != in[1].dtype)
    throw input_error(cat("dtype mismatch: ", dtype_name(in[0].dtype), " vs ", dtype_name(in[1].dtype)));
  auto s = broadcast_shapes(in[0].shape, in[1].shape);
  if (!s)
    throw input_error(
        cat("shapes ", shape_str(in[0].shape), " and ", shape_str(in[1].shape), " do not broadcast"));
  return {{*s, in[0].dtype}};
}

Cost elementwise_cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
  double bytes = 0;
  for (const auto& t : in)
    bytes += static_cast<double>(numel(t.shape) * static_cast<int64_t>(dtype_size(t.dtype)));
  const double n = static_cast<double>(numel(out[0].shape));
  return {n, bytes + n * static_cast<double>(dtype_size(out[0].dtype))};
}

std::vector<OpSample> binary_samples(bool positive_b) {
  auto fill = [positive_b](int i, Tensor& t, uint64_t seed) {
    RngStream r{seed, static_cast<uint64_t>(i)};
    std::vector<double> v(static_cast<size_t>(t.numel()));
    for (size_t k = 0; k < v.size(); ++k)
      v[k] = i == 1 && positive_b ? 0.5 + r.uniform(k) : 2.0 * r.uniform(k) - 1.0;
    t.fill_from(v);
  };
  std::vector<OpSample> s;
  for (auto [a, b] : std::vector<std::pair<Shape, Shape>>{
           {{3, 5}, {3, 5}}, {{2, 3, 7}, {7}}, {{4, 1, 3}, {1, 5, 1}}, {{3, 1}, {2, 1, 4}}, {{5}, {}}}) {
    OpSample o;
    o.label = shape_str(a) + "x" + shape_str(b);
    o.inputs = {{a, DType::f64}, {b, DType::f64}};
    o.fill = fill;
    s.push_back(o);
  }
  return s;
}

std::vector<OpSample> unary_samples(std::vector<Attrs> attr_sets = {Attrs{}}, bool positive = false) {
  std::vector<OpSample> s;
  for (const auto& attrs : attr_sets)
    for (const Shape& sh : std::vector<Shape>{{7}, {3, 17}, {2, 3, 5}}) {
      OpSample o;
      o.label = shape_str(sh);
      o.inputs = {{sh, DType::f64}};
      o.attrs = attrs;
      if (positive)
        o.fill = [](int, Tensor& t, uint64_t seed) {
          std::vector<double> v(static_cast<size_t>(t.numel()));
          for (size_t k = 0; k < v.size(); ++k) v[k] = 0.2 + 2.0 * RngStream{seed, 7}.uniform(k);
          t.fill_from(v);
        };
      s.push_back(o);
    }
  return s;
}

// Splits pass through elementwise ops; partial sums only through the linear ones (a sum of partial sums,
// a scaled or re-typed partial sum).
std::function<std::vector<SbpSignature>(const SbpQuery&)> pointwise_sbp(const std::string& op) {
  const bool linear = op == "add" || op == "sub" || op == "mul_scalar" || op == "cast";
  return [linear](const SbpQuery& q) { return elementwise_signatures(q, linear); };
}

OpDef binary(const std::string& name, KernelFn fn, std::function<std::vector<ValueId>(GradCtx&)> grad,
             bool positive_b = false) {
  OpDef d;
  d.name = name;
  d.sbp = pointwise_sbp(name);
  d.doc = "elementwise " + name + " with NumPy broadcasting";
  d.num_inputs = 2;
  d.infer = infer_broadcast;
  d.grad = std::move(grad);
  d.cost = elementwise_cost;
  d.inplace_input = 0;
  d.kernels = {{DeviceKind::cpu, kF, fn}};
  d.samples = [positive_b] { return binary_samples(positive_b); };
  return d;
}

// An activation y = f(x) whose gradient is its own op `<name>_grad(dy, x or y)`.
// An activation's derivative in f64, from what its gradient op reads (the input x, or the output y).
using Derivative = double (*)(double z, const Attrs& a);

void activation(OpRegistry& r, const std::string& name, const std::string& doc, KernelFn fwd, KernelFn bwd,
                bool grad_uses_output, Derivative derivative, std::vector<Attrs> attr_sets = {Attrs{}}) {
  OpDef d;
  d.name = name;
  d.sbp = pointwise_sbp(name);
  d.doc = doc;
  d.infer = same_as_input0;
  d.cost = elementwise_cost;
  d.inplace_input = grad_uses_output ? 0 : -1;  // in place only if the input is not needed by the backward
  d.kernels = {{DeviceKind::cpu, kF, fwd}};
  d.grad = [name, grad_uses_output](GradCtx& c) -> std::vector<ValueId> {
    return {c.b.op1(name + "_grad", {c.dout(0), grad_uses_output ? c.out(0) : c.in(0)}, c.attrs())};
  };
  d.samples = [attr_sets] { return unary_samples(attr_sets); };
  r.add(d);

  OpDef g;
  g.name = name + "_grad";
  g.doc = "gradient of " + name + ": dy * f'(" + (grad_uses_output ? "y" : "x") + ")";
  g.num_inputs = 2;
  g.infer = same_as_input0;
  if (name == "relu") {
    // relu_grad alone may take the sum that feeds it (graph/passes.cc fuse_backward: a ResNet block's input
    // gradient, its shortcut's plus its first convolution's).
    g.doc +=
        "; with a third input dy2 of dy's shape and dtype: (dy + dy2, rounded as add rounds it) where y > 0";
    g.num_inputs = -1;
    g.infer = [](const std::vector<TensorType>& in, const Attrs&) -> std::vector<TensorType> {
      if (in.size() != 2 && in.size() != 3)
        throw input_error(cat("relu_grad: 2 or 3 inputs expected, got ", in.size()));
      if (in.size() == 3 && (in[2].shape != in[0].shape || in[2].dtype != in[0].dtype))
        throw input_error(cat("relu_grad: dy2 is ", shape_str(in[2].shape), " ", dtype_name(in[2].dtype),
                              ", dy ", shape_str(in[0].shape), " ", dtype_name(in[0].dtype)));
      return {in[0]};
    };
  }
  g.cost = elementwise_cost;
  g.inplace_input = 0;
  g.kernels = {{DeviceKind::cpu, kF, bwd}};
  g.covered_by = {name};
  // Samples of its own, against the derivative in f64, so that every device's kernel of it is checked.
  g.samples = [attr_sets, derivative] {
    std::vector<OpSample> s;
    for (const Attrs& a : attr_sets) {
      OpSample o;
      o.label = "dy, z [3,5]";
      o.inputs = {{{3, 5}, DType::f64}, {{3, 5}, DType::f64}};
      o.attrs = a;
      o.gradcheck = false;
      o.reference = [derivative](const std::vector<Tensor>& in, const Attrs& at) {
        const std::vector<double> dy = in[0].to_f64(), z = in[1].to_f64();
        std::vector<double> dx(dy.size());
        for (size_t i = 0; i < dx.size(); ++i) dx[i] = dy[i] * derivative(z[i], at);
        Tensor out = Tensor::empty(in[0].shape(), DType::f64);
        out.fill_from(dx);
        return std::vector<Tensor>{out};
      };
      s.push_back(o);
    }
    return s;
  };
  r.add(g);
}

double gelu_derivative(double x, const Attrs& a) {
  if (a.is("approximate", "tanh")) {
    const double k = std::sqrt(2.0 / M_PI), t = std::tanh(k * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
  }
  return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}

// The bias gradient's shape: x's rank, every axis but the last 1.
Shape column_sums_shape(const Shape& x) {
  Shape s(x.size(), 1);
  if (!s.empty()) s.back() = x.back();
  return s;
}

// An activation's gradient with the column sums of its result (a linear's bias gradient), which only the CPU
// fusion pass graph/passes.cc fuse_bias_gradients creates, from <act>_grad -> reduce_sum over the leading
// axes: gelu_bias_grad (dy, x), relu_bias_grad (dy, y).
OpDef bias_grad_op(const std::string& act, bool grad_uses_output, Derivative derivative, KernelFn kernel,
                   const std::vector<Attrs>& attr_sets) {
  OpDef d;
  d.name = act + "_bias_grad";
  const std::string z = grad_uses_output ? "y" : "x";
  d.doc = cat("(dy, ", z, ") -> (dx = ", act, "_grad(dy, ", z,
              "), db = dx summed over every axis but the last, kept as size 1); attrs ",
              act == "gelu" ? "approximate, " : "", "out_dtype (f32: db in f32 from bf16 operands)");
  d.num_inputs = 2;
  d.num_outputs = [](const Attrs&) { return 2; };
  d.infer = [name = d.name, z](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    if (in[0].shape != in[1].shape || in[0].dtype != in[1].dtype || in[0].shape.empty())
      throw input_error(cat(name, ": dy ", shape_str(in[0].shape), " and ", z, " ", shape_str(in[1].shape),
                            " must have one shape and dtype, of rank 1 or more"));
    return {in[0], {column_sums_shape(in[0].shape), result_dtype(in[0].dtype, a)}};
  };
  d.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a) {
    Cost c = elementwise_cost(in, out, a);
    c.flops *= 2;  // an add per element for the sums
    c.bytes += static_cast<double>(numel(out[1].shape) * static_cast<int64_t>(dtype_size(out[1].dtype)));
    return c;
  };
  d.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    const int64_t n = in[0].shape.back(), rows = numel(in[0].shape) / std::max<int64_t>(n, 1);
    const size_t acc = in[0].dtype == DType::f64 ? 8 : 4;  // the sums' type: f64, else f32
    return static_cast<size_t>(cpu::reduce_row_chunks(rows) * n) * acc;
  };
  d.inplace_input = 0;
  d.kernels = {{DeviceKind::cpu, kF, kernel}};
  d.samples = [attr_sets, derivative, z] {
    std::vector<OpSample> s;
    // One chunk of rows; three chunks (300 rows) of 20 columns; two column blocks (270) over three chunks.
    for (const Attrs& a : attr_sets)
      for (const Shape& sh : std::vector<Shape>{{3, 5}, {2, 150, 20}, {300, 270}}) {
        OpSample o;
        o.label = cat("dy, ", z, " ", shape_str(sh));
        o.inputs = {{sh, DType::f64}, {sh, DType::f64}};
        o.attrs = a;
        o.gradcheck = false;
        o.reference = [derivative](const std::vector<Tensor>& in, const Attrs& at) {
          const std::vector<double> dy = in[0].to_f64(), x = in[1].to_f64();
          const int64_t n = in[0].shape().back();
          std::vector<double> dx(dy.size()), db(static_cast<size_t>(n), 0.0);
          for (size_t i = 0; i < dx.size(); ++i) {
            dx[i] = dy[i] * derivative(x[i], at);
            db[i % static_cast<size_t>(n)] += dx[i];
          }
          Tensor a = Tensor::empty(in[0].shape(), DType::f64),
                 b = Tensor::empty(column_sums_shape(in[0].shape()), DType::f64);
          a.fill_from(dx);
          b.fill_from(db);
          return std::vector<Tensor>{a, b};
        };
        s.push_back(o);
      }
    return s;
  };
  return d;
}

double sigmoid(double x) {
  return 1 / (1 + std::exp(-x));
}

// Inputs of one shape and floating dtype (SwiGLU's gate and up projections, and its gradient's dh).
std::vector<TensorType> infer_same_shapes(const std::string& op, const std::vector<TensorType>& in) {
  for (const TensorType& t : in)
    if (t.shape != in[0].shape || t.dtype != in[0].dtype || !is_floating(t.dtype))
      throw input_error(cat(op, ": inputs must share one shape and floating dtype, got ",
                            shape_str(in[0].shape), " ", dtype_name(in[0].dtype), " and ", shape_str(t.shape),
                            " ", dtype_name(t.dtype)));
  return {in[0]};
}

// silu(g) * u, which the CPU fusion pass (graph/passes.cc fuse_swiglu) makes of a Llama MLP's silu -> mul:
// one pass over g and u where the pair took two and stored silu(g), and a gradient of one pass.
OpDef swiglu_op() {
  OpDef d;
  d.name = "swiglu";
  d.sbp = pointwise_sbp(d.name);
  d.doc = "(g, u) -> silu(g) * u (SwiGLU's product; silu -> mul fused on the CPU)";
  d.num_inputs = 2;
  d.infer = [](const std::vector<TensorType>& in, const Attrs&) { return infer_same_shapes("swiglu", in); };
  d.cost = elementwise_cost;
  d.kernels = {{DeviceKind::cpu, kF, cpu::swiglu}};
  d.grad = [](GradCtx& c) -> std::vector<ValueId> {
    const std::vector<ValueId> g = c.b.op("swiglu_grad", {c.dout(0), c.in(0), c.in(1)}, {});
    return {g[0], g[1]};
  };
  d.samples = [] {
    std::vector<OpSample> s;
    for (const Shape& sh : std::vector<Shape>{{7}, {3, 17}, {2, 3, 5}}) {
      OpSample o;
      o.label = shape_str(sh);
      o.inputs = {{sh, DType::f64}, {sh, DType::f64}};
      o.reference = [](const std::vector<Tensor>& in, const Attrs&) {
        const std::vector<double> g = in[0].to_f64(), u = in[1].to_f64();
        std::vector<double> h(g.size());
        for (size_t i = 0; i < h.size(); ++i) h[i] = g[i] * sigmoid(g[i]) * u[i];
        Tensor out = Tensor::empty(in[0].shape(), DType::f64);
        out.fill_from(h);
        return std::vector<Tensor>{out};
      };
      s.push_back(o);
    }
    return s;
  };
  return d;
}

OpDef swiglu_grad_op() {
  OpDef d;
  d.name = "swiglu_grad";
  d.doc = "gradient of swiglu: (dh, g, u) -> (dg = dh u silu'(g), du = dh silu(g))";
  d.num_inputs = 3;
  d.num_outputs = [](const Attrs&) { return 2; };
  d.infer = [](const std::vector<TensorType>& in, const Attrs&) {
    const std::vector<TensorType> one = infer_same_shapes("swiglu_grad", in);
    return std::vector<TensorType>{one[0], one[0]};
  };
  d.cost = elementwise_cost;
  d.kernels = {{DeviceKind::cpu, kF, cpu::swiglu_grad}};
  d.covered_by = {"swiglu"};
  d.samples = [] {
    OpSample o;
    o.label = "dh, g, u [3,17]";
    o.inputs = {{{3, 17}, DType::f64}, {{3, 17}, DType::f64}, {{3, 17}, DType::f64}};
    o.gradcheck = false;
    o.reference = [](const std::vector<Tensor>& in, const Attrs&) {
      const std::vector<double> dh = in[0].to_f64(), g = in[1].to_f64(), u = in[2].to_f64();
      std::vector<double> dg(dh.size()), du(dh.size());
      for (size_t i = 0; i < dh.size(); ++i) {
        const double s = sigmoid(g[i]);
        dg[i] = dh[i] * u[i] * s * (1 + g[i] * (1 - s));
        du[i] = dh[i] * g[i] * s;
      }
      Tensor a = Tensor::empty(in[0].shape(), DType::f64), b = Tensor::empty(in[0].shape(), DType::f64);
      a.fill_from(dg);
      b.fill_from(du);
      return std::vector<Tensor>{a, b};
    };
    return std::vector<OpSample>{o};
  };
  return d;
}

OpDef scalar_op(const std::string& name, const std::string& doc, KernelFn fn,
                std::function<std::vector<ValueId>(GradCtx&)> grad, double sample_value, bool positive) {
  OpDef d;
  d.name = name;
  d.sbp = pointwise_sbp(name);
  d.doc = doc;
  d.infer = same_as_input0;
  d.cost = elementwise_cost;
  d.inplace_input = 0;
  d.grad = std::move(grad);
  d.kernels = {{DeviceKind::cpu, kF, fn}};
  d.samples = [sample_value, positive] { return unary_samples({Attrs{{"value", sample_value}}}, positive); };
  return d;
}

}  // namespace

void register_elementwise_ops(OpRegistry& r) {
  r.add(binary("add", cpu::add, [](GradCtx& c) -> std::vector<ValueId> {
    const ValueId dy = c.dout(0);
    return {c.b.reduce_to_shape(dy, c.b.shape(c.in(0))), c.b.reduce_to_shape(dy, c.b.shape(c.in(1)))};
  }));
  r.add(binary("sub", cpu::sub, [](GradCtx& c) -> std::vector<ValueId> {
    const ValueId dy = c.dout(0);
    return {c.b.reduce_to_shape(dy, c.b.shape(c.in(0))),
            c.b.reduce_to_shape(c.b.mul_scalar(dy, -1.0), c.b.shape(c.in(1)))};
  }));
  r.add(binary("mul", cpu::mul, [](GradCtx& c) -> std::vector<ValueId> {
    const ValueId dy = c.dout(0);
    return {c.b.reduce_to_shape(c.b.mul(dy, c.in(1)), c.b.shape(c.in(0))),
            c.b.reduce_to_shape(c.b.mul(dy, c.in(0)), c.b.shape(c.in(1)))};
  }));
  r.add(binary(
      "div", cpu::div,
      [](GradCtx& c) -> std::vector<ValueId> {
        const ValueId dy = c.dout(0);
        // d(a/b)/db = -(a/b)/b: reuse the forward output instead of squaring b.
        const ValueId db = c.b.mul_scalar(c.b.div(c.b.mul(dy, c.out(0)), c.in(1)), -1.0);
        return {c.b.reduce_to_shape(c.b.div(dy, c.in(1)), c.b.shape(c.in(0))),
                c.b.reduce_to_shape(db, c.b.shape(c.in(1)))};
      },
      /*positive_b=*/true));

  r.add(scalar_op(
      "add_scalar", "x + value", cpu::add_scalar,
      [](GradCtx& c) -> std::vector<ValueId> { return {c.dout(0)}; }, 0.75, false));
  r.add(scalar_op(
      "mul_scalar", "x * value", cpu::mul_scalar,
      [](GradCtx& c) -> std::vector<ValueId> { return {c.b.mul_scalar(c.dout(0), c.attrs().f("value"))}; },
      -1.5, false));
  r.add(scalar_op(
      "pow_scalar", "x ** value (x > 0 for non-integer powers)", cpu::pow_scalar,
      [](GradCtx& c) -> std::vector<ValueId> {
        const double p = c.attrs().f("value");
        const ValueId d = c.b.op1("pow_scalar", {c.in(0)}, {{"value", p - 1.0}});
        return {c.b.mul(c.dout(0), c.b.mul_scalar(d, p))};
      },
      1.7, true));

  const Derivative relu_derivative = [](double y, const Attrs&) { return y > 0 ? 1.0 : 0.0; };
  activation(r, "relu", "max(x, 0)", cpu::relu, cpu::relu_grad, /*grad_uses_output=*/true, relu_derivative);
  r.add(bias_grad_op("relu", true, relu_derivative, cpu::relu_bias_grad, {Attrs{}}));
  const std::vector<Attrs> gelu_attrs = {Attrs{{"approximate", std::string("none")}},
                                         Attrs{{"approximate", std::string("tanh")}}};
  activation(r, "gelu", "x * Phi(x); approximate=none (erf) or tanh", cpu::gelu, cpu::gelu_grad, false,
             gelu_derivative, gelu_attrs);
  r.add(bias_grad_op("gelu", false, gelu_derivative, cpu::gelu_bias_grad, gelu_attrs));
  activation(r, "silu", "x * sigmoid(x)", cpu::silu, cpu::silu_grad, false, [](double x, const Attrs&) {
    const double s = sigmoid(x);
    return s * (1 + x * (1 - s));
  });
  r.add(swiglu_op());
  r.add(swiglu_grad_op());
  activation(r, "tanh", "tanh(x)", cpu::tanh, cpu::tanh_grad, true,
             [](double y, const Attrs&) { return 1 - y * y; });
  activation(r, "sigmoid", "1 / (1 + exp(-x))", cpu::sigmoid, cpu::sigmoid_grad, true,
             [](double y, const Attrs&) { return y * (1 - y); });

  OpDef fill;
  fill.name = "fill_like";
  fill.doc = "a tensor shaped like the input, every element = value (the input is only read for its type)";
  fill.infer = same_as_input0;
  fill.sbp = pointwise_sbp(fill.name);
  fill.cost = elementwise_cost;
  fill.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64, DType::f16, DType::bf16}, cpu::fill_like}};
  fill.grad = [](GradCtx&) -> std::vector<ValueId> { return {kNoValue}; };
  fill.samples = [] { return unary_samples({Attrs{{"value", 0.5}}}); };
  r.add(fill);

  OpDef sg;
  sg.name = "stop_gradient";
  sg.doc = "identity forward; no gradient flows back";
  sg.infer = same_as_input0;
  sg.sbp = pointwise_sbp(sg.name);
  sg.cost = elementwise_cost;
  sg.inplace_input = 0;
  sg.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64, DType::f16, DType::bf16}, cpu::copy}};
  sg.grad = [](GradCtx&) -> std::vector<ValueId> { return {kNoValue}; };
  sg.samples = [] {
    // Its gradient is zero by definition, which finite differences would contradict: check the forward only.
    std::vector<OpSample> s = unary_samples();
    for (OpSample& o : s) {
      o.gradcheck = false;
      o.reference = [](const std::vector<Tensor>& in, const Attrs&) {
        return std::vector<Tensor>{in[0].clone()};
      };
    }
    return s;
  };
  r.add(sg);

  OpDef cast;
  cast.name = "cast";
  cast.doc = "convert to attribute dtype (round to nearest-even into f16/bf16)";
  cast.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    auto t = parse_dtype(a.s("dtype"));
    if (!t) throw input_error(cat("unknown dtype '", a.s("dtype"), "'"));
    return {{in[0].shape, *t}};
  };
  cast.sbp = pointwise_sbp(cast.name);
  cast.cost = elementwise_cost;
  cast.kernels = {
      {DeviceKind::cpu, std::vector<DType>(std::begin(kAllDTypes), std::end(kAllDTypes)), cpu::cast}};
  cast.grad = [](GradCtx& c) -> std::vector<ValueId> { return {c.b.cast(c.dout(0), c.b.dtype(c.in(0)))}; };
  cast.samples = [] {
    // f64 -> f32 -> (f64 for the loss): the gradient check sees the rounding as noise far below tolerance.
    std::vector<OpSample> s = unary_samples({Attrs{{"dtype", std::string("f64")}}});
    OpSample ref;
    ref.label = "f64->bf16 reference";
    ref.inputs = {{{6}, DType::f64}};
    ref.attrs = Attrs{{"dtype", std::string("bf16")}};
    ref.gradcheck = false;
    ref.fill = [](int, Tensor& t, uint64_t) {
      t.fill_from({1.0, 1.00390625, 1.01171875, -3.0e38, 1e-40, 65504.0});
    };
    ref.reference = [](const std::vector<Tensor>&, const Attrs&) {
      // Ties round to even: 1+2^-8 -> 1, 1+3*2^-8 -> 1+2^-6... computed by hand from the bf16 grid.
      Tensor t = Tensor::empty({6}, DType::bf16);
      const uint16_t bits[] = {0x3f80, 0x3f80, 0x3f82, 0xff62, 0x0001, 0x4780};
      for (int i = 0; i < 6; ++i) t.data<bf16>()[i].bits = bits[i];
      return std::vector<Tensor>{t};
    };
    s.push_back(ref);
    return s;
  };
  r.add(cast);
}

}  // namespace flowrun
