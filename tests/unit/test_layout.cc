// The layout pass (graph/layout.cc): a small residual CNN keeps the activations that feed convolutions in
// nChw16c, with reorders only where a plain reader (pooling) meets them, and trains to bitwise the losses,
// weights and running statistics of the same program all in NCHW.
#include <gtest/gtest.h>

#include "graph/passes.h"
#include "models.h"

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

Program compile_cnn(bool blocked, bool eager = false) {
  Graph g;
  build_cnn(g);
  CompileOptions opts;
  opts.optimizer = {.type = "sgd", .momentum = 0.9};
  opts.blocked_layout = blocked;
  opts.eager = eager;
  return compile(std::move(g), opts);
}

TEST(BlockedLayout, ConvolutionChainsStayBlockedWithReordersAtTheirEdges) {
  const Program p = compile_cnn(true);
  const Graph& g = p.graph;
  std::map<std::string, Layout> conv_out;  // forward convolutions' outputs by node name
  int reorders = 0;
  for (NodeId id : p.order) {
    const Node& n = g.node(id);
    if (n.op == "reorder") ++reorders;
    if (n.op == "conv2d") conv_out[n.name] = g.value(n.outputs[0]).layout;
    // A plain reader never reads a blocked value.
    if (n.op == "maxpool2d" || n.op == "global_avgpool" || n.op == "maxpool2d_grad" || n.op == "mse_loss") {
      for (ValueId v : n.inputs) EXPECT_EQ(g.value(v).layout, Layout::plain) << n.name;
    }
  }
  // The stem's chain only reaches maxpool: it stays plain. The block's convolutions feed c3, and c3's output
  // joins r in the sum, which global_avgpool reads through a reorder.
  EXPECT_EQ(conv_out.at("stem"), Layout::plain);
  for (const char* name : {"c1", "c2", "shortcut", "c3"})
    EXPECT_EQ(conv_out.at(name), Layout::nchw16c) << name;
  // global_avgpool's input (forward); in the backward pass its plain gradient leads relu_grad of t, whose
  // output t is reordered to it, and the sum of that plain gradient with c3's blocked input gradient is
  // blocked (the plain one reordered).
  EXPECT_EQ(reorders, 3);

  const Program eager = compile_cnn(true, /*eager=*/true);
  for (const Value& v : eager.graph.values()) EXPECT_EQ(v.layout, Layout::plain) << v.name;
}

TEST(BlockedLayout, TrainsBitwiseAsThePlainProgram) {
  const auto [plain_losses, plain] = train_sgd(compile_cnn(false), 3);
  const auto [blocked_losses, blocked] = train_sgd(compile_cnn(true), 3);
  EXPECT_EQ(plain_losses, blocked_losses);
  ASSERT_EQ(plain.size(), blocked.size());
  for (const auto& [name, v] : plain) EXPECT_EQ(v, blocked.at(name)) << name;
  EXPECT_GT(plain.count("bn2/var"), 0u);
}

}  // namespace
}  // namespace flowrun::testing
