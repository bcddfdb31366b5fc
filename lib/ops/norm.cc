// Normalisation ops: layernorm, rmsnorm and batchnorm (running statistics updated in place), with their
// backward ops. CPU kernels are in ops/cpu/norm.cc.
#include "ops/cpu/norm.h"

#include <algorithm>
#include <cmath>

#include "graph/builder.h"
#include "ops/registry.h"

namespace flowrun {

namespace {

const std::vector<DType> kF = {DType::f32, DType::f64};

// The CPU's mixed-precision kernel of a norm: bf16 activations, the inputs `params` (gamma, beta, statistics)
// and the statistics it outputs in f32, the arithmetic in f32 (no avx512_bf16 instruction needed).
KernelDef mixed_bf16(KernelFn fn, std::vector<int> params) {
  KernelDef k{DeviceKind::cpu, {DType::bf16}, fn};
  k.f32_inputs = std::move(params);
  return k;
}

double sz(DType t) {
  return static_cast<double>(dtype_size(t));
}
double count(const Shape& s) {
  return static_cast<double>(numel(s));
}

// A norm's activations are its inputs before `first` (x last among them), all of one dtype; its parameters
// and statistics in [first, last) (gamma, beta, mean, rstd, running statistics; last 0: to the end) are x's
// dtype, or f32 with an f16/bf16 x (mixed precision: a kernel with KernelDef::f32_inputs). Returns their
// dtype, the statistics'.
DType check_param_dtypes(const std::string& op, const std::vector<TensorType>& in, size_t first,
                         size_t last = 0) {
  const DType x = in[first - 1].dtype;
  if (!is_floating(x)) throw input_error(cat(op, ": x must be floating, got ", dtype_name(x)));
  for (size_t i = 0; i < first; ++i)
    if (in[i].dtype != x)
      throw input_error(cat(op, ": input ", i, " is ", dtype_name(in[i].dtype), " but x is ", dtype_name(x)));
  const DType p = in[first].dtype;
  if (p != x && !(p == DType::f32 && is_low_precision(x)))
    throw input_error(cat(op, ": input ", first, " is ", dtype_name(p), " but x is ", dtype_name(x),
                          " (parameters and statistics are x's dtype, or f32 with an f16/bf16 x)"));
  for (size_t i = first + 1; i < (last ? last : in.size()); ++i)
    if (in[i].dtype != p)
      throw input_error(cat(op, ": input ", i, " is ", dtype_name(in[i].dtype), " but input ", first, " is ",
                            dtype_name(p)));
  return p;
}

void check_eps(const std::string& op, const Attrs& a, double dflt) {
  const double eps = a.f("eps", dflt);
  if (!(eps >= 0)) throw input_error(cat(op, ": eps must be >= 0, got ", eps));
}

void check_vector(const std::string& op, const char* what, const Shape& s, int64_t n) {
  if (s != Shape{n}) throw input_error(cat(op, ": ", what, " is ", shape_str(s), ", expected [", n, "]"));
}

// x (..., D) with per-feature parameters (D) after it; returns the statistics' dtype.
DType row_norm_features(const std::string& op, const std::vector<TensorType>& in, int num_params,
                        const Attrs& a, double eps) {
  const DType stat = check_param_dtypes(op, in, 1);
  const Shape& x = in[0].shape;
  if (x.empty() || x.back() < 1)
    throw input_error(cat(op, ": x needs a non-empty last dimension, got ", shape_str(x)));
  const char* names[] = {"gamma", "beta"};
  for (int i = 0; i < num_params; ++i)
    check_vector(op, names[i], in[static_cast<size_t>(1 + i)].shape, x.back());
  check_eps(op, a, eps);
  return stat;
}

// y of a row norm: x's type, or bf16 from an f32 x under attribute out_dtype: bf16 (graph/passes.cc
// fold_norm_casts: y computed in f32 and rounded once, as a cast of it would).
TensorType row_norm_output(const std::string& op, const TensorType& x, const Attrs& a) {
  if (!a.has("out_dtype")) return x;
  if (!a.is("out_dtype", "bf16") || x.dtype != DType::f32)
    throw input_error(
        cat(op, ": out_dtype ", a.s("out_dtype"), " on ", dtype_name(x.dtype), " x: only bf16, from f32"));
  return {x.shape, DType::bf16};
}

// Attr residual (graph/passes.cc): one input more than the op's own `num_inputs`, f32 and shaped as x
// (input `xi`), which must be f32. Returns whether the node has it.
bool residual_input(const std::string& op, const std::vector<TensorType>& in, size_t num_inputs, size_t xi,
                    const Attrs& a) {
  const bool residual = a.b("residual");
  if (in.size() != num_inputs + (residual ? 1 : 0))
    throw input_error(cat(op, ": ", num_inputs, residual ? " inputs and the residual" : " inputs",
                          " expected, got ", in.size()));
  if (residual &&
      (in[xi].dtype != DType::f32 || in.back().shape != in[xi].shape || in.back().dtype != DType::f32))
    throw input_error(cat(op, ": the residual needs an f32 x and an f32 input of x's shape, got x ",
                          shape_str(in[xi].shape), " ", dtype_name(in[xi].dtype), " and ",
                          shape_str(in.back().shape), " ", dtype_name(in.back().dtype)));
  return residual;
}

// A row norm gradient's optional fused parts (graph/passes.cc fuse_norm_grad_residual): attr residual adds
// an input r after the norm's own, returning dx + r as output 0; attr dx_bf16 appends an output, that sum
// (or dx) rounded to bf16. Both only on an f32 x. Returns the extra output types.
std::vector<TensorType> row_norm_grad_fused(const std::string& op, const std::vector<TensorType>& in,
                                            size_t num_inputs, const Attrs& a) {
  residual_input(op, in, num_inputs, 1, a);
  if (!a.b("dx_bf16")) return {};
  if (in[1].dtype != DType::f32)
    throw input_error(cat(op, ": dx_bf16 needs an f32 x, got ", dtype_name(in[1].dtype)));
  return {{in[1].shape, DType::bf16}};
}

// A row norm's residual form (graph/passes.cc fuse_residual_norm, attr residual): x is the sum of input 0
// and an input after the parameters, which the norm also writes as an extra, last output. f32 only.
std::vector<TensorType> row_norm_residual(const std::string& op, const std::vector<TensorType>& in,
                                          size_t num_inputs, const Attrs& a) {
  if (!residual_input(op, in, num_inputs, 0, a)) return {};
  return {in[0]};
}

// mean / rstd of a row norm: one per row, of dtype `stat` (f32 for an f16/bf16 x with f32 parameters).
TensorType row_stat(const TensorType& x, DType stat) {
  return {Shape(x.shape.begin(), x.shape.end() - 1), stat};
}

// Forward of a row norm: reads x and the parameters, writes y and the statistics.
Cost row_norm_cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
  const double n = count(in[0].shape);
  double bytes = 0;
  for (const auto& t : in) bytes += count(t.shape) * sz(t.dtype);
  for (const auto& t : out) bytes += count(t.shape) * sz(t.dtype);
  return {8 * n, bytes};
}

Cost row_norm_grad_cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
  const double n = count(in[1].shape);
  double bytes = 0;
  for (const auto& t : in) bytes += count(t.shape) * sz(t.dtype);
  for (const auto& t : out) bytes += count(t.shape) * sz(t.dtype);
  return {14 * n, bytes};
}

