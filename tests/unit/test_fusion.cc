// graph/passes.cc fuse_bias_gradients: gelu_grad (relu_grad) and the reduce_sum of a linear's bias gradient
// become one gelu_bias_grad (relu_bias_grad) node, which computes reduce_sum's bits (the kernel on every
// dtype and shape class, and a small MLP trained compiled against eager, in f32 and bf16); fold_norm_casts: a
// layer norm writes the bf16 its GEMM reads; fuse_residual_norm: it adds the residual stream's sum itself;
// fuse_norm_grad_residual: its gradient adds the residual's and writes the bf16 copy.
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "graph/passes.h"
#include "models.h"
#include "op_harness.h"
#include "ops/cpu/gemm_avx2.h"
#include "ops/cpu/matmul.h"
#include "ops/registry.h"

namespace flowrun::testing {
namespace {

// One call of op's native kernel for its first input's dtype.
std::vector<Tensor> run(const std::string& op, const Attrs& attrs, const std::vector<Tensor>& in) {
  const OpDef& def = OpRegistry::get().at(op);
  const KernelChoice k = select_kernel(def, DeviceKind::cpu, in[0].dtype());
  if (!k.kernel || k.widened)
    throw std::runtime_error(op + " has no native kernel for " + dtype_name(in[0].dtype()));
  return run_kernel(def, *k.kernel, attrs, in);
}

Tensor uniform(const Shape& s, DType t, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(numel(s)));
  const RngStream r{seed, 1};
  for (size_t i = 0; i < v.size(); ++i) v[i] = 4.0 * r.uniform(i) - 2.0;
  Tensor x = Tensor::empty(s, t);
  x.fill_from(v);
  return x;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// The row norm fusions' cases: rows of 7 (a tail only), 24, and 260 (vectors and a tail).
const std::vector<Shape> kRows = {{5, 7}, {3, 100, 24}, {4, 260}};

// f32 inputs of layernorm (x of shape s, gamma, beta) or rmsnorm (x, gamma).
std::vector<Tensor> norm_inputs(const std::string& op, const Shape& s) {
  const int64_t d = s.back();
  std::vector<Tensor> in = {uniform(s, DType::f32, 3), uniform({d}, DType::f32, 4)};
  if (op == "layernorm") in.push_back(uniform({d}, DType::f32, 5));
  return in;
}

// Both outputs bit for bit those of gelu_grad (relu_grad) then reduce_sum (keepdims over the leading axes):
// one chunk of rows (5), chunks of rows that do not divide them (300 = 3 x 100, 2 x 150), one and two column
// blocks, in f32, f64 and bf16 (the sum rounded to bf16, or kept in f32 as fold_f32_casts asks), erf and
// tanh GELU and relu (its y of either sign, zeros among them).
TEST(Fusion, ActivationBiasGradIsTheGradThenItsBiasSum) {
  const std::vector<std::pair<std::string, Attrs>> acts = {{"gelu", {{"approximate", std::string("none")}}},
                                                           {"gelu", {{"approximate", std::string("tanh")}}},
                                                           {"relu", {}}};
  for (DType t : {DType::f32, DType::f64, DType::bf16})
    for (const auto& [act, attrs] : acts)
      for (const Shape& s : std::vector<Shape>{{5, 7}, {2, 150, 20}, {300, 270}})
        for (const bool wide : {false, true}) {
          if (wide && t != DType::bf16) continue;
          SCOPED_TRACE(cat(dtype_name(t), " ", act, " ", attrs.s("approximate", ""), " ", shape_str(s),
                           wide ? " out_dtype f32" : ""));
          std::vector<Tensor> in = {uniform(s, t, 1), uniform(s, t, 2)};
          if (act == "relu") {  // some of y exactly 0, where relu_grad passes nothing
            std::vector<double> y = in[1].to_f64();
            for (size_t i = 0; i < y.size(); i += 3) y[i] = 0.0;
            in[1].fill_from(y);
          }
          Attrs a = attrs;
          const Tensor dx = run(act + "_grad", a, in)[0];
          std::vector<int64_t> axes(s.size() - 1);
          for (size_t i = 0; i < axes.size(); ++i) axes[i] = static_cast<int64_t>(i);
          Attrs sum{{"axes", axes}, {"keepdims", true}};
          if (wide) {
            sum.set("out_dtype", std::string("f32"));
            a.set("out_dtype", std::string("f32"));
          }
          const Tensor db = run("reduce_sum", sum, {dx})[0];
          const std::vector<Tensor> fused = run(act + "_bias_grad", a, in);
          EXPECT_TRUE(same_bytes(fused[0], dx));
          EXPECT_TRUE(same_bytes(fused[1], db));
        }
}

// fold_norm_casts: a layernorm or rmsnorm of f32 x writing bf16 y is the f32 norm with its y rounded once,
// bit for bit; the statistics are unchanged.
TEST(Fusion, NormWithBf16OutputIsTheF32NormRounded) {
  for (const std::string op : {"layernorm", "rmsnorm"})
    for (const Shape& s : kRows) {
      SCOPED_TRACE(op + " " + shape_str(s));
      const std::vector<Tensor> in = norm_inputs(op, s);
      const std::vector<Tensor> f32 = run(op, {}, in);
      const std::vector<Tensor> low = run(op, {{"out_dtype", std::string("bf16")}}, in);
      ASSERT_EQ(low.size(), f32.size());
      EXPECT_TRUE(same_bytes(low[0], f32[0].to(DType::bf16)));
      for (size_t i = 1; i < f32.size(); ++i) EXPECT_TRUE(same_bytes(low[i], f32[i]));
    }
}

// fuse_residual_norm: a layernorm or rmsnorm of x + r is the add, then the norm, bit for bit, and writes that
// sum; with y in bf16 too (fold_norm_casts).
TEST(Fusion, NormOfResidualSumIsTheAddThenTheNorm) {
  for (const std::string op : {"layernorm", "rmsnorm"})
    for (const Shape& s : kRows)
      for (const bool low : {false, true}) {
        SCOPED_TRACE(op + " " + shape_str(s) + (low ? " out_dtype bf16" : ""));
        std::vector<Tensor> in = norm_inputs(op, s);
        const Tensor x = in[0], r = uniform(s, DType::f32, 8);
        Attrs a;
        if (low) a.set("out_dtype", std::string("bf16"));
        const Tensor sum = run("add", {}, {x, r})[0];
        in[0] = sum;
        const std::vector<Tensor> plain = run(op, a, in);
        in[0] = x;
        in.push_back(r);
        a.set("residual", true);
        const std::vector<Tensor> fused = run(op, a, in);
        ASSERT_EQ(fused.size(), plain.size() + 1);
        for (size_t j = 0; j < plain.size(); ++j) EXPECT_TRUE(same_bytes(fused[j], plain[j])) << j;
        EXPECT_TRUE(same_bytes(fused.back(), sum));
      }
}

// fuse_norm_grad_residual: layernorm_grad and rmsnorm_grad with the residual add and the bf16 copy are the
// norm gradient, then the add, then the cast, bit for bit.
TEST(Fusion, NormGradWithResidualIsTheGradThenTheAddAndTheCast) {
  for (const std::string op : {"layernorm", "rmsnorm"})
    for (const Shape& s : kRows)
      for (const bool low : {false, true}) {
        SCOPED_TRACE(op + " " + shape_str(s) + (low ? " dx_bf16" : ""));
        const std::vector<Tensor> in = norm_inputs(op, s);
        const std::vector<Tensor> fwd = run(op, {}, in);
        std::vector<Tensor> grad_in = {uniform(s, DType::f32, 6), in[0], in[1]};
        for (size_t j = 1; j < fwd.size(); ++j) grad_in.push_back(fwd[j]);  // mean and rstd, or rstd
        const std::vector<Tensor> plain = run(op + "_grad", {}, grad_in);
        const Tensor r = uniform(s, DType::f32, 7);
        const Tensor sum = run("add", {}, {plain[0], r})[0];
        grad_in.push_back(r);
        Attrs a{{"residual", true}};
        if (low) a.set("dx_bf16", true);
        const std::vector<Tensor> fused = run(op + "_grad", a, grad_in);
        ASSERT_EQ(fused.size(), plain.size() + (low ? 1 : 0));
        EXPECT_TRUE(same_bytes(fused[0], sum));
        for (size_t j = 1; j < plain.size(); ++j) EXPECT_TRUE(same_bytes(fused[j], plain[j]));
        if (low) {
          EXPECT_TRUE(same_bytes(fused.back(), sum.to(DType::bf16)));
        }
      }
}

// fuse_backward's residual batchnorm: batchnorm with the residual (and relu) is batchnorm, then the add of
// the shortcut, then relu, bit for bit: in f32 and bf16 (the normalised value rounded before the add, as
// the add reads it), on planes in NCHW and nChw16c (AVX-512 there) and on (N, C) rows.
TEST(Fusion, BatchnormWithResidualIsTheNormThenTheAddAndRelu) {
  for (const DType t : {DType::f32, DType::bf16})
    for (const Shape& s : std::vector<Shape>{{6, 32, 5, 3}, {12, 16}})
      for (const bool blocked : {false, true})
        for (const bool relu : {false, true}) {
          if (blocked && s.size() == 2) continue;
          SCOPED_TRACE(cat(dtype_name(t), " ", shape_str(s), blocked ? " nChw16c" : "", relu ? " relu" : ""));
          const int64_t c = s[1];
          // Fresh running statistics for each call: the kernel updates them in place.
          auto inputs = [&] {
            return std::vector<Tensor>{uniform(s, DType::f32, 11).to(t), uniform({c}, DType::f32, 12),
                                       uniform({c}, DType::f32, 13), uniform({c}, DType::f32, 14),
                                       uniform({c}, DType::f32, 15)};
          };
          const Tensor r = uniform(s, DType::f32, 16).to(t);
          Attrs a{{"blocked", blocked}};
          const std::vector<Tensor> bn = run("batchnorm", a, inputs());
          Tensor want = run("add", {}, {bn[0], r})[0];
          if (relu) want = run("relu", {}, {want})[0];
          std::vector<Tensor> in = inputs();
          in.push_back(r);
          a.set("residual", true);
          a.set("relu", relu);
          const std::vector<Tensor> fused = run("batchnorm", a, in);
          ASSERT_EQ(fused.size(), bn.size());
          EXPECT_TRUE(same_bytes(fused[0], want));
          for (size_t j = 1; j < bn.size(); ++j) EXPECT_TRUE(same_bytes(fused[j], bn[j])) << j;
        }
}

// cross_entropy_grad's exps run 8 lanes at a time in f32 and the row's last columns one by one (cpu/nn.cc):
// the two give one value the same bits. Rows of 9 logits whose last repeats one of the first 8; the label
// elsewhere.
TEST(CrossEntropy, VectorExpsAreTheScalarOnes) {
  const int64_t rows = 512, C = 9;
  Tensor x = Tensor::empty({rows, C}, DType::f32);
  Tensor labels = Tensor::empty({rows}, DType::i64);
  const RngStream rng{7, 1};
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x.data<float>() + r * C;
    // Mostly within 12 of each other (exps far from 0 and 1), in every fourth row one 100 below (underflow).
    for (int64_t j = 0; j < 8; ++j) xr[j] = static_cast<float>(24.0 * rng.uniform(r * C + j) - 12.0);
    if (r % 4 == 0) xr[(r / 4) % 8] -= 100.0f;
    xr[8] = xr[r % 8];
    labels.data<int64_t>()[r] = (r % 8 + 1) % 8;
  }
  const std::vector<Tensor> fwd = run("cross_entropy", {}, {x, labels});
  const Tensor dx = run("cross_entropy_grad", {}, {Tensor::from<float>({}, {1.0f}), x, labels, fwd[1]})[0];
  for (int64_t r = 0; r < rows; ++r) {
    const float* d = dx.data<float>() + r * C;
    ASSERT_EQ(std::memcmp(&d[8], &d[r % 8], sizeof(float)), 0)
        << "row " << r << ": " << d[8] << " " << d[r % 8];
  }
}

// The backward end of the same fusion: relu_grad with a third input is the add of the two gradients, then
// relu_grad, bit for bit (masks above, at and below 0; f32 and bf16).
TEST(Fusion, ReluGradOfASumIsTheAddThenTheReluGrad) {
  for (const DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    const Shape s = {5, 37};
    const Tensor a = uniform(s, DType::f32, 21).to(t), b = uniform(s, DType::f32, 22).to(t);
    Tensor y = uniform(s, DType::f32, 23);
    float* py = y.data<float>();
    py[0] = 0.0f;
    py[1] = -0.0f;
    const Tensor mask = y.to(t);
    const Tensor want = run("relu_grad", {}, {run("add", {}, {a, b})[0], mask})[0];
    EXPECT_TRUE(same_bytes(run("relu_grad", {}, {a, mask, b})[0], want));
  }
}

// How many nodes of each op a program runs.
std::map<std::string, int> op_counts(const Program& p) {
  std::map<std::string, int> ops;
  for (NodeId id : p.order) ++ops[p.graph.node(id).op];
  return ops;
}

// compile() with SGD (momentum 0.9) in `compute`, eager or fused.
Program compile_sgd(Graph g, DType compute, bool eager) {
  CompileOptions opts = sgd_options(eager);
  opts.compute = compute;
  return compile(std::move(g), opts);
}

// The fused program (make(false)) trains 3 steps to the eager one's (make(true)) losses and weights, bit for
// bit.
template <typename Make>
void expect_trains_as_eager(Make make, const std::function<void(Executor&)>& setup = {}) {
  const auto [eager_losses, eager] = train_sgd(make(true), 3, setup);
  const auto [fused_losses, trained] = train_sgd(make(false), 3, setup);
  EXPECT_EQ(eager_losses, fused_losses);
  for (const auto& [name, v] : eager) EXPECT_EQ(v, trained.at(name)) << name;
}

// x (3, 100, 24) -> linear 24 + x = h -> layernorm -> linear 40 -> gelu (tanh) -> linear 24 -> + h -> mse
// against target (3, 100, 24): h's gradient is the layernorm gradient plus the residual's.
Program compile_mlp(DType compute, bool eager) {
  Graph g;
  GraphBuilder b(g);
  auto linear = [&](ValueId v, int64_t in, int64_t out, const std::string& name) {
    return b.op1("linear", {v, b.param(name + "/weight", {out, in}), b.param(name + "/bias", {out})}, {},
                 name);
  };
  const ValueId x = b.input("x", {3, 100, 24});
  // h is f32 in bf16 too (bf16 + f32 promotes), as a transformer's residual stream is.
  const ValueId h0 = b.op1("add", {linear(x, 24, 24, "in"), x}, {}, "stream");
  const ValueId xn =
      b.op("layernorm", {h0, b.param("ln/weight", {24}), b.param("ln/bias", {24})}, {}, "ln")[0];
  const ValueId h = b.op1("gelu", {linear(xn, 24, 40, "fc")}, {{"approximate", std::string("tanh")}}, "gelu");
  const ValueId out = b.op1("add", {linear(h, 40, 24, "proj"), h0}, {}, "residual");
  g.mark_output("loss", b.op1("mse_loss", {out, b.input("target", {3, 100, 24})}));
  return compile_sgd(std::move(g), compute, eager);
}

TEST(Fusion, FusedProgramTrainsBitwiseAsEager) {
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    if (t == DType::bf16 && !select_kernel(OpRegistry::get().at("gelu_bias_grad"), DeviceKind::cpu, t).kernel)
      GTEST_SKIP() << "no native bf16 kernel";
    const Program fused = compile_mlp(t, false);
    int n = 0;
    for (NodeId id : fused.order) {
      const Node& node = fused.graph.node(id);
      EXPECT_NE(node.op, "gelu_grad");
      if (node.op != "gelu_bias_grad") continue;
      ++n;
      // The bias gradient of fc, in f32 (the master gradient) whatever the compute type.
      EXPECT_EQ(fused.graph.value(node.outputs[1]).dtype(), DType::f32);
      EXPECT_EQ(fused.graph.value(node.outputs[1]).shape(), (Shape{1, 1, 40}));
    }
    EXPECT_EQ(n, 1);
    // In bf16 the layernorm of the f32 input writes the bf16 that fc reads (fold_norm_casts); its gradient
    // adds the residual's and, in bf16, writes the copy that in's backward reads (fuse_norm_grad_residual).
    int norms = 0, norm_grads = 0;
    for (NodeId id : fused.order) {
      const Node& node = fused.graph.node(id);
      EXPECT_FALSE(node.op == "add" && node.name != "residual") << node.name;
      if (node.op == "layernorm_grad") {
        ++norm_grads;
        EXPECT_TRUE(node.attrs.b("residual"));
        EXPECT_EQ(node.attrs.b("dx_bf16"), t == DType::bf16);
      }
      if (node.op != "layernorm") continue;
      ++norms;
      EXPECT_TRUE(node.attrs.b("residual"));  // the stream's add (fuse_residual_norm)
      EXPECT_EQ(fused.graph.value(node.outputs[0]).dtype(), t);
      EXPECT_EQ(node.attrs.has("out_dtype"), t == DType::bf16);
    }
    EXPECT_EQ(norms, 1);
    EXPECT_EQ(norm_grads, 1);
    expect_trains_as_eager([&](bool eager) { return compile_mlp(t, eager); });
  }
}

