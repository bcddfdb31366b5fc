// Graph construction, traversal and text/Graphviz dumps.
#include "graph/ir.h"

#include <algorithm>
#include <functional>
#include <map>
#include <queue>
#include <set>
#include <sstream>
#include <utility>

#include "ops/registry.h"

namespace flowrun {

double Attrs::f(std::string_view k) const {
  auto it = map_.find(k);
  FR_CHECK(it != map_.end(), "missing attribute '", k, "'");
  if (const auto* d = std::get_if<double>(&it->second)) return *d;
  if (const auto* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
  FR_CHECK(false, "attribute '", k, "' is not a number");
  return 0;
}

std::string Attrs::str() const {
  std::ostringstream os;
  bool first = true;
  for (const auto& [k, v] : map_) {
    os << (first ? "" : ", ") << k << "=";
    first = false;
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
            os << shape_str(x);
          } else if constexpr (std::is_same_v<T, bool>) {
            os << (x ? "true" : "false");
          } else {
            os << x;
          }
        },
        v);
  }
  return os.str();
}

const char* value_kind_name(ValueKind k) {
  switch (k) {
    case ValueKind::input: return "input";
    case ValueKind::param: return "param";
    case ValueKind::state: return "state";
    case ValueKind::intermediate: return "value";
  }
  return "?";
}

ValueId Graph::new_value(const std::string& name, const TensorType& t, ValueKind kind) {
  Value v;
  v.id = static_cast<ValueId>(values_.size());
  v.name = name;
  v.type = t;
  v.kind = kind;
  v.requires_grad = kind == ValueKind::param;
  values_.push_back(std::move(v));
  return values_.back().id;
}

ValueId Graph::add_input(const std::string& name, const Shape& shape, DType dtype) {
  return new_value(name, {shape, dtype}, ValueKind::input);
}
ValueId Graph::add_param(const std::string& name, const Shape& shape, DType dtype) {
  return new_value(name, {shape, dtype}, ValueKind::param);
}
ValueId Graph::add_state(const std::string& name, const Shape& shape, DType dtype) {
  return new_value(name, {shape, dtype}, ValueKind::state);
}

std::vector<ValueId> Graph::add_node(const std::string& op, const std::vector<ValueId>& inputs, Attrs attrs,
                                     const std::string& name) {
  const OpDef& def = OpRegistry::get().at(op);
  if (def.num_inputs >= 0 && static_cast<int>(inputs.size()) != def.num_inputs)
    throw input_error(cat("op ", op, " (", name, ") takes ", def.num_inputs, " inputs, got ", inputs.size()));
  std::vector<TensorType> in_types;
  for (ValueId v : inputs) in_types.push_back(value(v).type);
  std::vector<TensorType> out_types;
  try {
    out_types = def.infer(in_types, attrs);
  } catch (const Error& e) {
    std::string shapes;
    for (const auto& t : in_types) shapes += cat(" ", shape_str(t.shape), ":", dtype_name(t.dtype));
    throw Error(e.code(), cat(name.empty() ? op : name, " (", op, "): ", e.what(), "; inputs", shapes));
  }
  FR_CHECK(def.num_outputs(attrs) < 0 || static_cast<int>(out_types.size()) == def.num_outputs(attrs), "op ", op, " inferred ",
           out_types.size(), " outputs");
  Node n;
  n.id = static_cast<NodeId>(nodes_.size());
  n.op = op;
  n.name = name.empty() ? op : name;
  n.attrs = std::move(attrs);
  n.inputs = inputs;
  bool needs_grad = false;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (std::find(def.nondiff_inputs.begin(), def.nondiff_inputs.end(), static_cast<int>(i)) ==
        def.nondiff_inputs.end())
      needs_grad = needs_grad || value(inputs[i]).requires_grad;
  needs_grad = needs_grad && static_cast<bool>(def.grad);
  for (size_t i = 0; i < out_types.size(); ++i) {
    const std::string vname = out_types.size() == 1 ? n.name : cat(n.name, ":", i);
    ValueId v = new_value(vname, out_types[i], ValueKind::intermediate);
    values_[static_cast<size_t>(v)].producer = n.id;
    values_[static_cast<size_t>(v)].producer_slot = static_cast<int>(i);
    values_[static_cast<size_t>(v)].requires_grad =
        needs_grad && is_floating(out_types[i].dtype) &&
        std::find(def.nondiff_outputs.begin(), def.nondiff_outputs.end(), static_cast<int>(i)) ==
            def.nondiff_outputs.end();
    n.outputs.push_back(v);
  }
  nodes_.push_back(std::move(n));
  return nodes_.back().outputs;
}

