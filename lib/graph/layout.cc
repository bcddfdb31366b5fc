// The layout pass (CPU, compiled programs): activations stay in oneDNN's nChw16c between convolutions, so
// that a convolution no longer reorders its input, output and gradients from and to NCHW on every call (a
// ResNet-20 step spent a quarter of its time in those reorders). Eager programs skip it, so that the eager
// step, all plain, checks it bitwise.
//
// Nodes are visited in schedule order and each value gets a layout:
// - convolutions (f32, bf16) read either layout and write their activation output (y, or dx) blocked;
// - `follow` ops (relu, relu_grad, add of equal shapes, cast, batchnorm, batchnorm_grad) write blocked when
//   one of their leading activation inputs is blocked (see follow_inputs), the others reordered to it; their
//   kernels are elementwise, or batchnorm's, which sums each plane in the plain kernel's order
//   (ops/cpu/norm.cc);
// - every other reader of a blocked value reads a `reorder` of it back to NCHW (one per value).
// Only intermediates of shape (N, C, H, W) with C a multiple of 16 (f32 or bf16) are blocked, never a graph
// output nor a value something updates in place. A reorder is scheduled as its first reader.
// A chain (values joined through follow ops) is kept blocked only when a convolution reads it: a LeNet-style
// conv -> relu -> maxpool chain gains nothing (oneDNN's jit reorder inside the convolution would become one
// of ours, and its gradient two), so a first walk over the graph finds the chains that feed a convolution.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "graph/passes.h"
#include "ops/registry.h"

namespace flowrun {

namespace {

bool is_conv(const std::string& op) {
  return op == "conv2d" || op == "conv2d_grad_input" || op == "conv2d_grad_weight";
}

// Whether n is a follow op: its activation inputs (those of the output's shape) in `acts`, of which the first
// `lead` decide the output's layout. A gradient (relu_grad's and batchnorm_grad's dy) leads alone: it takes
// the layout its chain of gradients has, and the forward value it reads is reordered to that if need be
// (this keeps a forward chain and its gradients' chain apart, each blocked only where it feeds a
// convolution).
bool follow_inputs(const Graph& g, const Node& n, std::vector<size_t>& acts, size_t& lead) {
  acts.clear();
  if (n.op == "batchnorm" || n.op == "relu" || n.op == "cast") {
    acts = {0};
  } else if (n.op == "batchnorm_grad" || n.op == "relu_grad" || n.op == "add") {
    acts = {0, 1};
  } else {
    return false;
  }
  lead = n.op == "add" ? 2 : 1;
  const Shape& out = g.value(n.outputs[0]).shape();
  for (size_t i : acts)
    if (g.value(n.inputs[i]).shape() != out) return false;
  return true;
}

class LayoutPass {
 public:
  explicit LayoutPass(Graph& g) : g_(g) {
    for (const auto& [name, v] : g.outputs()) pinned_.insert(v);
    for (const Node& n : g.nodes()) {
      if (n.dead) continue;
      const OpDef* def = OpRegistry::get().find(n.op);
      if (def == nullptr) continue;
      for (int i : def->mutated_inputs(n.attrs, static_cast<int>(n.inputs.size())))
        pinned_.insert(n.inputs[static_cast<size_t>(i)]);
    }
  }

  void run() {
    const std::vector<NodeId> order = g_.live_nodes_topological();
    find_chains(order);
    for (NodeId id : order) visit(id);
  }

 private:
  bool could_block(ValueId id) const {
    const Value& v = g_.value(id);
    return v.kind == ValueKind::intermediate && v.producer >= 0 && !pinned_.count(id) &&
           v.shape().size() == 4 && v.shape()[1] % 16 == 0 &&
           (v.dtype() == DType::f32 || v.dtype() == DType::bf16);
  }
  bool eligible(ValueId id) const { return could_block(id) && feeds_conv_.count(root(id)) > 0; }

  bool conv_kernel(const Node& n) const {
    const DType t = g_.value(n.inputs[0]).dtype();
    return is_conv(n.op) && (t == DType::f32 || t == DType::bf16);
  }

  ValueId root(ValueId v) const {
    while (parent_[static_cast<size_t>(v)] != v) v = parent_[static_cast<size_t>(v)];
    return v;
  }

