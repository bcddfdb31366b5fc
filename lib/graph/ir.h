// The graph IR: Values (logical tensors with shape, dtype and a placement slot) and Nodes (an op type with
// typed attributes), owned by a Graph. Passes rewrite graphs; the planner turns one into a runnable Plan.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"
#include "parallel/sbp.h"

namespace flowrun {

using ValueId = int32_t;
using NodeId = int32_t;
inline constexpr ValueId kNoValue = -1;

using Attr = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>>;

// Typed attributes. Getters take string_view and return references, so kernels can read attributes in the
// steady-state step without allocating.
class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<const std::string, Attr>> init) : map_(init) {}
  bool has(std::string_view k) const { return map_.find(k) != map_.end(); }
  int64_t i(std::string_view k) const { return get<int64_t>(k); }
  int64_t i(std::string_view k, int64_t dflt) const { return has(k) ? get<int64_t>(k) : dflt; }
  double f(std::string_view k) const;
  double f(std::string_view k, double dflt) const { return has(k) ? f(k) : dflt; }
  bool b(std::string_view k, bool dflt = false) const { return has(k) ? get<bool>(k) : dflt; }
  const std::string& s(std::string_view k) const { return get<std::string>(k); }
  std::string s(std::string_view k, const std::string& dflt) const { return has(k) ? s(k) : dflt; }
  // True when string attribute k exists and equals v (no copy).
  bool is(std::string_view k, std::string_view v) const { return has(k) && s(k) == v; }
  const std::vector<int64_t>& ints(std::string_view k) const { return get<std::vector<int64_t>>(k); }
  // The list, or an empty one when absent (by reference: no allocation).
  const std::vector<int64_t>& ints_or_empty(std::string_view k) const {
    static const std::vector<int64_t> empty;
    return has(k) ? ints(k) : empty;
  }
  std::vector<int64_t> ints(std::string_view k, std::vector<int64_t> dflt) const {
    return has(k) ? ints(k) : dflt;
  }
  Attrs& set(const std::string& k, Attr v) {
    map_[k] = std::move(v);
    return *this;
  }
  Attrs& erase(std::string_view k) {
    if (auto it = map_.find(k); it != map_.end()) map_.erase(it);
    return *this;
  }
  const std::map<std::string, Attr, std::less<>>& all() const { return map_; }
  std::string str() const;

 private:
  template <typename T>
  const T& get(std::string_view k) const {
    auto it = map_.find(k);
    FR_CHECK(it != map_.end(), "missing attribute '", k, "'");
    const T* v = std::get_if<T>(&it->second);
    FR_CHECK(v != nullptr, "attribute '", k, "' has the wrong type");
    return *v;
  }
  std::map<std::string, Attr, std::less<>> map_;
};

// What a value is to the runtime: fed each step, a trained parameter, persistent non-trained state (e.g.
// momentum, running statistics), or an intermediate computed by a node.
enum class ValueKind : uint8_t { input, param, state, intermediate };
const char* value_kind_name(ValueKind k);

// How an (N, C, H, W) value's bytes are arranged. The layout pass (graph/layout.cc) keeps the activations
// between convolutions in the layout oneDNN's convolutions want: nChw16c (channel blocks of 16 innermost)
// with AVX-512, nChw8c (blocks of 8) below it, or NHWC for bf16 on AMX, so that no reorder runs around each
// convolution; every other value is plain (row-major in its shape).
enum class Layout : uint8_t { plain, nchw16c, nchw8c, nhwc };

// Logical tensor type: what shape inference produces.
struct TensorType {
  Shape shape;
  DType dtype = DType::f32;
};

// Placement of a value on the device mesh, filled by the distributed passes; the default is "one device,
// whole tensor".
struct Placement {
  // The tensor axis (graph/sbp_parallel.cc): this value's SBP over `tensor_parts` ranks, and the shape of
  // the whole value when it is split (the value's own shape is then one rank's piece). Before that pass,
  // `hint` (a model's `sbp:` override, "B" or "S(i)") and `groups` (a fused projection's blocks, e.g. 3 for
  // q|k|v) steer the choice for parameters.
  Sbp tensor;
  int64_t tensor_parts = 1;
  // The data axis's SBP (graph/sbp_parallel.cc): S(0) for the batch and what is computed from it, B for
  // parameters; the value's shape is already one rank's.
  Sbp data;
  Shape whole;
  std::string hint;
  int groups = 1;
  // A value split over the data-parallel ranks as flat, equal, zero-padded shards (ZeRO's optimizer state):
  // the shape of the (tensor-axis local) tensor, of which this value is one rank's numel / ranks (rounded up)
  // elements. Empty for whole tensors.
  Shape global_shape;
  // The pipeline axis (graph/pipeline.cc): a parameter several stages hold (a tied embedding), and whether
  // this stage's is a copy (left out of the gradient norm, which the first holder counts).
  bool pipe_shared = false, pipe_copy = false;
  bool sharded() const { return !global_shape.empty(); }
  bool tensor_split() const { return tensor.kind == Sbp::S && tensor_parts > 1; }
};