ValueId Graph::find_value(const std::string& name) const {
  for (const auto& v : values_)
    if (v.name == name) return v.id;
  return kNoValue;
}

void Graph::mark_output(const std::string& name, ValueId v) { outputs_[name] = v; }

std::vector<NodeId> Graph::live_nodes_topological() const {
  // Phase by phase (the apply phase after the every-step phase, so that it reads the state the every-step
  // mutations, e.g. gradient accumulation, left), Kahn's algorithm within a phase, always taking the lowest
  // ready id so that the order follows construction where it can (passes that append replacement nodes
  // still yield a valid order), except that eager ops (collectives to overlap) go first once ready. Nodes
  // that only mutate their inputs (optimizer updates) go last in their phase, so that every reader of the
  // old value has run first; one with a schedule_as instead waits for those readers alone.
  int last_phase = 0;
  for (const auto& n : nodes_)
    if (!n.dead) last_phase = std::max(last_phase, n.phase);
  std::vector<NodeId> order;
  for (int phase = 0; phase <= last_phase; ++phase) {
    std::vector<int> pending(nodes_.size(), 0);
    std::vector<std::vector<NodeId>> readers(nodes_.size());
    // Ordered by (key, id): a node's key is its id, a recomputed node's that of the backward node it
    // precedes, so that it runs just in time instead of as soon as its saved inputs exist.
    using Key = std::pair<NodeId, NodeId>;
    std::priority_queue<Key, std::vector<Key>, std::greater<>> ready, eager;
    auto key = [&](NodeId id) {
      const NodeId as = nodes_[static_cast<size_t>(id)].schedule_as;
      return Key{as >= 0 ? as : id, id};
    };
    std::vector<NodeId> last;
    // A node that only mutates its inputs (an optimizer update).
    auto only_mutates = [&](const Node& n) {
      const OpDef* def = OpRegistry::get().find(n.op);
      return def && def->updates_in_place() && n.outputs.empty();
    };
    // Readers in this phase of each value that a placed update (below) mutates.
    std::map<ValueId, std::vector<NodeId>> mutated;
    for (const auto& n : nodes_) {
      if (n.dead || n.phase != phase || n.schedule_as < 0 || !only_mutates(n)) continue;
      for (int m : OpRegistry::get().at(n.op).mutated_inputs(n.attrs, static_cast<int>(n.inputs.size())))
        mutated[n.inputs[static_cast<size_t>(m)]];
    }
    if (!mutated.empty())
      for (const auto& n : nodes_)
        if (!n.dead && n.phase == phase)
          for (ValueId v : n.inputs)
            if (auto it = mutated.find(v); it != mutated.end()) it->second.push_back(n.id);
    for (const auto& n : nodes_) {
      if (n.dead || n.phase != phase) continue;
      if (only_mutates(n)) {
        // A placed update (schedule_as: sgd_product_update where its product was) runs as soon as its inputs
        // exist and every other reader of what it mutates has run, unless one of those goes last itself.
        std::set<NodeId> before;
        if (n.schedule_as >= 0)
          for (int m : OpRegistry::get().at(n.op).mutated_inputs(n.attrs, static_cast<int>(n.inputs.size())))
            for (NodeId r : mutated.at(n.inputs[static_cast<size_t>(m)]))
              if (r != n.id) before.insert(r);
        if (n.schedule_as < 0 || std::any_of(before.begin(), before.end(), [&](NodeId r) {
              return only_mutates(nodes_[static_cast<size_t>(r)]);
            })) {
          last.push_back(n.id);
          continue;
        }
        for (NodeId r : before) {
          ++pending[static_cast<size_t>(n.id)];
          readers[static_cast<size_t>(r)].push_back(n.id);
        }
      }
      for (ValueId v : n.inputs) {
        const NodeId p = values_[static_cast<size_t>(v)].producer;
        if (p < 0 || nodes_[static_cast<size_t>(p)].dead) continue;
        const int producer_phase = nodes_[static_cast<size_t>(p)].phase;
        FR_CHECK(producer_phase <= phase, "node ", n.name, " (phase ", phase, ") reads a value of phase ",
                 producer_phase);
        if (producer_phase < phase) continue;  // already scheduled
        ++pending[static_cast<size_t>(n.id)];
        readers[static_cast<size_t>(p)].push_back(n.id);
      }
      if (pending[static_cast<size_t>(n.id)] == 0) ready.push(key(n.id));
    }
    auto push = [&](NodeId id) {
      const OpDef* def = OpRegistry::get().find(nodes_[static_cast<size_t>(id)].op);
      (def && def->eager ? eager : ready).push(key(id));
    };
    while (!ready.empty() || !eager.empty()) {
      auto& from = eager.empty() ? ready : eager;
      const NodeId id = from.top().second;
      from.pop();
      order.push_back(id);
      for (NodeId r : readers[static_cast<size_t>(id)])
        if (--pending[static_cast<size_t>(r)] == 0) push(r);
    }
    order.insert(order.end(), last.begin(), last.end());
  }
  return order;
}