// Per-block partial sums of the parameter gradients (cpu::norm_row_blocks), `parts` vectors of D each, in
// f32 for f16/bf16 (the CUDA kernels' partials; the CPU's f32 kernel runs them widened).
size_t row_norm_grad_workspace(const std::vector<TensorType>& in, int parts) {
  const int64_t d = in[1].shape.back(), rows = numel(in[1].shape) / d;
  const int64_t blocks = cpu::norm_row_blocks(rows);
  const size_t elem = std::max(dtype_size(in[1].dtype), sizeof(float));
  return blocks == 1 ? 0 : static_cast<size_t>(blocks * parts * d) * elem;
}

// Fills every input uniform in [-1, 1], except input `positive` (-1: none) in [0.5, 1.5).
std::function<void(int, Tensor&, uint64_t)> fill_with_positive(int positive) {
  return [positive](int i, Tensor& t, uint64_t seed) {
    const RngStream r{seed, 100 + static_cast<uint64_t>(i)};
    std::vector<double> v(static_cast<size_t>(t.numel()));
    for (size_t k = 0; k < v.size(); ++k)
      v[k] = i == positive ? 0.5 + r.uniform(k) : 2.0 * r.uniform(k) - 1.0;
    t.fill_from(v);
  };
}

// Plain f64 layernorm / rmsnorm over rows.
std::vector<Tensor> row_norm_reference(const std::vector<Tensor>& in, const Attrs& a, bool centered) {
  const Shape& xs = in[0].shape();
  const int64_t d = xs.back(), rows = in[0].numel() / d;
  const double eps = a.f("eps", centered ? 1e-5 : 1e-6);
  const Shape ss(xs.begin(), xs.end() - 1);
  Tensor y = Tensor::empty(xs, DType::f64), mean = Tensor::empty(ss, DType::f64),
         rstd = Tensor::empty(ss, DType::f64);
  const double *x = in[0].data<double>(), *g = in[1].data<double>();
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    if (centered) {
      for (int64_t j = 0; j < d; ++j) mu += x[r * d + j];
      mu /= static_cast<double>(d);
    }
    for (int64_t j = 0; j < d; ++j) var += (x[r * d + j] - mu) * (x[r * d + j] - mu);
    var /= static_cast<double>(d);
    const double rs = 1.0 / std::sqrt(var + eps);
    for (int64_t j = 0; j < d; ++j)
      y.data<double>()[r * d + j] =
          (x[r * d + j] - mu) * rs * g[j] + (centered ? in[2].data<double>()[j] : 0.0);
    mean.data<double>()[r] = mu;
    rstd.data<double>()[r] = rs;
  }
  if (centered) return {y, mean, rstd};
  return {y, rstd};
}

