// Optimizer pass and ops against double-precision references of PyTorch's algorithms (SGD, Adam, AdamW,
// weight decay, clipping), gradient accumulation against one big batch, and the learning-rate schedules.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <numbers>

#include "models.h"
#include "ops/cpu/optim.h"
#include "optim/schedule.h"

namespace flowrun::testing {
namespace {

// The tiny model: y = x W^T + b, loss = mean((y - target)^2), all f64.
constexpr int64_t kBatch = 4, kIn = 3, kOut = 2;

struct TinyData {
  std::vector<double> x, target;
};

TinyData tiny_data() {
  TinyData d;
  for (int64_t i = 0; i < kBatch * kIn; ++i) d.x.push_back(std::sin(1.0 + static_cast<double>(i)));
  for (int64_t i = 0; i < kBatch * kOut; ++i) d.target.push_back(std::cos(0.5 * static_cast<double>(i)));
  return d;
}

Executor compile_tiny(const OptimizerSpec& spec) {
  Graph g;
  GraphBuilder b(g);
  const ValueId x = b.input("x", {kBatch, kIn}, DType::f64);
  const ValueId y =
      b.op1("linear", {x, b.param("W", {kOut, kIn}, DType::f64), b.param("b", {kOut}, DType::f64)});
  g.mark_output("loss", b.op1("mse_loss", {y, b.input("target", {kBatch, kOut}, DType::f64)}));
  CompileOptions opts;
  opts.optimizer = spec;
  return Executor(compile(std::move(g), opts));
}

// Analytic gradients of the tiny model's loss at (W, b).
std::pair<std::vector<double>, std::vector<double>> tiny_grads(const TinyData& d,
                                                               const std::vector<double>& W,
                                                               const std::vector<double>& bias) {
  std::vector<double> dW(W.size(), 0.0), db(bias.size(), 0.0);
  for (int64_t i = 0; i < kBatch; ++i)
    for (int64_t o = 0; o < kOut; ++o) {
      double y = bias[static_cast<size_t>(o)];
      for (int64_t k = 0; k < kIn; ++k)
        y += d.x[static_cast<size_t>(i * kIn + k)] * W[static_cast<size_t>(o * kIn + k)];
      const double dy =
          2.0 * (y - d.target[static_cast<size_t>(i * kOut + o)]) / static_cast<double>(kBatch * kOut);
      db[static_cast<size_t>(o)] += dy;
      for (int64_t k = 0; k < kIn; ++k)
        dW[static_cast<size_t>(o * kIn + k)] += dy * d.x[static_cast<size_t>(i * kIn + k)];
    }
  return {dW, db};
}

// One parameter and its optimizer state in the reference.
struct RefParam {
  std::vector<double> p, buf, m, v;
  double wd = 0;
};

// PyTorch's SGD (the momentum buffer is the gradient at step 1, undampened), Adam and AdamW on one
// parameter, in double; `coef` multiplies the gradient first (clipping).
void ref_update(const OptimizerSpec& s, RefParam& r, const std::vector<double>& grad, double lr, int64_t t,
                double coef) {
  r.buf.resize(r.p.size(), 0.0);
  r.m.resize(r.p.size(), 0.0);
  r.v.resize(r.p.size(), 0.0);
  const double bc1 = 1 - std::pow(s.beta1, static_cast<double>(t)),
               bc2 = 1 - std::pow(s.beta2, static_cast<double>(t));
  for (size_t i = 0; i < r.p.size(); ++i) {
    double g = coef * grad[i];
    if (s.type == "adamw") {
      r.p[i] *= 1 - lr * r.wd;
    } else {
      g += r.wd * r.p[i];
    }
    if (s.type == "sgd") {
      if (s.momentum != 0) {
        r.buf[i] = t == 1 ? g : s.momentum * r.buf[i] + (1 - s.dampening) * g;
        g = s.nesterov ? g + s.momentum * r.buf[i] : r.buf[i];
      }
      r.p[i] -= lr * g;
      continue;
    }
    r.m[i] = s.beta1 * r.m[i] + (1 - s.beta1) * g;
    r.v[i] = s.beta2 * r.v[i] + (1 - s.beta2) * g * g;
    r.p[i] -= lr * (r.m[i] / bc1) / (std::sqrt(r.v[i] / bc2) + s.eps);
  }
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rel,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], rel * std::max(1e-3, std::fabs(want[i]))) << what << "[" << i << "]";
}

