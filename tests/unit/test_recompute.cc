// Activation recompute (graph/recompute.cc): a stack of residual attention blocks with dropout trains to
// bitwise the same losses and weights with every block a recompute segment as without, in a smaller arena,
// and the copies run in the backward pass, each segment's just before its first reader.
#include <gtest/gtest.h>

#include "graph/passes.h"
#include "models.h"

namespace flowrun::testing {
namespace {

// `layers` pre-LayerNorm blocks on x (B, T, C): x + proj(dropout(sdpa(heads of q, k, v))), then
// x + fc_out(dropout(gelu(fc(ln(x))))); loss = mse against "target". With `recompute` each block's nodes
// form a segment.
void build_stack(Graph& g, int layers, bool recompute) {
  const int64_t B = 4, T = 64, C = 32, H = 2, D = C / H;
  GraphBuilder b(g);
  ValueId x = b.input("x", {B, T, C});
  for (int l = 0; l < layers; ++l) {
    b.push_scope("block" + std::to_string(l));
    b.set_segment(recompute ? l : -1);
    auto ln = [&](ValueId v, const std::string& name) {
      return b.op("layernorm", {v, b.param(name + "/weight", {C}), b.param(name + "/bias", {C})}, {},
                  name)[0];
    };
    auto linear = [&](ValueId v, int64_t in, int64_t out, const std::string& name) {
      return b.op1("linear", {v, b.param(name + "/weight", {out, in}), b.param(name + "/bias", {out})}, {},
                   name);
    };
    auto heads = [&](ValueId v) {
      return b.op1("transpose", {b.reshape(v, {B, T, H, D})}, {{"dim0", int64_t{1}}, {"dim1", int64_t{2}}});
    };
    auto drop = [&](ValueId v) { return b.op("dropout", {v}, {{"p", 0.2}})[0]; };
    const ValueId a = ln(x, "ln1");
    const ValueId att =
        b.op("sdpa", {heads(linear(a, C, C, "q")), heads(linear(a, C, C, "k")), heads(linear(a, C, C, "v"))},
             {{"causal", true}}, "attn")[0];
    const ValueId merged =
        b.reshape(b.op1("transpose", {att}, {{"dim0", int64_t{1}}, {"dim1", int64_t{2}}}), {B, T, C});
    x = b.add(x, drop(linear(merged, C, C, "proj")));
    x = b.add(x, drop(linear(b.op1("gelu", {linear(ln(x, "ln2"), C, 4 * C, "fc")}), 4 * C, C, "fc_out")));
    b.set_segment(-1);
    b.pop_scope();
  }
  g.mark_output("loss", b.op1("mse_loss", {x, b.input("target", {B, T, C})}));
}

Program compile_stack(int layers, bool recompute) {
  Graph g;
  build_stack(g, layers, recompute);
  return compile(std::move(g), sgd_options());
}

TEST(Recompute, BitwiseTheSameTrainingInASmallerArena) {
  const Program plain = compile_stack(4, false), again = compile_stack(4, true);
  size_t copies = 0;
  for (NodeId id : again.order) copies += again.graph.node(id).recomputes >= 0;
  EXPECT_GT(copies, 0u);
  std::printf("4 blocks: arena %.2f MiB without recompute, %.2f MiB with (%zu nodes run again)\n",
              static_cast<double>(plain.memory.arena_bytes) / 1048576.0,
              static_cast<double>(again.memory.arena_bytes) / 1048576.0, copies);
  EXPECT_LT(static_cast<double>(again.memory.arena_bytes),
            0.6 * static_cast<double>(plain.memory.arena_bytes));
  const auto [l0, p0] = train_sgd(plain, 4);
  const auto [l1, p1] = train_sgd(again, 4);
  EXPECT_EQ(l0, l1);  // bitwise: dropout draws its masks again from the same keys
  ASSERT_EQ(p0.size(), p1.size());
  for (const auto& [name, v] : p0) EXPECT_EQ(v, p1.at(name)) << name;
}

TEST(Recompute, CopiesRunInTheBackwardPassJustBeforeTheirReaders) {
  const Program p = compile_stack(3, true);
  const Graph& g = p.graph;
  std::vector<size_t> pos(g.nodes().size());
  for (size_t i = 0; i < p.order.size(); ++i) pos[static_cast<size_t>(p.order[i])] = i;
  size_t last_forward = 0;
  for (size_t i = 0; i < p.order.size(); ++i)
    if (p.order[i] < g.backward_begin) last_forward = i;
  for (NodeId id : p.order) {
    const Node& n = g.node(id);
    if (n.recomputes < 0) continue;
    EXPECT_GT(pos[static_cast<size_t>(id)], last_forward) << n.name << " runs in the forward pass";
    EXPECT_LT(pos[static_cast<size_t>(id)], pos[static_cast<size_t>(n.schedule_as)]) << n.name;
    EXPECT_EQ(n.name, "recompute/" + g.node(n.recomputes).name);
    // Nothing but copies of the same segment runs between a copy and the backward node it precedes.
    for (size_t i = pos[static_cast<size_t>(id)] + 1; i < pos[static_cast<size_t>(n.schedule_as)]; ++i) {
      const Node& m = g.node(p.order[i]);
      EXPECT_TRUE(m.recomputes >= 0 && g.node(m.recomputes).segment == g.node(n.recomputes).segment)
          << m.name << " runs between " << n.name << " and its reader";
    }
  }
}

}  // namespace
}  // namespace flowrun::testing
