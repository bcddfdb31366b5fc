// Neural-network ops: softmax, log_softmax, cross_entropy, nll_loss, mse_loss, dropout, BERT's mlm_mask,
// embedding and their backward ops. CPU kernels are in ops/cpu/nn.cc.
#include "ops/cpu/nn.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <variant>

#include "graph/builder.h"
#include "ops/registry.h"

namespace flowrun {

namespace {

const std::vector<DType> kF = {DType::f32, DType::f64};
constexpr int64_t kDefaultIgnore = -100;

double bytes_of(const TensorType& t) {
  return static_cast<double>(numel(t.shape)) * static_cast<double>(dtype_size(t.dtype));
}

double bytes_of(const std::vector<TensorType>& ts) {
  double b = 0;
  for (const auto& t : ts) b += bytes_of(t);
  return b;
}

// Cost of an op doing `flops_per` flops per element of input `basis` and touching every input and output
// once.
std::function<Cost(const std::vector<TensorType>&, const std::vector<TensorType>&, const Attrs&)>
cost_per_elem(double flops_per, int basis) {
  return [flops_per, basis](const std::vector<TensorType>& in, const std::vector<TensorType>& out,
                            const Attrs&) {
    return Cost{flops_per * static_cast<double>(numel(in[static_cast<size_t>(basis)].shape)),
                bytes_of(in) + bytes_of(out)};
  };
}

int64_t int_attr(const std::string& op, const Attrs& a, std::string_view k, int64_t dflt) {
  if (!a.has(k)) return dflt;
  if (const auto* v = std::get_if<int64_t>(&a.all().find(k)->second)) return *v;
  throw input_error(cat(op, ": attribute '", k, "' must be an integer"));
}

double num_attr(const std::string& op, const Attrs& a, std::string_view k, double dflt) {
  if (!a.has(k)) return dflt;
  const Attr& v = a.all().find(k)->second;
  if (const auto* d = std::get_if<double>(&v)) return *d;
  if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  throw input_error(cat(op, ": attribute '", k, "' must be a number"));
}

void require_float(const std::string& op, const TensorType& t, const char* what) {
  if (!is_floating(t.dtype))
    throw input_error(cat(op, ": ", what, " must be floating point, got ", dtype_name(t.dtype)));
}

void require_same(const std::string& op, const TensorType& a, const TensorType& b, const char* what) {
  if (a.shape != b.shape || a.dtype != b.dtype)
    throw input_error(cat(op, ": ", what, " differ: ", shape_str(a.shape), ":", dtype_name(a.dtype), " vs ",
                          shape_str(b.shape), ":", dtype_name(b.dtype)));
}

// Softmax-like ops act on the last axis only; `axis` may name it as -1 or rank-1.
void check_last_axis(const std::string& op, const TensorType& x, const Attrs& a) {
  if (x.shape.empty()) throw input_error(cat(op, ": needs an input of rank >= 1, got a scalar"));
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  const int64_t axis = int_attr(op, a, "axis", -1);
  if (axis != -1 && axis != rank - 1)
    throw input_error(cat(op, ": only the last axis is supported (-1 or ", rank - 1, "), got axis ", axis));
}

// (logits or log-probabilities (..., C), labels i64 (...)) as the class-index losses take them.
void check_class_inputs(const std::string& op, const TensorType& x, const TensorType& labels,
                        const Attrs& a) {
  require_float(op, x, "the scores");
  if (x.shape.empty() || x.shape.back() < 1)
    throw input_error(cat(op, ": scores must be (..., C) with C >= 1, got ", shape_str(x.shape)));
  if (labels.dtype != DType::i64)
    throw input_error(cat(op, ": labels must be i64, got ", dtype_name(labels.dtype)));
  const Shape expected(x.shape.begin(), x.shape.end() - 1);
  if (labels.shape != expected)
    throw input_error(cat(op, ": labels ", shape_str(labels.shape), " do not match scores ",
                          shape_str(x.shape), " (expected ", shape_str(expected), ")"));
  int_attr(op, a, "ignore_index", kDefaultIgnore);
}

void check_scalar_grad(const std::string& op, const TensorType& d, const TensorType& x) {
  if (!d.shape.empty() || d.dtype != x.dtype)
    throw input_error(cat(op, ": the loss gradient must be a ", dtype_name(x.dtype), " scalar, got ",
                          shape_str(d.shape), ":", dtype_name(d.dtype)));
}

// cross_entropy's optional denominator: a one-element scalar ({} or {1}) of the logits' dtype.
void check_denominator(const std::string& op, const TensorType& d, const TensorType& x) {
  if (d.shape.size() > 1 || numel(d.shape) != 1 || d.dtype != x.dtype)
    throw input_error(cat(op, ": the denominator must be a ", dtype_name(x.dtype),
                          " scalar ({} or {1}), got ", shape_str(d.shape), ":", dtype_name(d.dtype)));
}

double dropout_p(const std::string& op, const Attrs& a) {
  const double p = num_attr(op, a, "p", 0.5);
  if (!(p >= 0.0 && p <= 1.0)) throw input_error(cat(op, ": p must be in [0, 1], got ", p));
  return p;
}

// ---- samples ----

std::vector<double> uniform(const Tensor& t, uint64_t seed, uint64_t stream, double lo, double hi) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  const RngStream r{seed, stream};
  for (size_t k = 0; k < v.size(); ++k) v[k] = lo + (hi - lo) * r.uniform(k);
  return v;
}

enum class Labels { in_range, some_ignored, all_ignored, out_of_range };

// Input 0: scores in [-2, 2] + shift; input 1: class labels in [0, C), some replaced as `mode` says; input
// 2 (cross_entropy's denominator): `denominator`.
std::function<void(int, Tensor&, uint64_t)> class_fill(int64_t C, Labels mode, int64_t ignore, double shift,
                                                       double denominator) {
  return [=](int i, Tensor& t, uint64_t seed) {
    if (i == 0) return t.fill_from(uniform(t, seed, 11, shift - 2.0, shift + 2.0));
    if (i == 2) return t.fill_from(std::vector<double>(static_cast<size_t>(t.numel()), denominator));
    std::vector<double> v(static_cast<size_t>(t.numel()));
    const RngStream r{seed, 12};
    for (size_t k = 0; k < v.size(); ++k) {
      int64_t l = static_cast<int64_t>(r.block(k)[0] % static_cast<uint64_t>(C));
      if (mode == Labels::all_ignored || (mode == Labels::some_ignored && k % 3 == 1)) l = ignore;
      if (mode == Labels::out_of_range && k % 4 == 1) l = C + static_cast<int64_t>(k);
      if (mode == Labels::out_of_range && k % 4 == 3) l = -5;
      v[k] = static_cast<double>(l);
    }
    t.fill_from(v);
  };
}

struct ClassCase {
  std::string label;
  Shape x;
  Labels mode;
  int64_t ignore;  // kDefaultIgnore: attribute left out
  double shift = 0.0;
  // Attrs offset 0 and classes C: the vocabulary-parallel path (graph/sbp_parallel.cc) on one rank.
  bool split = false;
  // cross_entropy's third input, the loss's denominator in place of the count of valid labels (BERT's
  // masked positions counted over the whole step); its shape {} or {1}.
  std::optional<double> denominator = std::nullopt;
  Shape denominator_shape = {};
};

std::vector<ClassCase> class_cases(bool cross_entropy) {
  std::vector<ClassCase> cs = {
      {"[3,7]", {3, 7}, Labels::in_range, kDefaultIgnore},
      {"[2,3,5] some ignored", {2, 3, 5}, Labels::some_ignored, kDefaultIgnore},
      {"[4,6] ignore_index=2", {4, 6}, Labels::some_ignored, 2},
      {"[3,7] all ignored", {3, 7}, Labels::all_ignored, kDefaultIgnore},
      {"[5] one row", {5}, Labels::in_range, kDefaultIgnore},
      {"[2,4,5] out-of-range labels", {2, 4, 5}, Labels::out_of_range, kDefaultIgnore}};
  if (cross_entropy) {
    cs.push_back({"[3,7] logits + 100", {3, 7}, Labels::in_range, kDefaultIgnore, 100.0});
    ClassCase split{
        "[2,4,5] out-of-range labels, split over one rank", {2, 4, 5}, Labels::out_of_range, kDefaultIgnore};
    split.split = true;
    cs.push_back(split);
    // A denominator that is not the count (the count here is 4, of 6 rows), fractional as a rank's share of
    // a whole batch's count is; 0 (no masked position in the whole step); a {1} one on the split path.
    ClassCase den{"[2,3,5] some ignored, denominator 2.5", {2, 3, 5}, Labels::some_ignored, kDefaultIgnore};
    den.denominator = 2.5;
    cs.push_back(den);
    ClassCase zero{"[3,7] denominator 0", {3, 7}, Labels::in_range, kDefaultIgnore};
    zero.denominator = 0.0;
    cs.push_back(zero);
    ClassCase split_den{"[2,4,5] out-of-range labels, split over one rank, denominator [1] 11",
                        {2, 4, 5},
                        Labels::out_of_range,
                        kDefaultIgnore};
    split_den.split = true;
    split_den.denominator = 11.0;
    split_den.denominator_shape = {1};
    cs.push_back(split_den);
  }
  return cs;
}

// Per row of a (rows, C) f64 tensor: log(sum(exp(x))).
std::vector<double> ref_lse(const Tensor& x) {
  const int64_t C = x.shape().back(), rows = x.numel() / C;
  const double* p = x.data<double>();
  std::vector<double> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const double m = *std::max_element(p + r * C, p + (r + 1) * C);
    double s = 0;
    for (int64_t j = 0; j < C; ++j) s += std::exp(p[r * C + j] - m);
    out[static_cast<size_t>(r)] = m + std::log(s);
  }
  return out;
}