// Trains the tiny model for 5 steps (lr changing every step) in the graph and in the reference, with weight
// decay wd_W on W and wd_b on b in the reference; checks both parameters (and grad_norm) after every step.
void expect_tiny_matches_reference(const OptimizerSpec& spec, double wd_W, double wd_b) {
  const TinyData d = tiny_data();
  Executor ex = compile_tiny(spec);
  RefParam W{{0.3, -0.2, 0.1, 0.05, -0.4, 0.25}, {}, {}, {}, wd_W}, b{{0.2, -0.1}, {}, {}, {}, wd_b};
  ex.tensor("W").fill_from(W.p);
  ex.tensor("b").fill_from(b.p);
  ex.tensor("x").fill_from(d.x);
  ex.tensor("target").fill_from(d.target);
  for (int64_t t = 1; t <= 5; ++t) {
    SCOPED_TRACE(cat("step ", t));
    // The graph's lr and clipping coefficient are f32 scalars: the reference rounds them the same way.
    const double lr = static_cast<float>(0.05 * (1.0 + 0.2 * static_cast<double>(t)));
    ex.tensor("lr").fill_from({lr});
    ex.tensor("opt/step").data<int64_t>()[0] = t;
    ex.run();
    const auto [dW, db] = tiny_grads(d, W.p, b.p);
    double sq = 0;
    for (double g : dW) sq += g * g;
    for (double g : db) sq += g * g;
    const double norm = std::sqrt(sq);
    const double coef =
        spec.clip_grad_norm > 0
            ? static_cast<float>(std::min(1.0, spec.clip_grad_norm / (static_cast<float>(norm) + 1e-6)))
            : 1.0;
    if (spec.clip_grad_norm > 0) {
      EXPECT_LT(coef, 1.0) << "the test should exercise clipping";
      EXPECT_NEAR(ex.output("grad_norm").to_f64()[0], norm, 1e-6 * norm);
    }
    ref_update(spec, W, dW, lr, t, coef);
    ref_update(spec, b, db, lr, t, coef);
    expect_close(ex.tensor("W").to_f64(), W.p, 1e-6, "W");
    expect_close(ex.tensor("b").to_f64(), b.p, 1e-6, "b");
  }
}

OptimizerSpec adam_spec(const std::string& type, double wd) {
  OptimizerSpec s;
  s.type = type;
  s.weight_decay = wd;
  return s;
}

TEST(OptimAdam, MatchesPyTorchReferenceOverFiveSteps) {
  expect_tiny_matches_reference(adam_spec("adam", 0.01), 0.01, 0.01);
}

TEST(OptimAdam, AdamWMatchesPyTorchReferenceOverFiveSteps) {
  OptimizerSpec s = adam_spec("adamw", 0.1);
  s.beta1 = 0.8;
  s.beta2 = 0.95;
  s.eps = 1e-6;
  expect_tiny_matches_reference(s, 0.1, 0.1);
}

TEST(OptimSgd, MomentumAndNesterovMatchReference) {
  for (bool nesterov : {false, true}) {
    SCOPED_TRACE(nesterov ? "nesterov" : "momentum");
    OptimizerSpec s;
    s.type = "sgd";
    s.momentum = 0.9;
    s.nesterov = nesterov;
    s.weight_decay = 0.01;
    expect_tiny_matches_reference(s, 0.01, 0.01);
  }
}