  // The layouts visit() would give with every chain allowed, without changing the graph: the chains (a
  // follow op's blocked output joined with its blocked inputs) and those a convolution reads as x or dy.
  void find_chains(const std::vector<NodeId>& order) {
    parent_.resize(g_.values().size());
    for (size_t v = 0; v < parent_.size(); ++v) parent_[v] = static_cast<ValueId>(v);
    std::vector<bool> blocked(g_.values().size(), false);
    std::vector<size_t> acts;
    size_t lead = 0;
    for (NodeId id : order) {
      const Node& n = g_.node(id);
      if (conv_kernel(n)) {
        const bool weight = n.op == "conv2d_grad_weight";  // reads (dy, x); the others x or dy first
        if (!weight && could_block(n.outputs[0])) blocked[static_cast<size_t>(n.outputs[0])] = true;
        for (size_t i = 0; i < (weight ? 2u : 1u); ++i)
          if (blocked[static_cast<size_t>(n.inputs[i])]) feeds_conv_.insert(root(n.inputs[i]));
        continue;
      }
      if (!follow_inputs(g_, n, acts, lead) || !could_block(n.outputs[0])) continue;
      const ValueId out = n.outputs[0];
      for (size_t k = 0; k < lead; ++k) {
        const ValueId in = n.inputs[acts[k]];
        if (!blocked[static_cast<size_t>(in)]) continue;
        blocked[static_cast<size_t>(out)] = true;
        const ValueId a = root(in), b = root(out);
        if (a == b) continue;
        parent_[static_cast<size_t>(a)] = b;
        if (feeds_conv_.erase(a) > 0) feeds_conv_.insert(b);
      }
    }
  }
  bool blocked(ValueId id) const { return g_.value(id).layout == Layout::nchw16c; }

  // Input i of node id, read in layout `to` (through a reorder when it is in the other one).
  void read_as(NodeId id, size_t i, Layout to) {
    const ValueId v = g_.node(id).inputs[i];
    if (g_.value(v).layout == to) return;
    const auto key = std::make_pair(v, to);
    auto it = reorders_.find(key);
    if (it == reorders_.end()) {
      const Node& reader = g_.node(id);
      const NodeId at = reader.schedule_as >= 0 ? reader.schedule_as : reader.id;
      const int phase = reader.phase;
      std::string name = cat(g_.value(v).name, to == Layout::nchw16c ? "/nchw16c" : "/nchw");
      if (g_.in_backward(reader) && name.rfind("grad/", 0) != 0) name = "grad/" + name;
      const ValueId r = g_.add_node(
          "reorder", {v}, {{"to", std::string(to == Layout::nchw16c ? "nchw16c" : "nchw")}}, name)[0];
      Node& made = g_.node(g_.value(r).producer);
      made.schedule_as = at;
      made.phase = phase;
      g_.value(r).layout = to;
      g_.value(r).placement = g_.value(v).placement;
      it = reorders_.emplace(key, r).first;
    }
    g_.node(id).inputs[i] = it->second;
  }

  void visit(NodeId id) {
    Node& n = g_.node(id);
    if (conv_kernel(n)) {
      // conv2d (x, w[, b]) -> y; conv2d_grad_input (dy, w) -> dx; conv2d_grad_weight (dy, x) -> dw.
      const ValueId out = n.outputs[0];
      const bool writes_act = n.op != "conv2d_grad_weight" && eligible(out);
      if (writes_act) g_.value(out).layout = Layout::nchw16c;
      const bool x_blocked = n.op == "conv2d"              ? blocked(n.inputs[0])
                             : n.op == "conv2d_grad_input" ? writes_act
                                                           : blocked(n.inputs[1]);
      const bool y_blocked = n.op == "conv2d" ? writes_act : blocked(n.inputs[0]);
      if (x_blocked) n.attrs.set("x_blocked", true);
      if (y_blocked) n.attrs.set("y_blocked", true);
      return;
    }
    std::vector<size_t> acts;
    size_t lead = 0;
    if (follow_inputs(g_, n, acts, lead) && eligible(n.outputs[0]) &&
        std::any_of(acts.begin(), acts.begin() + static_cast<std::ptrdiff_t>(lead),
                    [&](size_t i) { return blocked(n.inputs[i]); })) {
      g_.value(n.outputs[0]).layout = Layout::nchw16c;
      if (n.op == "batchnorm" || n.op == "batchnorm_grad") n.attrs.set("blocked", true);
      for (size_t i : acts) read_as(id, i, Layout::nchw16c);
      return;
    }
    for (size_t i = 0; i < g_.node(id).inputs.size(); ++i)
      if (blocked(g_.node(id).inputs[i])) read_as(id, i, Layout::plain);
  }

  Graph& g_;
  std::set<ValueId> pinned_;
  std::vector<ValueId> parent_;   // union-find over the chains
  std::set<ValueId> feeds_conv_;  // roots of the chains a convolution reads blocked
  std::map<std::pair<ValueId, Layout>, ValueId> reorders_;
};

}  // namespace

void blocked_layout(Graph& g) {
  LayoutPass(g).run();
}

}  // namespace flowrun