// Mean over labels != ignore of term(row, label); out-of-range labels count and contribute 0. With a
// denominator: the sum of the terms over it (0 where it is 0).
template <typename F>
double ref_class_mean(const Tensor& labels, int64_t C, int64_t ignore, F term,
                      std::optional<double> denominator = std::nullopt) {
  double sum = 0;
  int64_t n = 0;
  for (int64_t r = 0; r < labels.numel(); ++r) {
    const int64_t l = labels.data<int64_t>()[r];
    if (l == ignore) continue;
    ++n;
    if (l >= 0 && l < C) sum += term(r, l);
  }
  if (denominator) return *denominator != 0 ? sum / *denominator : 0.0;
  return n > 0 ? sum / static_cast<double>(n) : 0.0;
}

Tensor scalar(double v) {
  return Tensor::from<double>({}, {v});
}

std::vector<OpSample> softmax_samples(bool log) {
  std::vector<OpSample> s;
  struct Case {
    Shape x;
    int64_t axis;
    double shift;
  };
  for (const Case& k : std::vector<Case>{{{7}, -1, 0},
                                         {{3, 7}, -1, 0},
                                         {{2, 3, 5}, -1, 0},
                                         {{2, 3, 5}, 2, 0},
                                         {{3, 7}, 1, 100.0},
                                         {{4, 33}, -1, 0}}) {
    OpSample o;
    o.label = shape_str(k.x) + " axis " + std::to_string(k.axis) + (k.shift != 0 ? " shifted" : "");
    o.inputs = {{k.x, DType::f64}};
    o.attrs = Attrs{{"axis", k.axis}};
    const double shift = k.shift;
    o.fill = [shift](int, Tensor& t, uint64_t seed) {
      t.fill_from(uniform(t, seed, 3, shift - 3.0, shift + 3.0));
    };
    o.reference = [log](const std::vector<Tensor>& in, const Attrs&) {
      const Tensor& x = in[0];
      const int64_t C = x.shape().back();
      const std::vector<double> lse = ref_lse(x);
      Tensor y = Tensor::empty(x.shape(), DType::f64);
      for (int64_t i = 0; i < x.numel(); ++i) {
        const double v = x.data<double>()[i] - lse[static_cast<size_t>(i / C)];
        y.data<double>()[i] = log ? v : std::exp(v);
      }
      return std::vector<Tensor>{y};
    };
    s.push_back(o);
  }
  return s;
}

