// matmul (batched, with transposes) and linear (x W^T + b, PyTorch's weight layout).
#include "ops/cpu/matmul.h"

#include <tuple>

#include "graph/builder.h"
#include "ops/cpu/dnnl_matmul.h"
#include "ops/registry.h"

namespace flowrun {

namespace {

struct MatmulDims {
  int64_t batch, m, k, n;
  bool b_shared;  // b is one matrix used by every batch of a
};

Shape batch_of(const Shape& s) {
  return Shape(s.begin(), s.end() - 2);
}

std::vector<TensorType> infer_matmul(const std::vector<TensorType>& in, const Attrs& a) {
  const Shape &sa = in[0].shape, &sb = in[1].shape;
  if (sa.size() < 2 || sb.size() < 2)
    throw input_error(cat("matmul needs rank >= 2 operands, got ", shape_str(sa), " and ", shape_str(sb)));
  if (in[0].dtype != in[1].dtype) throw input_error("matmul operands have different dtypes");
  const bool ta = a.b("trans_a"), tb = a.b("trans_b");
  const int64_t m = ta ? sa[sa.size() - 1] : sa[sa.size() - 2];
  const int64_t ka = ta ? sa[sa.size() - 2] : sa[sa.size() - 1];
  const int64_t kb = tb ? sb[sb.size() - 1] : sb[sb.size() - 2];
  const int64_t n = tb ? sb[sb.size() - 2] : sb[sb.size() - 1];
  if (ka != kb) throw input_error(cat("matmul inner dimensions differ: ", ka, " vs ", kb));
  Shape batch;
  if (sb.size() == 2)
    batch = batch_of(sa);
  else if (sa.size() == 2)
    batch = batch_of(sb);
  else if (batch_of(sa) == batch_of(sb))
    batch = batch_of(sa);
  else
    throw input_error(cat("matmul batch dimensions differ: ", shape_str(sa), " vs ", shape_str(sb)));
  batch.push_back(m);
  batch.push_back(n);
  return {{batch, result_dtype(in[0].dtype, a)}};
}

Cost matmul_cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a) {
  const Shape& sa = in[0].shape;
  const int64_t k = a.b("trans_a") ? sa[sa.size() - 2] : sa[sa.size() - 1];
  double bytes = 0;
  for (const auto& t : in)
    bytes += static_cast<double>(numel(t.shape)) * static_cast<double>(dtype_size(t.dtype));
  const double outn = static_cast<double>(numel(out[0].shape));
  return {2.0 * outn * static_cast<double>(k), bytes + outn * static_cast<double>(dtype_size(out[0].dtype))};
}

// Flatten all but the last dimension: (..., c) -> (rows, c).
ValueId flat2d(GraphBuilder& b, ValueId v) {
  const Shape& s = b.shape(v);
  if (s.size() == 2) return v;
  return b.reshape(v, {numel(s) / s.back(), s.back()});
}

std::vector<ValueId> matmul_grad(GradCtx& c) {
  GraphBuilder& b = c.b;
  const bool ta = c.attrs().b("trans_a"), tb = c.attrs().b("trans_b");
  const ValueId A = c.in(0), B = c.in(1), dC = c.dout(0);
  const Shape sa = b.shape(A), sb = b.shape(B);
  ValueId dA, dB;
  if (!ta)
    dA = tb ? b.matmul(dC, B) : b.matmul(dC, B, false, true);
  else
    dA = tb ? b.matmul(B, dC, true, true) : b.matmul(B, dC, false, true);
  if (sb.size() == 2 && sa.size() > 2 && !ta) {
    // Shared weight: one GEMM over all rows of A instead of a batched product summed afterwards.
    const ValueId A2 = flat2d(b, A), dC2 = flat2d(b, dC);
    dB = tb ? b.matmul(dC2, A2, true, false) : b.matmul(A2, dC2, true, false);
  } else {
    if (!tb)
      dB = ta ? b.matmul(A, dC) : b.matmul(A, dC, true, false);
    else
      dB = ta ? b.matmul(dC, A, true, true) : b.matmul(dC, A, true, false);
  }
  return {b.reduce_to_shape(dA, sa), b.reduce_to_shape(dB, sb)};
}

std::vector<OpSample> matmul_samples() {
  std::vector<OpSample> s;
  struct Case {
    Shape a, b;
    bool ta, tb;
  };
  // The last two: a classifier head's input and weight gradients in f32 (cpu/skinny_gemm.cc: an inner side,
  // or op(A)'s rows, of at most 16, over 32 columns).
  for (const Case& k : std::vector<Case>{{{3, 5}, {5, 4}, false, false},
                                         {{5, 3}, {5, 4}, true, false},
                                         {{5, 3}, {3, 32}, false, false},
                                         {{7, 4}, {7, 32}, true, false},
                                         {{3, 5}, {4, 5}, false, true},
                                         {{5, 3}, {4, 5}, true, true},
                                         {{2, 3, 5}, {2, 5, 7}, false, false},
                                         {{2, 3, 5}, {5, 7}, false, false},
                                         {{2, 3, 5}, {7, 5}, false, true},
                                         {{2, 5, 3}, {5, 7}, true, false},
                                         {{3, 5}, {2, 5, 4}, false, false},
                                         {{2, 2, 3, 5}, {2, 2, 4, 5}, false, true}}) {
    OpSample o;
    o.label = shape_str(k.a) + (k.ta ? "T" : "") + "@" + shape_str(k.b) + (k.tb ? "T" : "");
    o.inputs = {{k.a, DType::f64}, {k.b, DType::f64}};
    o.attrs = Attrs{{"trans_a", k.ta}, {"trans_b", k.tb}};
    o.reference = [](const std::vector<Tensor>& in, const Attrs& a) {
      const auto out = infer_matmul({{in[0].shape(), DType::f64}, {in[1].shape(), DType::f64}}, a)[0];
      Tensor y = Tensor::zeros(out.shape, DType::f64);
      const Shape &sa = in[0].shape(), &sb = in[1].shape();
      const bool ta = a.b("trans_a"), tb = a.b("trans_b");
      const int64_t m = out.shape[out.shape.size() - 2], n = out.shape.back();
      const int64_t kk = ta ? sa[sa.size() - 2] : sa.back();
      const int64_t batches = numel(out.shape) / (m * n);
      const int64_t astride = sa.size() == 2 ? 0 : m * kk, bstride = sb.size() == 2 ? 0 : kk * n;
      const double *pa = in[0].data<double>(), *pb = in[1].data<double>();
      for (int64_t bi = 0; bi < batches; ++bi)
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double acc = 0;
            for (int64_t p = 0; p < kk; ++p)
              acc += pa[bi * astride + (ta ? p * m + i : i * kk + p)] *
                     pb[bi * bstride + (tb ? j * kk + p : p * n + j)];
            y.data<double>()[(bi * m + i) * n + j] = acc;
          }
      return std::vector<Tensor>{y};
    };
    s.push_back(o);
  }
  return s;
}

}  // namespace

