// Tensor parallelism as SBP deduction on the tensor axis of the device mesh, then ONE boxing step that turns
// the logical forward graph into this rank's local graph. It runs before autodiff: the boxing ops are each
// other's gradients (tp_enter <-> tp_all_reduce, tp_slice <-> tp_all_gather, tp_reduce_scatter ->
// tp_all_gather), so the backward graph autodiff derives from the local forward graph is the distributed
// backward pass, with every collective in place.
//
// Deduction, in topological order: a value read by the graph is B; a parameter takes the SBP its first reader
// asks for (free: each rank initialises or loads its own piece) unless the model fixes it (`sbp:` in the
// model YAML); each node takes, from its op's signatures (below) and all-B, the one with the fewest bytes of
// boxing by the cost table of ../shared/DESIGN.md (ties: the one that splits more). Megatron-LM's layout
// comes out of this: column-parallel q|k|v and MLP up-projections (B in, S(last) out), heads split through
// reshape, transpose and sdpa, row-parallel output projections (S(last) in, partial sums reduced before the
// bias), a vocabulary-parallel embedding (partial sums) and tied head (logits split on the vocabulary).
#include <map>
#include <optional>

#include "graph/passes.h"
#include "ops/registry.h"

namespace flowrun {

namespace {

struct Sig {
  std::vector<Sbp> in, out;
  // linear (x S(last), W S(1), b): x W^T summed over the ranks, then b added (the bias must be added once).
  bool row_bias = false;
};

// What a rule sees of a node: whole (logical) types and the SBP its inputs have now (nullopt: a parameter
// still free), with the block count each parameter is split in (Placement::groups).
struct NodeInfo {
  const Node& node;
  std::vector<TensorType> in, out;
  std::vector<std::optional<Sbp>> cur;
  std::vector<int> groups;
  int64_t parts;
};

int rank_of(const TensorType& t) {
  return static_cast<int>(t.shape.size());
}

// The split SBPs among the inputs' current ones (candidates for ops that keep an axis split).
std::vector<Sbp> current_splits(const NodeInfo& n) {
  std::vector<Sbp> s;
  for (const auto& c : n.cur)
    if (c && c->kind == Sbp::S && std::find(s.begin(), s.end(), *c) == s.end()) s.push_back(*c);
  return s;
}

// Elementwise ops with numpy broadcasting: an output axis split maps to the same axis of each input counted
// from the right, or B where the input broadcasts along it. `linear_in_p`: sums of partial sums are partial
// sums (add, sub; unary linear ops).
std::vector<Sig> elementwise(const NodeInfo& n, bool linear_in_p) {
  std::vector<Sig> sigs;
  const int ro = rank_of(n.out[0]);
  for (const Sbp& s : current_splits(n)) {
    // The candidate's output axis: from whichever input carries this split.
    int axis = -1;
    for (size_t i = 0; i < n.in.size() && axis < 0; ++i)
      if (n.cur[i] && *n.cur[i] == s) axis = s.axis + ro - rank_of(n.in[i]);
    Sig sig;
    for (const TensorType& t : n.in) {
      const int a = axis - (ro - rank_of(t));
      const bool broadcast = a < 0 || t.shape[static_cast<size_t>(a)] == 1;
      sig.in.push_back(broadcast ? Sbp::broadcast() : Sbp::split(a, s.groups));
    }
    for (size_t o = 0; o < n.out.size(); ++o) sig.out.push_back(Sbp::split(axis, s.groups));
    sigs.push_back(sig);
  }
  if (linear_in_p) {
    bool any_p = false;
    for (const auto& c : n.cur) any_p = any_p || (c && c->kind == Sbp::P);
    if (any_p)
      sigs.push_back(
          {std::vector<Sbp>(n.in.size(), Sbp::partial()), std::vector<Sbp>(n.out.size(), Sbp::partial())});
  }
  return sigs;
}

std::vector<Sig> linear_rule(const NodeInfo& n) {
  const int r = rank_of(n.in[0]);
  const bool bias = n.in.size() == 3;
  std::vector<Sig> sigs;
  auto with_bias = [&](Sig s, Sbp b) {
    if (bias) s.in.push_back(b);
    return s;
  };
  // Column parallel: the output features split (grouped as the weight is).
  const int g = n.groups[1];
  sigs.push_back(with_bias({{Sbp::broadcast(), Sbp::split(0, g)}, {Sbp::split(r - 1, g)}}, Sbp::split(0, g)));
  // Row parallel: the input features split; partial sums out.
  Sig row = with_bias({{Sbp::split(r - 1), Sbp::split(1)}, {bias ? Sbp::broadcast() : Sbp::partial()}},
                      Sbp::broadcast());
  row.row_bias = bias;
  sigs.push_back(row);
  // A split over leading (batch, sequence) axes with the weight whole.
  for (int a = 0; a < r - 1; ++a)
    sigs.push_back(with_bias({{Sbp::split(a), Sbp::broadcast()}, {Sbp::split(a)}}, Sbp::broadcast()));
  if (!bias) sigs.push_back({{Sbp::partial(), Sbp::broadcast()}, {Sbp::partial()}});
  return sigs;
}

// A contiguous split of axis a of `from` is a split of axis b of `to` when the axes before them hold as
// many elements and b divides evenly (the rank's elements stay one block per leading index).
std::optional<int> reshaped_axis(const Shape& from, const Shape& to, const Sbp& s, int64_t parts) {
  int64_t before = 1;
  for (int i = 0; i < s.axis; ++i) before *= from[static_cast<size_t>(i)];
  int64_t p = 1;
  for (size_t b = 0; b < to.size(); ++b) {
    if (p == before && to[b] > 1 && to[b] % (parts * s.groups) == 0) return static_cast<int>(b);
    p *= to[b];
    if (p > before) break;
  }
  return std::nullopt;
}

std::vector<Sig> reshape_rule(const NodeInfo& n) {
  std::vector<Sig> sigs;
  if (n.cur[0] && n.cur[0]->kind == Sbp::S)
    if (auto b = reshaped_axis(n.in[0].shape, n.out[0].shape, *n.cur[0], n.parts))
      sigs.push_back({{*n.cur[0]}, {Sbp::split(*b, n.cur[0]->groups)}});
  if (n.cur[0] && n.cur[0]->kind == Sbp::P) sigs.push_back({{Sbp::partial()}, {Sbp::partial()}});
  return sigs;
}

std::vector<Sig> transpose_rule(const NodeInfo& n) {
  std::vector<Sig> sigs;
  const int r = rank_of(n.in[0]);
  auto norm = [&](int64_t d) { return static_cast<int>(d < 0 ? d + r : d); };
  const int d0 = norm(n.node.attrs.i("dim0")), d1 = norm(n.node.attrs.i("dim1"));
  if (n.cur[0] && n.cur[0]->kind == Sbp::S) {
    const Sbp s = *n.cur[0];
    const int a = s.axis == d0 ? d1 : s.axis == d1 ? d0 : s.axis;
    sigs.push_back({{s}, {Sbp::split(a, s.groups)}});
  }
  if (n.cur[0] && n.cur[0]->kind == Sbp::P) sigs.push_back({{Sbp::partial()}, {Sbp::partial()}});
  return sigs;
}

std::vector<Sig> split_rule(const NodeInfo& n) {
  std::vector<Sig> sigs;
  if (!n.cur[0] || n.cur[0]->kind != Sbp::S) return sigs;
  const Sbp s = *n.cur[0];
  const int r = rank_of(n.in[0]);
  const int64_t at = n.node.attrs.i("axis");
  const int axis = static_cast<int>(at < 0 ? at + r : at);
  const auto& sizes = n.node.attrs.ints("sizes");
  if (s.axis != axis) {
    sigs.push_back({{s}, std::vector<Sbp>(n.out.size(), s)});
  } else if (s.groups == static_cast<int>(sizes.size()) &&
             std::all_of(sizes.begin(), sizes.end(), [&](int64_t v) { return v == sizes[0]; })) {
    // A grouped split cut along its groups: each group is one output, split plainly.
    sigs.push_back({{s}, std::vector<Sbp>(n.out.size(), Sbp::split(axis))});
  }
  return sigs;
}

std::vector<Sig> sdpa_rule(const NodeInfo&) {
  return {{{Sbp::split(1), Sbp::split(1), Sbp::split(1)}, {Sbp::split(1), Sbp::split(1)}},
          {{Sbp::split(0), Sbp::split(0), Sbp::split(0)}, {Sbp::split(0), Sbp::split(0)}}};
}

std::vector<Sig> embedding_rule(const NodeInfo& n) {
  std::vector<Sig> sigs{{{Sbp::broadcast(), Sbp::split(0)}, {Sbp::partial()}}};
  for (int a = 0; a < rank_of(n.in[0]); ++a)
    sigs.push_back({{Sbp::split(a), Sbp::broadcast()}, {Sbp::split(a)}});
  return sigs;
}

std::vector<Sig> layernorm_rule(const NodeInfo& n) {
  std::vector<Sig> sigs;
  for (int a = 0; a + 1 < rank_of(n.in[0]); ++a)
    sigs.push_back(
        {{Sbp::split(a), Sbp::broadcast(), Sbp::broadcast()}, {Sbp::split(a), Sbp::split(a), Sbp::split(a)}});
  return sigs;
}

// Vocabulary-parallel cross-entropy: logits split by class, the row statistics reduced inside the kernel.
std::vector<Sig> cross_entropy_rule(const NodeInfo& n) {
  return {{{Sbp::split(rank_of(n.in[0]) - 1), Sbp::broadcast()}, {Sbp::broadcast(), Sbp::broadcast()}}};
}

using Rule = std::vector<Sig> (*)(const NodeInfo&);

// The ops with signatures beyond all-B. Unlisted ops run replicated (every input boxed to B).
Rule rule_of(const std::string& op, bool random) {
  static const std::map<std::string, Rule> rules = {
      {"linear", linear_rule},
      {"reshape", reshape_rule},
      {"transpose", transpose_rule},
      {"split", split_rule},
      {"sdpa", sdpa_rule},
      {"embedding", embedding_rule},
      {"layernorm", layernorm_rule},
      {"cross_entropy", cross_entropy_rule},
      {"add", [](const NodeInfo& n) { return elementwise(n, true); }},
      {"sub", [](const NodeInfo& n) { return elementwise(n, true); }},
      {"mul_scalar", [](const NodeInfo& n) { return elementwise(n, true); }},
      {"cast", [](const NodeInfo& n) { return elementwise(n, true); }},
  };
  static const std::vector<std::string> pointwise = {
      "mul", "div", "relu", "gelu", "tanh", "sigmoid", "silu", "add_scalar", "dropout", "exp", "neg"};
  if (auto it = rules.find(op); it != rules.end()) return it->second;
  if (std::find(pointwise.begin(), pointwise.end(), op) != pointwise.end()) {
    if (random)  // numbered by element: a grouped piece is not one box of the whole (see the dropout kernel)
      return [](const NodeInfo& n) {
        std::vector<Sig> s = elementwise(n, false);
        s.erase(std::remove_if(s.begin(), s.end(), [](const Sig& g) { return g.out[0].groups > 1; }),
                s.end());
        return s;
      };
    return [](const NodeInfo& n) { return elementwise(n, false); };
  }
  return nullptr;
}

// Bytes each rank moves to turn `from` into `to` (DESIGN.md's table); nullopt: impossible (B or S -> P).
std::optional<double> boxing_bytes(const Sbp& from, const Sbp& to, const TensorType& t, int64_t parts) {
  if (from == to) return 0.0;
  const double bytes = static_cast<double>(numel(t.shape) * static_cast<int64_t>(dtype_size(t.dtype)));
  const double share = bytes * static_cast<double>(parts - 1) / static_cast<double>(parts);
  if (to.kind == Sbp::P) return std::nullopt;
  if (from.kind == Sbp::P) return to.kind == Sbp::B ? 2 * share : share;
  if (from.kind == Sbp::B) return 0.0;  // a local slice
  return share;                         // S -> B: all-gather; S -> S': all-gather, then a local slice
}

struct Choice {
  Sig sig;
  bool distributed = false;  // some output is S or P: each rank computes a different part
};

class TensorParallel {
 public:
  TensorParallel(const Graph& g, int64_t parts, int64_t rank) : g_(g), parts_(parts), rank_(rank) {}

