// Memory planning: the arena is much smaller than the sum of all intermediates, and no two values that are
// alive at the same time overlap.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "models.h"

namespace flowrun::testing {
namespace {

// Brute-force check of the plan: values alive at the same schedule position never share bytes, unless one
// is the in-place successor of the other, or a view of it (views and their sources form one buffer whose
// lifetime is the union of theirs).
void expect_plan_valid(const Program& p) {
  const Graph& g = p.graph;
  const int end = static_cast<int>(p.order.size());
  std::vector<int> def(g.values().size(), -1), last(g.values().size(), -1);
  for (int pos = 0; pos < end; ++pos) {
    const Node& n = g.node(p.order[static_cast<size_t>(pos)]);
    for (ValueId v : n.outputs) def[static_cast<size_t>(v)] = pos;
    for (ValueId v : n.inputs) last[static_cast<size_t>(v)] = pos;
  }
  for (const auto& [name, v] : g.outputs()) last[static_cast<size_t>(v)] = end;
  auto offset = [&](ValueId v) { return p.memory.offset[static_cast<size_t>(v)]; };
  // The value a chain of views starts from.
  auto root = [&](ValueId v) {
    for (;;) {
      const Value& x = g.value(v);
      if (x.producer < 0 || x.producer_slot != 0) return v;
      const Node& n = g.node(x.producer);
      if (!OpRegistry::get().at(n.op).view || offset(n.inputs[0]) != offset(v)) return v;
      v = n.inputs[0];
    }
  };
  std::map<ValueId, std::pair<int, int>> life;  // root -> (written first, read last) of its whole group
  for (const auto& v : g.values()) {
    if (offset(v.id) < 0 || v.nbytes() == 0) continue;
    EXPECT_LE(static_cast<size_t>(offset(v.id)) + v.nbytes(), p.memory.arena_bytes);
    const ValueId r = root(v.id);
    const int d = def[static_cast<size_t>(v.id)], l = std::max(d, last[static_cast<size_t>(v.id)]);
    auto [it, fresh] = life.try_emplace(r, d, l);
    if (!fresh) it->second = {std::min(it->second.first, d), std::max(it->second.second, l)};
  }
  auto in_place_of = [&](ValueId out, ValueId in_root) {
    const Value& v = g.value(out);
    if (v.producer < 0 || v.producer_slot != 0) return false;
    const Node& n = g.node(v.producer);
    const int k = OpRegistry::get().at(n.op).inplace_input;
    return k >= 0 && root(n.inputs[static_cast<size_t>(k)]) == in_root;
  };
  for (auto i = life.begin(); i != life.end(); ++i)
    for (auto j = std::next(i); j != life.end(); ++j) {
      const ValueId a = i->first, b = j->first;
      const int64_t oa = offset(a), ob = offset(b);
      const bool bytes_overlap = oa < ob + static_cast<int64_t>(g.value(b).nbytes()) &&
                                 ob < oa + static_cast<int64_t>(g.value(a).nbytes());
      if (!bytes_overlap) continue;
      // Sharing is legal when one is dead before the other is written, or when b is produced in place
      // from a at a's last use.
      const auto [da, la] = i->second;
      const auto [db, lb] = j->second;
      const bool disjoint =
          la < db || lb < da || (la == db && in_place_of(b, a)) || (lb == da && in_place_of(a, b));
      EXPECT_TRUE(disjoint) << g.value(a).name << " and " << g.value(b).name << " overlap while both alive";
    }
}

double report(const char* what, const Program& p) {
  const double ratio = static_cast<double>(p.memory.total_intermediate_bytes) / static_cast<double>(p.memory.arena_bytes);
  std::printf("%s: arena %.2f MiB, sum of intermediates %.2f MiB (%.1fx smaller), %d in-place outputs\n", what,
              static_cast<double>(p.memory.arena_bytes) / 1048576.0,
              static_cast<double>(p.memory.total_intermediate_bytes) / 1048576.0, ratio, p.memory.inplace_count);
  return ratio;
}

TEST(MemoryPlan, MlpArenaAtLeast1_5xSmallerThanIntermediates) {
  Graph g;
  build_mlp(g, 128, {784, 512, 512, 10}, true);
  CompileOptions opts;
  opts.optimizer.type = "sgd";
  const Program p = compile(std::move(g), opts);
  expect_plan_valid(p);
  // Weight gradients stay alive until the updates at the end of the step, which bounds the reuse here.
  EXPECT_GE(report("mlp 784-512-512-10 batch 128", p), 1.5);
  EXPECT_GT(p.memory.inplace_count, 0);
}

TEST(MemoryPlan, TransformerBlockArenaAtLeast3xSmallerThanIntermediates) {
  Graph g;
  build_transformer_block(g, 4, 64, 128, 4);
  CompileOptions opts;
  opts.optimizer.type = "sgd";
  const Program p = compile(std::move(g), opts);
  expect_plan_valid(p);
  EXPECT_GE(report("transformer block B4 T64 C128", p), 3.0);
}

TEST(MemoryPlan, InPlaceCanBeDisabled) {
  Graph g;
  build_mlp(g, 8, {16, 16, 4}, true);
  CompileOptions opts;
  opts.inplace = false;
  const Program p = compile(std::move(g), opts);
  EXPECT_EQ(p.memory.inplace_count, 0);
  expect_plan_valid(p);
}

// An eager program: every value and workspace in bytes of its own, so the arena is the sum of them all.
TEST(MemoryPlan, EagerSharesNothing) {
  Graph g;
  build_mlp(g, 8, {16, 16, 4}, true);
  CompileOptions opts;
  opts.eager = true;
  const Program p = compile(std::move(g), opts);
  EXPECT_TRUE(p.eager);
  EXPECT_EQ(p.memory.inplace_count, 0);
  EXPECT_EQ(p.memory.view_count, 0);
  EXPECT_EQ(p.memory.arena_bytes, p.memory.total_intermediate_bytes);
  std::vector<std::pair<int64_t, int64_t>> ranges;  // [begin, end) of every value and workspace
  for (const Value& v : p.graph.values())
    if (p.memory.offset[static_cast<size_t>(v.id)] >= 0 && v.nbytes() > 0)
      ranges.emplace_back(p.memory.offset[static_cast<size_t>(v.id)],
                          p.memory.offset[static_cast<size_t>(v.id)] + static_cast<int64_t>(v.nbytes()));
  for (NodeId id : p.order)
    if (p.memory.workspace_bytes[static_cast<size_t>(id)] > 0)
      ranges.emplace_back(p.memory.workspace_offset[static_cast<size_t>(id)],
                          p.memory.workspace_offset[static_cast<size_t>(id)] +
                              static_cast<int64_t>(p.memory.workspace_bytes[static_cast<size_t>(id)]));
  std::sort(ranges.begin(), ranges.end());
  ASSERT_GT(ranges.size(), 10u);
  for (size_t i = 1; i < ranges.size(); ++i) EXPECT_LE(ranges[i - 1].second, ranges[i].first);
}

// A reshape of a fed input (an MLP flattening its images) is the input's bytes: no buffer, no copy, and
// training gives the eager program's bits (where the reshape copies).
TEST(MemoryPlan, AViewOfAnInputIsTheInputsBytes) {
  auto build = [](bool eager) {
    Graph g;
    GraphBuilder b(g);
    const ValueId flat = b.reshape(b.input("x", {8, 2, 8}), {8, 16});
    const ValueId h = b.op1("linear", {flat, b.param("fc/weight", {4, 16}), b.param("fc/bias", {4})});
    g.mark_output("loss", b.op1("mse_loss", {h, b.input("target", {8, 4})}));
    return compile(std::move(g), sgd_options(eager));
  };
  const Program p = build(false);
  const ValueId x = p.graph.find_value("x");
  int aliases = 0;
  for (const Value& v : p.graph.values())
    if (p.memory.alias[static_cast<size_t>(v.id)] >= 0) {
      ++aliases;
      EXPECT_EQ(p.memory.alias[static_cast<size_t>(v.id)], x);
      EXPECT_EQ(p.memory.offset[static_cast<size_t>(v.id)], -1);
      EXPECT_EQ(v.shape(), (Shape{8, 16}));
    }
  EXPECT_EQ(aliases, 1);
  expect_plan_valid(p);
  const Program eager = build(true);
  for (const Value& v : eager.graph.values()) EXPECT_EQ(eager.memory.alias[static_cast<size_t>(v.id)], -1);
  const auto [losses, trained] = train_sgd(p, 3);
  const auto [eager_losses, eager_trained] = train_sgd(eager, 3);
  EXPECT_EQ(losses, eager_losses);
  EXPECT_EQ(trained, eager_trained);
}

}  // namespace
}  // namespace flowrun::testing