// PyTorch's dampening: the first step's buffer is the gradient itself (not (1 - dampening) * grad), later
// ones add (1 - dampening) * grad; with and without Nesterov's dampening-free rule beside it.
TEST(OptimSgd, DampeningStartsTheBufferAtTheGradient) {
  OptimizerSpec s;
  s.type = "sgd";
  s.momentum = 0.9;
  s.dampening = 0.5;
  s.weight_decay = 0.01;
  expect_tiny_matches_reference(s, 0.01, 0.01);
}

// One update of f32 parameters from zero state at step 1, in the single and the multi-tensor op: with no
// weight decay the gradient arrives unchanged, so Adam's moments are exactly float(1 - beta) * g and
// float(1 - beta) * g * g (1 - beta formed in double and rounded once, as PyTorch's Python floats; 1 -
// float(0.999) would be 0.000999987); SGD's dampened buffer is g at step 1 and 0.9 * g + float(1 - 0.3) * g
// at step 2.
TEST(OptimF32, OneMinusBetaAndDampeningAreRoundedOnce) {
  const int64_t n = 6;
  std::vector<float> grad;
  for (int64_t i = 0; i < n; ++i) grad.push_back(0.37f * static_cast<float>(i + 1) - 1.1f);
  for (const std::string op : {"adamw_update", "adamw_update_multi", "sgd_update", "sgd_update_multi"}) {
    SCOPED_TRACE(op);
    const bool sgd = op.rfind("sgd", 0) == 0, multi = op.find("multi") != std::string::npos;
    Graph g;
    GraphBuilder b(g);
    const ValueId p = g.add_state("p", {n}, DType::f32), gr = b.input("g", {n}, DType::f32),
                  s0 = g.add_state("s0", {n}, DType::f32), s1 = g.add_state("s1", {n}, DType::f32),
                  lr = b.input("lr", {}, DType::f32), step = b.input("step", {}, DType::i64);
    std::vector<ValueId> in = sgd ? std::vector<ValueId>{p, gr, s0} : std::vector<ValueId>{p, gr, s0, s1};
    in.insert(in.end(), {lr, step});
    Attrs a = sgd ? Attrs{{"momentum", 0.9}, {"dampening", 0.3}, {"nesterov", false}, {"weight_decay", 0.0}}
                  : Attrs{{"beta1", 0.9},
                          {"beta2", 0.999},
                          {"eps", 1e-8},
                          {"weight_decay", 0.0},
                          {"decoupled", true}};
    if (multi) a.set("tensors", int64_t{1});
    b.op(op, in, a, "update");
    CompileOptions opts;
    opts.loss = "";
    Executor ex(compile(std::move(g), opts));
    ex.tensor("g").fill_from(std::vector<double>(grad.begin(), grad.end()));
    ex.tensor("lr").fill_from({0.01});
    ex.tensor("step").data<int64_t>()[0] = 1;
    ex.run();
    const float c1 = static_cast<float>(1 - 0.9), c2 = static_cast<float>(1 - 0.999);
    for (int64_t i = 0; i < n; ++i) {
      const float gi = grad[static_cast<size_t>(i)];
      if (sgd) {
        EXPECT_EQ(ex.tensor("s0").data<float>()[i], gi) << i;
      } else {
        EXPECT_EQ(ex.tensor("s0").data<float>()[i], c1 * gi) << i;
        EXPECT_EQ(ex.tensor("s1").data<float>()[i], c2 * gi * gi) << i;
      }
    }
    if (!sgd) continue;
    ex.tensor("step").data<int64_t>()[0] = 2;
    ex.run();
    for (int64_t i = 0; i < n; ++i) {
      const float gi = grad[static_cast<size_t>(i)];
      EXPECT_EQ(ex.tensor("s0").data<float>()[i], 0.9f * gi + static_cast<float>(1 - 0.3) * gi) << i;
    }
  }
}

TEST(OptimDecay, OneDimensionalParamsUndecayedWhenDecay1dIsOff) {
  for (const std::string type : {"sgd", "adam", "adamw"}) {
    SCOPED_TRACE(type);
    OptimizerSpec s = adam_spec(type, 0.5);
    s.decay_1d = false;
    expect_tiny_matches_reference(s, 0.5, 0.0);
  }
}