  Graph run() {
    sbp_.assign(g_.values().size(), std::nullopt);
    for (const Value& v : g_.values()) {
      if (v.kind == ValueKind::input || v.kind == ValueKind::state)
        sbp_[static_cast<size_t>(v.id)] = Sbp::broadcast();
      if (v.kind == ValueKind::param && !v.placement.hint.empty())
        sbp_[static_cast<size_t>(v.id)] = parse_sbp(v.placement.hint, v.shape().size(), "sbp of " + v.name);
    }
    const std::vector<NodeId> order = g_.live_nodes_topological();
    for (NodeId id : order) deduce(g_.node(id));
    for (const Value& v : g_.values())  // parameters no node split stay whole
      if (!sbp_[static_cast<size_t>(v.id)]) sbp_[static_cast<size_t>(v.id)] = Sbp::broadcast();
    return materialize(order);
  }

 private:
  void deduce(const Node& node) {
    const OpDef& def = OpRegistry::get().at(node.op);
    NodeInfo n{node, {}, {}, {}, {}, parts_};
    for (ValueId v : node.inputs) {
      n.in.push_back(g_.value(v).type);
      n.cur.push_back(sbp_[static_cast<size_t>(v)]);
      n.groups.push_back(g_.value(v).placement.groups);
    }
    for (ValueId v : node.outputs) n.out.push_back(g_.value(v).type);
    std::vector<Sig> sigs;
    if (Rule rule = rule_of(node.op, def.random)) sigs = rule(n);
    sigs.push_back(
        {std::vector<Sbp>(n.in.size(), Sbp::broadcast()), std::vector<Sbp>(n.out.size(), Sbp::broadcast())});
    // The cheapest signature; among equally cheap ones, the one with the fewest conversions (a free slice of
    // a B value is still a change of layout that later ops may have to undo), then the one that splits more.
    const Sig* best = nullptr;
    double best_cost = 0;
    int best_boxes = 0, best_split = 0;
    for (const Sig& s : sigs) {
      double cost = 0;
      bool ok = true;
      int boxes = 0;
      for (size_t i = 0; i < n.in.size() && ok; ++i) {
        if (!splittable(n.in[i].shape, s.in[i], parts_)) {
          ok = false;
        } else if (!n.cur[i]) {  // a free parameter takes any layout but P
          ok = s.in[i].kind != Sbp::P;
        } else if (auto b = boxing_bytes(*n.cur[i], s.in[i], n.in[i], parts_)) {
          cost += *b;
          boxes += *n.cur[i] != s.in[i];
          // Integer inputs (ids, labels) can only be sliced or gathered.
          ok = *n.cur[i] == s.in[i] || s.in[i].kind == Sbp::S || n.cur[i]->kind == Sbp::S ||
               is_floating(n.in[i].dtype);
        } else {
          ok = false;
        }
      }
      for (size_t o = 0; o < n.out.size() && ok; ++o) ok = splittable(n.out[o].shape, s.out[o], parts_);
      if (!ok) continue;
      int split = 0;
      for (const Sbp& o : s.out) split += o.kind != Sbp::B;
      const bool better =
          !best || cost < best_cost ||
          (cost == best_cost && (boxes < best_boxes || (boxes == best_boxes && split > best_split)));
      if (better) {
        best = &s;
        best_cost = cost;
        best_boxes = boxes;
        best_split = split;
      }
    }
    FR_CHECK(best, "no signature for ", node.name);
    Choice c{*best, best_split > 0 || best->row_bias};
    for (size_t i = 0; i < node.inputs.size(); ++i)
      if (!n.cur[i]) sbp_[static_cast<size_t>(node.inputs[i])] = c.sig.in[i];
    for (size_t o = 0; o < node.outputs.size(); ++o)
      sbp_[static_cast<size_t>(node.outputs[o])] = c.sig.out[o];
    choice_[node.id] = c;
  }

