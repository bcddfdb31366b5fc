// The mixed-precision pass (which ops run in which dtype, where casts go) and fp16 loss scaling (unscaled
// updates, skipped steps, the scaler's state) on a small graph with every policy in it.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "graph/builder.h"
#include "graph/passes.h"
#include "runtime/executor.h"

namespace flowrun {
namespace {

constexpr int64_t kBatch = 8, kDim = 16, kClasses = 5;

// x -> layernorm (f32 policy) -> linear (low) -> relu (follows) -> + x (mixed: promoted to f32) -> linear
// (low) -> cross_entropy (f32).
Graph mixed_graph() {
  Graph g;
  GraphBuilder b(g);
  const ValueId x = b.input("x", {kBatch, kDim});
  const ValueId y = b.input("y", {kBatch}, DType::i64);
  const ValueId ln =
      b.op("layernorm", {x, b.param("ln.g", {kDim}), b.param("ln.b", {kDim})}, {}, "ln")[0];
  const ValueId h = b.op1("linear", {ln, b.param("fc1.w", {kDim, kDim}), b.param("fc1.b", {kDim})}, {}, "fc1");
  const ValueId r = b.op1("relu", {h}, {}, "relu");
  const ValueId s = b.op1("add", {r, x}, {}, "residual");
  const ValueId logits =
      b.op1("linear", {s, b.param("fc2.w", {kClasses, kDim}), b.param("fc2.b", {kClasses})}, {}, "fc2");
  g.mark_output("loss", b.op("cross_entropy", {logits, y}, {}, "loss")[0]);
  return g;
}

CompileOptions options(DType compute, bool loss_scaling) {
  CompileOptions o;
  o.compute = compute;
  o.optimizer.type = "sgd";
  o.optimizer.momentum = 0.9;
  o.optimizer.loss_scaling = loss_scaling;
  return o;
}

const Node& forward_node(const Program& p, const std::string& name) {
  for (NodeId id : p.order)
    if (p.graph.node(id).name == name) return p.graph.node(id);
  throw std::runtime_error("no node " + name);
}

DType in_dtype(const Program& p, const Node& n, size_t i) { return p.graph.value(n.inputs[i]).dtype(); }

void feed(Executor& ex) {
  std::vector<double> x(kBatch * kDim);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7 * static_cast<double>(i));
  ex.tensor("x").fill_from(x);
  std::vector<double> y(kBatch);
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<double>(i % kClasses);
  ex.tensor("y").fill_from(y);
  ex.tensor("lr").fill_from({0.1});
  const char* params[] = {"ln.g", "ln.b", "fc1.w", "fc1.b", "fc2.w", "fc2.b"};
  for (size_t k = 0; k < 6; ++k) {
    Tensor& t = ex.tensor(params[k]);
    std::vector<double> v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.3 * std::cos(static_cast<double>(i + 7 * k));
    t.fill_from(v);
  }
}

TEST(Amp, PolicyDecidesEachOpsDtype) {
  for (DType low : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(low));
    const Program p = compile(mixed_graph(), options(low, false));
    const Node& ln = forward_node(p, "ln");
    const Node& fc1 = forward_node(p, "fc1");
    const Node& fc2 = forward_node(p, "fc2");
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(in_dtype(p, ln, i), DType::f32);
      EXPECT_EQ(in_dtype(p, fc1, i), low);
      EXPECT_EQ(in_dtype(p, fc2, i), low);
    }
    EXPECT_EQ(in_dtype(p, forward_node(p, "relu"), 0), low);  // follows its low input
    const Node& res = forward_node(p, "residual");
    EXPECT_EQ(in_dtype(p, res, 0), DType::f32);  // low relu + f32 x: promoted
    EXPECT_EQ(in_dtype(p, res, 1), DType::f32);
    EXPECT_EQ(in_dtype(p, forward_node(p, "loss"), 0), DType::f32);
    EXPECT_EQ(p.graph.value(p.graph.outputs().at("loss")).dtype(), DType::f32);
    // Master weights: parameters and their gradients stay f32.
    for (const auto& [param, grad] : p.graph.param_grads()) {
      EXPECT_EQ(p.graph.value(param).dtype(), DType::f32);
      EXPECT_EQ(p.graph.value(grad).dtype(), DType::f32) << p.graph.value(param).name;
    }
  }
}