TEST(OptimDecay, BiasDecayChangesTheResult) {
  // The reference with decay on the bias must disagree when decay_1d is off: the tests above can fail.
  OptimizerSpec s = adam_spec("adamw", 0.5);
  s.decay_1d = false;
  const TinyData d = tiny_data();
  Executor off = compile_tiny(s);
  s.decay_1d = true;
  Executor on = compile_tiny(s);
  for (Executor* ex : {&off, &on}) {
    ex->tensor("W").fill_from({0.3, -0.2, 0.1, 0.05, -0.4, 0.25});
    ex->tensor("b").fill_from({0.2, -0.1});
    ex->tensor("x").fill_from(d.x);
    ex->tensor("target").fill_from(d.target);
    ex->tensor("lr").fill_from({0.1});
    ex->tensor("opt/step").data<int64_t>()[0] = 1;
    ex->run();
  }
  const double b_off = off.tensor("b").to_f64()[0], b_on = on.tensor("b").to_f64()[0];
  EXPECT_NE(b_off, 0.2) << "the bias must still be trained";
  // AdamW decays before its step: the decayed bias ends lower by exactly b * lr * weight_decay.
  EXPECT_NEAR(b_off - b_on, 0.2 * static_cast<float>(0.1) * 0.5, 1e-12);
}

TEST(OptimClip, AppliedUpdateIsTheClippedOne) {
  for (const std::string type : {"sgd", "adam"}) {
    SCOPED_TRACE(type);
    OptimizerSpec s = adam_spec(type, 0.0);
    s.momentum = type == "sgd" ? 0.5 : 0.0;
    s.clip_grad_norm = 0.05;
    expect_tiny_matches_reference(s, 0.0, 0.0);
  }
}

TEST(OptimPass, RejectsUnknownOptimizerAndBadAccumulation) {
  EXPECT_THROW(compile_tiny(adam_spec("lamb", 0.0)), Error);
  OptimizerSpec s = adam_spec("sgd", 0.0);
  s.accumulation = 0;
  EXPECT_THROW(compile_tiny(s), Error);
}

TEST(OptimNorm, GlobalNormIsTheSameOnAnyThreadCount) {
  Graph g;
  GraphBuilder b(g);
  const ValueId big = b.input("big", {5 * cpu::kNormBlock + 3}, DType::f32),
                small = b.input("small", {7}, DType::f32);
  g.mark_output("norm", b.op1("global_norm", {big, small}));
  CompileOptions opts;
  opts.loss = "";
  Executor ex(compile(std::move(g), opts));
  double sum = 0;
  for (const char* name : {"big", "small"}) {
    Tensor& t = ex.tensor(name);
    const RngStream r{3, t.numel() == 7 ? 1u : 0u};
    for (int64_t i = 0; i < t.numel(); ++i) {
      t.data<float>()[i] = 2 * r.uniform(static_cast<uint64_t>(i)) - 1;
      sum += static_cast<double>(t.data<float>()[i]) * t.data<float>()[i];
    }
  }
  const int threads = omp_get_max_threads();
  std::vector<float> norms;
  for (int n : {1, 2, 3, 4}) {
    omp_set_num_threads(n);
    ex.run();
    norms.push_back(ex.output("norm").data<float>()[0]);
  }
  omp_set_num_threads(threads);
  for (float n : norms) EXPECT_EQ(n, norms[0]);
  EXPECT_NEAR(norms[0], std::sqrt(sum), 1e-6 * std::sqrt(sum));
}

// Gradient accumulation: the MLP trained on 32 samples per step, in one batch or in `accumulation`
// micro-batches of the same samples; returns its parameters after 5 steps and the grad_norm of each step.
struct Trained {
  std::map<std::string, std::vector<double>> params;
  std::vector<double> norms;
};

constexpr int64_t kSamples = 32, kFeatures = 6, kClasses = 3, kSteps = 5;

