// Optimizer ops: updates that mutate parameters and optimizer state in place (they run after every reader
// of the old values, see Graph::live_nodes_topological), the global gradient norm and clipping coefficient,
// and gradient accumulation. None is differentiable.
#include "ops/cpu/optim.h"

#include <cmath>
#include <type_traits>

#include "ops/registry.h"

namespace flowrun {
namespace {

void check_scalar(const TensorType& t, const char* op, const char* what) {
  if (numel(t.shape) != 1)
    throw input_error(cat(op, ": ", what, " must be a scalar, got ", shape_str(t.shape)));
}

void check_i64_scalar(const TensorType& t, const char* op, const char* what) {
  check_scalar(t, op, what);
  if (t.dtype != DType::i64)
    throw input_error(cat(op, ": ", what, " must be i64, got ", dtype_name(t.dtype)));
}

Tensor f32_scalar(double v) {
  Tensor t = Tensor::empty({}, DType::f32);
  t.fill_from({v});
  return t;
}

// The optional trailing coef input of an update, 1 when absent.
double sample_coef(const std::vector<Tensor>& in, size_t index) {
  return in.size() > index ? in[index].to_f64()[0] : 1.0;
}

// PyTorch's SGD step in double, for the samples: the mutated inputs (param, buffer), in order. Its first
// step sets the buffer to the gradient (torch.clone(d_p)), undampened.
std::vector<Tensor> sgd_reference(const std::vector<Tensor>& in, const Attrs& a) {
  Tensor p = in[0].clone(), buf = in[2].clone();
  const double lr = in[3].data<double>()[0], mom = a.f("momentum"), damp = a.f("dampening"),
               wd = a.f("weight_decay"), coef = sample_coef(in, 5);
  const bool first = in[4].data<int64_t>()[0] == 1;
  for (int64_t i = 0; i < p.numel(); ++i) {
    double g = coef * in[1].data<double>()[i] + wd * p.data<double>()[i];
    double& b = buf.data<double>()[i];
    b = first ? g : mom * b + (1 - damp) * g;
    g = a.b("nesterov") ? g + mom * b : b;
    p.data<double>()[i] -= lr * g;
  }
  return {p, buf};
}

OpDef sgd_def() {
  OpDef d;
  d.name = "sgd_update";
  d.doc =
      "p -= lr * (momentum/Nesterov of coef * grad + weight_decay * p), PyTorch's SGD: the momentum buffer "
      "is the gradient at step 1, then buf = momentum * buf + (1 - dampening) * grad; inputs (param, grad, "
      "momentum buffer, lr scalar, step i64 scalar (1-based, read with dampening only) [, coef scalar])";
  d.num_inputs = -1;
  d.num_outputs = [](const Attrs&) { return 0; };
  d.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    if (in.size() != 5 && in.size() != 6)
      throw input_error("sgd_update takes (param, grad, buffer, lr, step [, coef])");
    if (in[0].shape != in[1].shape)
      throw input_error("sgd_update: gradient shape differs from the parameter");
    if (a.f("momentum", 0) != 0 && in[2].shape != in[0].shape)
      throw input_error("sgd_update: momentum buffer shape");
    check_scalar(in[3], "sgd_update", "lr");
    check_i64_scalar(in[4], "sgd_update", "step");
    if (in.size() == 6) check_scalar(in[5], "sgd_update", "coef");
    return {};
  };
  d.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    const double n = static_cast<double>(numel(in[0].shape));
    return Cost{5 * n, 5 * n * static_cast<double>(dtype_size(in[0].dtype))};
  };
  d.nondiff_inputs = {0, 1, 2, 3, 4, 5};
  d.mutates = {0, 2};
  d.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::sgd_update}};
  d.samples = [] {
    std::vector<OpSample> s;
    // Dampening at the first step (the buffer becomes the gradient) and at a later one.
    for (int variant = 0; variant < 4; ++variant) {
      const bool nesterov = variant == 1, with_coef = variant == 2, first = variant == 3;
      OpSample o;
      o.label = first       ? "dampening, first step"
                : with_coef ? "dampening, coef"
                : nesterov  ? "nesterov"
                            : "dampening";
      o.inputs = {
          {{7}, DType::f64}, {{7}, DType::f64}, {{7}, DType::f64}, {{}, DType::f64}, {{}, DType::i64}};
      if (with_coef) o.inputs.push_back({{}, DType::f32});
      o.fill = sample_fill({{4, first ? 1.0 : 2.0}, {5, 0.375}});
      o.attrs = Attrs{{"momentum", 0.9},
                      {"dampening", nesterov ? 0.0 : 0.1},
                      {"nesterov", nesterov},
                      {"weight_decay", 0.01}};
      o.reference = sgd_reference;
      s.push_back(o);
    }
    return s;
  };
  return d;
}