void register_matmul_ops(OpRegistry& r) {
  OpDef mm;
  mm.name = "matmul";
  mm.doc =
      "C = op(A) op(B), op = optional transpose of the last two dims; batched over leading dims "
      "(equal, or one side a single matrix); attribute out_dtype: f32 on bf16 operands writes the f32 sum "
      "(CPU)";
  mm.num_inputs = 2;
  mm.infer = infer_matmul;
  mm.grad = matmul_grad;
  mm.cost = matmul_cost;
  // Batch axes split alike (or a's alone over a shared b), the rows of op(a) or the columns of op(b) split with
  // the other operand whole, or the inner axis split on both (partial sums out).
  mm.sbp = [](const SbpQuery& q) {
    const int ra = static_cast<int>(q.in[0].shape.size()), rb = static_cast<int>(q.in[1].shape.size());
    const int ro = static_cast<int>(q.out[0].shape.size());
    const bool ta = q.attrs.b("trans_a"), tb = q.attrs.b("trans_b");
    std::vector<SbpSignature> sigs;
    for (int a = 0; a < ra - 2; ++a) {
      if (rb == 2)
        sigs.push_back({{Sbp::split(a), Sbp::broadcast()}, {Sbp::split(a)}});
      else if (rb == ra)
        sigs.push_back({{Sbp::split(a), Sbp::split(a)}, {Sbp::split(a)}});
    }
    if (ra == 2 && rb > 2)
      for (int a = 0; a < rb - 2; ++a) sigs.push_back({{Sbp::broadcast(), Sbp::split(a)}, {Sbp::split(a)}});
    sigs.push_back({{Sbp::split(ta ? ra - 1 : ra - 2), Sbp::broadcast()}, {Sbp::split(ro - 2)}});
    sigs.push_back({{Sbp::broadcast(), Sbp::split(tb ? rb - 2 : rb - 1)}, {Sbp::split(ro - 1)}});
    sigs.push_back({{Sbp::split(ta ? ra - 2 : ra - 1), Sbp::split(tb ? rb - 1 : rb - 2)}, {Sbp::partial()}});
    return sigs;
  };
  mm.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::matmul},
                {DeviceKind::cpu, {DType::bf16}, cpu::matmul_bf16, cpu::has_native_bf16}};
  mm.samples = matmul_samples;
  r.add(mm);

  OpDef lin;
  lin.name = "linear";
  lin.doc =
      "y = x W^T (+ b); x (..., in), W (out, in), b (out). Attribute activation: gelu (approximate: none or "
      "tanh): outputs (gelu(x W^T + b), x W^T + b), linear then gelu fused (graph/passes.cc fuse_ops). "
      "Attribute out_dtype: f32 on bf16 operands writes the f32 sum (CPU)";
  lin.num_inputs = -1;
  lin.num_outputs = [](const Attrs& a) { return a.has("activation") ? 2 : 1; };
  lin.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    if (in.size() != 2 && in.size() != 3) throw input_error("linear takes (x, W) or (x, W, b)");
    if (a.has("activation") && !a.is("activation", "gelu"))
      throw input_error("linear: the only fused activation is gelu");
    if (a.has("approximate") && !a.is("approximate", "none") && !a.is("approximate", "tanh"))
      throw input_error("linear: approximate must be none or tanh");
    const Shape &x = in[0].shape, &w = in[1].shape;
    if (x.empty() || w.size() != 2 || w[1] != x.back())
      throw input_error(cat("linear: x ", shape_str(x), " does not match W ", shape_str(w), " (out, in)"));
    if (in.size() == 3 && in[2].shape != Shape{w[0]})
      throw input_error(cat("linear: bias ", shape_str(in[2].shape), " should be [", w[0], "]"));
    Shape y = x;
    y.back() = w[0];
    if (a.has("activation")) {
      if (a.has("out_dtype")) throw input_error("linear: out_dtype with a fused activation");
      return {{y, in[0].dtype}, {y, in[0].dtype}};
    }
    return {{y, result_dtype(in[0].dtype, a)}};
  };
  lin.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
    const double n = static_cast<double>(numel(out[0].shape));
    double bytes = 0;
    for (const auto& t : out) bytes += n * static_cast<double>(dtype_size(t.dtype));
    for (const auto& t : in)
      bytes += static_cast<double>(numel(t.shape)) * static_cast<double>(dtype_size(t.dtype));
    // The activation: as gelu's elementwise cost.
    return Cost{(2.0 * static_cast<double>(in[1].shape[1]) + (out.size() > 1 ? 1.0 : 0.0)) * n, bytes};
  };
  // The pre-activation is what the activation's gradient reads, not a result of its own.
  lin.nondiff_outputs = {1};
  lin.grad = [](GradCtx& c) -> std::vector<ValueId> {
    GraphBuilder& b = c.b;
    ValueId dy = c.dout(0);
    if (c.attrs().has("activation"))
      dy = b.op1("gelu_grad", {dy, c.out(1)}, {{"approximate", c.attrs().s("approximate", "none")}});
    const ValueId dx = b.matmul(dy, c.in(1));
    const ValueId dw = b.matmul(flat2d(b, dy), flat2d(b, c.in(0)), true, false);
    std::vector<ValueId> g = {dx, dw};
    if (c.node.inputs.size() == 3) g.push_back(b.reduce_to_shape(dy, b.shape(c.in(2))));
    return g;
  };
  lin.sbp = [](const SbpQuery& q) {
    const int r = static_cast<int>(q.in[0].shape.size());
    const bool bias = q.in.size() == 3;
    const bool act = q.attrs.has("activation");
    std::vector<SbpSignature> sigs;
    // The pre-activation output splits as the result does.
    auto with_bias = [&](SbpSignature s, Sbp b) {
      if (bias) s.in.push_back(b);
      if (act) {
        const Sbp y = s.out[0];
        s.out.push_back(y);
      }
      return s;
    };
    // Column parallel: the output features split (grouped as the weight is).
    const int g = q.groups[1];
    sigs.push_back(
        with_bias({{Sbp::broadcast(), Sbp::split(0, g)}, {Sbp::split(r - 1, g)}}, Sbp::split(0, g)));
    // The activation needs whole sums: the splits that leave partial ones are not for the fused op.
    if (act) {
      for (int a = 0; a < r - 1; ++a)
        sigs.push_back(with_bias({{Sbp::split(a), Sbp::broadcast()}, {Sbp::split(a)}}, Sbp::broadcast()));
      return sigs;
    }
    // Row parallel: the input features split; partial sums out (the bias added after their sum).
    SbpSignature row = with_bias(
        {{Sbp::split(r - 1), Sbp::split(1)}, {bias ? Sbp::broadcast() : Sbp::partial()}}, Sbp::broadcast());
    row.row_bias = bias;
    sigs.push_back(row);
    // A split over leading (batch, sequence) axes with the weight whole: data parallelism.
    for (int a = 0; a < r - 1; ++a)
      sigs.push_back(with_bias({{Sbp::split(a), Sbp::broadcast()}, {Sbp::split(a)}}, Sbp::broadcast()));
    if (!bias) sigs.push_back({{Sbp::partial(), Sbp::broadcast()}, {Sbp::partial()}});
    return sigs;
  };
  lin.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::linear},
                 {DeviceKind::cpu, {DType::bf16}, cpu::linear_bf16, cpu::has_native_bf16}};
  lin.samples = [] {
    std::vector<OpSample> s;
    // The last two: a classifier head in f32 (cpu/skinny_gemm.cc: at most 16 outputs over a multiple of 16
    // inputs), two rows at a time with a row left over, and one at a time past 10 outputs.
    for (const auto& [x, out] :
         std::vector<std::pair<Shape, int64_t>>{{{4, 3}, 6}, {{2, 5, 3}, 6}, {{5, 32}, 10}, {{3, 16}, 12}}) {
      OpSample o;
      o.label = shape_str(x) + " x [" + std::to_string(out) + "] with bias";
      o.inputs = {{x, DType::f64}, {{out, x.back()}, DType::f64}, {{out}, DType::f64}};
      s.push_back(o);
      o.label = shape_str(x) + " x [" + std::to_string(out) + "] no bias";
      o.inputs.pop_back();
      s.push_back(o);
    }
    // Fused GELU: in f16/bf16, 16 output features take cuBLASLt's GELU epilogue (its auxiliary output's
    // leading dimension is a multiple of 8), 6 the CUDA kernel's GEMM then GELU.
    for (const auto& [x, out, bias, approx] :
         std::vector<std::tuple<Shape, int64_t, bool, std::string>>{{{4, 3}, 6, true, "none"},
                                                                    {{2, 5, 3}, 6, true, "tanh"},
                                                                    {{5, 3}, 16, true, "tanh"},
                                                                    {{5, 3}, 16, false, "tanh"},
                                                                    {{2, 3, 4}, 16, false, "none"}}) {
      OpSample o;
      o.label = cat(shape_str(x), " x [", out, ",", x.back(), "]", bias ? " with bias" : " no bias", " gelu ",
                    approx);
      o.inputs = {{x, DType::f64}, {{out, x.back()}, DType::f64}};
      if (bias) o.inputs.push_back({{out}, DType::f64});
      o.attrs = Attrs{{"activation", std::string("gelu")}, {"approximate", approx}};
      s.push_back(o);
    }
    return s;
  };
  r.add(lin);
}

}  // namespace flowrun