// x (rows, 40) -> linear 48 -> relu -> linear 10 -> mse against target (rows, 10), SGD with momentum 0.9,
// `weight_decay` and `nesterov`; `keep` sets keep_gradients.
Program compile_momentum_mlp(bool eager, int64_t rows, double weight_decay = 0, bool nesterov = false,
                             bool keep = false) {
  Graph g;
  GraphBuilder b(g);
  auto linear = [&](ValueId v, int64_t in, int64_t out, const std::string& name) {
    return b.op1("linear", {v, b.param(name + "/weight", {out, in}), b.param(name + "/bias", {out})}, {},
                 name);
  };
  const ValueId h = b.op1("relu", {linear(b.input("x", {rows, 40}), 40, 48, "fc")});
  g.mark_output("loss", b.op1("mse_loss", {linear(h, 48, 10, "head"), b.input("target", {rows, 10})}));
  CompileOptions opts = sgd_options(eager);
  opts.optimizer.weight_decay = weight_decay;
  opts.optimizer.nesterov = nesterov;
  opts.keep_gradients = keep;
  return compile(std::move(g), opts);
}

// fuse_bias_gradients on a relu: fc's bias gradient is summed by relu_bias_grad over 300 rows (three chunks
// of the sum), and left to relu_grad and reduce_sum over 100 (one chunk, where the fused kernel was slower);
// the same bits as eager either way.
TEST(Fusion, ReluBiasGradOverChunksOfRowsTrainsBitwiseAsEager) {
  for (const int64_t rows : {100, 300}) {
    SCOPED_TRACE(cat(rows, " rows"));
    std::map<std::string, int> ops = op_counts(compile_momentum_mlp(false, rows));
    EXPECT_EQ(ops["relu_bias_grad"], rows == 300 ? 1 : 0);
    EXPECT_EQ(ops["relu_grad"], rows == 300 ? 0 : 1);
    expect_trains_as_eager([&](bool eager) { return compile_momentum_mlp(eager, rows); });
  }
}