Trained train_mlp(OptimizerSpec spec, int64_t accumulation, DType dtype) {
  spec.accumulation = accumulation;
  const int64_t micro_batch = kSamples / accumulation;
  Graph g;
  build_mlp(g, micro_batch, {kFeatures, 8, kClasses}, /*with_loss=*/true, dtype);
  CompileOptions opts;
  opts.optimizer = spec;
  Executor ex(compile(std::move(g), opts));
  init_params(ex, 11);
  const RngStream data{5, 0};
  Trained out;
  for (int64_t step = 0; step < kSteps; ++step) {
    ex.tensor("lr").fill_from({0.05});
    if (spec.type != "sgd") ex.tensor("opt/step").data<int64_t>()[0] = step + 1;
    for (int64_t micro = 0; micro < accumulation; ++micro) {
      std::vector<double> x, y;
      for (int64_t i = 0; i < micro_batch; ++i) {
        const auto row = static_cast<uint64_t>(step * kSamples + micro * micro_batch + i);
        for (int64_t f = 0; f < kFeatures; ++f)
          x.push_back(2.0 * data.uniform(row * kFeatures + static_cast<uint64_t>(f)) - 1.0);
        y.push_back(static_cast<double>(data.block(1000000 + row)[0] % kClasses));
      }
      ex.tensor("x").fill_from(x);
      ex.tensor("y").fill_from(y);
      if (accumulation > 1) ex.tensor("opt/micro").data<int64_t>()[0] = micro;
      ex.run(/*apply=*/micro == accumulation - 1);
    }
    if (spec.clip_grad_norm > 0) out.norms.push_back(ex.output("grad_norm").to_f64()[0]);
  }
  for (const auto& [name, t] : ex.persistent())
    if (ex.program().graph.value(ex.program().graph.find_value(name)).kind == ValueKind::param)
      out.params[name] = t.to_f64();
  return out;
}

void expect_accumulation_matches_big_batch(const OptimizerSpec& spec, DType dtype, double rel) {
  const Trained big = train_mlp(spec, 1, dtype), acc = train_mlp(spec, 4, dtype);
  ASSERT_EQ(big.params.size(), 4u);
  for (const auto& [name, want] : big.params) {
    SCOPED_TRACE(name);
    double scale = 0;
    for (double w : want) scale = std::max(scale, std::fabs(w));
    const std::vector<double>& got = acc.params.at(name);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], rel * scale) << "[" << i << "]";
  }
  ASSERT_EQ(big.norms.size(), acc.norms.size());
  for (size_t i = 0; i < big.norms.size(); ++i) EXPECT_NEAR(acc.norms[i], big.norms[i], 1e-6 * big.norms[i]);
}

OptimizerSpec sgd_momentum() {
  OptimizerSpec s;
  s.type = "sgd";
  s.momentum = 0.9;
  s.weight_decay = 1e-3;
  return s;
}

OptimizerSpec adamw_clipped() {
  OptimizerSpec s = adam_spec("adamw", 0.01);
  s.clip_grad_norm = 0.1;  // below the MLP's gradient norm, so clipping is active
  return s;
}

TEST(OptimAccumulation, FourMicroBatchesMatchOneBatchF64) {
  expect_accumulation_matches_big_batch(sgd_momentum(), DType::f64, 1e-10);
  expect_accumulation_matches_big_batch(adamw_clipped(), DType::f64, 1e-10);
}

TEST(OptimAccumulation, FourMicroBatchesMatchOneBatchF32) {
  expect_accumulation_matches_big_batch(sgd_momentum(), DType::f32, 1e-5);
  expect_accumulation_matches_big_batch(adamw_clipped(), DType::f32, 1e-5);
}

TEST(OptimAccumulation, ClippingIsActiveInTheAccumulationTest) {
  const Trained t = train_mlp(adamw_clipped(), 4, DType::f64);
  for (double n : t.norms) EXPECT_GT(n, adamw_clipped().clip_grad_norm);
}