std::vector<OpSample> row_norm_samples(bool centered) {
  std::vector<OpSample> s;
  struct Case {
    Shape x;
    double eps;  // < 0: the default
  };
  // Odd widths; 70 runs the vector main loop and a tail; 67 rows exceed the 64 gradient blocks (uneven).
  for (const Case& k :
       std::vector<Case>{{{3, 7}, -1}, {{2, 3, 7}, 1e-3}, {{7}, -1}, {{2, 70}, -1}, {{67, 5}, 0.1}}) {
    OpSample o;
    o.label = shape_str(k.x) + (k.eps < 0 ? "" : cat(" eps ", k.eps));
    o.inputs = {{k.x, DType::f64}, {{k.x.back()}, DType::f64}};
    if (centered) o.inputs.push_back({{k.x.back()}, DType::f64});
    if (k.eps >= 0) o.attrs.set("eps", k.eps);
    o.reference = [centered](const std::vector<Tensor>& in, const Attrs& a) {
      return row_norm_reference(in, a, centered);
    };
    s.push_back(o);
  }
  return s;
}

// x (N, C, spatial...): N, C and the number of values per channel.
struct BatchDims {
  int64_t n, c, per_channel;
};
BatchDims batch_dims(const Shape& x) {
  const int64_t n = x[0], c = x[1];
  return {n, c, n * c == 0 ? 0 : numel(x) / c};
}

// The sums are in the statistics' dtype `stat` (f32 for a bf16 x).
size_t batchnorm_workspace_bytes(const TensorType& x, DType stat, int64_t sums) {
  const BatchDims d = batch_dims(x.shape);
  const int64_t s = d.n == 0 ? 0 : d.per_channel / d.n;
  return static_cast<size_t>(cpu::batchnorm_workspace_elems(d.n, d.c, s, sums)) * dtype_size(stat);
}

std::vector<Tensor> batchnorm_reference(const std::vector<Tensor>& in, const Attrs& a) {
  const Shape& xs = in[0].shape();
  const int64_t n = xs[0], c = xs[1], s = in[0].numel() / (n * c), m = n * s;
  const double eps = a.f("eps", 1e-5), momentum = a.f("momentum", 0.1);
  const bool training = a.b("training", true);
  Tensor y = Tensor::empty(xs, DType::f64), mean = Tensor::empty({c}, DType::f64),
         rstd = Tensor::empty({c}, DType::f64);
  Tensor rm = in[3].clone(), rv = in[4].clone();
  const double *x = in[0].data<double>(), *g = in[1].data<double>(), *b = in[2].data<double>();
  for (int64_t ch = 0; ch < c; ++ch) {
    double mu = 0, ss = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < s; ++k) mu += x[(i * c + ch) * s + k];
    mu /= static_cast<double>(m);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < s; ++k) ss += (x[(i * c + ch) * s + k] - mu) * (x[(i * c + ch) * s + k] - mu);
    double var = ss / static_cast<double>(m);
    if (training) {
      rm.data<double>()[ch] = (1 - momentum) * rm.data<double>()[ch] + momentum * mu;
      rv.data<double>()[ch] =
          (1 - momentum) * rv.data<double>()[ch] + momentum * ss / static_cast<double>(m - 1);
    } else {
      mu = in[3].data<double>()[ch];
      var = in[4].data<double>()[ch];
    }
    const double r = 1.0 / std::sqrt(var + eps);
    mean.data<double>()[ch] = mu;
    rstd.data<double>()[ch] = r;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < s; ++k) {
        const int64_t j = (i * c + ch) * s + k;
        const double v = (x[j] - mu) * r * g[ch] + b[ch];
        y.data<double>()[j] = a.b("relu") ? std::max(v, 0.0) : v;
      }
  }
  return {y, mean, rstd, rm, rv};  // outputs, then the mutated running statistics
}