// fuse_momentum_products: fc's weight gradient is computed into its momentum buffer where its product was in
// the backward pass (not with the other updates at the end), the same bits as eager, with and without
// weight decay; the head's (10 rows, gemm_fuses_beta's skinny kernel on AVX-512) is fused only where that
// kernel does not take it; nothing is fused under Nesterov, with keep_gradients, or over 2048 rows where
// oneDNN cuts the product's K sum into chunks (not gemm_avx2's).
TEST(Fusion, MomentumProductsTrainBitwiseAsEager) {
  const Program p = compile_momentum_mlp(false, 64);
  if (!cpu::gemm_fuses_beta(true, false, 48, 40, 64)) {  // oneDNN's gemm driver (dnnl_matmul.h, gemm_avx2.h)
    EXPECT_EQ(op_counts(p)["sgd_product_update"], 0);
    GTEST_SKIP() << "no product computes beta * C + AB in one rounding here: nothing is fused";
  }
  const int head_fused = cpu::gemm_fuses_beta(true, false, 10, 48, 64) ? 1 : 0;
  EXPECT_EQ(op_counts(p)["sgd_product_update"], 1 + head_fused);
  EXPECT_EQ(op_counts(p)["sgd_update"], 3 - head_fused);
  EXPECT_FALSE(p.graph.outputs().count("grad/fc/weight"));
  EXPECT_TRUE(p.graph.outputs().count("grad/fc/bias"));
  size_t fused_at = 0, first_update = p.order.size();
  for (size_t i = 0; i < p.order.size(); ++i) {
    const Node& n = p.graph.node(p.order[i]);
    if (n.op == "sgd_product_update" && n.name == "update/fc/weight") fused_at = i;
    if (n.op == "sgd_update") first_update = std::min(first_update, i);
  }
  EXPECT_LT(fused_at, first_update);
  for (const double wd : {0.0, 0.01}) {
    SCOPED_TRACE(::testing::Message() << "weight decay " << wd);
    EXPECT_EQ(op_counts(compile_momentum_mlp(false, 64, wd))["sgd_product_update"], 1 + head_fused);
    expect_trains_as_eager([&](bool eager) { return compile_momentum_mlp(eager, 64, wd); });
  }
  EXPECT_EQ(op_counts(compile_momentum_mlp(false, 64, 0, true))["sgd_product_update"], 0);
  EXPECT_EQ(op_counts(compile_momentum_mlp(false, 64, 0, false, true))["sgd_product_update"], 0);
  EXPECT_EQ(op_counts(compile_momentum_mlp(false, 2048))["sgd_product_update"],
            cpu::gemm_avx2_applies() ? 1 + head_fused : 0);  // its sums are never cut
}