TEST(OptimAccumulation, ApplyPhaseRunsAfterEveryAccumulation) {
  Graph g;
  build_mlp(g, 8, {kFeatures, 8, kClasses}, /*with_loss=*/true);
  CompileOptions opts;
  opts.optimizer = adamw_clipped();
  opts.optimizer.accumulation = 4;
  const Program prog = compile(std::move(g), opts);
  int accumulates = 0, updates = 0;
  bool in_apply = false;
  for (NodeId id : prog.order) {
    const Node& n = prog.graph.node(id);
    if (n.phase == 1) in_apply = true;
    EXPECT_FALSE(in_apply && n.phase == 0) << n.name << " (every step) runs after the apply phase began";
    if (n.op == "grad_accumulate") {
      ++accumulates;
      EXPECT_EQ(n.phase, 0) << n.name;
    }
    if (n.op == "global_norm" || n.op == "clip_coef" || n.op == "adamw_update") {
      EXPECT_EQ(n.phase, 1) << n.name;
    }
    updates += n.op == "adamw_update";
  }
  EXPECT_EQ(accumulates, 4);
  EXPECT_EQ(updates, 4);
  for (const char* state : {"opt/fc1/weight/grad_acc", "opt/fc1/weight/m", "opt/fc2/bias/v"})
    EXPECT_NE(prog.graph.find_value(state), kNoValue) << state;
  EXPECT_EQ(prog.graph.value(prog.graph.find_value("opt/micro")).dtype(), DType::i64);
}

// Schedules.
TEST(Schedule, ConstantWithWarmup) {
  ScheduleConfig s;
  s.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 0.8, 0, 100), 0.2);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 0.8, 2, 100), 0.6);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 0.8, 3, 100), 0.8);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 0.8, 50, 100), 0.8);
}

TEST(Schedule, StepEveryStepSizeAfterWarmup) {
  ScheduleConfig s;
  s.type = "step";
  s.step_size = 10;
  s.gamma = 0.5;
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 9, 100), 1.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 10, 100), 0.5);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 25, 100), 0.25);
  s.warmup_steps = 5;
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 1, 100), 0.4);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 14, 100), 1.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 15, 100), 0.5);
  s.step_size = 0;
  EXPECT_THROW(scheduled_lr(s, 1.0, 15, 100), Error);
}

TEST(Schedule, StepAtMilestones) {
  ScheduleConfig s;
  s.type = "step";
  s.milestones = {3, 7};
  s.gamma = 0.1;
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 2.0, 2, 100), 2.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 2.0, 3, 100), 0.2);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 2.0, 6, 100), 0.2);
  EXPECT_NEAR(scheduled_lr(s, 2.0, 7, 100), 0.02, 1e-15);
  EXPECT_NEAR(scheduled_lr(s, 2.0, 99, 100), 0.02, 1e-15);
}

TEST(Schedule, CosineToMinLr) {
  ScheduleConfig s;
  s.type = "cosine";
  s.min_lr = 0.1;
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 0, 100), 1.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 50, 100), 0.55);
  EXPECT_NEAR(scheduled_lr(s, 1.0, 25, 100), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi / 4)), 1e-15);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 100, 100), 0.1);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 150, 100), 0.1);
  s.warmup_steps = 10;
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 4, 100), 0.5);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 10, 100), 1.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 55, 100), 0.55);
}

TEST(Schedule, LinearToMinLr) {
  ScheduleConfig s;
  s.type = "linear";
  s.min_lr = 0.2;
  s.warmup_steps = 2;
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 0, 12), 0.5);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 2, 12), 1.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 7, 12), 0.6);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 12, 12), 0.2);
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 1.0, 20, 12), 0.2);
}

TEST(Schedule, UnknownTypeIsAnInputError) {
  ScheduleConfig s;
  s.type = "exponential";
  EXPECT_THROW(scheduled_lr(s, 1.0, 0, 10), Error);
}

}  // namespace
}  // namespace flowrun::testing