  // This rank's piece of value v under `want`, inserting the boxing op (once per value and SBP).
  ValueId boxed(ValueId v, const Sbp& want) {
    const Sbp have = *sbp_[static_cast<size_t>(v)];
    const ValueId local = local_[static_cast<size_t>(v)];
    if (have == want) return local;
    const std::string key = cat(v, "/", want.str());
    if (auto it = boxed_.find(key); it != boxed_.end()) return it->second;
    const std::string base = g_.value(v).name;
    auto split_attrs = [&](const Sbp& s) {
      return Attrs{{"parts", parts_}, {"axis", int64_t{s.axis}}, {"groups", int64_t{s.groups}}};
    };
    ValueId out;
    if (have.kind == Sbp::P && want.kind == Sbp::B) {
      out = ng_.add_node("tp_all_reduce", {local}, {{"parts", parts_}}, base + "/tp_all_reduce")[0];
    } else if (have.kind == Sbp::P) {
      out = ng_.add_node("tp_reduce_scatter", {local}, split_attrs(want), base + "/tp_reduce_scatter")[0];
    } else if (have.kind == Sbp::B) {
      out = ng_.add_node("tp_slice", {local}, split_attrs(want), base + "/tp_slice")[0];
    } else {
      out = ng_.add_node("tp_all_gather", {local}, split_attrs(have), base + "/tp_all_gather")[0];
      if (want.kind == Sbp::S)
        out = ng_.add_node("tp_slice", {out}, split_attrs(want), base + "/tp_slice")[0];
    }
    boxed_[key] = out;
    return out;
  }