// sgd_product_update: the gradient op(a) op(b) of a weight, then PyTorch's SGD with momentum and weight
// decay (no dampening or Nesterov), in double, for the samples.
std::vector<Tensor> sgd_product_reference(const std::vector<Tensor>& in, const Attrs& a) {
  Tensor p = in[0].clone(), buf = in[3].clone();
  const bool ta = a.b("trans_a"), tb = a.b("trans_b");
  const int64_t m = p.shape()[0], n = p.shape()[1], k = in[1].shape()[ta ? 0 : 1];
  const double lr = in[4].data<double>()[0], mom = a.f("momentum"), wd = a.f("weight_decay", 0);
  const double *x = in[1].data<double>(), *y = in[2].data<double>();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double g = 0;
      for (int64_t l = 0; l < k; ++l) g += x[ta ? l * m + i : i * k + l] * y[tb ? j * k + l : l * n + j];
      double& b = buf.data<double>()[i * n + j];
      double& w = p.data<double>()[i * n + j];
      b = mom * b + g + wd * w;
      w -= lr * b;
    }
  return {p, buf};
}

OpDef sgd_product_def() {
  OpDef d;
  d.name = "sgd_product_update";
  d.doc =
      "sgd_update of a weight whose gradient is the product op(a) op(b), computed by the GEMM into the "
      "momentum buffer: buf = op(a) op(b) + momentum * buf + weight_decay * p, p -= lr * buf (momentum, no "
      "dampening or Nesterov); inputs (param m x n, a, b, momentum buffer, lr scalar), attrs momentum, "
      "weight_decay, trans_a, trans_b. Made on the CPU by graph/passes.cc fuse_momentum_products";
  d.num_inputs = 5;
  d.num_outputs = [](const Attrs&) { return 0; };
  d.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    const Shape &p = in[0].shape, &x = in[1].shape, &y = in[2].shape;
    if (p.size() != 2 || x.size() != 2 || y.size() != 2)
      throw input_error("sgd_product_update: the parameter and both factors must be matrices");
    const bool ta = a.b("trans_a"), tb = a.b("trans_b");
    if ((ta ? x[1] : x[0]) != p[0] || (tb ? y[0] : y[1]) != p[1] || (ta ? x[0] : x[1]) != (tb ? y[1] : y[0]))
      throw input_error(cat("sgd_product_update: the product of ", shape_str(x), " and ", shape_str(y),
                            " is not the parameter's ", shape_str(p)));
    if (in[3].shape != p) throw input_error("sgd_product_update: momentum buffer shape");
    if (in[1].dtype != in[0].dtype || in[2].dtype != in[0].dtype || in[3].dtype != in[0].dtype)
      throw input_error("sgd_product_update: the factors and the buffer must have the parameter's dtype");
    if (a.f("momentum", 0) == 0) throw input_error("sgd_product_update: momentum must be nonzero");
    check_scalar(in[4], "sgd_product_update", "lr");
    return {};
  };
  // The matmul's and the sgd_update's costs together, so that a step counts the same FLOPs fused or not.
  d.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs& a) {
    const double n = static_cast<double>(numel(in[0].shape));
    const double k = static_cast<double>(in[1].shape[a.b("trans_a") ? 0 : 1]);
    const double bytes = static_cast<double>(numel(in[1].shape) + numel(in[2].shape)) + 4 * n;
    return Cost{2 * n * k + 5 * n, bytes * static_cast<double>(dtype_size(in[0].dtype))};
  };
  d.nondiff_inputs = {0, 1, 2, 3, 4};
  d.mutates = {0, 3};
  d.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::sgd_product_update}};
  d.samples = [] {
    std::vector<OpSample> s;
    // A weight gradient dy^T x (a transposed), and the product with b transposed under weight decay.
    for (const bool ta : {true, false}) {
      OpSample o;
      o.label = ta ? "a transposed" : "b transposed, weight decay";
      const Shape x = ta ? Shape{6, 5} : Shape{5, 6}, y = ta ? Shape{6, 7} : Shape{7, 6};
      o.inputs = {
          {{5, 7}, DType::f64}, {x, DType::f64}, {y, DType::f64}, {{5, 7}, DType::f64}, {{}, DType::f64}};
      o.fill = sample_fill({{4, 0.375}});
      o.attrs =
          Attrs{{"momentum", 0.9}, {"weight_decay", ta ? 0.0 : 0.01}, {"trans_a", ta}, {"trans_b", !ta}};
      o.reference = sgd_product_reference;
      s.push_back(o);
    }
    return s;
  };
  return d;
}