TEST(Amp, CastsOnlyOnBoundariesAndOncePerValue) {
  const Program p = compile(mixed_graph(), options(DType::bf16, false));
  std::set<std::pair<ValueId, DType>> seen;
  std::set<std::string> cast_params;
  int forward_casts = 0;
  for (NodeId id : p.order) {
    const Node& n = p.graph.node(id);
    if (n.op != "cast") continue;
    const Value& in = p.graph.value(n.inputs[0]);
    const DType out = p.graph.value(n.outputs[0]).dtype();
    EXPECT_NE(in.dtype(), out) << n.name << " casts to its own dtype";
    EXPECT_TRUE(seen.insert({in.id, out}).second) << "a second cast of " << in.name << " to " << dtype_name(out);
    if (in.kind == ValueKind::param) {
      EXPECT_TRUE(cast_params.insert(in.name).second);
    }
    forward_casts += n.name.rfind("grad/", 0) != 0;
  }
  EXPECT_EQ(cast_params, (std::set<std::string>{"fc1.w", "fc1.b", "fc2.w", "fc2.b"}));
  // ln -> bf16 for fc1 (which ln writes itself on the CPU: fold_norm_casts), relu's bf16 -> f32 for the
  // residual, the sum -> bf16 for fc2, logits -> f32 (which fc2 writes itself where its bf16 kernel is
  // native: fold_f32_casts), and the four parameters: eight boundary edges.
  const bool folded = forward_node(p, "fc2").attrs.has("out_dtype");
  const bool norm_folded = forward_node(p, "ln").attrs.has("out_dtype");
  EXPECT_TRUE(norm_folded);
  EXPECT_EQ(forward_casts + folded + norm_folded, 8);
}

// fold_f32_casts: with native bf16 kernels, fc2 writes the f32 logits, and every parameter's f32 gradient is
// written by the matmul (weights) or reduce_sum (biases) that sums it, with no cast after it; the gradients
// flowing on between the layers stay bf16. f16 has no native GEMM on the CPU: nothing folds.
TEST(Amp, CastsToF32FoldIntoTheGemmsAndSumsThatFeedThem) {
  const OpDef& mm = OpRegistry::get().at("matmul");
  for (DType low : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(low));
    const KernelChoice k = select_kernel(mm, DeviceKind::cpu, low);
    const bool native = k.kernel && !k.widened;
    if (low == DType::bf16 && !native) GTEST_SKIP() << "no native bf16 GEMM on this machine";
    const Program p = compile(mixed_graph(), options(low, false));
    EXPECT_EQ(forward_node(p, "fc2").attrs.has("out_dtype"), native);
    EXPECT_EQ(p.graph.value(forward_node(p, "fc2").outputs[0]).dtype(), native ? DType::f32 : low);
    EXPECT_FALSE(forward_node(p, "fc1").attrs.has("out_dtype"));  // its result goes on in bf16 (relu)
    for (const auto& [param, grad] : p.graph.param_grads()) {
      const Value& pv = p.graph.value(param);
      if (pv.name.rfind("fc", 0) != 0) continue;
      const Node* src = &p.graph.node(p.graph.value(grad).producer);
      SCOPED_TRACE(pv.name);
      EXPECT_EQ(p.graph.value(grad).dtype(), DType::f32);
      // A bias gradient: reduce_sum (keepdims) reshaped to the bias.
      if (src->op == "reshape") src = &p.graph.node(p.graph.value(src->inputs[0]).producer);
      EXPECT_EQ(src->op, native ? (pv.shape().size() == 2 ? "matmul" : "reduce_sum") : "cast");
      EXPECT_EQ(src->attrs.has("out_dtype"), native);
    }
  }
}