std::vector<OpSample> class_samples(bool cross_entropy) {
  std::vector<OpSample> s;
  for (const ClassCase& k : class_cases(cross_entropy)) {
    OpSample o;
    o.label = k.label;
    const Shape lshape(k.x.begin(), k.x.end() - 1);
    o.inputs = {{k.x, DType::f64}, {lshape, DType::i64}};
    if (k.denominator) o.inputs.push_back({k.denominator_shape, DType::f64});
    if (k.ignore != kDefaultIgnore) o.attrs = Attrs{{"ignore_index", k.ignore}};
    if (k.split) o.attrs.set("offset", int64_t{0}).set("classes", k.x.back());
    o.fill = class_fill(k.x.back(), k.mode, k.ignore, k.shift, k.denominator.value_or(0.0));
    o.reference = [cross_entropy](const std::vector<Tensor>& in, const Attrs& a) {
      const Tensor &x = in[0], &labels = in[1];
      const int64_t C = x.shape().back();
      const int64_t ignore = a.i("ignore_index", kDefaultIgnore);
      const double* p = x.data<double>();
      if (!cross_entropy)
        return std::vector<Tensor>{
            scalar(ref_class_mean(labels, C, ignore, [&](int64_t r, int64_t l) { return -p[r * C + l]; }))};
      const std::vector<double> lse = ref_lse(x);
      Tensor lse_t = Tensor::empty(labels.shape(), DType::f64);
      std::copy(lse.begin(), lse.end(), lse_t.data<double>());
      const std::optional<double> den =
          in.size() > 2 ? std::optional<double>(in[2].data<double>()[0]) : std::nullopt;
      const double loss = ref_class_mean(
          labels, C, ignore, [&](int64_t r, int64_t l) { return lse[static_cast<size_t>(r)] - p[r * C + l]; },
          den);
      return std::vector<Tensor>{scalar(loss), lse_t};
    };
    s.push_back(o);
  }
  return s;
}

std::vector<OpSample> mse_samples() {
  std::vector<OpSample> s;
  for (const Shape& sh : std::vector<Shape>{{7}, {3, 5}, {2, 3, 5}}) {
    OpSample o;
    o.label = shape_str(sh);
    o.inputs = {{sh, DType::f64}, {sh, DType::f64}};
    o.reference = [](const std::vector<Tensor>& in, const Attrs&) {
      double sum = 0;
      for (int64_t i = 0; i < in[0].numel(); ++i) {
        const double d = in[0].data<double>()[i] - in[1].data<double>()[i];
        sum += d * d;
      }
      return std::vector<Tensor>{scalar(sum / static_cast<double>(in[0].numel()))};
    };
    s.push_back(o);
  }
  return s;
}

std::vector<OpSample> dropout_samples() {
  std::vector<OpSample> s;
  OpSample id;
  id.label = "[3,7] p=0 (identity)";
  id.inputs = {{{3, 7}, DType::f64}};
  id.attrs = Attrs{{"p", 0.0}};
  id.reference = [](const std::vector<Tensor>& in, const Attrs&) {
    Tensor mask = Tensor::empty(in[0].shape(), DType::u8);
    std::fill_n(mask.data<uint8_t>(), mask.numel(), uint8_t{1});
    return std::vector<Tensor>{in[0].clone(), mask};
  };
  s.push_back(id);
  // Random masks: no reference; the gradient check holds because the executor replays the same step.
  for (const auto& [sh, p] :
       std::vector<std::pair<Shape, double>>{{{3, 7}, 0.3}, {{2, 3, 5}, 0.3}, {{7}, 0.5}}) {
    OpSample o;
    o.label = shape_str(sh) + " p=" + std::to_string(p);
    o.inputs = {{sh, DType::f64}};
    o.attrs = Attrs{{"p", p}};
    s.push_back(o);
  }
  return s;
}