// PyTorch's Adam/AdamW step in double, for the samples.
std::vector<Tensor> adamw_reference(const std::vector<Tensor>& in, const Attrs& a) {
  Tensor p = in[0].clone(), m = in[2].clone(), v = in[3].clone();
  const double lr = in[4].to_f64()[0], t = in[5].to_f64()[0], coef = sample_coef(in, 6);
  const double b1 = a.f("beta1"), b2 = a.f("beta2"), eps = a.f("eps"), wd = a.f("weight_decay");
  const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
  for (int64_t i = 0; i < p.numel(); ++i) {
    double& pi = p.data<double>()[i];
    double& mi = m.data<double>()[i];
    double& vi = v.data<double>()[i];
    double g = coef * in[1].data<double>()[i];
    if (a.b("decoupled"))
      pi *= 1 - lr * wd;
    else
      g += wd * pi;
    mi = b1 * mi + (1 - b1) * g;
    vi = b2 * vi + (1 - b2) * g * g;
    pi -= lr / bc1 * mi / (std::sqrt(vi) / std::sqrt(bc2) + eps);
  }
  return {p, m, v};
}

OpDef adamw_def() {
  OpDef d;
  d.name = "adamw_update";
  d.doc =
      "PyTorch's Adam (decoupled=false: L2 term weight_decay * p added to the gradient) or AdamW "
      "(decoupled=true: p *= 1 - lr * weight_decay), bias-corrected with the 1-based step; inputs (param, "
      "grad, m, v, lr scalar, step i64 scalar [, coef scalar multiplying the gradient])";
  d.num_inputs = -1;
  d.num_outputs = [](const Attrs&) { return 0; };
  d.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    if (in.size() != 6 && in.size() != 7)
      throw input_error("adamw_update takes (param, grad, m, v, lr, step [, coef])");
    for (int i = 1; i < 4; ++i)
      if (in[static_cast<size_t>(i)].shape != in[0].shape)
        throw input_error(cat("adamw_update: input ", i, " has shape ",
                              shape_str(in[static_cast<size_t>(i)].shape), ", the parameter ",
                              shape_str(in[0].shape)));
    check_scalar(in[4], "adamw_update", "lr");
    check_i64_scalar(in[5], "adamw_update", "step");
    if (in.size() == 7) check_scalar(in[6], "adamw_update", "coef");
    for (const char* beta : {"beta1", "beta2"})
      if (!(a.f(beta) >= 0 && a.f(beta) < 1))
        throw input_error(cat("adamw_update: ", beta, " must be in [0, 1)"));
    return {};
  };
  d.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    const double n = static_cast<double>(numel(in[0].shape));
    return Cost{12 * n, 7 * n * static_cast<double>(dtype_size(in[0].dtype))};
  };
  d.nondiff_inputs = {0, 1, 2, 3, 4, 5, 6};
  d.mutates = {0, 2, 3};
  d.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::adamw_update}};
  d.samples = [] {
    std::vector<OpSample> s;
    for (bool decoupled : {false, true}) {
      OpSample o;
      o.label = decoupled ? "adamw, coef" : "adam";
      o.inputs = {{{9}, DType::f64}, {{9}, DType::f64}, {{9}, DType::f64},
                  {{9}, DType::f64}, {{}, DType::f64},  {{}, DType::i64}};
      if (decoupled) o.inputs.push_back({{}, DType::f32});
      o.fill = sample_fill({{4, 0.01}, {5, 3}, {6, 0.5}}, 3, 4);
      o.attrs = Attrs{{"beta1", 0.9},
                      {"beta2", 0.999},
                      {"eps", 1e-8},
                      {"weight_decay", decoupled ? 0.1 : 0.01},
                      {"decoupled", decoupled}};
      o.reference = adamw_reference;
      s.push_back(o);
    }
    return s;
  };
  return d;
}

