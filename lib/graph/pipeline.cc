// Pipeline parallelism: the forward graph cut into consecutive stages, one per pipeline rank. A cut may only
// fall where exactly one floating value (the activation, e.g. the residual stream between transformer
// blocks) flows from the nodes before it to the nodes after it; cuts are placed where the forward FLOPs
// before them come closest to k/stages of the whole. Stage s keeps its nodes, reads the activation as the
// input "pp/in" (differentiable: its gradient "grad/pp/in" goes back to stage s - 1) and marks the one it
// hands on as "pp/out" (differentiated from the input "pp/out_grad" that stage s + 1 sends back). The last
// stage computes the loss. A parameter that several stages read (a tied embedding: the first and the last)
// is held by each, its gradients summed over them once per step (pipeline_shared_grads, in the optimizer's
// apply phase: a collective inside the backward pass would wait for a stage that waits for this one's
// gradient).
#include <map>
#include <set>

#include "graph/builder.h"
#include "graph/passes.h"
#include "ops/registry.h"

namespace flowrun {

namespace {

struct Cuts {
  std::vector<NodeId> order;
  std::vector<size_t> end;        // stage s holds order[end[s - 1], end[s]) (end[-1] = 0)
  std::vector<ValueId> crossing;  // the activation each cut hands on
};

Cuts cut(const Graph& g, int64_t stages) {
  Cuts c;
  c.order = g.live_nodes_topological();
  const size_t n = c.order.size();
  std::vector<size_t> pos(g.nodes().size(), 0);
  for (size_t i = 0; i < n; ++i) pos[static_cast<size_t>(c.order[i])] = i;
  // For each value computed by a node: its producer's position and its last reader's.
  std::vector<int64_t> made(g.values().size(), -1), last(g.values().size(), -1);
  for (size_t i = 0; i < n; ++i) {
    const Node& node = g.node(c.order[i]);
    for (ValueId v : node.outputs) made[static_cast<size_t>(v)] = static_cast<int64_t>(i);
    for (ValueId v : node.inputs) last[static_cast<size_t>(v)] = static_cast<int64_t>(i);
  }
  // Everything the caller reads must come from the last stage.
  size_t first_output = n;
  for (const auto& [name, v] : g.outputs())
    if (made[static_cast<size_t>(v)] >= 0)
      first_output = std::min(first_output, static_cast<size_t>(made[static_cast<size_t>(v)]));
  // Values live across the boundary after position i: made at or before i, read after it.
  std::vector<double> work(n + 1, 0.0);
  std::vector<int> live_count(n, 0);
  std::vector<ValueId> live_one(n, kNoValue);
  for (const Value& v : g.values()) {
    const int64_t m = made[static_cast<size_t>(v.id)], l = last[static_cast<size_t>(v.id)];
    for (int64_t i = m; m >= 0 && i < l; ++i) {
      ++live_count[static_cast<size_t>(i)];
      live_one[static_cast<size_t>(i)] = v.id;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const Node& node = g.node(c.order[i]);
    std::vector<TensorType> in, out;
    for (ValueId v : node.inputs) in.push_back(g.value(v).type);
    for (ValueId v : node.outputs) out.push_back(g.value(v).type);
    const OpDef& def = OpRegistry::get().at(node.op);
    work[i + 1] = work[i] + 1.0 + (def.cost ? def.cost(in, out, node.attrs).flops : 0.0);
  }
  size_t prev = 0;
  for (int64_t k = 1; k < stages; ++k) {
    const double target = work[n] * static_cast<double>(k) / static_cast<double>(stages);
    int64_t best = -1;
    for (size_t i = prev; i + 1 < first_output && i + 1 < n; ++i) {
      const ValueId v = live_one[i];
      if (live_count[i] != 1 || !is_floating(g.value(v).dtype())) continue;
      if (best < 0 || std::abs(work[i + 1] - target) < std::abs(work[static_cast<size_t>(best) + 1] - target))
        best = static_cast<int64_t>(i);
    }
    if (best < 0)
      throw input_error(cat("parallel.pipeline: the model cannot be cut into ", stages,
                            " stages (a cut needs a point where a single activation flows on; found ", k - 1,
                            ")"));
    c.end.push_back(static_cast<size_t>(best) + 1);
    c.crossing.push_back(live_one[static_cast<size_t>(best)]);
    prev = static_cast<size_t>(best) + 1;
  }
  c.end.push_back(n);
  return c;
}

}  // namespace

void pipeline_stage(Graph& g, int64_t stages, int64_t stage) {
  if (stages <= 1) return;
  FR_CHECK(g.param_grads().empty(), "pipeline_stage runs on the forward graph, before autodiff");
  const Cuts c = cut(g, stages);
  auto stage_of = [&](size_t i) {
    int64_t s = 0;
    while (i >= c.end[static_cast<size_t>(s)]) ++s;
    return s;
  };
  // Which stages read each persistent value.
  std::map<ValueId, std::set<int64_t>> readers;
  for (size_t i = 0; i < c.order.size(); ++i)
    for (ValueId v : g.node(c.order[i]).inputs)
      if (g.value(v).kind != ValueKind::intermediate) readers[v].insert(stage_of(i));

  Graph ng;
  std::map<ValueId, ValueId> local;
  for (const Value& v : g.values()) {
    auto it = readers.find(v.id);
    if (v.kind == ValueKind::intermediate || it == readers.end() || !it->second.count(stage)) continue;
    const ValueId nv = v.kind == ValueKind::input   ? ng.add_input(v.name, v.shape(), v.dtype())
                       : v.kind == ValueKind::param ? ng.add_param(v.name, v.shape(), v.dtype())
                                                    : ng.add_state(v.name, v.shape(), v.dtype());
    ng.value(nv).placement = v.placement;
    // Every stage loads the batch (train/program.cc feeds each its micro-batch), so a graph input read by
    // several stages (BERT's token ids, masked again next to the loss) is an input of each.
    if (it->second.size() > 1 && v.kind != ValueKind::input) {
      if (v.kind != ValueKind::param || it->second != std::set<int64_t>{0, stages - 1})
        throw input_error(cat("parallel.pipeline: '", v.name,
                              "' is read by stages other than the first and the "
                              "last together; only parameters tied between them (embeddings) can be shared"));
      ng.value(nv).placement.pipe_shared = true;
      ng.value(nv).placement.pipe_copy = stage != 0;
    }
    local[v.id] = nv;
  }
  if (stage > 0) {
    const Value& a = g.value(c.crossing[static_cast<size_t>(stage - 1)]);
    const ValueId in = ng.add_input("pp/in", a.shape(), a.dtype());
    ng.value(in).requires_grad = true;
    local[a.id] = in;
  }
  const size_t begin = stage == 0 ? 0 : c.end[static_cast<size_t>(stage - 1)];
  for (size_t i = begin; i < c.end[static_cast<size_t>(stage)]; ++i) {
    const Node& node = g.node(c.order[i]);
    std::vector<ValueId> in;
    for (ValueId v : node.inputs) in.push_back(local.at(v));
    const std::vector<ValueId> out = ng.add_node(node.op, in, node.attrs, node.name);
    ng.nodes().back().segment = node.segment;
    for (size_t o = 0; o < out.size(); ++o) local[node.outputs[o]] = out[o];
  }
  if (stage < stages - 1) {
    ng.mark_output("pp/out", local.at(c.crossing[static_cast<size_t>(stage)]));
  } else {
    for (const auto& [name, v] : g.outputs()) ng.mark_output(name, local.at(v));
  }
  g = std::move(ng);
}

void pipeline_shared_grads(Graph& g, std::map<ValueId, ValueId>& grads) {
  GraphBuilder b(g);
  for (auto& [p, grad] : grads)
    if (g.value(p).placement.pipe_shared)
      grad =
          b.op1("all_reduce", {grad}, {{"group", std::string("ends")}}, "pipeline/shared/" + g.value(p).name);
}

}  // namespace flowrun