  // A B value read by a split computation: the identity whose gradient, a partial sum on each rank, is
  // summed.
  ValueId entered(ValueId v, ValueId local) {
    if (auto it = entered_.find(v); it != entered_.end()) return it->second;
    const ValueId out =
        ng_.add_node("tp_enter", {local}, {{"parts", parts_}}, g_.value(v).name + "/tp_enter")[0];
    entered_[v] = out;
    return out;
  }

  Attrs local_attrs(const Node& node, const Sig& sig, const std::vector<ValueId>& inputs) {
    Attrs a = node.attrs;
    const Value& out0 = g_.value(node.outputs.at(0));
    const Sbp& s0 = sig.out.at(0);
    if (node.op == "reshape") a.set("shape", local_shape(out0.shape(), s0, parts_));
    if (node.op == "split" && s0.kind == Sbp::S && sig.in[0].kind == Sbp::S && sig.in[0].groups > 1) {
      std::vector<int64_t> sizes = a.ints("sizes");
      for (int64_t& v : sizes) v /= parts_;
      a.set("sizes", sizes);
    }
    if (node.op == "cross_entropy" && sig.in[0].kind == Sbp::S) {
      const int64_t classes = g_.value(node.inputs[0]).shape().back();
      a.set("classes", classes);
      a.set("offset", rank_ * classes / parts_);
    }
    if (node.op == "embedding" && s0.kind == Sbp::P) a.set("offset", rank_ * ng_.value(inputs[1]).shape()[0]);
    if (OpRegistry::get().at(node.op).random && s0.kind == Sbp::S) {
      std::vector<int64_t> start(out0.shape().size(), 0);
      start[static_cast<size_t>(s0.axis)] = rank_ * out0.shape()[static_cast<size_t>(s0.axis)] / parts_;
      a.set("rng_whole", out0.shape());
      a.set("rng_start", start);
    }
    return a;
  }