struct Value {
  ValueId id = kNoValue;
  std::string name;
  TensorType type;
  ValueKind kind = ValueKind::intermediate;
  NodeId producer = -1;
  int producer_slot = 0;
  bool requires_grad = false;  // params always; inputs never; intermediates derived by autodiff
  Layout layout = Layout::plain;
  Placement placement;
  const Shape& shape() const { return type.shape; }
  DType dtype() const { return type.dtype; }
  size_t nbytes() const { return static_cast<size_t>(numel(type.shape)) * dtype_size(type.dtype); }
};

struct Node {
  NodeId id = -1;
  std::string op;
  std::string name;
  Attrs attrs;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  bool dead = false;
  // 0: runs every step; 1 ("apply"): runs only on the last micro-step of a gradient-accumulation window
  // (optimizer updates), see Executor::run.
  int phase = 0;
  // Activation recompute (graph/recompute.cc). `segment`: the recompute segment (a model layer marked for
  // it) this forward node belongs to, -1 for none. On a node the recompute pass re-emitted in the backward
  // pass: `recomputes`, the forward node it repeats (whose name keys its random draws, so that a dropout
  // mask is drawn again as it was), and `schedule_as`, the backward node it is scheduled just before. An
  // update given a schedule_as (sgd_product_update) runs there, not last (live_nodes_topological).
  int segment = -1;
  NodeId recomputes = -1;
  NodeId schedule_as = -1;
};

class Graph {
 public:
  ValueId add_input(const std::string& name, const Shape& shape, DType dtype);
  ValueId add_param(const std::string& name, const Shape& shape, DType dtype);
  ValueId add_state(const std::string& name, const Shape& shape, DType dtype);
  // Adds a node for a registered op: validates inputs and infers output types through the registry.
  std::vector<ValueId> add_node(const std::string& op, const std::vector<ValueId>& inputs, Attrs attrs = {},
                                const std::string& name = "");

  Value& value(ValueId id) { return values_.at(static_cast<size_t>(id)); }
  const Value& value(ValueId id) const { return values_.at(static_cast<size_t>(id)); }
  Node& node(NodeId id) { return nodes_.at(static_cast<size_t>(id)); }
  const Node& node(NodeId id) const { return nodes_.at(static_cast<size_t>(id)); }
  std::vector<Value>& values() { return values_; }
  const std::vector<Value>& values() const { return values_; }
  std::vector<Node>& nodes() { return nodes_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  ValueId find_value(const std::string& name) const;  // kNoValue if absent

  // Named outputs the caller wants to read after a step (e.g. "loss"); they are kept alive by passes.
  void mark_output(const std::string& name, ValueId v);
  void unmark_output(const std::string& name) { outputs_.erase(name); }
  const std::map<std::string, ValueId>& outputs() const { return outputs_; }
  // The values marked as outputs, which passes must keep (not fold into a fused node).
  std::set<ValueId> output_values() const;
  // Gradient of each parameter, filled by autodiff (param -> gradient value).
  std::map<ValueId, ValueId>& param_grads() { return param_grads_; }
  const std::map<ValueId, ValueId>& param_grads() const { return param_grads_; }
  // The live nodes in run order. Nodes that only mutate their inputs (optimizer updates) run after every
  // reader of what they mutate: last in their phase, or, given a schedule_as, as soon as those readers have.
  std::vector<NodeId> live_nodes_topological() const;
  // Consumers of each value among live nodes.
  std::vector<std::vector<NodeId>> consumers() const;

  std::string to_text() const;
  std::string to_dot() const;

 private:
  ValueId new_value(const std::string& name, const TensorType& t, ValueKind kind);
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::map<std::string, ValueId> outputs_;
  std::map<ValueId, ValueId> param_grads_;

 public:
  // The first node autodiff added (-1 before it ran): the nodes before it are the forward pass.
  NodeId backward_begin = -1;
  // Whether n belongs to the backward pass: added by autodiff or later, and not scheduled as a forward node
  // (a pass that adds a node for a forward reader schedules it as that reader, Node::schedule_as).
  bool in_backward(const Node& n) const {
    const NodeId at = n.schedule_as >= 0 ? n.schedule_as : n.id;
    return backward_begin >= 0 && at >= backward_begin;
  }
};

}  // namespace flowrun