// The multi-tensor updates (graph pass group_updates): one node updating `tensors` parameters that share the
// update's attrs, learning rate, step and coefficient. Inputs are the single update's, list by list (the n
// parameters, the n gradients, then each state's n tensors), then the shared scalars; each tensor is updated
// exactly as its single update would (the same kernel code on the CPU, the same element formula on the GPU).
struct MultiUpdate {
  const char* name;
  int lists;    // per-tensor inputs: param, grad and the state tensors
  int scalars;  // shared scalars before the optional coef
  std::vector<int> mutated_lists;
};

int multi_tensors(const MultiUpdate& u, const Attrs& a, size_t num_inputs) {
  const int64_t n = a.i("tensors");
  const auto fixed = static_cast<size_t>(n * u.lists + u.scalars);
  if (n < 1 || (num_inputs != fixed && num_inputs != fixed + 1))
    throw input_error(cat(u.name, ": ", num_inputs, " inputs for ", n, " tensors (", u.lists,
                          " lists of tensors, then ", u.scalars, " scalars [, coef])"));
  return static_cast<int>(n);
}

// The single update's OpDef turned into its multi-tensor op.
OpDef multi_def(const OpDef& single, const MultiUpdate& u) {
  OpDef d;
  d.name = u.name;
  d.doc = cat(
      "the ", single.name, " of attr `tensors` parameters in one node (one launch or a few on a GPU); ",
      "inputs list by list (params..., grads..., state...), then the shared scalars as ", single.name, "'s");
  d.num_inputs = -1;
  d.num_outputs = [](const Attrs&) { return 0; };
  // Tensor k's inputs, as its single update takes them.
  auto single_inputs = [u](const auto& in, int n, int k) {
    std::remove_cvref_t<decltype(in)> one;
    for (int l = 0; l < u.lists; ++l) one.push_back(in[static_cast<size_t>(l * n + k)]);
    for (size_t i = static_cast<size_t>(u.lists * n); i < in.size(); ++i) one.push_back(in[i]);
    return one;
  };
  d.infer = [single, u, single_inputs](const std::vector<TensorType>& in,
                                       const Attrs& a) -> std::vector<TensorType> {
    const int n = multi_tensors(u, a, in.size());
    for (int k = 0; k < n; ++k) {
      const std::vector<TensorType> one = single_inputs(in, n, k);
      single.infer(one, a);
      for (int l = 0; l < u.lists; ++l)
        if (one[static_cast<size_t>(l)].dtype != in[0].dtype)
          throw input_error(cat(u.name, ": tensor ", k, " of list ", l, " is ",
                                dtype_name(one[static_cast<size_t>(l)].dtype), ", parameter 0 ",
                                dtype_name(in[0].dtype)));
    }
    return {};
  };
  d.cost = [single, u, single_inputs](const std::vector<TensorType>& in, const std::vector<TensorType>& out,
                                      const Attrs& a) {
    const int n = multi_tensors(u, a, in.size());
    Cost c;
    for (int k = 0; k < n; ++k) {
      const Cost one = single.cost(single_inputs(in, n, k), out, a);
      c.flops += one.flops;
      c.bytes += one.bytes;
    }
    return c;
  };
  d.mutates_of = [u](const Attrs& a, int num_inputs) {
    const int n = multi_tensors(u, a, static_cast<size_t>(num_inputs));
    std::vector<int> m;
    for (int l : u.mutated_lists)
      for (int k = 0; k < n; ++k) m.push_back(l * n + k);
    return m;
  };
  d.samples = [single, u, single_inputs] {
    // Three tensors of different sizes, from each of the single op's samples (same attrs and scalars).
    std::vector<OpSample> s;
    const std::vector<Shape> shapes = {{7}, {2, 3}, {5}};
    const int n = static_cast<int>(shapes.size());
    for (const OpSample& one : single.samples()) {
      OpSample o;
      o.label = cat(one.label, ", ", n, " tensors");
      o.attrs = one.attrs;
      o.attrs.set("tensors", int64_t{n});
      for (int l = 0; l < u.lists; ++l)
        for (const Shape& shape : shapes)
          o.inputs.push_back({shape, one.inputs[static_cast<size_t>(l)].dtype});
      o.inputs.insert(o.inputs.end(), one.inputs.begin() + u.lists, one.inputs.end());
      // Tensor inputs as the single sample's list l, scalars as its own.
      o.fill = [fill = one.fill ? one.fill : sample_fill({}), u, n](int i, Tensor& t, uint64_t seed) {
        const int single_index = i < u.lists * n ? i / n : i - u.lists * (n - 1);
        fill(single_index, t, seed + static_cast<uint64_t>(i));
      };
      o.reference = [one, u, n, single_inputs](const std::vector<Tensor>& in, const Attrs& a) {
        std::vector<std::vector<Tensor>> per_tensor;
        for (int k = 0; k < n; ++k) per_tensor.push_back(one.reference(single_inputs(in, n, k), a));
        std::vector<Tensor> out;  // the mutated inputs, list by list
        for (size_t m = 0; m < u.mutated_lists.size(); ++m)
          for (int k = 0; k < n; ++k) out.push_back(per_tensor[static_cast<size_t>(k)][m]);
        return out;
      };
      s.push_back(o);
    }
    return s;
  };
  return d;
}