struct MlmAttrs {
  int64_t vocab, mask_id;
  double p, mask_p, random_p;
  bool fixed;
  int64_t micro_batches;
};

MlmAttrs mlm_attrs(const Attrs& a) {
  const std::string op = "mlm_mask";
  for (const char* k : {"vocab", "mask_id"})
    if (!a.has(k)) throw input_error(cat(op, ": attribute '", k, "' is required"));
  MlmAttrs m{int_attr(op, a, "vocab", 0),        int_attr(op, a, "mask_id", 0),    num_attr(op, a, "p", 0.15),
             num_attr(op, a, "mask_p", 0.8),     num_attr(op, a, "random_p", 0.1), false,
             int_attr(op, a, "micro_batches", 1)};
  if (m.vocab < 1) throw input_error(cat(op, ": vocab must be at least 1, got ", m.vocab));
  if (m.micro_batches < 1)
    throw input_error(cat(op, ": micro_batches must be at least 1, got ", m.micro_batches));
  for (const auto& [k, v] : {std::pair{"p", m.p}, {"mask_p", m.mask_p}, {"random_p", m.random_p}})
    if (!(v >= 0.0 && v <= 1.0)) throw input_error(cat(op, ": ", k, " must be in [0, 1], got ", v));
  // 0.9 + 0.1 is 1 in doubles, but a sum of decimal fractions may land an ulp above it.
  if (m.mask_p + m.random_p > 1.0 + 1e-12)
    throw input_error(cat(op, ": mask_p + random_p must be at most 1, got ", m.mask_p, " + ", m.random_p));
  if (a.has("fixed")) {
    if (!std::holds_alternative<bool>(a.all().find("fixed")->second))
      throw input_error(cat(op, ": attribute 'fixed' must be a bool"));
    m.fixed = a.b("fixed");
  }
  return m;
}

// Samples whose draws decide nothing (p = 0, or p = 1 with one outcome certain) have exact references; the
// random ones are checked by the unit tests (MlmMask.*) and, on a GPU, against the CPU's draws.
std::vector<OpSample> mlm_mask_samples() {
  std::vector<OpSample> s;
  auto add = [&](const std::string& label, const Shape& sh, Attrs a, bool all_selected, bool masked,
                 bool with_reference) {
    OpSample o;
    o.label = label;
    o.inputs = {{sh, DType::i64}};
    a.set("vocab", int64_t{11});
    a.set("mask_id", int64_t{10});
    o.attrs = a;
    if (with_reference)
      o.reference = [all_selected, masked](const std::vector<Tensor>& in, const Attrs& at) {
        Tensor ids = in[0].clone(), labels = in[0].clone();
        for (int64_t k = 0; k < ids.numel(); ++k) {
          if (!all_selected) labels.data<int64_t>()[k] = kDefaultIgnore;
          if (masked) ids.data<int64_t>()[k] = at.i("mask_id");
        }
        // The whole step is this one tensor (micro_batches 1, no split): its count is its own.
        const float count = all_selected ? static_cast<float>(in[0].numel()) : 0.0f;
        return std::vector<Tensor>{ids, labels, Tensor::from<float>({}, {count})};
      };
    s.push_back(o);
  };
  add("[3,7] p=0 (nothing selected)", {3, 7}, Attrs{{"p", 0.0}}, false, false, true);
  add("[2,5] p=1 mask_p=1 (all masked)", {2, 5}, Attrs{{"p", 1.0}, {"mask_p", 1.0}, {"random_p", 0.0}}, true,
      true, true);
  add("[4,3] p=1 mask_p=0 random_p=0 (all selected, kept)", {4, 3},
      Attrs{{"p", 1.0}, {"mask_p", 0.0}, {"random_p", 0.0}}, true, false, true);
  add("[4,16] defaults", {4, 16}, Attrs{}, false, false, false);
  add("[3,5] p=0.5 random_p=0.5 fixed", {3, 5},
      Attrs{{"p", 0.5}, {"random_p", 0.5}, {"mask_p", 0.5}, {"fixed", true}}, false, false, false);
  add("[9] p=0.3 (one axis)", {9}, Attrs{{"p", 0.3}}, false, false, false);
  return s;
}