  Graph materialize(const std::vector<NodeId>& order) {
    local_.assign(g_.values().size(), kNoValue);
    for (const Value& v : g_.values()) {
      if (v.kind == ValueKind::intermediate) continue;
      const Sbp s = *sbp_[static_cast<size_t>(v.id)];
      const Shape shape = local_shape(v.shape(), s, parts_);
      ValueId nv = v.kind == ValueKind::input   ? ng_.add_input(v.name, shape, v.dtype())
                   : v.kind == ValueKind::param ? ng_.add_param(v.name, shape, v.dtype())
                                                : ng_.add_state(v.name, shape, v.dtype());
      ng_.value(nv).requires_grad = v.requires_grad;  // a pipeline stage's "pp/in"
      Placement& p = ng_.value(nv).placement;
      p = v.placement;
      p.tensor = s;
      p.tensor_parts = parts_;
      p.whole = v.shape();
      local_[static_cast<size_t>(v.id)] = nv;
    }
    for (NodeId id : order) {
      const Node& node = g_.node(id);
      const Choice& c = choice_.at(id);
      const OpDef& def = OpRegistry::get().at(node.op);
      std::vector<ValueId> in;
      for (size_t i = 0; i < node.inputs.size(); ++i) {
        const ValueId v = node.inputs[i];
        ValueId local = boxed(v, c.sig.in[i]);
        const bool diff = std::find(def.nondiff_inputs.begin(), def.nondiff_inputs.end(),
                                    static_cast<int>(i)) == def.nondiff_inputs.end();
        const bool bias_after_reduce = c.sig.row_bias && i == 2;
        if (c.distributed && c.sig.in[i].kind == Sbp::B && diff && !bias_after_reduce &&
            is_floating(g_.value(v).dtype()))
          local = entered(v, local);
        in.push_back(local);
      }
      std::vector<ValueId> outs;
      if (c.sig.row_bias) {
        const ValueId partial = ng_.add_node("linear", {in[0], in[1]}, node.attrs, node.name)[0];
        const ValueId sum =
            ng_.add_node("tp_all_reduce", {partial}, {{"parts", parts_}}, node.name + "/tp_all_reduce")[0];
        outs = ng_.add_node("add", {sum, in[2]}, {}, node.name + "/bias");
      } else {
        outs = ng_.add_node(node.op, in, local_attrs(node, c.sig, in), node.name);
      }
      for (size_t o = 0; o < node.outputs.size(); ++o) {
        const Value& whole = g_.value(node.outputs[o]);
        const Shape want = local_shape(whole.shape(), c.sig.out[o], parts_);
        FR_CHECK(ng_.value(outs[o]).shape() == want, node.name, ": local output ",
                 shape_str(ng_.value(outs[o]).shape()), ", expected ", shape_str(want), " (",
                 c.sig.out[o].str(), " of ", shape_str(whole.shape()), ")");
        Placement& p = ng_.value(outs[o]).placement;
        p.tensor = c.sig.out[o];
        p.tensor_parts = parts_;
        if (c.sig.out[o].kind == Sbp::S) p.whole = whole.shape();
        local_[static_cast<size_t>(node.outputs[o])] = outs[o];
      }
    }
    // Whatever the caller reads (loss, logits) it reads whole, on every rank.
    for (const auto& [name, v] : g_.outputs()) ng_.mark_output(name, boxed(v, Sbp::broadcast()));
    return std::move(ng_);
  }

  const Graph& g_;
  int64_t parts_, rank_;
  Graph ng_;
  std::vector<std::optional<Sbp>> sbp_;
  std::map<NodeId, Choice> choice_;
  std::vector<ValueId> local_;
  std::map<std::string, ValueId> boxed_;
  std::map<ValueId, ValueId> entered_;
};

}  // namespace

void tensor_parallel(Graph& g, int64_t parts, int64_t rank) {
  if (parts <= 1) return;
  FR_CHECK(g.param_grads().empty(), "tensor_parallel runs on the forward graph, before autodiff");
  g = TensorParallel(g, parts, rank).run();
}

std::string describe_layout(const Graph& g) {
  std::string s;
  for (const Value& v : g.values())
    if (v.kind == ValueKind::param)
      s += cat(v.name, " ", shape_str(v.placement.whole.empty() ? v.shape() : v.placement.whole), " ",
               v.placement.tensor.str(), "\n");
  return s;
}

}  // namespace flowrun
