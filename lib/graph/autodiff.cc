// Reverse-mode autodiff as a graph pass: walks the forward nodes backwards from the loss, asks each op's
// gradient function for input gradients (as new nodes), and sums contributions where a value fans out.
#include <algorithm>
#include <map>

#include "graph/builder.h"
#include "graph/passes.h"
#include "ops/registry.h"

namespace flowrun {

void autodiff(Graph& g, ValueId loss, ValueId seed) {
  const Value& lv = g.value(loss);
  g.backward_begin = static_cast<NodeId>(g.nodes().size());
  // A non-scalar output is differentiated from a given gradient (a pipeline stage's "pp/out").
  if ((seed == kNoValue && numel(lv.shape()) != 1) || !is_floating(lv.dtype()))
    throw input_error(cat("the loss '", lv.name, "' must be a floating scalar, got ", shape_str(lv.shape()), ":",
                          dtype_name(lv.dtype())));
  if (!lv.requires_grad) throw input_error(cat("the loss '", lv.name, "' does not depend on any parameter"));

  // Forward nodes that lie on a path to the loss, in reverse schedule order.
  std::vector<NodeId> forward = g.live_nodes_topological();
  std::vector<bool> reaches(g.values().size(), false);
  reaches[static_cast<size_t>(loss)] = true;
  std::vector<NodeId> relevant;
  for (auto it = forward.rbegin(); it != forward.rend(); ++it) {
    const Node& n = g.node(*it);
    const bool hit = std::any_of(n.outputs.begin(), n.outputs.end(), [&](ValueId v) {
      return reaches[static_cast<size_t>(v)] && g.value(v).requires_grad;
    });
    if (!hit) continue;
    relevant.push_back(n.id);
    for (ValueId v : n.inputs) reaches[static_cast<size_t>(v)] = true;
  }

  GraphBuilder b(g);
  std::map<ValueId, std::vector<ValueId>> contrib;
  auto total = [&](ValueId v) -> ValueId {
    auto it = contrib.find(v);
    if (it == contrib.end() || it->second.empty()) return kNoValue;
    ValueId sum = it->second[0];
    for (size_t i = 1; i < it->second.size(); ++i) sum = b.add(sum, it->second[i]);
    return sum;
  };
  b.push_scope("grad");
  if (seed == kNoValue) {
    seed = b.op1("fill_like", {loss}, {{"value", 1.0}}, "seed");
  } else {
    FR_CHECK(g.value(seed).shape() == g.value(loss).shape() && g.value(seed).dtype() == g.value(loss).dtype(),
             "the loss gradient seed must match the loss's type");
  }
  contrib[loss].push_back(seed);
  for (NodeId id : relevant) {
    const Node node = g.node(id);  // copy: adding nodes may reallocate the node list
    const OpDef& def = OpRegistry::get().at(node.op);
    std::vector<ValueId> out_grads;
    bool any = false;
    for (ValueId v : node.outputs) {
      out_grads.push_back(g.value(v).requires_grad ? total(v) : kNoValue);
      any = any || out_grads.back() != kNoValue;
    }
    if (!any) continue;
    if (!def.grad) throw input_error(cat("op ", node.op, " (", node.name, ") is not differentiable"));
    b.push_scope(node.name);
    GradCtx ctx{b, node, out_grads};
    const std::vector<ValueId> in_grads = def.grad(ctx);
    b.pop_scope();
    FR_CHECK(in_grads.size() == node.inputs.size(), "gradient of ", node.op, " returned ", in_grads.size(),
             " values for ", node.inputs.size(), " inputs");
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const ValueId in = node.inputs[i];
      if (in_grads[i] == kNoValue || !g.value(in).requires_grad) continue;
      FR_CHECK(g.value(in_grads[i]).shape() == g.value(in).shape(), "gradient of ", node.op, " input ", i, " is ",
               shape_str(g.value(in_grads[i]).shape()), ", expected ", shape_str(g.value(in).shape()));
      FR_CHECK(g.value(in_grads[i]).dtype() == g.value(in).dtype(), "gradient of ", node.op, " input ", i, " is ",
               dtype_name(g.value(in_grads[i]).dtype()), ", expected ", dtype_name(g.value(in).dtype()));
      contrib[in].push_back(in_grads[i]);
    }
  }
  b.pop_scope();
  for (const auto& v : g.values()) {
    // A differentiable input (a pipeline stage's "pp/in"): its gradient goes to the previous stage.
    if (v.kind == ValueKind::input && v.requires_grad) {
      const ValueId grad = total(v.id);
      g.mark_output("grad/" + v.name, grad != kNoValue ? grad : b.zeros_like(v.id));
    }
    if (v.kind != ValueKind::param) continue;
    const ValueId grad = total(v.id);
    if (grad == kNoValue) continue;
    g.param_grads()[v.id] = grad;
    g.mark_output("grad/" + v.name, grad);
  }
}

}  // namespace flowrun
