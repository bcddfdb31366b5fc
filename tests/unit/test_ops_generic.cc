// Generic op tests over the whole registry: every differentiable op's gradient against central finite
// differences in f64, forwards against references, f32 kernels against f64, and a coverage check that fails
// for any op no test exercises.
#include <gtest/gtest.h>

// GCC 12 at -O3 reports a false -Wrestrict inside std::string's operator+ once op_harness.h's fill_all
// ("w" + std::to_string(j)) is inlined here (GCC bug 105329); no string in this file overlaps another.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include <cmath>
#include <functional>
#include <iostream>
#include <map>
#include <set>

#include "graph/passes.h"
#include "op_harness.h"

namespace flowrun::testing {
namespace {

std::vector<std::string> all_op_names() {
  std::vector<std::string> names;
  for (const auto& [name, def] : OpRegistry::get().all())
    if (def.samples) names.push_back(name);
  return names;
}

class OpTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OpTest, GradientMatchesFiniteDifferences) {
  const OpDef& def = OpRegistry::get().at(GetParam());
  if (!def.grad) GTEST_SKIP() << "not differentiable (checked by reference)";
  for (const OpSample& s : def.samples()) {
    if (!s.gradcheck) continue;
    SCOPED_TRACE(s.label);
    SampleProgram sp = build_sample(def, s, /*with_grad=*/true);
    ASSERT_TRUE(sp.has_loss) << "sample has no differentiable output";
    fill_all(s, sp, 42);
    run_loss(sp);
    // All analytic gradients first: the perturbed runs below overwrite the arena.
    std::map<std::string, std::vector<double>> grads;
    for (size_t i = 0; i < sp.input_names.size(); ++i)
      if (sp.is_param[i]) {
        // No gradient output means autodiff found none flowing (stop_gradient, fill_like): it must be zero.
        const std::string out = "grad/" + sp.input_names[i];
        grads[sp.input_names[i]] = sp.exec->program().graph.outputs().count(out)
                                       ? sp.exec->output(out).to_f64()
                                       : std::vector<double>(static_cast<size_t>(numel(s.inputs[i].shape)), 0.0);
      }
    bool any_param = false;
    for (size_t i = 0; i < sp.input_names.size(); ++i) {
      if (!sp.is_param[i]) continue;
      any_param = true;
      const std::string& name = sp.input_names[i];
      const std::vector<double>& analytic = grads[name];
      Tensor& x = sp.exec->tensor(name);
      const int64_t n = x.numel();
      const int64_t stride = std::max<int64_t>(1, n / 48);  // check at most ~48 elements per input
      for (int64_t k = 0; k < n; k += stride) {
        double* p = x.data<double>() + k;
        const double orig = *p, h = 1e-6 * std::max(1.0, std::fabs(orig));
        *p = orig + h;
        const double up = run_loss(sp);
        *p = orig - h;
        const double down = run_loss(sp);
        *p = orig;
        const double numeric = (up - down) / (2 * h);
        const double a = analytic[static_cast<size_t>(k)];
        const double err = std::fabs(a - numeric) / std::max({1.0, std::fabs(a), std::fabs(numeric)});
        EXPECT_LE(err, s.tolerance) << name << "[" << k << "]: analytic " << a << " numeric " << numeric;
      }
    }
    EXPECT_TRUE(any_param) << "no input of " << def.name << " receives a gradient";
  }
}

TEST_P(OpTest, ForwardMatchesReference) {
  const OpDef& def = OpRegistry::get().at(GetParam());
  int checked = 0;
  for (const OpSample& s : def.samples()) {
    if (!s.reference) continue;
    SCOPED_TRACE(s.label);
    SampleProgram sp = build_sample(def, s, /*with_grad=*/false);
    fill_all(s, sp, 7);
    std::vector<Tensor> inputs;
    for (const auto& n : sp.input_names) inputs.push_back(sp.exec->tensor(n).clone());
    const std::vector<Tensor> expected = s.reference(inputs, s.attrs);
    sp.exec->run();
    std::vector<Tensor> got;
    for (int j = 0; j < sp.num_outputs; ++j) got.push_back(sp.exec->output("out" + std::to_string(j)));
    for (int m : def.mutated_inputs(s.attrs, static_cast<int>(s.inputs.size())))
      got.push_back(sp.exec->tensor(sp.input_names[static_cast<size_t>(m)]));
    ASSERT_EQ(got.size(), expected.size());
    for (size_t j = 0; j < got.size(); ++j) {
      ASSERT_EQ(got[j].shape(), expected[j].shape()) << "output " << j;
      ASSERT_EQ(got[j].dtype(), expected[j].dtype()) << "output " << j;
      const auto g = got[j].to_f64(), e = expected[j].to_f64();
      for (size_t k = 0; k < g.size(); ++k) {
        if (!std::isfinite(e[k])) {  // e.g. the NaN coefficient that marks a skipped step
          EXPECT_TRUE(std::isnan(e[k]) ? std::isnan(g[k]) : g[k] == e[k]) << "output " << j << " [" << k << "]: " << g[k] << ", expected " << e[k];
          continue;
        }
        EXPECT_NEAR(g[k], e[k], 1e-9 * std::max(1.0, std::fabs(e[k]))) << "output " << j << " [" << k << "]";
      }
    }
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no reference";
}

TEST_P(OpTest, Float32KernelMatchesFloat64) {
  const OpDef& def = OpRegistry::get().at(GetParam());
  if (!def.kernel(DeviceKind::cpu, DType::f32)) GTEST_SKIP() << "no f32 kernel";
  for (const OpSample& s : def.samples()) {
    if (std::none_of(s.inputs.begin(), s.inputs.end(), [](const TensorType& t) { return t.dtype == DType::f64; }))
      continue;
    SCOPED_TRACE(s.label);
    SampleProgram ref = build_sample(def, s, false, DType::f64);
    SampleProgram f32 = build_sample(def, s, false, DType::f32);
    fill_all(s, ref, 9);
    fill_all(s, f32, 9);
    ref.exec->run();
    f32.exec->run();
    for (int j = 0; j < ref.num_outputs; ++j) {
      const auto a = ref.exec->output("out" + std::to_string(j)).to_f64();
      const auto b = f32.exec->output("out" + std::to_string(j)).to_f64();
      double scale = 1e-3;
      for (double v : a) scale = std::max(scale, std::fabs(v));
      for (size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(a[k], b[k], 1e-4 * scale) << "output " << j << " [" << k << "]";
    }
  }
}

// Every f16/bf16 kernel against the f32 kernel on the same (rounded) inputs. A widened kernel is the f32
// kernel between conversions, so its outputs must be exactly the f32 results rounded to nearest-even; a
// native one (oneDNN bf16 GEMMs, ...) accumulates differently and gets a tolerance of a few low-precision
// ulps of the output's scale.
TEST_P(OpTest, LowPrecisionMatchesFloat32) {
  const OpDef& def = OpRegistry::get().at(GetParam());
  if (!def.kernel(DeviceKind::cpu, DType::f32)) GTEST_SKIP() << "no f32 kernel";
  int checked = 0;
  for (DType low : {DType::bf16, DType::f16}) {
    const KernelChoice k = select_kernel(def, DeviceKind::cpu, low);
    if (!k.kernel) continue;  // updates that mutate state stay f32 (master weights)
    for (const OpSample& s : def.samples()) {
      if (std::none_of(s.inputs.begin(), s.inputs.end(), [](const TensorType& t) { return t.dtype == DType::f64; }))
        continue;
      SCOPED_TRACE(cat(s.label, " in ", dtype_name(low), k.widened ? " (widened)" : " (native)"));
      SampleProgram lo = build_sample(def, s, false, low);
      SampleProgram ref = build_sample(def, s, false, DType::f32);
      fill_all(s, lo, 9);
      for (const std::string& n : lo.input_names) ref.exec->tensor(n).fill_from(lo.exec->tensor(n).to_f64());
      lo.exec->run();
      ref.exec->run();
      for (int j = 0; j < lo.num_outputs; ++j) {
        const Tensor got_t = lo.exec->output(cat("out", j));
        const auto got = got_t.to_f64(), want = ref.exec->output(cat("out", j)).to_f64();
        ASSERT_EQ(got.size(), want.size());
        const bool low_out = got_t.dtype() == low;
        double scale = 1e-3;
        for (double v : want) scale = std::max(scale, std::fabs(v));
        const double tol = (low == DType::bf16 ? 1.0 / 64 : 1.0 / 512) * scale;
        for (size_t e = 0; e < got.size(); ++e) {
          if (!k.widened) {
            if (std::isfinite(want[e]))
              EXPECT_NEAR(got[e], want[e], tol) << "output " << j << " [" << e << "]";
            else  // e.g. -3e38 cast to f16: -inf in both
              EXPECT_TRUE(std::isnan(want[e]) ? std::isnan(got[e]) : got[e] == want[e]) << "output " << j;
            continue;
          }
          const float w = static_cast<float>(want[e]);
          const double rounded = !low_out ? want[e]
                                 : low == DType::bf16 ? bf16_to_float(float_to_bf16(w))
                                                      : f16_to_float(float_to_f16(w));
          if (std::isnan(rounded))
            EXPECT_TRUE(std::isnan(got[e])) << "output " << j << " [" << e << "]";
          else
            EXPECT_EQ(got[e], rounded) << "output " << j << " [" << e << "]";
        }
      }
      ++checked;
    }
  }
  if (checked == 0) GTEST_SKIP() << "no low-precision kernel";
}

INSTANTIATE_TEST_SUITE_P(Registry, OpTest, ::testing::ValuesIn(all_op_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// Every registered op is exercised: by its own samples, or inside the gradient graph of an op that lists it
// in covered_by. A new op without either fails here.
TEST(OpCoverage, EveryRegisteredOpIsTested) {
  std::set<std::string> seen;
  for (const auto& [name, def] : OpRegistry::get().all()) {
    if (!def.samples) continue;
    const auto samples = def.samples();
    EXPECT_FALSE(samples.empty()) << name << " has an empty sample list";
    for (const OpSample& s : samples) build_sample(def, s, def.grad && s.gradcheck, DType::f64, &seen);
    if (!def.grad) {
      EXPECT_TRUE(std::any_of(samples.begin(), samples.end(), [](const OpSample& x) { return static_cast<bool>(x.reference); }))
          << name << " is not differentiable, so its samples need a reference";
    }
  }
  for (const auto& [name, def] : OpRegistry::get().all()) {
    EXPECT_TRUE(seen.count(name)) << "op " << name << " is not exercised by any generic test: give it samples";
    if (!def.samples) {
      EXPECT_FALSE(def.covered_by.empty()) << "op " << name << " has neither samples nor covered_by";
    }
  }
}

// Runs one node of `op` on `inputs` (by value: their dtypes and shapes) at optimizer step `step`, micro-batch
// `micro`; returns its outputs.
std::vector<Tensor> run_op(const std::string& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                           int64_t step = 0, int64_t micro = 0, uint64_t seed = 1234) {
  Graph g;
  GraphBuilder b(g);
  std::vector<ValueId> ins;
  for (size_t i = 0; i < inputs.size(); ++i)
    ins.push_back(b.input(cat("x", i), inputs[i].shape(), inputs[i].dtype()));
  const std::vector<ValueId> outs = b.op(op, ins, attrs, "op");
  for (size_t j = 0; j < outs.size(); ++j) g.mark_output(cat("out", j), outs[j]);
  CompileOptions o;
  o.loss = "";
  Executor ex(compile(std::move(g), o), kCpu, seed);
  for (size_t i = 0; i < inputs.size(); ++i) ex.tensor(cat("x", i)).fill_from(inputs[i].to_f64());
  ex.set_step(step);
  ex.set_micro(micro);
  ex.run();
  std::vector<Tensor> got;
  for (size_t j = 0; j < outs.size(); ++j) got.push_back(ex.output(cat("out", j)).clone());
  return got;
}

// The f32 activation kernels (AVX-512 where built with it) against f64 formulas on a dense grid of x in
// [-13, 13] (the f32 GELU's lower tail is still normal there), with dy = 1 for the gradients. Each value is
// within `rel` of the largest term that makes it (so the gradients' zero crossings, where a relative error
// means nothing, are held to the terms' size), plus `per_z2` * x^2 for GELU's tails: the f32 argument
// -x^2 / 2 of its exp is off by up to 3 roundings of itself, x^2 * 9e-8, which exp turns into a relative
// error of the result.
TEST(Activations, Float32KernelsAreAccurateOverTheWholeRange) {
  struct Case {
    const char* op;
    Attrs attrs;
    std::function<std::pair<double, double>(double)> want;  // (value, size of its largest term)
    double rel, per_z2;
  };
  const double inv_sqrt2 = 1 / std::sqrt(2.0), inv_sqrt2pi = 1 / std::sqrt(2 * M_PI);
  auto phi = [=](double x) { return 0.5 * std::erfc(-x * inv_sqrt2); };
  auto sigmoid = [](double x) { return 1 / (1 + std::exp(-x)); };
  const Attrs erf{{"approximate", std::string("none")}};
  const std::vector<Case> cases = {
      {"gelu", erf,
       [&](double x) {
         return std::pair{x * phi(x), std::fabs(x * phi(x))};
       },
       4e-7, 1.2e-7},
      {"gelu_grad", erf,
       [&](double x) {
         const double pdf = x * std::exp(-0.5 * x * x) * inv_sqrt2pi;
         return std::pair{phi(x) + pdf, std::max(phi(x), std::fabs(pdf))};
       },
       4e-7, 1.2e-7},
      {"silu",
       {},
       [&](double x) {
         return std::pair{x * sigmoid(x), std::fabs(x * sigmoid(x))};
       },
       4e-7,
       0},
      {"silu_grad",
       {},
       [&](double x) {
         const double s = sigmoid(x), t = s * x * (1 - s);
         return std::pair{s + t, std::max(s, std::fabs(t))};
       },
       4e-7,
       0},
      {"sigmoid",
       {},
       [&](double x) {
         return std::pair{sigmoid(x), sigmoid(x)};
       },
       4e-7,
       0},
  };
  const int64_t n = 2 * 13 * 4096 + 1;  // x = k / 4096
  Tensor x = Tensor::empty({n}, DType::f32), ones = Tensor::empty({n}, DType::f32);
  for (int64_t k = 0; k < n; ++k) {
    x.data<float>()[k] = static_cast<float>(k - n / 2) / 4096.0f;
    ones.data<float>()[k] = 1.0f;
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    const bool grad = std::string(c.op).ends_with("_grad");
    const std::vector<Tensor> in = grad ? std::vector<Tensor>{ones, x} : std::vector<Tensor>{x};
    const Tensor y = run_op(c.op, in, c.attrs)[0];
    double worst = 0, worst_x = 0;
    for (int64_t k = 0; k < n; ++k) {
      const double v = x.data<float>()[k];
      const auto [want, size] = c.want(v);
      const double diff = std::fabs(y.data<float>()[k] - want);
      const double err = diff == 0 ? 0 : diff / (size * (c.rel + c.per_z2 * v * v));
      if (err > worst) worst = err, worst_x = v;
      ASSERT_LE(err, 1.0) << "x = " << v << ": " << y.data<float>()[k] << ", want " << want;
    }
    std::cout << c.op << ": worst error " << worst << " of its bound, at x = " << worst_x << "\n";
  }
}

Tensor uniform_tensor(const Shape& shape, DType t, uint64_t seed) {
  Tensor x = Tensor::empty(shape, t);
  std::vector<double> v(static_cast<size_t>(x.numel()));
  const RngStream r{seed, 3};
  for (size_t k = 0; k < v.size(); ++k) v[k] = 2.0 * r.uniform(k) - 1.0;
  x.fill_from(v);
  return x;
}

// Position 1 of pair 0 turns by exactly 1 radian (inv_freq = theta^0 = 1) whatever theta is: HF's y = x cos +
// rotate_half(x) sin by hand; inverse undoes the rotation; and a single row at `offset` k (a decode step) is
// bitwise row k of the whole sequence's rotation.
TEST(Rope, MatchesHandValuesInvertsAndDecodesAtAnOffset) {
  const Tensor x = Tensor::from<double>({1, 1, 2, 2}, {0.3, -0.7, 0.3, -0.7});
  const auto y = run_op("rope", {x}, {{"theta", 77.0}})[0].to_f64();
  EXPECT_DOUBLE_EQ(y[0], 0.3);  // position 0: no rotation
  EXPECT_DOUBLE_EQ(y[1], -0.7);
  EXPECT_NEAR(y[2], 0.3 * std::cos(1.0) + 0.7 * std::sin(1.0), 1e-15);
  EXPECT_NEAR(y[3], -0.7 * std::cos(1.0) + 0.3 * std::sin(1.0), 1e-15);

  for (DType t : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor q = uniform_tensor({2, 3, 6, 8}, t, 5);
    const Attrs a{{"theta", 500000.0}, {"offset", int64_t{40}}};
    const Tensor r = run_op("rope", {q}, a)[0];
    Attrs inv = a;
    inv.set("inverse", true);
    const auto back = run_op("rope", {r}, inv)[0].to_f64(), orig = q.to_f64();
    for (size_t k = 0; k < orig.size(); ++k)
      ASSERT_NEAR(back[k], orig[k], t == DType::f64 ? 1e-14 : 1e-6) << k;
    // Row 4 alone at offset 44.
    Tensor row = Tensor::empty({2, 3, 1, 8}, t);
    std::vector<double> rv;
    for (int64_t bh = 0; bh < 6; ++bh)
      for (int64_t d = 0; d < 8; ++d) rv.push_back(orig[static_cast<size_t>((bh * 6 + 4) * 8 + d)]);
    row.fill_from(rv);
    const auto one = run_op("rope", {row}, {{"theta", 500000.0}, {"offset", int64_t{44}}})[0].to_f64();
    const auto all = r.to_f64();
    for (int64_t bh = 0; bh < 6; ++bh)
      for (int64_t d = 0; d < 8; ++d)
        ASSERT_EQ(one[static_cast<size_t>(bh * 8 + d)], all[static_cast<size_t>((bh * 6 + 4) * 8 + d)]);
  }
}

TEST(Rope, RejectsBadShapesAndAttributes) {
  Graph g;
  GraphBuilder b(g);
  const ValueId odd = b.input("odd", {1, 1, 2, 3});
  EXPECT_THROW(b.op("rope", {odd}, {}), Error);
  const ValueId x = b.input("x", {1, 1, 2, 4});
  EXPECT_THROW(b.op("rope", {x}, {{"theta", -1.0}}), Error);
  EXPECT_THROW(b.op("rope", {x}, {{"offset", int64_t{-1}}}), Error);
  EXPECT_THROW(b.op("rope", {x}, {{"offset", 1.5}}), Error);
  EXPECT_THROW(b.op("rope", {x}, {{"inverse", int64_t{1}}}), Error);
  EXPECT_THROW(b.op("rope", {b.input("r3", {2, 2, 4})}, {}), Error);
}

Tensor ids_tensor(const Shape& shape, int64_t vocab, uint64_t seed) {
  Tensor x = Tensor::empty(shape, DType::i64);
  const RngStream r{seed, 4};
  for (int64_t k = 0; k < x.numel(); ++k)
    x.data<int64_t>()[k] =
        static_cast<int64_t>(r.block(static_cast<uint64_t>(k))[0] % static_cast<uint64_t>(vocab));
  return x;
}

std::vector<int64_t> ints_of(const Tensor& t) {
  return std::vector<int64_t>(t.data<int64_t>(), t.data<int64_t>() + t.numel());
}

// Rows [r0, r1) and columns [c0, c1) of a row-major (rows x cols) list.
std::vector<int64_t> block_of(const std::vector<int64_t>& v, int64_t cols, int64_t r0, int64_t r1, int64_t c0,
                              int64_t c1) {
  std::vector<int64_t> out;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) out.push_back(v[static_cast<size_t>(r * cols + c)]);
  return out;
}

// On 64 x 512 ids every one of one value: the share selected is p, of those mask_p become mask_id, random_p a
// token of [0, vocab) other than the id (but for 1 in vocab draws) and the rest stay; labels are the id where
// selected, -100 elsewhere, and unselected positions keep their id.
TEST(MlmMask, SelectsPAndSplitsEightyTenTen) {
  const int64_t vocab = 1000, mask_id = 999, id = 7;
  Tensor ids = Tensor::empty({64, 512}, DType::i64);
  std::fill_n(ids.data<int64_t>(), ids.numel(), id);
  const auto out = run_op("mlm_mask", {ids}, {{"vocab", vocab}, {"mask_id", mask_id}}, 5);
  const auto masked = ints_of(out[0]), labels = ints_of(out[1]);
  int64_t selected = 0, to_mask = 0, to_random = 0, kept = 0;
  double random_sum = 0;
  for (size_t k = 0; k < masked.size(); ++k) {
    if (labels[k] == -100) {
      ASSERT_EQ(masked[k], id) << k;
      continue;
    }
    ASSERT_EQ(labels[k], id) << k;
    ++selected;
    ASSERT_GE(masked[k], 0);
    ASSERT_LT(masked[k], vocab);
    if (masked[k] == mask_id) {
      ++to_mask;
    } else if (masked[k] == id) {
      ++kept;
    } else {
      ++to_random;
      random_sum += static_cast<double>(masked[k]);
    }
  }
  const double n = static_cast<double>(masked.size()), sel = static_cast<double>(selected);
  // Binomial standard deviations: 0.002 of the total, 0.006 / 0.004 of the selected; 5 of them allowed.
  EXPECT_NEAR(sel / n, 0.15, 0.01);
  EXPECT_NEAR(static_cast<double>(to_mask) / sel, 0.8, 0.03);
  EXPECT_NEAR(static_cast<double>(to_random) / sel, 0.1, 0.02);
  EXPECT_NEAR(static_cast<double>(kept) / sel, 0.1, 0.02);
  EXPECT_NEAR(random_sum / static_cast<double>(to_random), (vocab - 1) / 2.0, 40.0);  // uniform tokens
}

// Micro-batch m of 4 rows draws rows 4m.. of the step's batch of 8, and so do a data rank's rows and a
// tensor rank's columns of it (rng_whole/rng_start, as the SBP pass sets them): accumulation, pipelines and
// parallel layouts mask as one process masks the whole batch.
TEST(MlmMask, SplitsOfTheBatchDrawWhatTheWholeDraws) {
  const Attrs a{{"vocab", int64_t{50}}, {"mask_id", int64_t{49}}, {"p", 0.4}};
  const Tensor all = ids_tensor({8, 6}, 49, 1);
  const auto whole = run_op("mlm_mask", {all}, a, 3);
  const auto ids = ints_of(all), w0 = ints_of(whole[0]), w1 = ints_of(whole[1]);
  auto piece = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    const std::vector<int64_t> v = block_of(ids, 6, r0, r1, c0, c1);
    Tensor t = Tensor::empty({r1 - r0, c1 - c0}, DType::i64);
    std::copy(v.begin(), v.end(), t.data<int64_t>());
    return t;
  };
  int64_t selected = 0;
  for (int64_t l : w1) selected += l != -100;
  EXPECT_GT(selected, 5);  // the comparisons below see masking, not only copies
  for (int64_t m : {0, 1}) {
    SCOPED_TRACE(cat("micro-batch ", m));
    const auto mb = run_op("mlm_mask", {piece(4 * m, 4 * m + 4, 0, 6)}, a, 3, m);
    EXPECT_EQ(ints_of(mb[0]), block_of(w0, 6, 4 * m, 4 * m + 4, 0, 6));
    EXPECT_EQ(ints_of(mb[1]), block_of(w1, 6, 4 * m, 4 * m + 4, 0, 6));
    Attrs data_rank = a;  // rows 2..3 of the micro-batch of 4
    data_rank.set("rng_whole", std::vector<int64_t>{4, 6});
    data_rank.set("rng_start", std::vector<int64_t>{2, 0});
    const auto dr = run_op("mlm_mask", {piece(4 * m + 2, 4 * m + 4, 0, 6)}, data_rank, 3, m);
    EXPECT_EQ(ints_of(dr[0]), block_of(w0, 6, 4 * m + 2, 4 * m + 4, 0, 6));
    EXPECT_EQ(ints_of(dr[1]), block_of(w1, 6, 4 * m + 2, 4 * m + 4, 0, 6));
    Attrs tensor_rank = a;  // columns 3..5
    tensor_rank.set("rng_whole", std::vector<int64_t>{4, 6});
    tensor_rank.set("rng_start", std::vector<int64_t>{0, 3});
    const auto tr = run_op("mlm_mask", {piece(4 * m, 4 * m + 4, 3, 6)}, tensor_rank, 3, m);
    EXPECT_EQ(ints_of(tr[0]), block_of(w0, 6, 4 * m, 4 * m + 4, 3, 6));
    EXPECT_EQ(ints_of(tr[1]), block_of(w1, 6, 4 * m, 4 * m + 4, 3, 6));
  }
}

// The count output: a step of 2 micro-batches of 4 rows, each split over 2 data ranks (rows) or 2 tensor
// ranks (columns), has 4 pieces; each piece's count is a quarter of the step's selected positions (those of
// the 8 rows drawn whole), though its own rows select a different number, so the pieces' counts sum to the
// whole step's. With that count as cross_entropy's denominator, the mean of the pieces' losses is the whole
// batch's mean over its selected positions, which the pieces' own means do not give.
TEST(MlmMask, CountIsTheWholeStepsShareOfEachPiece) {
  const Attrs a{{"vocab", int64_t{50}}, {"mask_id", int64_t{49}}, {"p", 0.4}};
  const Tensor all = ids_tensor({8, 6}, 7, 1);  // ids, and so labels, are classes of the 7 logits below
  const auto whole = run_op("mlm_mask", {all}, a, 3);
  const auto labels = ints_of(whole[1]);
  int64_t selected = 0;
  for (int64_t l : labels) selected += l != -100;
  ASSERT_EQ(whole[2].shape(), Shape{});
  ASSERT_EQ(whole[2].dtype(), DType::f32);
  EXPECT_EQ(whole[2].data<float>()[0], static_cast<float>(selected));
  const Tensor logits = uniform_tensor({8, 6, 7}, DType::f64, 11);
  auto rows_of = [](const Tensor& t, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    Shape s = t.shape();
    const int64_t cols = s[1], inner = s.size() > 2 ? s[2] : 1;
    s[0] = r1 - r0;
    s[1] = c1 - c0;
    const auto v = t.to_f64();
    std::vector<double> out;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t k = 0; k < inner; ++k) out.push_back(v[static_cast<size_t>((r * cols + c) * inner + k)]);
    Tensor p = Tensor::empty(s, t.dtype());
    p.fill_from(out);
    return p;
  };
  Tensor whole_labels = Tensor::empty({8, 6}, DType::i64);
  std::copy(labels.begin(), labels.end(), whole_labels.data<int64_t>());
  const double mean = run_op("cross_entropy", {logits, whole_labels}, {})[0].data<double>()[0];
  for (const bool by_rows : {true, false}) {
    SCOPED_TRACE(by_rows ? "data ranks" : "tensor ranks");
    double count_sum = 0, loss_sum = 0, own_mean_sum = 0;
    std::set<int64_t> own_counts;
    for (int64_t m : {0, 1})
      for (int64_t r : {0, 1}) {
        const int64_t r0 = 4 * m + (by_rows ? 2 * r : 0), r1 = by_rows ? r0 + 2 : r0 + 4;
        const int64_t c0 = by_rows ? 0 : 3 * r, c1 = by_rows ? 6 : c0 + 3;
        Attrs piece = a;
        piece.set("micro_batches", int64_t{2});
        piece.set("rng_whole", std::vector<int64_t>{4, 6});
        piece.set("rng_start", by_rows ? std::vector<int64_t>{2 * r, 0} : std::vector<int64_t>{0, 3 * r});
        const auto out = run_op("mlm_mask", {rows_of(all, r0, r1, c0, c1)}, piece, 3, m);
        int64_t own = 0;
        for (int64_t l : ints_of(out[1])) own += l != -100;
        own_counts.insert(own);
        const float count = out[2].data<float>()[0];
        EXPECT_EQ(count, static_cast<float>(selected) / 4.0f);
        count_sum += static_cast<double>(count);
        const Tensor den = Tensor::from<double>({}, {static_cast<double>(count)});
        const Tensor lg = rows_of(logits, r0, r1, c0, c1);
        loss_sum += run_op("cross_entropy", {lg, out[1], den}, {})[0].data<double>()[0];
        own_mean_sum += run_op("cross_entropy", {lg, out[1]}, {})[0].data<double>()[0];
      }
    EXPECT_EQ(count_sum, static_cast<double>(selected));
    EXPECT_GT(own_counts.size(), 1u);  // the pieces select different numbers: their own means would differ
    EXPECT_NEAR(loss_sum / 4, mean, 1e-12 * mean);
    EXPECT_GT(std::fabs(own_mean_sum / 4 - mean), 1e-6 * mean);
  }
}

// Each step draws anew (and resuming at a step redraws it exactly); `fixed` draws the same at every step.
TEST(MlmMask, StepsDrawAnewUnlessFixed) {
  const Tensor ids = ids_tensor({8, 32}, 30, 2);
  Attrs a{{"vocab", int64_t{30}}, {"mask_id", int64_t{29}}};
  const auto s3 = ints_of(run_op("mlm_mask", {ids}, a, 3)[1]),
             s4 = ints_of(run_op("mlm_mask", {ids}, a, 4)[1]);
  EXPECT_NE(s3, s4);
  EXPECT_EQ(s3, ints_of(run_op("mlm_mask", {ids}, a, 3)[1]));
  a.set("fixed", true);
  const auto f3 = run_op("mlm_mask", {ids}, a, 3), f9 = run_op("mlm_mask", {ids}, a, 9);
  EXPECT_EQ(ints_of(f3[0]), ints_of(f9[0]));
  EXPECT_EQ(ints_of(f3[1]), ints_of(f9[1]));
  EXPECT_EQ(f3[2].data<float>()[0], f9[2].data<float>()[0]);
  EXPECT_NE(ints_of(f3[1]), s3);  // fixed draws step 0's numbers, not step 3's
}

TEST(MlmMask, RejectsBadAttributes) {
  Graph g;
  GraphBuilder b(g);
  const ValueId ids = b.input("ids", {2, 3}, DType::i64);
  const Attrs ok{{"vocab", int64_t{10}}, {"mask_id", int64_t{9}}};
  EXPECT_NO_THROW(b.op("mlm_mask", {ids}, ok));
  EXPECT_THROW(b.op("mlm_mask", {ids}, {{"vocab", int64_t{10}}}), Error);  // no mask_id
  EXPECT_THROW(b.op("mlm_mask", {b.input("x", {2, 3})}, ok), Error);       // f32 ids
  for (const auto& [k, v] : std::vector<std::pair<std::string, Attr>>{{"p", 1.5},
                                                                      {"mask_p", -0.1},
                                                                      {"random_p", 0.3},
                                                                      {"vocab", int64_t{0}},
                                                                      {"fixed", int64_t{1}},
                                                                      {"micro_batches", int64_t{0}}}) {
    Attrs bad = ok;
    bad.set(k, v);
    EXPECT_THROW(b.op("mlm_mask", {ids}, bad), Error) << k;
  }
}

// Padded keys are as good as absent: sdpa with key_ids equals sdpa over the visible keys alone (non-causal,
// where dropping keys shifts no mask), on the CPU kernel in f64 and f32.
TEST(SdpaKeyPadding, EqualsAttentionOverTheVisibleKeysOnly) {
  for (DType t : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor q = uniform_tensor({1, 2, 5, 4}, t, 1), k = uniform_tensor({1, 2, 7, 4}, t, 2),
                 v = uniform_tensor({1, 2, 7, 3}, t, 3);
    const Tensor ids = Tensor::from<int64_t>({1, 7}, {5, 0, 5, 5, 0, 5, 5});  // pad_id 0: keys 1 and 4
    const Attrs a{{"causal", false}, {"pad_id", int64_t{0}}};
    const auto masked = run_op("sdpa", {q, k, v, ids}, a)[0].to_f64();
    auto keep = [](const Tensor& x, int64_t d) {  // keys 0, 2, 3, 5, 6 of both heads
      const auto all = x.to_f64();
      std::vector<double> out;
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t j : {0, 2, 3, 5, 6})
          for (int64_t c = 0; c < d; ++c) out.push_back(all[static_cast<size_t>((h * 7 + j) * d + c)]);
      Tensor r = Tensor::empty({1, 2, 5, d}, x.dtype());
      r.fill_from(out);
      return r;
    };
    const auto plain = run_op("sdpa", {q, keep(k, 4), keep(v, 3)}, {{"causal", false}})[0].to_f64();
    ASSERT_EQ(masked.size(), plain.size());
    for (size_t e = 0; e < plain.size(); ++e)
      EXPECT_NEAR(masked[e], plain[e], t == DType::f64 ? 1e-14 : 1e-6);
  }
}

// A batch whose keys are all padding, and causal rows whose visible keys are all padding: output 0 and every
// gradient 0 there (dk, dv of padded keys too), nothing NaN, in f64 and in f32 (the kernel's own exp).
TEST(SdpaKeyPadding, RowsThatSeeNoKeyGiveZeroAndZeroGradients) {
  const OpDef& def = OpRegistry::get().at("sdpa");
  for (const std::string label : {"full key padding, batch 1 all padding",
                                  "causal left padding (first rows see nothing), right padding"})
    for (DType t : {DType::f64, DType::f32}) {
      SCOPED_TRACE(cat(label, " ", dtype_name(t)));
      const auto samples = def.samples();
      const auto it =
          std::find_if(samples.begin(), samples.end(), [&](const OpSample& x) { return x.label == label; });
      ASSERT_NE(it, samples.end());
      SampleProgram sp = build_sample(def, *it, /*with_grad=*/true, t);
      fill_all(*it, sp, 3);
      run_loss(sp);
      const Shape qs = it->inputs[0].shape, ks = it->inputs[1].shape;
      const int64_t H = qs[1], T = qs[2], S = ks[2];
      const auto ids = sp.exec->tensor("x3").to_f64();
      const int64_t pad = it->attrs.i("pad_id");
      const bool causal = it->attrs.b("causal", true);
      auto sees_nothing = [&](int64_t b, int64_t i) {
        for (int64_t j = 0; j < S; ++j)
          if ((!causal || j <= i + S - T) && ids[static_cast<size_t>(b * S + j)] != static_cast<double>(pad))
            return false;
        return true;
      };
      const auto out = sp.exec->output("out0").to_f64(), dq = sp.exec->output("grad/x0").to_f64(),
                 dk = sp.exec->output("grad/x1").to_f64(), dv = sp.exec->output("grad/x2").to_f64();
      for (double x : out) ASSERT_TRUE(std::isfinite(x));
      for (const auto* g : {&dq, &dk, &dv})
        for (double x : *g) ASSERT_TRUE(std::isfinite(x));
      int empty_rows = 0;
      for (int64_t bh = 0; bh < qs[0] * H; ++bh)
        for (int64_t i = 0; i < T; ++i) {
          if (!sees_nothing(bh / H, i)) continue;
          ++empty_rows;
          for (int64_t c = 0; c < it->inputs[2].shape[3]; ++c)
            EXPECT_EQ(out[static_cast<size_t>((bh * T + i) * it->inputs[2].shape[3] + c)], 0.0);
          for (int64_t c = 0; c < qs[3]; ++c)
            EXPECT_EQ(dq[static_cast<size_t>((bh * T + i) * qs[3] + c)], 0.0);
        }
      EXPECT_GT(empty_rows, 0);
      for (int64_t bh = 0; bh < qs[0] * H; ++bh)
        for (int64_t j = 0; j < S; ++j) {
          if (ids[static_cast<size_t>(bh / H * S + j)] != static_cast<double>(pad)) continue;
          for (int64_t c = 0; c < ks[3]; ++c)
            EXPECT_EQ(dk[static_cast<size_t>((bh * S + j) * ks[3] + c)], 0.0);
          for (int64_t c = 0; c < it->inputs[2].shape[3]; ++c)
            EXPECT_EQ(dv[static_cast<size_t>((bh * S + j) * it->inputs[2].shape[3] + c)], 0.0);
        }
    }
}

// Split over the data axis, key_ids follow the batch (each rank its rows), and rope and mlm_mask keep the
// batch split: no gather anywhere.
TEST(SdpaKeyPadding, KeyIdsRopeAndMlmMaskKeepTheBatchSplit) {
  Graph g;
  GraphBuilder b(g);
  const ValueId ids = b.input("ids", {4, 6}, DType::i64);
  const auto masked = b.op("mlm_mask", {ids}, {{"vocab", int64_t{9}}, {"mask_id", int64_t{8}}});
  const ValueId q = b.op1("rope", {b.input("q", {4, 2, 6, 8})}),
                k = b.op1("rope", {b.input("k", {4, 2, 6, 8})});
  const ValueId att =
      b.op("sdpa", {q, k, b.input("v", {4, 2, 6, 8}), masked[0]}, {{"pad_id", int64_t{0}}})[0];
  g.mark_output("att", att);
  g.mark_output("labels", masked[1]);
  split_over_axis(g, MeshAxis::data, 2, 1);
  int gathers = 0;
  for (NodeId id : g.live_nodes_topological()) {
    const Node& n = g.node(id);
    gathers += n.op == "sbp_all_gather";
    if (n.op == "sdpa") {
      EXPECT_EQ(g.value(n.inputs[3]).shape(), (Shape{2, 6}));
    }
    if (n.op == "mlm_mask") {
      EXPECT_EQ(n.attrs.ints("rng_start"), (std::vector<int64_t>{2, 0}));
    }
  }
  EXPECT_EQ(gathers, 0);
  EXPECT_EQ(g.value(g.find_value("ids")).shape(), (Shape{2, 6}));
}

TEST(SdpaKeyPadding, RejectsMismatchedKeyIdsAndPadId) {
  Graph g;
  GraphBuilder b(g);
  const ValueId q = b.input("q", {2, 1, 3, 4}), k = b.input("k", {2, 1, 5, 4}),
                v = b.input("v", {2, 1, 5, 4});
  const ValueId ids = b.input("ids", {2, 5}, DType::i64);
  const Attrs a{{"causal", false}, {"pad_id", int64_t{0}}};
  EXPECT_NO_THROW(b.op("sdpa", {q, k, v, ids}, a));
  EXPECT_THROW(b.op("sdpa", {q, k, v, ids}, {{"causal", false}}), Error);  // no pad_id
  EXPECT_THROW(b.op("sdpa", {q, k, v}, a), Error);                         // pad_id without key_ids
  EXPECT_THROW(b.op("sdpa", {q, k, v, b.input("short", {2, 4}, DType::i64)}, a), Error);
  EXPECT_THROW(b.op("sdpa", {q, k, v, b.input("f", {2, 5})}, a), Error);
  EXPECT_THROW(b.op("sdpa", {q, k, v, ids, ids}, a), Error);
  EXPECT_THROW(b.op("sdpa", {q, k, v, ids}, {{"causal", false}, {"pad_id", 0.5}}), Error);
}

}  // namespace
}  // namespace flowrun::testing
