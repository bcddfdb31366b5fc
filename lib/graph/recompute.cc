// Activation recompute: the forward nodes of a marked segment (a model layer, Node::segment) are emitted a
// second time for the backward pass, which reads their fresh outputs instead of the ones the forward pass
// made, so those die after the forward pass and the memory planner reuses their bytes. ZeRO-3's parameter
// gathers are emitted again the same way, so that a whole parameter lives only around its uses.
#include <algorithm>
#include <map>
#include <set>

#include "graph/passes.h"
#include "ops/registry.h"

namespace flowrun {

namespace {

bool mutates(const Node& n) {
  const OpDef* def = OpRegistry::get().find(n.op);
  return def != nullptr && def->updates_in_place();
}

// Forward nodes outside every segment that only one segment's forward nodes read join it: the casts of the
// mixed-precision pass and the collectives of the tensor axis, added after the model was built. Walks the
// forward pass backwards, so that a chain of them joins as a whole.
void adopt_helpers(Graph& g, const std::vector<NodeId>& forward,
                   const std::vector<std::vector<NodeId>>& readers, const std::set<ValueId>& outputs) {
  for (auto it = forward.rbegin(); it != forward.rend(); ++it) {
    Node& n = g.node(*it);
    if (n.segment >= 0 || n.outputs.empty() || mutates(n)) continue;
    int seg = -1;
    bool one = true;
    for (ValueId v : n.outputs) {
      if (outputs.count(v)) one = false;
      for (NodeId r : readers[static_cast<size_t>(v)]) {
        if (r >= g.backward_begin) continue;  // the backward pass will read the recomputed copy
        const int s = g.node(r).segment;
        one = one && s >= 0 && (seg < 0 || s == seg);
        seg = s;
      }
    }
    if (one && seg >= 0) n.segment = seg;
  }
}

// The segments' nodes emitted again (see recompute_segments); `forward`: the forward nodes in schedule order.
void recompute_forward(Graph& g, const std::vector<NodeId>& forward) {
  const NodeId bb = g.backward_begin;
  const std::vector<std::vector<NodeId>> readers = g.consumers();
  const std::set<ValueId> outputs = g.output_values();
  adopt_helpers(g, forward, readers, outputs);

  // The segment of each value a segment's node makes (-1: none, or made by a node that mutates state, such as
  // batchnorm's running statistics: running it twice would update them twice, so what it makes is kept).
  // A value is internal to its segment when no forward node of another segment reads it, nor the caller:
  // the values that cross a segment's edge are kept, the internal ones a backward node reads are made again.
  std::vector<int> seg_of(g.values().size(), -1);
  for (NodeId id : forward)
    if (g.node(id).segment >= 0 && !mutates(g.node(id)))
      for (ValueId v : g.node(id).outputs) seg_of[static_cast<size_t>(v)] = g.node(id).segment;
  std::vector<bool> internal(g.values().size(), false), redo(g.values().size(), false);
  for (size_t v = 0; v < seg_of.size(); ++v) {
    if (seg_of[v] < 0 || outputs.count(static_cast<ValueId>(v))) continue;
    bool backward = false, crosses = false;
    for (NodeId r : readers[v]) {
      if (r >= bb)
        backward = true;
      else if (g.node(r).segment != seg_of[v])
        crosses = true;
    }
    internal[v] = !crosses;
    redo[v] = backward && !crosses;
  }
  const auto inside = [&](ValueId v) { return internal[static_cast<size_t>(v)]; };
  // The nodes that make the recomputed values, and what they read inside their segment, in reverse order.
  std::vector<bool> needed(g.nodes().size(), false);
  for (auto it = forward.rbegin(); it != forward.rend(); ++it) {
    const Node& n = g.node(*it);
    const bool feeds = std::any_of(n.outputs.begin(), n.outputs.end(),
                                   [&](ValueId v) { return redo[static_cast<size_t>(v)]; });
    if (!feeds && !needed[static_cast<size_t>(n.id)]) continue;
    needed[static_cast<size_t>(n.id)] = true;
    for (ValueId in : n.inputs)
      if (inside(in)) needed[static_cast<size_t>(g.value(in).producer)] = true;
  }

  // Emit the copies in forward order, reading the kept values where they are and each other's outputs.
  std::map<ValueId, ValueId> fresh;
  const auto current = [&](ValueId v) { return inside(v) ? fresh.at(v) : v; };
  std::vector<NodeId> copies;
  for (NodeId id : forward) {
    if (!needed[static_cast<size_t>(id)]) continue;
    const Node orig = g.node(id);  // a copy: add_node may reallocate the node list
    std::vector<ValueId> inputs;
    for (ValueId v : orig.inputs) inputs.push_back(current(v));
    const std::vector<ValueId> outs = g.add_node(orig.op, inputs, orig.attrs, "recompute/" + orig.name);
    Node& copy = g.nodes().back();
    copy.recomputes = id;
    copy.phase = orig.phase;
    copies.push_back(copy.id);
    for (size_t i = 0; i < outs.size(); ++i) {
      const Value& was = g.value(orig.outputs[i]);
      g.value(outs[i]).placement = was.placement;
      g.value(outs[i]).requires_grad = was.requires_grad;
      fresh[orig.outputs[i]] = outs[i];
    }
  }

  // The backward pass reads the copies; each segment's copies run just before the first backward node that
  // reads one of them.
  std::map<int, NodeId> first_reader;
  for (NodeId id = bb; id < static_cast<NodeId>(g.nodes().size()); ++id) {
    Node& n = g.node(id);
    if (n.dead || n.recomputes >= 0) continue;
    for (ValueId& v : n.inputs) {
      if (!redo[static_cast<size_t>(v)]) continue;
      const int s = seg_of[static_cast<size_t>(v)];
      v = fresh.at(v);
      if (!first_reader.count(s)) first_reader[s] = id;
    }
  }
  for (NodeId id : copies) {
    Node& copy = g.node(id);
    copy.schedule_as = first_reader.at(g.node(copy.recomputes).segment);
  }
}

// The backward pass gathers ZeRO-3's parameters again: each gather_shards of the forward pass gets a copy
// that every backward reader of its output reads instead (recomputed segments included), scheduled just
// before the first of them, so that a whole parameter lives only around its uses.
void regather_parameters(Graph& g) {
  const NodeId bb = g.backward_begin, end = static_cast<NodeId>(g.nodes().size());
  const auto readers = g.consumers();
  for (NodeId id = 0; id < bb; ++id) {
    if (g.node(id).dead || g.node(id).op != "gather_shards") continue;
    const ValueId whole = g.node(id).outputs[0];
    std::vector<NodeId> late;
    for (NodeId r : readers[static_cast<size_t>(whole)])
      if (r >= bb && r < end) late.push_back(r);
    if (late.empty()) continue;
    const Node orig = g.node(id);  // a copy: add_node may reallocate the node list
    const ValueId again = g.add_node(orig.op, orig.inputs, orig.attrs, "recompute/" + orig.name)[0];
    g.value(again).placement = g.value(whole).placement;
    const NodeId copy = g.nodes().back().id;
    g.node(copy).recomputes = id;
    NodeId first = -1;
    for (NodeId r : late) {
      Node& n = g.node(r);
      for (ValueId& v : n.inputs)
        if (v == whole) v = again;
      const NodeId key = n.schedule_as >= 0 ? n.schedule_as : r;
      first = first < 0 ? key : std::min(first, key);
    }
    g.node(copy).schedule_as = first;
  }
}

}  // namespace

void recompute_segments(Graph& g) {
  if (g.backward_begin < 0) return;
  std::vector<NodeId> forward;
  for (NodeId id : g.live_nodes_topological())
    if (id < g.backward_begin) forward.push_back(id);
  if (std::any_of(forward.begin(), forward.end(), [&](NodeId id) { return g.node(id).segment >= 0; }))
    recompute_forward(g, forward);
  regather_parameters(g);
}

}  // namespace flowrun