// x (3, 100, 24) -> down(silu(gate(x)) * up(x)) -> mse: a Llama MLP. Its 21600 hidden values split between
// threads mid-register.
Program compile_swiglu(DType compute, bool eager) {
  Graph g;
  GraphBuilder b(g);
  auto linear = [&](ValueId v, int64_t in, int64_t out, const std::string& name) {
    return b.op1("linear", {v, b.param(name + "/weight", {out, in})}, {}, name);
  };
  const ValueId x = b.input("x", {3, 100, 24});
  const ValueId gate = b.op1("silu", {linear(x, 24, 72, "gate")}, {}, "silu");
  const ValueId h = b.op1("mul", {gate, linear(x, 24, 72, "up")}, {}, "mul");
  g.mark_output("loss", b.op1("mse_loss", {linear(h, 72, 24, "down"), b.input("target", {3, 100, 24})}));
  return compile_sgd(std::move(g), compute, eager);
}

TEST(Fusion, SwigluTrainsBitwiseAsEager) {
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    std::map<std::string, int> ops = op_counts(compile_swiglu(t, false));
    EXPECT_EQ(ops["swiglu"], 1);
    EXPECT_EQ(ops["swiglu_grad"], 1);
    EXPECT_EQ(ops["silu"] + ops["silu_grad"], 0);
    EXPECT_EQ(ops["mul"], 1);  // mse_loss's gradient; unfused, the product and its gradient added three
    expect_trains_as_eager([&](bool eager) { return compile_swiglu(t, eager); });
  }
}

