// The layout pass (CPU, compiled programs): activations stay in oneDNN's blocked layout between
// convolutions, so that a convolution no longer reorders its input, output and gradients from and to NCHW on
// every call (a ResNet-20 step spent a quarter of its time in those reorders). Eager programs skip it, so
// that the eager step, all plain, checks it bitwise.
//
// The blocked layout is the one oneDNN's f32 convolutions pick on this CPU (cpu::convs_take_nchw8c): nChw16c
// with AVX-512, nChw8c below it (its AVX2 kernels: in nChw16c, the bench CNN's step reordered each
// convolution's operands to nChw8c and back, 5 ms of 26 on a Zen 3 host). It is NHWC where the graph's
// convolutions are bf16 and run oneDNN's AMX kernels, which take NHWC only (ResNet-20's bf16 step spent a
// third of its time reordering nChw16c to NHWC and back, on a Sapphire Rapids-class host). The kernels of
// the ops below take attr `blocked` with attr `nchw8c` or `nhwc` beside it for those two (ops/cpu/conv.h's
// PixelBlocks); in NHWC the per-channel reduce_sum reads a reorder back to NCHW.
//
// Nodes are visited in schedule order and each value gets a layout:
// - convolutions (f32, bf16) read either layout and write their activation output (y, or dx) blocked;
// - `follow` ops (relu, relu_grad, add of equal shapes, cast, batchnorm, batchnorm_grad, maxpool2d,
//   maxpool2d_grad) write blocked when one of their leading activation inputs is blocked (see
//   follow_inputs), the others reordered to it; their kernels are elementwise, or batchnorm's, which sums
//   each plane in the plain kernel's order (ops/cpu/norm.cc), or maxpool's, which scans each window in it
//   (ops/cpu/conv.cc);
// - a per-channel reduce_sum (a convolution's bias gradient) sums a blocked input in place;
// - every other reader of a blocked value reads a `reorder` of it back to NCHW (one per value).
// Only intermediates of shape (N, C, H, W) with C a multiple of the block (f32 or bf16) are blocked, never a
// graph output nor a value something updates in place. A reorder is scheduled as its first reader. A chain
// (values joined through follow ops) is kept blocked only when a convolution reads it: a chain that ends in a
// plain reader gains nothing (oneDNN's jit reorder inside the convolution would become one of ours, and its
// gradient two), so a first walk over the graph finds the chains that feed a convolution. A LeNet-style conv
// -> relu -> maxpool -> conv chain does, and so does the last conv -> relu -> maxpool before the classifier,
// through its gradient: maxpool2d_grad follows the forward indices and feeds the convolution's gradients.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "graph/passes.h"
#include "ops/cpu/dnnl_conv.h"
#include "ops/cpu/reduce.h"
#include "ops/registry.h"

namespace flowrun {

namespace {

bool is_conv(const std::string& op) {
  return op == "conv2d" || op == "conv2d_grad_input" || op == "conv2d_grad_weight";
}

// Whether n is a follow op: its activation inputs in `acts`, of which the first `lead` decide the layout of
// its outputs (follow_outputs). Elementwise ops and batchnorm read activations of their output's shape;
// maxpool2d writes its output and indices in its input's layout, and its gradient follows the indices. A
// gradient (relu_grad's and batchnorm_grad's dy) leads alone: it takes the layout its chain of gradients
// has, and the forward value it reads is reordered to that if need be (this keeps a forward chain and its
// gradients' chain apart, each blocked only where it feeds a convolution). maxpool2d_grad is the exception,
// as its indices (i64) cannot be reordered: its dy is reordered to them instead.
bool follow_inputs(const Graph& g, const Node& n, std::vector<size_t>& acts, size_t& lead) {
  lead = 1;
  if (n.op == "maxpool2d") {
    acts = {0};
    return true;
  }
  if (n.op == "maxpool2d_grad") {
    acts = {1, 0};
    if (n.inputs.size() == 3) acts.push_back(2);  // the fused relu_grad's mask
    return true;
  }
  if (n.op == "batchnorm" || n.op == "relu" || n.op == "cast") {
    acts = {0};
    if (n.op == "batchnorm" && n.inputs.size() == 6) {  // the fused residual leads too, as the add's did
      acts.push_back(5);
      lead = 2;
    }
  } else if (n.op == "batchnorm_grad" || n.op == "relu_grad" || n.op == "add") {
    acts = {0, 1};
    if (n.op == "batchnorm_grad" && n.inputs.size() == 6) acts.push_back(5);  // the fused relu_grad's mask
    if (n.op == "relu_grad" && n.inputs.size() == 3) {  // the fused sum's second gradient leads with dy
      acts = {0, 2, 1};
      lead = 2;
    }
  } else {
    return false;
  }
  if (n.op == "add") lead = 2;
  const Shape& out = g.value(n.outputs[0]).shape();
  for (size_t i : acts)
    if (g.value(n.inputs[i]).shape() != out) return false;
  return true;
}

// The outputs a follow op writes in the layout its leading inputs decide: maxpool2d's indices go with y.
std::vector<ValueId> follow_outputs(const Node& n) {
  if (n.op == "maxpool2d") return {n.outputs[0], n.outputs[1]};
  return {n.outputs[0]};
}

// The follow ops whose kernels take attr `blocked` (the elementwise ones need none).
bool takes_blocked_attr(const std::string& op) {
  return op == "batchnorm" || op == "batchnorm_grad" || op == "maxpool2d" || op == "maxpool2d_grad";
}

class LayoutPass {
 public:
  LayoutPass(Graph& g, std::optional<Layout> as) : g_(g), pinned_(g.output_values()) {
    bool amx = false;
    for (const Node& n : g.nodes()) {
      if (n.dead) continue;
      if (conv_kernel(n) && g.value(n.inputs[0]).dtype() == DType::bf16 && cpu::bf16_convs_take_nhwc())
        amx = true;
      const OpDef* def = OpRegistry::get().find(n.op);
      if (def == nullptr) continue;
      for (int i : def->mutated_inputs(n.attrs, static_cast<int>(n.inputs.size())))
        pinned_.insert(n.inputs[static_cast<size_t>(i)]);
    }
    target_ = as ? *as : amx ? Layout::nhwc : cpu::convs_take_nchw8c() ? Layout::nchw8c : Layout::nchw16c;
    FR_CHECK(target_ != Layout::plain, "layout pass: the blocked layout cannot be plain");
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
           v.shape().size() == 4 && v.shape()[1] % (target_ == Layout::nchw8c ? 8 : 16) == 0 &&
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
      for (size_t k = 0; k < lead; ++k) {
        const ValueId in = n.inputs[acts[k]];
        if (!blocked[static_cast<size_t>(in)]) continue;
        for (ValueId out : follow_outputs(n)) {
          blocked[static_cast<size_t>(out)] = true;
          join(in, out);
        }
      }
      // maxpool2d_grad's dy is reordered to its indices' layout: a blocked dy joins their chain, so that the
      // sum of convolutions' input gradients it reads stays blocked with it.
      const ValueId dy = n.inputs[0];
      if (n.op == "maxpool2d_grad" && blocked[static_cast<size_t>(n.outputs[0])] &&
          blocked[static_cast<size_t>(dy)])
        join(dy, n.outputs[0]);
    }
  }
  void join(ValueId x, ValueId y) {
    const ValueId a = root(x), b = root(y);
    if (a == b) return;
    parent_[static_cast<size_t>(a)] = b;
    if (feeds_conv_.erase(a) > 0) feeds_conv_.insert(b);
  }
  bool blocked(ValueId id) const { return g_.value(id).layout == target_; }
  // The kernels' attr that names the blocked layout beside `blocked` (none for nChw16c).
  void mark_layout(Node& n) const {
    if (target_ != Layout::nchw16c) n.attrs.set(tag(target_), true);
  }
  static const char* tag(Layout l) {
    return l == Layout::nchw16c  ? "nchw16c"
           : l == Layout::nchw8c ? "nchw8c"
           : l == Layout::nhwc   ? "nhwc"
                                 : "nchw";
  }