std::vector<OpSample> embedding_samples() {
  std::vector<OpSample> s;
  struct Case {
    Shape ids;
    int64_t V, D;
    bool out_of_range;
  };
  // The last two: ids repeated ~200 and ~9 times (a GPU kernel must sum them in f32, as the CPU's widened
  // f16/bf16 kernel does), over more ids than a block scans at once and, for 70 rows, more than one block.
  for (const Case& k : std::vector<Case>{{{5}, 7, 3, false},
                                         {{2, 3}, 4, 5, false},
                                         {{3, 4}, 3, 1, false},
                                         {{2, 5}, 6, 4, true},
                                         {{600}, 3, 20, false},
                                         {{2, 300}, 70, 20, false}}) {
    OpSample o;
    o.label = "ids " + shape_str(k.ids) + " table [" + std::to_string(k.V) + "," + std::to_string(k.D) + "]" +
              (k.out_of_range ? " out-of-range ids" : "");
    o.inputs = {{k.ids, DType::i64}, {{k.V, k.D}, DType::f64}};
    const int64_t V = k.V;
    const bool oor = k.out_of_range;
    o.fill = [V, oor](int i, Tensor& t, uint64_t seed) {
      if (i == 1) return t.fill_from(uniform(t, seed, 21, -1.0, 1.0));
      std::vector<double> v(static_cast<size_t>(t.numel()));
      const RngStream r{seed, 22};
      for (size_t j = 0; j < v.size(); ++j) {
        int64_t id = static_cast<int64_t>(r.block(j)[0] % static_cast<uint64_t>(V));
        if (oor && j % 3 == 1) id = V + static_cast<int64_t>(j);
        if (oor && j % 5 == 2) id = -1;
        v[j] = static_cast<double>(id);
      }
      t.fill_from(v);
    };
    o.reference = [](const std::vector<Tensor>& in, const Attrs&) {
      const Tensor &ids = in[0], &table = in[1];
      const int64_t V = table.shape()[0], D = table.shape()[1];
      Shape ys = ids.shape();
      ys.push_back(D);
      Tensor y = Tensor::zeros(ys, DType::f64);
      for (int64_t i = 0; i < ids.numel(); ++i) {
        const int64_t id = ids.data<int64_t>()[i];
        if (id < 0 || id >= V) continue;
        for (int64_t d = 0; d < D; ++d) y.data<double>()[i * D + d] = table.data<double>()[id * D + d];
      }
      return std::vector<Tensor>{y};
    };
    s.push_back(o);
  }
  return s;
}

// ---- op definitions ----

void add_softmax_like(OpRegistry& r, const std::string& name, const std::string& doc, KernelFn fwd,
                      KernelFn bwd, const std::string& grad_doc, bool log) {
  OpDef d;
  d.name = name;
  d.doc = doc;
  d.infer = [name](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    require_float(name, in[0], "the input");
    check_last_axis(name, in[0], a);
    return {in[0]};
  };
  d.cost = cost_per_elem(log ? 4.0 : 5.0, 0);
  d.inplace_input = 0;  // the backward reads the output, not the input
  d.grad = [name](GradCtx& c) -> std::vector<ValueId> {
    return {c.b.op1(name + "_grad", {c.dout(0), c.out(0)}, c.attrs())};
  };
  d.sbp = [](const SbpQuery& q) { return row_wise_signatures(q, 1); };
  d.kernels = {{DeviceKind::cpu, kF, fwd}};
  d.samples = [log] { return softmax_samples(log); };
  r.add(d);

  OpDef g;
  g.name = name + "_grad";
  g.doc = grad_doc;
  g.num_inputs = 2;
  g.infer = [gname = g.name](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    require_float(gname, in[0], "dy");
    require_same(gname, in[0], in[1], "dy and y");
    check_last_axis(gname, in[0], a);
    return {in[0]};
  };
  g.cost = cost_per_elem(4.0, 0);
  g.inplace_input = 0;
  g.kernels = {{DeviceKind::cpu, kF, bwd}};
  g.covered_by = {name};
  r.add(g);
}

}  // namespace