// x (3, 20, 24) -> BERT's attention with separate q, k and v (2 heads of 12), bidirectional, keys of batch
// row 1 from 15 on padding -> proj -> mse: the heads' transposes around sdpa (forward and backward) become
// one sdpa_rows and its gradient, in f32 and bf16.
Program compile_row_attention(DType compute, bool eager) {
  Graph g;
  GraphBuilder b(g);
  const int64_t B = 3, T = 20, C = 24, H = 2;
  auto linear = [&](ValueId v, const std::string& name) {
    return b.op1("linear", {v, b.param(name + "/weight", {C, C})}, {}, name);
  };
  auto heads = [&](ValueId v) {
    return b.op1("transpose", {b.reshape(v, {B, T, H, C / H})}, {{"dim0", int64_t{1}}, {"dim1", int64_t{2}}});
  };
  const ValueId x = b.input("x", {B, T, C}), ids = b.input("ids", {B, T}, DType::i64);
  const ValueId att = b.op("sdpa", {heads(linear(x, "q")), heads(linear(x, "k")), heads(linear(x, "v")), ids},
                           {{"causal", false}, {"pad_id", int64_t{0}}}, "sdpa")[0];
  const ValueId merged =
      b.reshape(b.op1("transpose", {att}, {{"dim0", int64_t{1}}, {"dim1", int64_t{2}}}), {B, T, C});
  g.mark_output("loss", b.op1("mse_loss", {linear(merged, "proj"), b.input("target", {B, T, C})}));
  return compile_sgd(std::move(g), compute, eager);
}

TEST(Fusion, RowAttentionTrainsBitwiseAsEager) {
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    std::map<std::string, int> ops = op_counts(compile_row_attention(t, false));
    EXPECT_EQ(ops["sdpa_rows"], 1);
    EXPECT_EQ(ops["sdpa_rows_grad"], 1);
    EXPECT_EQ(ops["transpose"], 0);
    // Batch row 1's keys from 15 on are padding (id 0), the others not.
    expect_trains_as_eager([&](bool eager) { return compile_row_attention(t, eager); },
                           [](Executor& ex) {
                             int64_t* ids = ex.tensor("ids").data<int64_t>();
                             for (int64_t i = 0; i < 3 * 20; ++i)
                               ids[i] = i / 20 == 1 && i % 20 >= 15 ? 0 : 1 + i;
                           });
  }
}

}  // namespace
}  // namespace flowrun::testing