  // Input i of node id, read in layout `to` (through a reorder when it is in the other one).
  void read_as(NodeId id, size_t i, Layout to) {
    const ValueId v = g_.node(id).inputs[i];
    if (g_.value(v).layout == to) return;
    FR_CHECK(g_.value(v).dtype() == DType::f32 || g_.value(v).dtype() == DType::bf16,
             "layout pass: ", g_.value(v).name, " (", dtype_name(g_.value(v).dtype()),
             ") cannot be reordered");
    const auto key = std::make_pair(v, to);
    auto it = reorders_.find(key);
    if (it == reorders_.end()) {
      const Node& reader = g_.node(id);
      const NodeId at = reader.schedule_as >= 0 ? reader.schedule_as : reader.id;
      const int phase = reader.phase;
      std::string name = cat(g_.value(v).name, "/", tag(to));
      if (g_.in_backward(reader) && name.rfind("grad/", 0) != 0) name = "grad/" + name;
      Attrs attrs{{"to", std::string(tag(to))}};
      const Layout from = g_.value(v).layout;
      if (from == Layout::nhwc || from == Layout::nchw8c) attrs.set("from", std::string(tag(from)));
      const ValueId r = g_.add_node("reorder", {v}, attrs, name)[0];
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
      if (writes_act) g_.value(out).layout = target_;
      const bool x_blocked = n.op == "conv2d"              ? blocked(n.inputs[0])
                             : n.op == "conv2d_grad_input" ? writes_act
                                                           : blocked(n.inputs[1]);
      const bool y_blocked = n.op == "conv2d" ? writes_act : blocked(n.inputs[0]);
      if (x_blocked) n.attrs.set("x_blocked", true);
      if (y_blocked) n.attrs.set("y_blocked", true);
      if (x_blocked || y_blocked) mark_layout(n);
      return;
    }
    std::vector<size_t> acts;
    size_t lead = 0;
    if (follow_inputs(g_, n, acts, lead) && eligible(n.outputs[0]) &&
        std::any_of(acts.begin(), acts.begin() + static_cast<std::ptrdiff_t>(lead),
                    [&](size_t i) { return blocked(n.inputs[i]); })) {
      for (ValueId out : follow_outputs(n)) g_.value(out).layout = target_;
      if (takes_blocked_attr(n.op)) {
        n.attrs.set("blocked", true);
        mark_layout(n);
      }
      for (size_t i : acts) read_as(id, i, target_);
      return;
    }
    // A convolution's bias gradient (a per-channel reduce_sum of dy) sums the blocked dy where it lies.
    if (n.op == "reduce_sum" && target_ != Layout::nhwc && blocked(n.inputs[0]) &&
        cpu::sums_per_channel(g_.value(n.inputs[0]).shape(), n.attrs.ints_or_empty("axes"))) {
      n.attrs.set("blocked", true);
      mark_layout(n);
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
  Layout target_ = Layout::nchw16c;  // the blocked layout
};

}  // namespace

void blocked_layout(Graph& g, std::optional<Layout> as) {
  LayoutPass(g, as).run();
}

}  // namespace flowrun