OpDef global_norm_def() {
  OpDef d;
  d.name = "global_norm";
  d.doc =
      "f32 scalar scale * sqrt(sum of squares of every input), accumulated in double over fixed blocks "
      "(the same bits on any thread count); attr scale (default 1)";
  d.num_inputs = -1;
  d.infer = [](const std::vector<TensorType>& in, const Attrs&) -> std::vector<TensorType> {
    for (const TensorType& t : in)
      if (!is_floating(t.dtype))
        throw input_error(cat("global_norm: inputs must be floating, got ", dtype_name(t.dtype)));
    return {{{}, DType::f32}};
  };
  d.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    int64_t blocks = 0;
    for (const TensorType& t : in) blocks += (numel(t.shape) + cpu::kNormBlock - 1) / cpu::kNormBlock;
    // The blocks' partial sums, then (on a GPU) the split inputs' and the others' totals.
    return static_cast<size_t>(blocks + 2) * sizeof(double);
  };
  d.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    Cost c;
    for (const TensorType& t : in) {
      c.flops += 2 * static_cast<double>(numel(t.shape));
      c.bytes += static_cast<double>(numel(t.shape)) * static_cast<double>(dtype_size(t.dtype));
    }
    return c;
  };
  d.nondiff_outputs = {0};
  d.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::global_norm}};
  d.samples = [] {
    std::vector<OpSample> s;
    OpSample o;
    o.label = "three tensors";
    o.inputs = {{{3, 5}, DType::f64}, {{7}, DType::f64}, {{}, DType::f64}};
    o.reference = [](const std::vector<Tensor>& in, const Attrs& a) {
      double sum = 0;
      for (const Tensor& t : in)
        for (double x : t.to_f64()) sum += x * x;
      return std::vector<Tensor>{f32_scalar(a.f("scale", 1.0) * std::sqrt(sum))};
    };
    s.push_back(o);
    o.label = "several blocks, scaled";
    o.inputs = {{{3 * cpu::kNormBlock + 5}, DType::f64}, {{4, 3}, DType::f64}};
    o.attrs = Attrs{{"scale", 0.25}};
    s.push_back(o);
    return s;
  };
  return d;
}

OpDef clip_coef_def() {
  OpDef d;
  d.name = "clip_coef";
  d.doc =
      "f32 scalar scale * min(1, max_norm / (norm + 1e-6)): the factor that clips gradients of global "
      "norm `norm` to max_norm (PyTorch's clip_grad_norm_); attrs max_norm, scale (default 1)";
  d.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    check_scalar(in[0], "clip_coef", "norm");
    if (!(a.f("max_norm") > 0)) throw input_error("clip_coef: max_norm must be positive");
    return {{{}, DType::f32}};
  };
  d.cost = [](const std::vector<TensorType>&, const std::vector<TensorType>&, const Attrs&) {
    return Cost{3, 8};
  };
  d.nondiff_inputs = {0};
  d.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::clip_coef}};
  d.samples = [] {
    std::vector<OpSample> s;
    for (double max_norm : {0.5, 4.0}) {
      OpSample o;
      o.label = max_norm < 1 ? "clipping" : "no clipping";
      o.inputs = {{{}, DType::f32}};
      o.attrs = Attrs{{"max_norm", max_norm}, {"scale", 0.5}};
      o.fill = sample_fill({{0, 1.5}});
      o.reference = [](const std::vector<Tensor>& in, const Attrs& a) {
        const double norm = in[0].to_f64()[0];
        return std::vector<Tensor>{f32_scalar(a.f("scale") * std::min(1.0, a.f("max_norm") / (norm + 1e-6)))};
      };
      s.push_back(o);
    }
    return s;
  };
  return d;
}

