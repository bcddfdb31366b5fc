// The layout pass (graph/layout.cc): a small residual CNN keeps the activations that feed convolutions in
// the blocked layout (nChw16c with AVX-512, nChw8c below it), max pooling included, with reorders only where
// a plain reader (global pooling) meets them, and trains to bitwise the losses, weights and running
// statistics of the same program all in NCHW. The bitwise tests run both nChw16c and nChw8c on every host:
// oneDNN reorders to its own layout inside a convolution where the graph's is the other, flowrun's own
// 16-channel convolution kernels (AVX-512) read nChw8c through copies and its 8-channel ones (AVX2) read
// either, and the blocked kernels of batchnorm, pooling and the per-channel sum have a path for each width.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "graph/passes.h"
#include "models.h"
#include "ops/cpu/dnnl_conv.h"
#include "ops/cpu/dnnl_matmul.h"

namespace flowrun::testing {
namespace {

// x (4, 3, 8, 8) -> stem conv 16 -> bn -> relu -> maxpool 2 -> x1; r = relu(bn(conv 32 (relu(bn(conv 16
// (x1))))) + conv 1x1 32 (x1)) (a residual block); t = relu(conv 32 (r)); mse(global average (r + t),
// "target" (4, 32)).
void build_cnn(Graph& g) {
  GraphBuilder b(g);
  auto conv = [&](ValueId v, int64_t in, int64_t out, int64_t k, const std::string& name) {
    return b.op1("conv2d", {v, b.param(name + "/weight", {out, in, k, k})}, {{"padding", (k - 1) / 2}}, name);
  };
  auto bn = [&](ValueId v, int64_t c, const std::string& name) {
    return b.op("batchnorm",
                {v, b.param(name + "/gamma", {c}), b.param(name + "/beta", {c}), b.state(name + "/mean", {c}),
                 b.state(name + "/var", {c})},
                {}, name)[0];
  };
  auto relu = [&](ValueId v) { return b.op1("relu", {v}); };
  const ValueId stem = relu(bn(conv(b.input("x", {4, 3, 8, 8}), 3, 16, 3, "stem"), 16, "stem_bn"));
  const ValueId x1 = b.op("maxpool2d", {stem}, {{"kernel", int64_t{2}}})[0];
  const ValueId h = bn(conv(relu(bn(conv(x1, 16, 16, 3, "c1"), 16, "bn1")), 16, 32, 3, "c2"), 32, "bn2");
  const ValueId r = relu(b.add(h, conv(x1, 16, 32, 1, "shortcut")));
  const ValueId t = relu(conv(r, 32, 32, 3, "c3"));
  g.mark_output("loss",
                b.op1("mse_loss", {b.op1("global_avgpool", {b.add(r, t)}), b.input("target", {4, 32})}));
}

// A graph's training program (SGD with momentum), with or without the layout pass (in layout `as`, or this
// CPU's), or eager.
Program compile_sgd(Graph g, bool blocked, bool eager, std::optional<Layout> as = std::nullopt) {
  CompileOptions opts = sgd_options(eager);
  opts.blocked_layout = blocked;
  opts.blocked_as = as;
  return compile(std::move(g), opts);
}

Program compile_cnn(bool blocked, bool eager = false, std::optional<Layout> as = std::nullopt) {
  Graph g;
  build_cnn(g);
  return compile_sgd(std::move(g), blocked, eager, as);
}

// The layout the pass picks by default for f32 convolutions: oneDNN's.
Layout default_blocked() {
  return cpu::convs_take_nchw8c() ? Layout::nchw8c : Layout::nchw16c;
}

const char* layout_name(Layout l) {
  return l == Layout::nchw8c ? "nChw8c" : "nChw16c";
}
constexpr Layout kChannelBlocks[] = {Layout::nchw16c, Layout::nchw8c};

TEST(BlockedLayout, ConvolutionChainsStayBlockedWithReordersAtTheirEdges) {
  const Program p = compile_cnn(true);
  const Layout blocked = default_blocked();
  const Graph& g = p.graph;
  std::map<std::string, Layout> conv_out;  // forward convolutions' outputs by node name
  int reorders = 0;
  for (NodeId id : p.order) {
    const Node& n = g.node(id);
    if (n.op == "reorder") ++reorders;
    if (n.op == "conv2d") conv_out[n.name] = g.value(n.outputs[0]).layout;
    // A plain reader never reads a blocked value; maxpool and its gradient read and write blocked ones.
    if (n.op == "global_avgpool" || n.op == "mse_loss") {
      for (ValueId v : n.inputs) EXPECT_EQ(g.value(v).layout, Layout::plain) << n.name;
    }
    if (n.op == "maxpool2d" || n.op == "maxpool2d_grad") {
      for (ValueId v : n.inputs) EXPECT_EQ(g.value(v).layout, blocked) << n.name;
      for (ValueId v : n.outputs) EXPECT_EQ(g.value(v).layout, blocked) << n.name;
      EXPECT_TRUE(n.attrs.b("blocked")) << n.name;
      EXPECT_EQ(n.attrs.b("nchw8c"), blocked == Layout::nchw8c) << n.name;
    }
    if (n.op == "conv2d" || n.op == "conv2d_grad_input" || n.op == "conv2d_grad_weight") {
      EXPECT_EQ(n.attrs.b("nchw8c"), blocked == Layout::nchw8c) << n.name;
    }
  }
  // The stem's chain reaches c1 and the shortcut through maxpool; the block's convolutions feed c3, and c3's
  // output joins r in the sum, which global_avgpool reads through a reorder.
  for (const char* name : {"stem", "c1", "c2", "shortcut", "c3"})
    EXPECT_EQ(conv_out.at(name), blocked) << name;
  // global_avgpool's input (forward); in the backward pass its plain gradient leads relu_grad of t, whose
  // output t is reordered to it, and the sum of that plain gradient with c3's blocked input gradient is
  // blocked (the plain one reordered).
  EXPECT_EQ(reorders, 3);

  const Program eager = compile_cnn(true, /*eager=*/true);
  for (const Value& v : eager.graph.values()) EXPECT_EQ(v.layout, Layout::plain) << v.name;
}

// oneDNN's own answer decides the default: nChw16c on AVX-512 CPUs, nChw8c on AVX2 ones.
TEST(BlockedLayout, DefaultIsTheLayoutOneDnnPicks) {
  EXPECT_EQ(cpu::convs_take_nchw8c(), !__builtin_cpu_supports("avx512f"));
}

// NHWC as the blocked layout (CompileOptions::blocked_as; by default where bf16 convolutions run on AMX):
// the same chains as nChw16c, max pooling and batchnorm reading and writing NHWC, and global pooling a
// reorder. f32's NHWC convolutions are other oneDNN kernels than the plain program's (their sums in another
// order): within 1e-5 of it after 3 steps.
Program compile_cnn_nhwc(DType compute, bool nhwc) {
  Graph g;
  build_cnn(g);
  CompileOptions opts = sgd_options();
  opts.compute = compute;
  if (nhwc) opts.blocked_as = Layout::nhwc;
  return compile(std::move(g), opts);
}

TEST(BlockedLayout, NhwcKeepsTheBlockInNhwcAndTrainsAsThePlainProgram) {
  const Program p = compile_cnn_nhwc(DType::f32, true);
  std::map<std::string, Layout> conv_out;
  for (NodeId id : p.order) {
    const Node& n = p.graph.node(id);
    if (n.op == "conv2d") conv_out[n.name] = p.graph.value(n.outputs[0]).layout;
    if (n.op == "maxpool2d" || n.op == "maxpool2d_grad" || n.op == "batchnorm" || n.op == "batchnorm_grad") {
      for (ValueId v : n.outputs) {
        if (p.graph.value(v).shape().size() == 4) {
          EXPECT_EQ(p.graph.value(v).layout, Layout::nhwc) << n.name;
        }
      }
      EXPECT_TRUE(n.attrs.b("nhwc")) << n.name;
    }
  }
  for (const char* name : {"stem", "c1", "c2", "shortcut", "c3"})
    EXPECT_EQ(conv_out.at(name), Layout::nhwc) << name;
  const auto [plain_losses, plain] = train_sgd(compile_cnn(false), 3);
  const auto [nhwc_losses, nhwc] = train_sgd(compile_cnn_nhwc(DType::f32, true), 3);
  ASSERT_EQ(plain_losses.size(), nhwc_losses.size());
  for (size_t i = 0; i < plain_losses.size(); ++i) EXPECT_NEAR(plain_losses[i], nhwc_losses[i], 1e-5) << i;
  for (const auto& [name, v] : plain)
    for (size_t i = 0; i < v.size(); ++i)
      ASSERT_NEAR(v[i], nhwc.at(name)[i], 1e-5 * (1 + std::abs(v[i]))) << name << "[" << i << "]";
}

// In bf16 the blocked layout is NHWC where oneDNN's AMX kernels run the convolutions, nChw16c elsewhere;
// either way the same kernels run as in the plain program (its convolutions reorder to their layout
// themselves), and it trains to the same bits.
TEST(BlockedLayout, Bf16TrainsBitwiseAsThePlainProgram) {
  if (!cpu::has_native_bf16()) GTEST_SKIP() << "no native bf16 convolutions on this machine";
  const Program blocked = compile_cnn_nhwc(DType::bf16, false);
  const Layout want = cpu::bf16_convs_take_nhwc() ? Layout::nhwc : Layout::nchw16c;
  for (NodeId id : blocked.order) {
    const Node& n = blocked.graph.node(id);
    if (n.op == "conv2d" && n.name == "c2") {
      EXPECT_EQ(blocked.graph.value(n.outputs[0]).layout, want);
    }
  }
  Graph g;
  build_cnn(g);
  CompileOptions opts = sgd_options();
  opts.compute = DType::bf16;
  opts.blocked_layout = false;
  const auto [plain_losses, plain] = train_sgd(compile(std::move(g), opts), 3);
  const auto [blocked_losses, trained] = train_sgd(compile_cnn_nhwc(DType::bf16, false), 3);
  EXPECT_EQ(plain_losses, blocked_losses);
  for (const auto& [name, v] : plain) EXPECT_EQ(v, trained.at(name)) << name;
}

TEST(BlockedLayout, TrainsBitwiseAsThePlainProgram) {
  const auto [plain_losses, plain] = train_sgd(compile_cnn(false), 3);
  EXPECT_GT(plain.count("bn2/var"), 0u);
  for (Layout l : kChannelBlocks) {
    SCOPED_TRACE(layout_name(l));
    const auto [blocked_losses, blocked] = train_sgd(compile_cnn(true, false, l), 3);
    EXPECT_EQ(plain_losses, blocked_losses);
    ASSERT_EQ(plain.size(), blocked.size());
    for (const auto& [name, v] : plain) EXPECT_EQ(v, blocked.at(name)) << name;
  }
}

// fuse_backward (graph/passes.cc): stem_bn's and bn1's relus join their batchnorms (nothing else reads the
// batchnorm outputs), and bn2 takes the residual sum with the shortcut and its relu (the shortcut, blocked,
// read where it lies); bn1's relu_grad joins its batchnorm_grad as the mask, and the stem's joins the max
// pool's gradient; r's relu_grad adds r's two gradients itself; c3's relu stays. The fused, blocked program
// trains to the bits of the eager one (unfused, plain).
TEST(BlockedLayout, BatchnormTakesItsReluAndTrainsBitwiseAsEager) {
  const Program fused = compile_cnn(true);
  const Layout blocked = default_blocked();
  std::map<std::string, int> ops;
  int relu_bns = 0, residual_bns = 0, masked_bn_grads = 0;
  for (NodeId id : fused.order) {
    const Node& n = fused.graph.node(id);
    ++ops[n.op];
    relu_bns += n.op == "batchnorm" && n.attrs.b("relu");
    if (n.op == "batchnorm" && n.attrs.b("residual")) {
      ++residual_bns;
      EXPECT_EQ(fused.graph.value(n.inputs[5]).layout, blocked) << n.name;
    }
    masked_bn_grads += n.op == "batchnorm_grad" && n.inputs.size() == 6;
    if (n.op == "batchnorm_grad" && n.inputs.size() == 6) {
      EXPECT_EQ(fused.graph.value(n.inputs[5]).layout, fused.graph.value(n.inputs[0]).layout) << n.name;
    }
  }
  EXPECT_EQ(relu_bns, 3);
  EXPECT_EQ(residual_bns, 1);
  EXPECT_EQ(masked_bn_grads, 1);
  EXPECT_EQ(ops["relu"], 1);
  EXPECT_EQ(ops["add"], 2);  // r + t, and x1's gradient sum (r's joins its relu_grad)
  EXPECT_EQ(ops["relu_grad"], 2);
  const auto [eager_losses, eager] = train_sgd(compile_cnn(false, /*eager=*/true), 3);
  for (Layout l : kChannelBlocks) {
    SCOPED_TRACE(layout_name(l));
    const auto [fused_losses, trained] = train_sgd(compile_cnn(true, false, l), 3);
    EXPECT_EQ(eager_losses, fused_losses);
    for (const auto& [name, v] : eager) EXPECT_EQ(v, trained.at(name)) << name;
  }
}

// Overlapping, padded windows on odd planes after a ReLU (so that windows tie at zero), the ReLU fused into
// the pooling and its gradient into the pooling's, and the bias gradients summed per channel where they lie:
// x (2, 16, 7, 7) -> conv 16 + bias -> relu -> maxpool 3, stride 2, padding 1 -> conv 16 + bias -> global
// average -> mse.
Program compile_overlapping_pool(bool blocked, bool eager = false, std::optional<Layout> as = std::nullopt) {
  Graph g;
  GraphBuilder b(g);
  auto conv = [&](ValueId v, const std::string& name) {
    return b.op1("conv2d", {v, b.param(name + "/weight", {16, 16, 3, 3}), b.param(name + "/bias", {16})},
                 {{"padding", int64_t{1}}}, name);
  };
  const ValueId h = b.op1("relu", {conv(b.input("x", {2, 16, 7, 7}), "a")});
  const ValueId p =
      b.op("maxpool2d", {h}, {{"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"padding", int64_t{1}}})[0];
  g.mark_output("loss",
                b.op1("mse_loss", {b.op1("global_avgpool", {conv(p, "b")}), b.input("target", {2, 16})}));
  return compile_sgd(std::move(g), blocked, eager, as);
}

TEST(BlockedLayout, OverlappingMaxPoolAndBiasGradientsTrainBitwiseAsEager) {
  const Program blocked = compile_overlapping_pool(true);
  std::map<std::string, int> blocked_ops;
  for (NodeId id : blocked.order) {
    const Node& n = blocked.graph.node(id);
    if (n.attrs.b("blocked")) ++blocked_ops[n.op];
  }
  EXPECT_EQ(blocked_ops["maxpool2d"], 1);
  EXPECT_EQ(blocked_ops["maxpool2d_grad"], 1);
  EXPECT_EQ(blocked_ops["reduce_sum"], 1);  // a's bias gradient; b's dy comes plain from global pooling
  // relu_grad is fused into the pooling's gradient, its mask the pooled output, and then the relu into the
  // pooling (graph/passes.cc, fuse_backward); the eager program, unfused and plain, is the reference.
  int relus = 0, relu_pools = 0;
  for (NodeId id : blocked.order) {
    const Node& n = blocked.graph.node(id);
    relus += n.op == "relu_grad" || n.op == "relu";
    relu_pools += n.op == "maxpool2d" && n.attrs.b("relu");
    if (n.op == "maxpool2d_grad") {
      ASSERT_EQ(n.inputs.size(), 3u);
      EXPECT_EQ(blocked.graph.value(n.inputs[2]).producer, blocked.graph.value(n.inputs[1]).producer);
    }
  }
  EXPECT_EQ(relus, 0);
  EXPECT_EQ(relu_pools, 1);
  const auto [plain_losses, plain] = train_sgd(compile_overlapping_pool(false, /*eager=*/true), 3);
  for (Layout l : kChannelBlocks) {
    SCOPED_TRACE(layout_name(l));
    const auto [blocked_losses, trained] = train_sgd(compile_overlapping_pool(true, false, l), 3);
    EXPECT_EQ(plain_losses, blocked_losses);
    for (const auto& [name, v] : plain) EXPECT_EQ(v, trained.at(name)) << name;
  }
}

// Batchnorm's sums over planes that are not a multiple of its 16 lanes (7 x 7: three whole rounds and one
// pixel; 3 x 3: fewer pixels than lanes), blocked, against the eager program's plain planes.
Program compile_ragged_bn(bool blocked, bool eager = false, std::optional<Layout> as = std::nullopt) {
  Graph g;
  GraphBuilder b(g);
  auto conv = [&](ValueId v, const std::string& name) {
    return b.op1("conv2d", {v, b.param(name + "/weight", {16, 16, 3, 3})}, {{"padding", int64_t{1}}}, name);
  };
  auto bn = [&](ValueId v, const std::string& name) {
    return b.op("batchnorm",
                {v, b.param(name + "/gamma", {16}), b.param(name + "/beta", {16}),
                 b.state(name + "/mean", {16}), b.state(name + "/var", {16})},
                {}, name)[0];
  };
  const ValueId h = b.op1("relu", {bn(conv(b.input("x", {3, 16, 7, 7}), "a"), "bn_a")});
  const ValueId p = b.op("maxpool2d", {h}, {{"kernel", int64_t{2}}})[0];
  const ValueId q = conv(b.op1("relu", {bn(conv(p, "b"), "bn_b")}), "c");
  g.mark_output("loss", b.op1("mse_loss", {b.op1("global_avgpool", {q}), b.input("target", {3, 16})}));
  return compile_sgd(std::move(g), blocked, eager, as);
}

TEST(BlockedLayout, BatchnormOverRaggedPlanesTrainsBitwiseAsEager) {
  const Program blocked = compile_ragged_bn(true);
  int blocked_bns = 0;
  for (NodeId id : blocked.order) {
    const Node& n = blocked.graph.node(id);
    blocked_bns += (n.op == "batchnorm" || n.op == "batchnorm_grad") && n.attrs.b("blocked");
  }
  EXPECT_EQ(blocked_bns, 4);
  const auto [plain_losses, plain] = train_sgd(compile_ragged_bn(false, /*eager=*/true), 3);
  EXPECT_GT(plain.count("bn_b/var"), 0u);
  for (Layout l : kChannelBlocks) {
    SCOPED_TRACE(layout_name(l));
    const auto [blocked_losses, trained] = train_sgd(compile_ragged_bn(true, false, l), 3);
    EXPECT_EQ(plain_losses, blocked_losses);
    for (const auto& [name, v] : plain) EXPECT_EQ(v, trained.at(name)) << name;
  }
}

}  // namespace
}  // namespace flowrun::testing