std::vector<OpSample> batchnorm_samples() {
  std::vector<OpSample> s;
  struct Case {
    Shape x;
    bool training;
    double momentum;  // < 0: the default
    bool relu = false;
  };
  // (N, C) and (N, C, H, W) in both modes; (N, C, L); 260 channels run the vector loops with a tail; 67 rows
  // exceed the 64 row blocks of the (N, C) channel sums (uneven blocks); a fused relu, whose gradient
  // passes batchnorm_grad its output as the mask.
  for (const Case& k : std::vector<Case>{{{5, 3}, true, -1},
                                         {{5, 3}, false, -1},
                                         {{3, 4, 5, 3}, true, -1},
                                         {{3, 4, 5, 3}, false, -1},
                                         {{2, 3, 4}, true, 0.3},
                                         {{4, 260}, true, -1},
                                         {{4, 260}, false, -1},
                                         {{67, 3}, true, -1},
                                         {{67, 3}, false, -1},
                                         {{3, 4, 5, 3}, true, -1, true},
                                         {{5, 3}, false, -1, true}}) {
    OpSample o;
    o.label = shape_str(k.x) + (k.training ? " training" : " inference") +
              (k.momentum < 0 ? "" : cat(" momentum ", k.momentum)) + (k.relu ? " relu" : "");
    if (k.relu) o.attrs.set("relu", true);
    const Shape c = {k.x[1]};
    o.inputs = {{k.x, DType::f64}, {c, DType::f64}, {c, DType::f64}, {c, DType::f64}, {c, DType::f64}};
    o.attrs.set("training", k.training);
    if (k.momentum >= 0) o.attrs.set("momentum", k.momentum);
    o.fill = fill_with_positive(4);  // running_var
    o.reference = batchnorm_reference;
    s.push_back(o);
  }
  return s;
}

}  // namespace