// Loss scaling (fp16): the backward pass starts from the loss scale instead of 1, so every gradient arrives
// multiplied by it. unscale_coef turns the global norm of those scaled gradients into the coefficient the
// updates apply (1/scale, times clipping); loss_scale_update then adapts the scale.
OpDef unscale_coef_def() {
  OpDef d;
  d.name = "unscale_coef";
  d.doc =
      "(norm of the loss-scaled gradients, loss scale) -> (coef, grad_norm): grad_norm = norm / loss_scale; "
      "coef = scale / loss_scale [* min(1, max_norm / (grad_norm + 1e-6)) when max_norm > 0], NaN when the "
      "norm is not finite (the updates then skip the step); attrs max_norm (default 0: no clipping), scale "
      "(default 1)";
  d.num_inputs = 2;
  d.num_outputs = [](const Attrs&) { return 2; };
  d.infer = [](const std::vector<TensorType>& in, const Attrs&) -> std::vector<TensorType> {
    check_scalar(in[0], "unscale_coef", "norm");
    check_scalar(in[1], "unscale_coef", "loss scale");
    return {{{}, DType::f32}, {{}, DType::f32}};
  };
  d.cost = [](const std::vector<TensorType>&, const std::vector<TensorType>&, const Attrs&) {
    return Cost{5, 16};
  };
  d.nondiff_inputs = {0, 1};
  d.kernels = {{DeviceKind::cpu, {DType::f32}, cpu::unscale_coef}};
  d.samples = [] {
    std::vector<OpSample> s;
    for (double norm : {3.0, 1e30 * 1e10}) {
      for (double max_norm : {0.0, 0.5}) {
        OpSample o;
        o.label = cat(norm > 1e38 ? "overflow" : "finite", max_norm > 0 ? ", clipped" : "");
        o.inputs = {{{}, DType::f32}, {{}, DType::f32}};
        o.attrs = Attrs{{"max_norm", max_norm}, {"scale", 0.5}};
        o.fill = sample_fill({{0, norm}, {1, 1024.0}});
        o.reference = [](const std::vector<Tensor>& in, const Attrs& a) {
          const double n = in[0].to_f64()[0], ls = in[1].to_f64()[0];
          double coef = std::nan("");
          if (std::isfinite(n)) {
            coef = a.f("scale") / ls;
            if (a.f("max_norm") > 0) coef *= std::min(1.0, a.f("max_norm") / (n / ls + 1e-6));
          }
          return std::vector<Tensor>{f32_scalar(coef), f32_scalar(n / ls)};
        };
        s.push_back(o);
      }
    }
    return s;
  };
  return d;
}