// conv2d (low) -> batchnorm -> relu. In bf16 the CPU's batchnorm takes the convolution's bf16 output as it
// is, with f32 gamma and beta and f32 running statistics (state updated in place), and relu follows in bf16:
// no cast between the convolution and the next layer. f16 has no such kernel on the CPU: batchnorm runs in
// f32 there, its activations cast.
TEST(Amp, BatchnormKeepsBf16ActivationsWithF32Statistics) {
  for (DType low : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(low));
    Graph g;
    GraphBuilder b(g);
    const ValueId x = b.input("x", {2, 3, 6, 6});
    const ValueId c = b.op1("conv2d", {x, b.param("w", {4, 3, 3, 3})}, {}, "conv");
    const auto bn =
        b.op("batchnorm",
             {c, b.param("g", {4}), b.param("b", {4}), b.state("mean", {4}), b.state("var", {4})}, {}, "bn");
    const ValueId h = b.op1("relu", {bn[0]}, {}, "relu");
    g.mark_output("loss", b.op1("reduce_mean", {h}, {{"axes", std::vector<int64_t>{}}}));
    CompileOptions o = options(low, false);
    o.fuse = false;  // the relu stays a node of its own (fuse_backward would fold it into batchnorm)
    Program p = compile(std::move(g), o);
    EXPECT_EQ(in_dtype(p, forward_node(p, "conv"), 0), low);
    const Node& n = forward_node(p, "bn");
    const DType act = low == DType::bf16 ? low : DType::f32;
    EXPECT_EQ(in_dtype(p, n, 0), act);
    for (size_t i = 1; i < 5; ++i) EXPECT_EQ(in_dtype(p, n, i), DType::f32) << "batchnorm input " << i;
    EXPECT_EQ(p.graph.value(n.inputs[3]).kind, ValueKind::state);
    EXPECT_EQ(p.graph.value(n.outputs[1]).dtype(), DType::f32);  // the saved statistics
    EXPECT_EQ(in_dtype(p, forward_node(p, "relu"), 0), act);
    int forward_casts = 0;
    for (NodeId id : p.order) {
      const Node& k = p.graph.node(id);
      if (k.op == "cast" && p.graph.value(k.inputs[0]).kind != ValueKind::param)
        forward_casts += k.name.rfind("grad/", 0) != 0;
    }
    // x -> low for the convolution, then in bf16 relu's output -> f32 for reduce_mean, in f16 the
    // convolution's output -> f32 for batchnorm.
    EXPECT_EQ(forward_casts, 2);
    for (const auto& [param, grad] : p.graph.param_grads())
      EXPECT_EQ(p.graph.value(grad).dtype(), DType::f32) << p.graph.value(param).name;
    Executor ex(std::move(p));
    ex.tensor("lr").fill_from({0.1});
    ex.tensor("var").fill_from(std::vector<double>(4, 1.0));
    for (const char* name : {"x", "w"}) {
      std::vector<double> v(static_cast<size_t>(ex.tensor(name).numel()));
      for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5 + std::sin(0.3 * static_cast<double>(i));
      ex.tensor(name).fill_from(v);
    }
    ex.run();
    EXPECT_TRUE(std::isfinite(ex.output("loss").to_f64()[0]));
    EXPECT_NE(ex.tensor("mean").to_f64(), std::vector<double>(4, 0.0));  // the running mean moved
  }
}

// linear (low) -> layernorm / rmsnorm -> linear (low): in bf16 the norms read the first linear's bf16 output
// and write bf16 for the second, with f32 parameters and statistics; in f16 they run in f32 between casts.
TEST(Amp, RowNormsKeepBf16ActivationsWithF32Statistics) {
  for (const char* op : {"layernorm", "rmsnorm"})
    for (DType low : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(cat(op, " in ", dtype_name(low)));
      const bool centered = std::string(op) == "layernorm";
      Graph g;
      GraphBuilder b(g);
      const ValueId x = b.input("x", {kBatch, kDim});
      const ValueId y = b.input("y", {kBatch}, DType::i64);
      const ValueId h = b.op1("linear", {x, b.param("fc1.w", {kDim, kDim})}, {}, "fc1");
      std::vector<ValueId> in = {h, b.param("n.g", {kDim})};
      if (centered) in.push_back(b.param("n.b", {kDim}));
      const auto n = b.op(op, in, {}, "norm");
      const ValueId logits = b.op1("linear", {n[0], b.param("fc2.w", {kClasses, kDim})}, {}, "fc2");
      g.mark_output("loss", b.op("cross_entropy", {logits, y}, {}, "loss")[0]);
      const Program p = compile(std::move(g), options(low, false));
      const Node& node = forward_node(p, "norm");
      const DType act = low == DType::bf16 ? low : DType::f32;
      EXPECT_EQ(in_dtype(p, node, 0), act);
      for (size_t i = 1; i < node.inputs.size(); ++i) EXPECT_EQ(in_dtype(p, node, i), DType::f32);
      EXPECT_EQ(p.graph.value(node.outputs[0]).dtype(), act);
      EXPECT_EQ(p.graph.value(node.outputs[1]).dtype(), DType::f32);
      for (const auto& [param, grad] : p.graph.param_grads())
        EXPECT_EQ(p.graph.value(grad).dtype(), DType::f32) << p.graph.value(param).name;
    }
}