void register_norm_ops(OpRegistry& r) {
  OpDef ln;
  ln.name = "layernorm";
  ln.doc =
      "layer normalisation over the last dim: y = (x - mean) * rstd * gamma + beta, "
      "rstd = 1/sqrt(biased var + eps); inputs (x (..., D), gamma (D), beta (D)), attr eps (1e-5), "
      "out_dtype (bf16: y rounded to bf16 from an f32 x, CPU), residual (CPU, f32: x is input 0 plus a "
      "fourth input, also written as a fourth output); outputs (y, mean (...), rstd (...))";
  ln.num_inputs = -1;
  ln.num_outputs = [](const Attrs& a) { return a.b("residual") ? 4 : 3; };
  ln.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    const std::vector<TensorType> sum = row_norm_residual("layernorm", in, 3, a);
    const DType stat = row_norm_features("layernorm", in, 2, a, 1e-5);
    std::vector<TensorType> out = {row_norm_output("layernorm", in[0], a), row_stat(in[0], stat),
                                   row_stat(in[0], stat)};
    out.insert(out.end(), sum.begin(), sum.end());
    return out;
  };
  ln.grad = [](GradCtx& c) -> std::vector<ValueId> {
    const auto g = c.b.op("layernorm_grad", {c.dout(0), c.in(0), c.in(1), c.out(1), c.out(2)});
    return {g[0], g[1], g[2]};
  };
  ln.cost = row_norm_cost;
  ln.nondiff_outputs = {1, 2};
  ln.sbp = [](const SbpQuery& q) { return row_wise_signatures(q, 1); };
  ln.kernels = {{DeviceKind::cpu, kF, cpu::layernorm}, mixed_bf16(cpu::layernorm, {1, 2})};
  ln.samples = [] { return row_norm_samples(true); };
  r.add(ln);

  OpDef lng;
  lng.name = "layernorm_grad";
  lng.doc =
      "gradient of layernorm: inputs (dy, x, gamma, mean, rstd), outputs (dx, dgamma, dbeta); CPU fusions "
      "(f32 x): attr residual (a sixth input r: output 0 is dx + r), attr dx_bf16 (a fourth output: output "
      "0 rounded to bf16)";
  lng.num_inputs = -1;
  lng.num_outputs = [](const Attrs& a) { return a.b("dx_bf16") ? 4 : 3; };
  lng.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    const std::vector<TensorType> extra = row_norm_grad_fused("layernorm_grad", in, 5, a);
    const DType stat = check_param_dtypes("layernorm_grad", in, 2);
    if (in[0].shape != in[1].shape || in[1].shape.empty())
      throw input_error(
          cat("layernorm_grad: dy ", shape_str(in[0].shape), " does not match x ", shape_str(in[1].shape)));
    check_vector("layernorm_grad", "gamma", in[2].shape, in[1].shape.back());
    const TensorType st = row_stat(in[1], stat);
    if (in[3].shape != st.shape || in[4].shape != st.shape)
      throw input_error(cat("layernorm_grad: mean/rstd should be ", shape_str(st.shape)));
    std::vector<TensorType> out = {in[1], in[2], in[2]};
    out.insert(out.end(), extra.begin(), extra.end());
    return out;
  };
  lng.cost = row_norm_grad_cost;
  lng.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    return row_norm_grad_workspace(in, 2);
  };
  lng.kernels = {{DeviceKind::cpu, kF, cpu::layernorm_grad}, mixed_bf16(cpu::layernorm_grad, {2, 3, 4})};
  lng.covered_by = {"layernorm"};
  r.add(lng);

  OpDef rms;
  rms.name = "rmsnorm";
  rms.doc =
      "RMS normalisation over the last dim: y = x * rstd * gamma, rstd = 1/sqrt(mean(x^2) + eps); "
      "inputs (x (..., D), gamma (D)), attr eps (1e-6), out_dtype (bf16: y rounded to bf16 from an f32 x, "
      "CPU), residual (CPU, f32: x is input 0 plus a third input, also written as a third output); "
      "outputs (y, rstd (...))";
  rms.num_inputs = -1;
  rms.num_outputs = [](const Attrs& a) { return a.b("residual") ? 3 : 2; };
  rms.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    const std::vector<TensorType> sum = row_norm_residual("rmsnorm", in, 2, a);
    const DType stat = row_norm_features("rmsnorm", in, 1, a, 1e-6);
    std::vector<TensorType> out = {row_norm_output("rmsnorm", in[0], a), row_stat(in[0], stat)};
    out.insert(out.end(), sum.begin(), sum.end());
    return out;
  };
  rms.grad = [](GradCtx& c) -> std::vector<ValueId> {
    const auto g = c.b.op("rmsnorm_grad", {c.dout(0), c.in(0), c.in(1), c.out(1)});
    return {g[0], g[1]};
  };
  rms.cost = row_norm_cost;
  rms.nondiff_outputs = {1};
  rms.sbp = [](const SbpQuery& q) { return row_wise_signatures(q, 1); };
  rms.kernels = {{DeviceKind::cpu, kF, cpu::rmsnorm}, mixed_bf16(cpu::rmsnorm, {1})};
  rms.samples = [] { return row_norm_samples(false); };
  r.add(rms);

  OpDef rmsg;
  rmsg.name = "rmsnorm_grad";
  rmsg.doc =
      "gradient of rmsnorm: inputs (dy, x, gamma, rstd), outputs (dx, dgamma); CPU fusions (f32 x): attr "
      "residual (a fifth input r: output 0 is dx + r), attr dx_bf16 (a third output: output 0 rounded to "
      "bf16)";
  rmsg.num_inputs = -1;
  rmsg.num_outputs = [](const Attrs& a) { return a.b("dx_bf16") ? 3 : 2; };
  rmsg.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    const std::vector<TensorType> extra = row_norm_grad_fused("rmsnorm_grad", in, 4, a);
    const DType stat = check_param_dtypes("rmsnorm_grad", in, 2);
    if (in[0].shape != in[1].shape || in[1].shape.empty())
      throw input_error(
          cat("rmsnorm_grad: dy ", shape_str(in[0].shape), " does not match x ", shape_str(in[1].shape)));
    check_vector("rmsnorm_grad", "gamma", in[2].shape, in[1].shape.back());
    if (in[3].shape != row_stat(in[1], stat).shape)
      throw input_error(cat("rmsnorm_grad: rstd should be ", shape_str(row_stat(in[1], stat).shape)));
    std::vector<TensorType> out = {in[1], in[2]};
    out.insert(out.end(), extra.begin(), extra.end());
    return out;
  };
  rmsg.cost = row_norm_grad_cost;
  rmsg.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    return row_norm_grad_workspace(in, 1);
  };
  rmsg.kernels = {{DeviceKind::cpu, kF, cpu::rmsnorm_grad}, mixed_bf16(cpu::rmsnorm_grad, {2, 3})};
  rmsg.covered_by = {"rmsnorm"};
  r.add(rmsg);

  OpDef bn;
  bn.name = "batchnorm";
  bn.doc =
      "batch normalisation per channel (dim 1): inputs (x (N, C, ...), gamma, beta, running_mean, "
      "running_var (C)), attrs eps (1e-5), momentum (0.1), training (true); outputs (y, save_mean, "
      "save_rstd (C)). Training normalises by the batch mean and biased variance and updates the running "
      "statistics in place (PyTorch: running = (1 - momentum) running + momentum batch, unbiased variance); "
      "inference normalises by the running statistics; attr blocked (false): x and y in nChw16c, nChw8c "
      "with attr nchw8c, NHWC with attr nhwc (graph/layout.cc); attr relu (false): y = max(normalised, 0), a "
      "following relu fused by the CPU's "
      "backward fusion (graph/passes.cc); attr residual (false): a sixth input r of x's shape and dtype, "
      "y = [max](normalised rounded to x's dtype + r), a ResNet block's add (and relu) fused likewise. With "
      "a bf16 x the per-channel inputs and outputs may be f32 (mixed precision)";
  bn.num_inputs = -1;
  bn.num_outputs = [](const Attrs&) { return 3; };
  bn.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    const bool residual = a.b("residual");
    if (in.size() != (residual ? 6u : 5u))
      throw input_error(cat("batchnorm: ", residual ? "6 inputs (with the residual)" : "5 inputs",
                            " expected, got ", in.size()));
    if (residual && (in[5].shape != in[0].shape || in[5].dtype != in[0].dtype))
      throw input_error(cat("batchnorm: the residual must be shaped and typed as x ", shape_str(in[0].shape),
                            " ", dtype_name(in[0].dtype), ", got ", shape_str(in[5].shape), " ",
                            dtype_name(in[5].dtype)));
    const DType stat_dtype = check_param_dtypes("batchnorm", in, 1, 5);
    const Shape& x = in[0].shape;
    if (x.size() < 2) throw input_error(cat("batchnorm: x must be (N, C, ...), got ", shape_str(x)));
    const char* names[] = {"gamma", "beta", "running_mean", "running_var"};
    for (size_t i = 1; i < 5; ++i) check_vector("batchnorm", names[i - 1], in[i].shape, x[1]);
    check_eps("batchnorm", a, 1e-5);
    const double momentum = a.f("momentum", 0.1);
    if (!(momentum >= 0 && momentum <= 1))
      throw input_error(cat("batchnorm: momentum must be in [0, 1], got ", momentum));
    if (a.b("training", true) && batch_dims(x).per_channel < 2)
      throw input_error(
          cat("batchnorm: training needs more than one value per channel, x is ", shape_str(x)));
    const TensorType stat{{x[1]}, stat_dtype};
    return {in[0], stat, stat};
  };
  bn.grad = [](GradCtx& c) -> std::vector<ValueId> {
    // The residual form is made after autodiff, from the forward of a graph already differentiated.
    FR_CHECK(!c.attrs().b("residual"), "batchnorm: no gradient of the fused residual form");
    std::vector<ValueId> in = {c.dout(0), c.in(0), c.in(1), c.out(1), c.out(2)};
    if (c.attrs().b("relu")) in.push_back(c.out(0));  // the fused relu's mask
    const auto g = c.b.op("batchnorm_grad", in, Attrs{{"training", c.attrs().b("training", true)}});
    return {g[0], g[1], g[2], kNoValue, kNoValue};
  };
  bn.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs& a) {
    const double n = count(in[0].shape), c = count(in[1].shape), e = sz(in[0].dtype);
    // Training reads x twice (the statistics, normalise); the residual once.
    const double r = a.b("residual") ? n * e : 0;
    return a.b("training", true) ? Cost{8 * n, (3 * n + 9 * c) * e + r}
                                 : Cost{4 * n, (2 * n + 6 * c) * e + r};
  };
  bn.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>&,
                    const Attrs& a) -> size_t {
    // Per plane its sum and squared deviations (with spatial dims; without, the mean and variance passes
    // share one sum per block of rows).
    return a.b("training", true) ? batchnorm_workspace_bytes(in[0], in[1].dtype, 2) : 0;
  };
  bn.nondiff_inputs = {3, 4};
  bn.nondiff_outputs = {1, 2};
  bn.mutates = {3, 4};
  // The batch split: exact for inference. In training each rank normalises by its own part's statistics, as
  // PyTorch's DistributedDataParallel does (not SyncBatchNorm): offered on the data axis only, where that is
  // what users expect.
  bn.sbp = [](const SbpQuery& q) {
    std::vector<SbpSignature> sigs;
    if (q.axis == MeshAxis::data || !q.attrs.b("training", true))
      sigs.push_back({{Sbp::split(0), Sbp::broadcast(), Sbp::broadcast(), Sbp::broadcast(), Sbp::broadcast()},
                      {Sbp::split(0), Sbp::broadcast(), Sbp::broadcast()}});
    return sigs;
  };
  bn.kernels = {{DeviceKind::cpu, kF, cpu::batchnorm}, mixed_bf16(cpu::batchnorm, {1, 2, 3, 4})};
  bn.samples = batchnorm_samples;
  r.add(bn);

  OpDef bng;
  bng.name = "batchnorm_grad";
  bng.doc =
      "gradient of batchnorm: inputs (dy, x, gamma, save_mean, save_rstd[, mask]), attr training (true: "
      "the batch statistics depend on x); outputs (dx, dgamma, dbeta). With a mask (shaped like x: a fused "
      "relu's output, graph/passes.cc) dy counts only where mask > 0, as relu_grad would pass it";
  bng.num_inputs = -1;
  bng.num_outputs = [](const Attrs&) { return 3; };
  bng.infer = [](const std::vector<TensorType>& in, const Attrs&) -> std::vector<TensorType> {
    if (in.size() != 5 && in.size() != 6)
      throw input_error(cat("batchnorm_grad takes (dy, x, gamma, save_mean, save_rstd[, mask]), got ",
                            in.size(), " inputs"));
    check_param_dtypes("batchnorm_grad", in, 2, 5);
    const Shape& x = in[1].shape;
    if (in[0].shape != x || x.size() < 2)
      throw input_error(
          cat("batchnorm_grad: dy ", shape_str(in[0].shape), " does not match x ", shape_str(x)));
    if (in.size() == 6 && (in[5].shape != x || in[5].dtype != in[1].dtype))
      throw input_error(cat("batchnorm_grad: the mask ", shape_str(in[5].shape), " ", dtype_name(in[5].dtype),
                            " must be shaped and typed like x ", shape_str(x), " ", dtype_name(in[1].dtype)));
    const char* names[] = {"gamma", "save_mean", "save_rstd"};
    for (size_t i = 2; i < 5; ++i) check_vector("batchnorm_grad", names[i - 2], in[i].shape, x[1]);
    return {in[1], in[2], in[2]};
  };
  bng.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    const double n = count(in[1].shape), c = count(in[2].shape), e = sz(in[1].dtype);
    const double mask = in.size() == 6 ? 2 * n : 0;  // read by both passes
    return Cost{10 * n, (5 * n + mask + 5 * c) * e};
  };
  bng.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    return batchnorm_workspace_bytes(in[1], in[2].dtype, 2);  // dbeta and dgamma sums in one pass
  };
  bng.kernels = {{DeviceKind::cpu, kF, cpu::batchnorm_grad}, mixed_bf16(cpu::batchnorm_grad, {2, 3, 4})};
  bng.covered_by = {"batchnorm"};
  r.add(bng);
}

}  // namespace flowrun