std::set<ValueId> Graph::output_values() const {
  std::set<ValueId> s;
  for (const auto& [name, v] : outputs_) s.insert(v);
  return s;
}

std::vector<std::vector<NodeId>> Graph::consumers() const {
  std::vector<std::vector<NodeId>> c(values_.size());
  for (const auto& n : nodes_) {
    if (n.dead) continue;
    for (ValueId v : n.inputs) c[static_cast<size_t>(v)].push_back(n.id);
  }
  return c;
}

std::string Graph::to_text() const {
  std::ostringstream os;
  for (const auto& v : values_)
    if (v.kind != ValueKind::intermediate)
      os << value_kind_name(v.kind) << " %" << v.id << " " << v.name << " " << shape_str(v.shape()) << ":"
         << dtype_name(v.dtype()) << "\n";
  for (NodeId id : live_nodes_topological()) {
    const Node& n = nodes_[static_cast<size_t>(id)];
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      const Value& v = value(n.outputs[i]);
      os << (i ? ", " : "") << "%" << v.id << " " << shape_str(v.shape()) << ":" << dtype_name(v.dtype())
         << (v.layout == Layout::nchw16c  ? "@nChw16c"
             : v.layout == Layout::nchw8c ? "@nChw8c"
             : v.layout == Layout::nhwc   ? "@NHWC"
                                          : "");
    }
    os << (n.outputs.empty() ? "" : " = ") << n.op << "(";
    for (size_t i = 0; i < n.inputs.size(); ++i) os << (i ? ", " : "") << "%" << n.inputs[i];
    os << ")";
    if (!n.attrs.all().empty()) os << " {" << n.attrs.str() << "}";
    os << "  # " << n.name << "\n";
  }
  for (const auto& [name, v] : outputs_) os << "output " << name << " = %" << v << "\n";
  return os.str();
}

std::string Graph::to_dot() const {
  std::ostringstream os;
  os << "digraph flowrun {\n  rankdir=TB;\n  node [fontname=\"monospace\", fontsize=10];\n";
  for (const auto& v : values_)
    if (v.kind != ValueKind::intermediate)
      os << "  v" << v.id << " [shape=ellipse, label=\"" << v.name << "\\n" << shape_str(v.shape()) << "\"];\n";
  for (NodeId id : live_nodes_topological()) {
    const Node& n = nodes_[static_cast<size_t>(id)];
    os << "  n" << n.id << " [shape=box, label=\"" << n.op << "\\n" << n.name << "\"];\n";
    for (ValueId in : n.inputs) {
      const Value& v = value(in);
      if (v.kind == ValueKind::intermediate)
        os << "  n" << v.producer << " -> n" << n.id << " [label=\"" << shape_str(v.shape()) << "\"];\n";
      else
        os << "  v" << in << " -> n" << n.id << ";\n";
    }
  }
  os << "}\n";
  return os.str();
}

}  // namespace flowrun