TEST(Amp, Fp32CompileHasNoCasts) {
  const Program p = compile(mixed_graph(), options(DType::f32, false));
  for (NodeId id : p.order) EXPECT_NE(p.graph.node(id).op, "cast");
}

TEST(Amp, LowPrecisionLossTracksFp32) {
  Executor ref(compile(mixed_graph(), options(DType::f32, false)));
  feed(ref);
  ref.run();
  const double want = ref.output("loss").to_f64()[0];
  for (DType low : {DType::bf16, DType::f16}) {
    Executor ex(compile(mixed_graph(), options(low, false)));
    feed(ex);
    ex.run();
    EXPECT_NEAR(ex.output("loss").to_f64()[0], want, 0.01 * want) << dtype_name(low);
  }
}

// An fp16 program with loss scaling, fed, its scale set to `scale`; step() runs one SGD step.
struct ScaledRun {
  Executor ex;
  explicit ScaledRun(float scale) : ex(compile(mixed_graph(), options(DType::f16, true))) {
    feed(ex);
    ex.tensor("amp/loss_scale").data<float>()[0] = scale;
  }
  std::vector<double> weights() { return ex.tensor("fc1.w").to_f64(); }
  std::vector<double> step() {
    ex.run();
    return weights();
  }
};

TEST(AmpLossScale, UpdatesAreUnscaled) {
  // Scaling the loss by 1024 and the update by 1/1024 gives (up to fp16 rounding of the gradients) the step
  // of scale 1, not a 1024x larger one.
  ScaledRun unit(1.0f), scaled(1024.0f);
  const std::vector<double> before = unit.weights();
  const auto one = unit.step(), big = scaled.step();
  double moved = 0;
  for (size_t i = 0; i < one.size(); ++i) {
    moved = std::max(moved, std::fabs(one[i] - before[i]));
    EXPECT_NEAR(big[i] - before[i], one[i] - before[i], 1e-2 * std::fabs(one[i] - before[i]) + 1e-6) << i;
  }
  EXPECT_GT(moved, 1e-3);
}

TEST(AmpLossScale, OverflowSkipsTheStepAndHalvesTheScale) {
  ScaledRun run(1e30f);  // fp16 gradients overflow to inf
  const std::vector<double> before = run.weights();
  EXPECT_EQ(run.step(), before) << "a step with non-finite gradients must not touch the parameters";
  Executor& ex = run.ex;
  EXPECT_EQ(ex.tensor("opt/fc1.w/momentum").to_f64(), std::vector<double>(before.size(), 0.0));
  EXPECT_EQ(ex.tensor("amp/loss_scale").data<float>()[0], 5e29f);
  EXPECT_EQ(ex.tensor("amp/skipped_steps").data<int64_t>()[0], 1);
  EXPECT_EQ(ex.tensor("amp/good_steps").data<int64_t>()[0], 0);
  // Once the scale fits, a step updates and counts towards growth (interval 2000: the scale stays).
  ex.tensor("amp/loss_scale").data<float>()[0] = 256.0f;
  EXPECT_NE(run.step(), before);
  EXPECT_EQ(ex.tensor("amp/loss_scale").data<float>()[0], 256.0f);
  EXPECT_EQ(ex.tensor("amp/good_steps").data<int64_t>()[0], 1);
  EXPECT_EQ(ex.tensor("amp/skipped_steps").data<int64_t>()[0], 1);
}

}  // namespace
}  // namespace flowrun