void register_nn_ops(OpRegistry& r) {
  add_softmax_like(r, "softmax", "exp(x) / sum(exp(x)) over the last axis (attribute axis: -1 or rank-1)",
                   cpu::softmax, cpu::softmax_grad,
                   "gradient of softmax from (dy, y): y * (dy - sum(dy * y))",
                   /*log=*/false);
  add_softmax_like(r, "log_softmax", "x - log(sum(exp(x))) over the last axis (attribute axis: -1 or rank-1)",
                   cpu::log_softmax, cpu::log_softmax_grad,
                   "gradient of log_softmax from (dy, y): dy - exp(y) * sum(dy)", /*log=*/true);

  OpDef ce;
  ce.name = "cross_entropy";
  ce.doc =
      "fused log_softmax + nll_loss: (logits (..., C), labels i64 (...) [, denominator]) -> (mean loss over "
      "labels != ignore_index (default -100; 0 if none), log-sum-exp per row). Labels outside [0, C) other "
      "than ignore_index count in the mean but contribute 0 (a kernel cannot report them). The optional "
      "denominator (a scalar, {} or {1}, of the logits' dtype) replaces the count: loss = the sum of the "
      "valid labels' terms / denominator, 0 where it is 0 (BERT: the masked positions of the whole step)";
  ce.num_inputs = -1;  // 2, or 3 with the denominator
  ce.num_outputs = [](const Attrs&) { return 2; };
  ce.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    if (in.size() != 2 && in.size() != 3)
      throw input_error(
          cat("cross_entropy: takes logits, labels [, denominator], got ", in.size(), " inputs"));
    check_class_inputs("cross_entropy", in[0], in[1], a);
    if (in.size() == 3) check_denominator("cross_entropy", in[2], in[0]);
    return {{{}, in[0].dtype}, {in[1].shape, in[0].dtype}};
  };
  ce.cost = cost_per_elem(4.0, 0);
  // Logits split over the tensor axis by class (attrs offset, classes; set by graph/sbp_parallel.cc): the
  // row statistics are reduced over its ranks in three doubles a row. The CUDA kernel keeps each row's loss
  // term (one double) to sum them in order.
  ce.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs& a) {
    return static_cast<size_t>((a.has("classes") ? 3 : 1) * numel(in[1].shape)) * sizeof(double);
  };
  // The denominator is a count, not a function of the logits: no gradient flows into it.
  ce.nondiff_inputs = {1, 2};
  ce.nondiff_outputs = {1};
  ce.grad = [](GradCtx& c) -> std::vector<ValueId> {
    std::vector<ValueId> ins = {c.dout(0), c.in(0), c.in(1), c.out(1)};
    if (c.node.inputs.size() == 3) ins.push_back(c.in(2));
    std::vector<ValueId> grads = {c.b.op1("cross_entropy_grad", ins, c.attrs()), kNoValue};
    if (c.node.inputs.size() == 3) grads.push_back(kNoValue);
    return grads;
  };
  ce.sbp = [](const SbpQuery& q) {
    const int r = static_cast<int>(q.in[0].shape.size());
    const bool den = q.in.size() == 3;
    // Vocabulary parallel: logits split by class, the row statistics reduced over the ranks in the kernel
    // (whole rows: the denominator whole too).
    SbpSignature vocab{{Sbp::split(r - 1), Sbp::broadcast()}, {Sbp::broadcast(), Sbp::broadcast()}};
    if (den) vocab.in.push_back(Sbp::broadcast());
    std::vector<SbpSignature> sigs{vocab};
    // Rows split (the batch): each rank's mean over its rows, the ranks' losses averaged. A denominator is
    // taken as partial sums: each rank divides its sum by its share of the whole denominator (mlm_mask's
    // count: the whole step's count over the number of pieces), and the mean of sum_r / (D / ranks) over
    // the ranks is sum / D exactly. A whole (B) denominator cannot be split so (B -> P is no boxing): such
    // a loss takes the whole rows instead.
    for (int a = 0; a + 1 < r; ++a) {
      SbpSignature s{{Sbp::split(a), Sbp::split(a)}, {Sbp::partial(), Sbp::split(a)}};
      if (den) s.in.push_back(Sbp::partial());
      s.partial_mean = true;
      sigs.push_back(s);
    }
    return sigs;
  };
  ce.kernels = {{DeviceKind::cpu, kF, cpu::cross_entropy}};
  ce.samples = [] { return class_samples(/*cross_entropy=*/true); };
  r.add(ce);

  OpDef ceg;
  ceg.name = "cross_entropy_grad";
  ceg.doc =
      "gradient of cross_entropy from (dloss, logits, labels, lse [, denominator]): dloss * (softmax - "
      "onehot) / count (or / denominator; 0 where it is 0)";
  ceg.num_inputs = -1;  // 4, or 5 with the denominator
  ceg.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    const std::string op = "cross_entropy_grad";
    if (in.size() != 4 && in.size() != 5)
      throw input_error(
          cat(op, ": takes dloss, logits, labels, lse [, denominator], got ", in.size(), " inputs"));
    check_class_inputs(op, in[1], in[2], a);
    check_scalar_grad(op, in[0], in[1]);
    require_same(op, in[3], {in[2].shape, in[1].dtype}, "lse and the expected row statistics");
    if (in.size() == 5) check_denominator(op, in[4], in[1]);
    return {in[1]};
  };
  ceg.cost = cost_per_elem(4.0, 1);
  // The CUDA kernel's dloss / count, computed once for every row.
  ceg.workspace = [](const std::vector<TensorType>&, const std::vector<TensorType>&, const Attrs&) {
    return sizeof(float);
  };
  ceg.kernels = {{DeviceKind::cpu, kF, cpu::cross_entropy_grad}};
  ceg.covered_by = {"cross_entropy"};
  r.add(ceg);

  OpDef nll;
  nll.name = "nll_loss";
  nll.doc =
      "(log-probabilities (..., C), labels i64 (...)) -> mean of -logp[label] over labels != ignore_index "
      "(default -100; 0 if none); out-of-range labels count but contribute 0, as in cross_entropy";
  nll.num_inputs = 2;
  nll.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    check_class_inputs("nll_loss", in[0], in[1], a);
    return {{{}, in[0].dtype}};
  };
  nll.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
    return Cost{static_cast<double>(numel(in[1].shape)),
                bytes_of(in[1]) +
                    static_cast<double>(numel(in[1].shape)) * static_cast<double>(dtype_size(in[0].dtype)) +
                    bytes_of(out)};
  };
  nll.nondiff_inputs = {1};
  nll.grad = [](GradCtx& c) -> std::vector<ValueId> {
    return {c.b.op1("nll_loss_grad", {c.dout(0), c.in(0), c.in(1)}, c.attrs()), kNoValue};
  };
  nll.sbp = [](const SbpQuery& q) {
    std::vector<SbpSignature> sigs;
    for (int a = 0; a + 1 < static_cast<int>(q.in[0].shape.size()); ++a) {
      SbpSignature s{{Sbp::split(a), Sbp::split(a)}, {Sbp::partial()}};
      s.partial_mean = true;
      sigs.push_back(s);
    }
    return sigs;
  };
  nll.kernels = {{DeviceKind::cpu, kF, cpu::nll_loss}};
  nll.samples = [] { return class_samples(/*cross_entropy=*/false); };
  r.add(nll);

  OpDef nllg;
  nllg.name = "nll_loss_grad";
  nllg.doc = "gradient of nll_loss from (dloss, logp, labels): -dloss / count at each label, 0 elsewhere";
  nllg.num_inputs = 3;
  nllg.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    check_class_inputs("nll_loss_grad", in[1], in[2], a);
    check_scalar_grad("nll_loss_grad", in[0], in[1]);
    return {in[1]};
  };
  nllg.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
    return Cost{0, bytes_of(in[2]) + bytes_of(out)};
  };
  nllg.kernels = {{DeviceKind::cpu, kF, cpu::nll_loss_grad}};
  nllg.covered_by = {"nll_loss"};
  r.add(nllg);

  OpDef mse;
  mse.name = "mse_loss";
  mse.doc = "mean((pred - target)^2) over all elements (0 for empty tensors); pred and target of one shape";
  mse.num_inputs = 2;
  mse.infer = [](const std::vector<TensorType>& in, const Attrs&) -> std::vector<TensorType> {
    require_float("mse_loss", in[0], "pred");
    require_same("mse_loss", in[0], in[1], "pred and target");
    return {{{}, in[0].dtype}};
  };
  mse.cost = cost_per_elem(3.0, 0);
  mse.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    const int64_t chunks = (numel(in[0].shape) + cpu::kMseChunk - 1) / cpu::kMseChunk;
    return static_cast<size_t>(chunks) * sizeof(double);
  };
  mse.grad = [](GradCtx& c) -> std::vector<ValueId> {
    const int64_t n = numel(c.b.shape(c.in(0)));
    const ValueId diff = c.b.sub(c.in(0), c.in(1));
    const ValueId dpred =
        c.b.mul_scalar(c.b.mul(diff, c.dout(0)), n > 0 ? 2.0 / static_cast<double>(n) : 0.0);
    return {dpred, c.b.mul_scalar(dpred, -1.0)};
  };
  // Pred and target split alike: each rank's mean over equal parts.
  mse.sbp = [](const SbpQuery& q) {
    std::vector<SbpSignature> sigs;
    for (int a = 0; a < static_cast<int>(q.in[0].shape.size()); ++a) {
      SbpSignature s{{Sbp::split(a), Sbp::split(a)}, {Sbp::partial()}};
      s.partial_mean = true;
      sigs.push_back(s);
    }
    return sigs;
  };
  mse.kernels = {{DeviceKind::cpu, kF, cpu::mse_loss}};
  mse.samples = mse_samples;
  r.add(mse);

  OpDef dr;
  dr.name = "dropout";
  dr.doc =
      "training-mode inverted dropout: keep each element with probability 1-p and scale it by 1/(1-p); "
      "-> (y, mask u8). p in [0, 1], default 0.5; draws are keyed by (seed, optimizer step, node, element), "
      "the element numbered in the step's whole batch (the tensor's whole shape under rng_whole/rng_start, "
      "micro-batch m after m whole micro-batches along axis 0)";
  dr.num_outputs = [](const Attrs&) { return 2; };
  dr.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    require_float("dropout", in[0], "the input");
    dropout_p("dropout", a);
    return {in[0], {in[0].shape, DType::u8}};
  };
  dr.cost = cost_per_elem(2.0, 0);
  dr.inplace_input = 0;  // the backward reads the mask only
  dr.nondiff_outputs = {1};
  dr.random = true;
  dr.grad = [](GradCtx& c) -> std::vector<ValueId> {
    return {c.b.op1("dropout_grad", {c.dout(0), c.out(1)}, c.attrs())};
  };
  dr.sbp = [](const SbpQuery& q) { return elementwise_signatures(q, false); };
  dr.kernels = {{DeviceKind::cpu, kF, cpu::dropout}};
  dr.samples = dropout_samples;
  r.add(dr);

  OpDef drg;
  drg.name = "dropout_grad";
  drg.doc = "gradient of dropout from (dy, mask): dy * mask / (1-p)";
  drg.num_inputs = 2;
  drg.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    require_float("dropout_grad", in[0], "dy");
    dropout_p("dropout_grad", a);
    if (in[1].dtype != DType::u8 || in[1].shape != in[0].shape)
      throw input_error(cat("dropout_grad: mask must be u8 shaped like dy ", shape_str(in[0].shape), ", got ",
                            shape_str(in[1].shape), ":", dtype_name(in[1].dtype)));
    return {in[0]};
  };
  drg.cost = cost_per_elem(1.0, 0);
  drg.inplace_input = 0;
  drg.kernels = {{DeviceKind::cpu, kF, cpu::dropout_grad}};
  drg.covered_by = {"dropout"};
  r.add(drg);

  OpDef mlm;
  mlm.name = "mlm_mask";
  mlm.doc =
      "BERT's masked-language-model masking of ids (B, T) i64 -> (masked ids, labels) i64: each position is "
      "selected with probability p (default 0.15); a selected one becomes mask_id with probability mask_p "
      "(0.8), a token drawn uniformly from [0, vocab) with probability random_p (0.1), else stays; labels "
      "hold the original id where selected, -100 elsewhere. Attrs vocab and mask_id (required), p, mask_p, "
      "random_p, fixed (bool, default false: draw step 0's numbers at every step, so that every evaluation "
      "masks alike). Draws are keyed and numbered as dropout's (Philox block e for element e of the step's "
      "whole batch). Third output count (f32 scalar): the positions selected in the step's whole batch "
      "(attr micro_batches M, default 1: every micro-batch of the step, the whole tensor over the mesh) "
      "times this piece's share of it, local elements / (whole elements * M): cross_entropy's denominator, "
      "so that the mean of the pieces' losses is the whole step's mean over its masked positions";
  mlm.num_outputs = [](const Attrs&) { return 3; };
  mlm.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    if (in[0].dtype != DType::i64 || in[0].shape.empty())
      throw input_error(cat("mlm_mask: ids must be i64 with at least one axis, got ", shape_str(in[0].shape),
                            ":", dtype_name(in[0].dtype)));
    mlm_attrs(a);
    return {in[0], in[0], {{}, DType::f32}};
  };
  // And one Philox block per element of the whole step for the count.
  mlm.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a) {
    const double whole =
        static_cast<double>(a.has("rng_whole") ? numel(a.ints("rng_whole")) : numel(in[0].shape));
    return Cost{
        4.0 * static_cast<double>(numel(in[0].shape)) + whole * static_cast<double>(a.i("micro_batches", 1)),
        bytes_of(in) + bytes_of(out)};
  };
  mlm.nondiff_inputs = {0};
  mlm.random = true;
  // Every element draws by its index in the whole tensor, so a batch (or sequence) split draws the same.
  // Each piece's count is its share of the whole count: partial sums of it.
  mlm.sbp = [](const SbpQuery& q) {
    std::vector<SbpSignature> sigs;
    for (int a = 0; a < static_cast<int>(q.in[0].shape.size()); ++a)
      sigs.push_back({{Sbp::split(a)}, {Sbp::split(a), Sbp::split(a), Sbp::partial()}});
    return sigs;
  };
  mlm.kernels = {{DeviceKind::cpu, {DType::i64}, cpu::mlm_mask}};
  mlm.samples = mlm_mask_samples;
  r.add(mlm);

  OpDef emb;
  emb.name = "embedding";
  emb.doc =
      "(ids i64 (...), table (V, D)) -> table rows (..., D); attr offset (default 0): id i reads row i - "
      "offset, "
      "ids outside [offset, offset + V) give zero rows";
  emb.num_inputs = 2;
  emb.infer = [](const std::vector<TensorType>& in, const Attrs&) -> std::vector<TensorType> {
    if (in[0].dtype != DType::i64)
      throw input_error(cat("embedding: ids must be i64, got ", dtype_name(in[0].dtype)));
    require_float("embedding", in[1], "the table");
    if (in[1].shape.size() != 2)
      throw input_error(cat("embedding: table must be (V, D), got ", shape_str(in[1].shape)));
    Shape out = in[0].shape;
    out.push_back(in[1].shape[1]);
    return {{out, in[1].dtype}};
  };
  emb.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
    return Cost{0, bytes_of(in[0]) + 2.0 * bytes_of(out)};
  };
  emb.nondiff_inputs = {0};
  emb.grad = [](GradCtx& c) -> std::vector<ValueId> {
    const int64_t V = c.b.shape(c.in(1))[0];
    return {kNoValue, c.b.op1("embedding_grad", {c.dout(0), c.in(0)},
                              {{"num_embeddings", V}, {"offset", c.attrs().i("offset", 0)}})};
  };
  // Vocabulary parallel (the table split by rows, each rank's lookups partial sums: zero rows for ids it does
  // not hold, attr offset set by the pass), or the ids split with the table whole.
  emb.sbp = [](const SbpQuery& q) {
    std::vector<SbpSignature> sigs{{{Sbp::broadcast(), Sbp::split(0)}, {Sbp::partial()}}};
    for (int a = 0; a < static_cast<int>(q.in[0].shape.size()); ++a)
      sigs.push_back({{Sbp::split(a), Sbp::broadcast()}, {Sbp::split(a)}});
    return sigs;
  };
  emb.kernels = {{DeviceKind::cpu, kF, cpu::embedding}};
  emb.samples = embedding_samples;
  r.add(emb);

  OpDef embg;
  embg.name = "embedding_grad";
  embg.doc =
      "gradient of embedding from (dy (..., D), ids (...)) {num_embeddings V} -> (V, D): rows of dy summed "
      "into "
      "their ids' rows in id order (deterministic, no atomics); ids outside [offset, offset + V) are skipped"
      " (attr offset, default 0)";
  embg.num_inputs = 2;
  embg.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    const std::string op = "embedding_grad";
    require_float(op, in[0], "dy");
    if (in[1].dtype != DType::i64)
      throw input_error(cat(op, ": ids must be i64, got ", dtype_name(in[1].dtype)));
    if (!a.has("num_embeddings")) throw input_error(cat(op, ": missing attribute 'num_embeddings'"));
    const int64_t V = int_attr(op, a, "num_embeddings", 0);
    if (V < 0) throw input_error(cat(op, ": num_embeddings must be >= 0, got ", V));
    if (in[0].shape.size() != in[1].shape.size() + 1 ||
        !std::equal(in[1].shape.begin(), in[1].shape.end(), in[0].shape.begin()))
      throw input_error(
          cat(op, ": dy ", shape_str(in[0].shape), " must be ids ", shape_str(in[1].shape), " + [D]"));
    return {{{V, in[0].shape.back()}, in[0].dtype}};
  };
  embg.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
    return Cost{static_cast<double>(numel(in[0].shape)), bytes_of(in) + bytes_of(out)};
  };
  embg.kernels = {{DeviceKind::cpu, kF, cpu::embedding_grad}};
  embg.covered_by = {"embedding"};
  r.add(embg);
}

}  // namespace flowrun
