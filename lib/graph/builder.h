// GraphBuilder: the API that C++ code, gradient functions and the YAML model loader use to add nodes.
#pragma once

#include <string>
#include <vector>

#include "graph/ir.h"

namespace flowrun {

class GraphBuilder {
 public:
  explicit GraphBuilder(Graph& g) : g_(g) {}
  Graph& graph() { return g_; }
  // A copy: adding nodes may reallocate the value list, so references would dangle across builder calls.
  Shape shape(ValueId v) const { return g_.value(v).shape(); }
  DType dtype(ValueId v) const { return g_.value(v).dtype(); }

  // Scope prefix for node names ("block0/attn/..."), so dumps and profiles read like the model.
  void push_scope(const std::string& s) { scopes_.push_back(s); }
  void pop_scope() { scopes_.pop_back(); }
  std::string scoped(const std::string& name) const;
  // The recompute segment (Node::segment) of the nodes added from now on; -1: none.
  void set_segment(int s) { segment_ = s; }
  int segment() const { return segment_; }

  ValueId input(const std::string& name, const Shape& s, DType t = DType::f32) {
    return g_.add_input(scoped(name), s, t);
  }
  ValueId param(const std::string& name, const Shape& s, DType t = DType::f32) {
    return g_.add_param(scoped(name), s, t);
  }
  ValueId state(const std::string& name, const Shape& s, DType t = DType::f32) {
    return g_.add_state(scoped(name), s, t);
  }

  std::vector<ValueId> op(const std::string& type, const std::vector<ValueId>& in, Attrs attrs = {},
                          const std::string& name = "");
  ValueId op1(const std::string& type, const std::vector<ValueId>& in, Attrs attrs = {},
              const std::string& name = "") {
    return op(type, in, std::move(attrs), name).at(0);
  }

  // Convenience for the most common ops (each is one registry op).
  ValueId add(ValueId a, ValueId b) { return op1("add", {a, b}); }
  ValueId sub(ValueId a, ValueId b) { return op1("sub", {a, b}); }
  ValueId mul(ValueId a, ValueId b) { return op1("mul", {a, b}); }
  ValueId div(ValueId a, ValueId b) { return op1("div", {a, b}); }
  ValueId mul_scalar(ValueId a, double s) { return op1("mul_scalar", {a}, {{"value", s}}); }
  ValueId add_scalar(ValueId a, double s) { return op1("add_scalar", {a}, {{"value", s}}); }
  ValueId matmul(ValueId a, ValueId b, bool ta = false, bool tb = false) {
    return op1("matmul", {a, b}, {{"trans_a", ta}, {"trans_b", tb}});
  }
  ValueId reshape(ValueId a, const Shape& s) { return op1("reshape", {a}, {{"shape", s}}); }
  ValueId reduce_sum(ValueId a, const std::vector<int64_t>& axes, bool keepdims = false) {
    return op1("reduce_sum", {a}, {{"axes", axes}, {"keepdims", keepdims}});
  }
  ValueId zeros_like(ValueId a) { return op1("fill_like", {a}, {{"value", 0.0}}); }
  ValueId cast(ValueId a, DType t) { return op1("cast", {a}, {{"dtype", std::string(dtype_name(t))}}); }
  // Sum `grad` over broadcast dimensions so that it has `target` shape (gradients of broadcasting ops).
  ValueId reduce_to_shape(ValueId grad, Shape target);

 private:
  Graph& g_;
  std::vector<std::string> scopes_;
  int segment_ = -1;
};

}  // namespace flowrun