OpDef loss_scale_update_def() {
  OpDef d;
  d.name = "loss_scale_update";
  d.doc =
      "dynamic loss scaling after a step: inputs (norm of the scaled gradients, loss scale f32, good steps "
      "i64, skipped steps i64), updated in place. A non-finite norm counts a skipped step and (dynamic) "
      "multiplies the scale by backoff_factor (0.5) and resets the good-step count; growth_interval (2000) "
      "finite steps in a row multiply it by growth_factor (2). attr dynamic=false keeps the scale fixed";
  d.num_inputs = 4;
  d.num_outputs = [](const Attrs&) { return 0; };
  d.infer = [](const std::vector<TensorType>& in, const Attrs&) -> std::vector<TensorType> {
    check_scalar(in[0], "loss_scale_update", "norm");
    check_scalar(in[1], "loss_scale_update", "loss scale");
    if (in[1].dtype != DType::f32) throw input_error("loss_scale_update: the loss scale must be f32");
    check_i64_scalar(in[2], "loss_scale_update", "good steps");
    check_i64_scalar(in[3], "loss_scale_update", "skipped steps");
    return {};
  };
  d.cost = [](const std::vector<TensorType>&, const std::vector<TensorType>&, const Attrs&) {
    return Cost{3, 40};
  };
  d.nondiff_inputs = {0, 1, 2, 3};
  d.mutates = {1, 2, 3};
  d.kernels = {{DeviceKind::cpu, {DType::f32}, cpu::loss_scale_update}};
  d.samples = [] {
    std::vector<OpSample> s;
    struct Case {
      const char* label;
      double norm;
      int64_t good;
      bool dynamic;
      double scale, good_after, skipped_after;
    };
    const double inf = 1e30 * 1e10;
    for (const Case& k : {Case{"overflow halves", inf, 2, true, 512, 0, 6},
                          Case{"finite counts", 1.0, 1, true, 1024, 2, 5},
                          Case{"growth", 1.0, 2, true, 2048, 0, 5},
                          Case{"static overflow", inf, 2, false, 1024, 2, 6}}) {
      OpSample o;
      o.label = k.label;
      o.inputs = {{{}, DType::f32}, {{}, DType::f32}, {{}, DType::i64}, {{}, DType::i64}};
      o.attrs = Attrs{{"dynamic", k.dynamic}, {"growth_interval", int64_t{3}}};
      o.fill = sample_fill({{0, k.norm}, {1, 1024.0}, {2, static_cast<double>(k.good)}, {3, 5.0}});
      o.reference = [k](const std::vector<Tensor>&, const Attrs&) {
        Tensor good = Tensor::empty({}, DType::i64), skipped = Tensor::empty({}, DType::i64);
        good.fill_from({k.good_after});
        skipped.fill_from({k.skipped_after});
        return std::vector<Tensor>{f32_scalar(k.scale), good, skipped};
      };
      s.push_back(o);
    }
    return s;
  };
  return d;
}

OpDef grad_accumulate_def() {
  OpDef d;
  d.name = "grad_accumulate";
  d.doc =
      "acc = grad on micro-step 0 of an accumulation window, else acc += grad; inputs (acc, grad, micro "
      "i64 scalar)";
  d.num_inputs = 3;
  d.num_outputs = [](const Attrs&) { return 0; };
  d.infer = [](const std::vector<TensorType>& in, const Attrs&) -> std::vector<TensorType> {
    if (in[0].shape != in[1].shape || in[0].dtype != in[1].dtype)
      throw input_error(cat("grad_accumulate: accumulator ", shape_str(in[0].shape), ":",
                            dtype_name(in[0].dtype), " does not match the gradient ", shape_str(in[1].shape),
                            ":", dtype_name(in[1].dtype)));
    check_i64_scalar(in[2], "grad_accumulate", "micro");
    return {};
  };
  d.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    const double n = static_cast<double>(numel(in[0].shape));
    return Cost{n, 3 * n * static_cast<double>(dtype_size(in[0].dtype))};
  };
  d.nondiff_inputs = {0, 1, 2};
  d.mutates = {0};
  d.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::grad_accumulate}};
  d.samples = [] {
    std::vector<OpSample> s;
    for (int64_t micro : {0, 2}) {
      OpSample o;
      o.label = micro == 0 ? "first micro-step" : "later micro-step";
      o.inputs = {{{2, 6}, DType::f64}, {{2, 6}, DType::f64}, {{}, DType::i64}};
      o.fill = sample_fill({{2, static_cast<double>(micro)}});
      o.reference = [](const std::vector<Tensor>& in, const Attrs&) {
        Tensor acc = in[0].clone();
        const bool first = in[2].data<int64_t>()[0] == 0;
        for (int64_t i = 0; i < acc.numel(); ++i)
          acc.data<double>()[i] = (first ? 0.0 : acc.data<double>()[i]) + in[1].data<double>()[i];
        return std::vector<Tensor>{acc};
      };
      s.push_back(o);
    }
    return s;
  };
  return d;
}

}  // namespace

void register_optim_ops(OpRegistry& r) {
  r.add(sgd_def());
  r.add(sgd_product_def());
  r.add(adamw_def());
  OpDef sgd_multi = multi_def(sgd_def(), {"sgd_update_multi", 3, 2, {0, 2}});
  sgd_multi.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::sgd_update_multi}};
  r.add(std::move(sgd_multi));
  OpDef adamw_multi = multi_def(adamw_def(), {"adamw_update_multi", 4, 2, {0, 2, 3}});
  adamw_multi.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::adamw_update_multi}};
  r.add(std::move(adamw_multi));
  r.add(global_norm_def());
  r.add(clip_coef_def());
  r.add(grad_accumulate_def());
  r.add(unscale_coef_def());
  r.add(loss_scale_update_def());
}

}  // namespace flowrun
