// Data and tensor parallelism as SBP deduction, one mesh axis at a time, then ONE boxing step that turns the
// logical forward graph into this rank's local graph for that axis: the data axis first (on the logical
// graph of the global micro-batch), then the tensor axis (on the data-local graph). It runs before autodiff:
// the boxing ops are each other's gradients (sbp_enter <-> sbp_all_reduce, sbp_slice <-> sbp_all_gather,
// sbp_reduce_scatter -> sbp_all_gather), so the backward graph autodiff derives from the local forward graph
// is the distributed backward pass, with every collective in place; reduce_gradients then fuses the data
// axis's gradient all-reduces into buckets.
//
// Deduction, in topological order. Graph inputs are S(0) on the data axis (each rank loads its part of the
// batch) and B on the tensor axis; states are B. Parameters are B on the data axis; on the tensor axis one
// takes the SBP its first reader asks for (free: each rank initialises or loads its own piece) unless the
// model fixes it (`sbp:` in the model YAML). Each node takes, from its op's signatures (OpDef::sbp) and
// all-B, the one with the fewest bytes of boxing by the cost table of ../shared/DESIGN.md (ties: the fewest
// conversions, then the most splitting). On the data axis this is the batch split through every layer, with
// the loss a partial mean; on the tensor axis Megatron-LM's layout comes out: column-parallel q|k|v and MLP
// up-projections (B in, S(last) out), heads split through reshape, transpose and sdpa, row-parallel output
// projections (S(last) in, partial sums reduced before the bias), a vocabulary-parallel embedding (partial
// sums) and tied head (logits split on the vocabulary).
#include <algorithm>
#include <map>
#include <optional>

#include "graph/builder.h"
#include "graph/passes.h"
#include "ops/registry.h"
#include "parallel/comm.h"

namespace flowrun {

namespace {

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
  SbpSignature sig;
  bool distributed = false;  // some output is S or P: each rank computes a different part
};

class SbpAxisPass {
 public:
  SbpAxisPass(const Graph& g, MeshAxis axis, int64_t parts, int64_t rank)
      : g_(g), axis_(axis), parts_(parts), rank_(rank) {}

  Graph run() {
    sbp_.assign(g_.values().size(), std::nullopt);
    for (const Value& v : g_.values()) {
      const size_t i = static_cast<size_t>(v.id);
      if (v.kind == ValueKind::input) sbp_[i] = axis_ == MeshAxis::data ? Sbp::split(0) : Sbp::broadcast();
      if (v.kind == ValueKind::state || (v.kind == ValueKind::param && axis_ == MeshAxis::data))
        sbp_[i] = Sbp::broadcast();
      if (v.kind == ValueKind::param && axis_ == MeshAxis::tensor && !v.placement.hint.empty())
        sbp_[i] = parse_sbp(v.placement.hint, v.shape().size(), "sbp of " + v.name);
      if (sbp_[i] && !splittable(v.shape(), *sbp_[i], parts_))
        throw input_error(cat(v.name, " ", shape_str(v.shape()), " cannot be split ", sbp_[i]->str(),
                              " over the ", parts_, " ranks of the ", mesh_axis_name(axis_), " axis"));
    }
    const std::vector<NodeId> order = g_.live_nodes_topological();
    for (NodeId id : order) deduce(g_.node(id));
    for (const Value& v : g_.values())  // parameters no node split stay whole
      if (!sbp_[static_cast<size_t>(v.id)]) settle(v.id, Sbp::broadcast());
    return materialize(order);
  }

 private:
  // Fixes the SBP of a value that was free (a parameter, or the sbp_enter of another axis that a free
  // parameter goes through), and of what it aliases.
  void settle(ValueId v, const Sbp& s) {
    sbp_[static_cast<size_t>(v)] = s;
    if (auto it = alias_.find(v); it != alias_.end()) {
      const Node& enter = g_.node(g_.value(v).producer);
      choice_[enter.id] = {{{s}, {s}}, false};
      settle(it->second, s);
    }
  }

  void deduce(const Node& node) {
    const OpDef& def = OpRegistry::get().at(node.op);
    // The identity of another axis's boxing in front of a free parameter (the data axis's sbp_enter, for the
    // tensor axis) leaves it free: the parameter takes the SBP its real reader asks for.
    if (node.op == "sbp_enter" && !sbp_[static_cast<size_t>(node.inputs[0])]) {
      alias_[node.outputs[0]] = node.inputs[0];
      return;
    }
    SbpQuery q{node.attrs, {}, {}, {}, {}, axis_, parts_};
    for (ValueId v : node.inputs) {
      q.in.push_back(g_.value(v).type);
      q.cur.push_back(sbp_[static_cast<size_t>(v)]);
      q.groups.push_back(g_.value(v).placement.groups);
    }
    for (ValueId v : node.outputs) q.out.push_back(g_.value(v).type);
    std::vector<SbpSignature> sigs;
    if (def.sbp) sigs = def.random ? without_grouped_outputs(def.sbp(q)) : def.sbp(q);
    sigs.push_back(
        {std::vector<Sbp>(q.in.size(), Sbp::broadcast()), std::vector<Sbp>(q.out.size(), Sbp::broadcast())});
    // The cheapest signature; among equally cheap ones, the one with the fewest conversions (a free slice of
    // a B value is still a change of layout that later ops may have to undo), then the one that splits more.
    //
    // Before all of that, on the tensor axis, a matmul or linear splits a free weight (a parameter of rank >=
    // 2 no node has placed yet) whenever a signature can: tensor parallelism is there to divide the weights,
    // and a node-by-node choice cannot weigh a whole copy (memory, held throughout) against the collectives a
    // split may need later (traffic). Otherwise, once a layout splits the batch on this axis (attention whose
    // heads the axis does not divide), every later weight would find keeping it whole cheapest.
    const bool split_weights = axis_ == MeshAxis::tensor && (node.op == "linear" || node.op == "matmul");
    auto keeps_weight_whole = [&](const SbpSignature& s) {
      for (size_t i = 0; i < q.in.size(); ++i)
        if (!q.cur[i] && q.in[i].shape.size() >= 2 && s.in[i].kind == Sbp::B) return true;
      return false;
    };
    const SbpSignature* best = nullptr;
    double best_cost = 0;
    int best_boxes = 0, best_split = 0;
    bool best_whole = false;
    for (const SbpSignature& s : sigs) {
      double cost = 0;
      bool ok = s.in.size() == q.in.size() && s.out.size() == q.out.size();
      int boxes = 0;
      for (size_t i = 0; i < q.in.size() && ok; ++i) {
        if (!splittable(q.in[i].shape, s.in[i], parts_)) {
          ok = false;
        } else if (!q.cur[i]) {  // a free parameter takes any layout but P
          ok = s.in[i].kind != Sbp::P;
        } else if (auto b = boxing_bytes(*q.cur[i], s.in[i], q.in[i], parts_)) {
          cost += *b;
          boxes += *q.cur[i] != s.in[i];
          // Integer inputs (ids, labels) can only be sliced or gathered.
          ok = *q.cur[i] == s.in[i] || s.in[i].kind == Sbp::S || q.cur[i]->kind == Sbp::S ||
               is_floating(q.in[i].dtype);
        } else {
          ok = false;
        }
      }
      for (size_t o = 0; o < q.out.size() && ok; ++o) ok = splittable(q.out[o].shape, s.out[o], parts_);
      if (!ok) continue;
      int split = 0;
      for (const Sbp& o : s.out) split += o.kind != Sbp::B;
      const bool whole = split_weights && keeps_weight_whole(s);
      const bool better =
          !best || (!whole && best_whole) ||
          (whole == best_whole &&
           (cost < best_cost ||
            (cost == best_cost && (boxes < best_boxes || (boxes == best_boxes && split > best_split)))));
      if (better) {
        best = &s;
        best_cost = cost;
        best_boxes = boxes;
        best_split = split;
        best_whole = whole;
      }
    }
    FR_CHECK(best, "no signature for ", node.name);
    Choice c{*best, best_split > 0 || best->row_bias};
    for (size_t i = 0; i < node.inputs.size(); ++i)
      if (!q.cur[i]) settle(node.inputs[i], c.sig.in[i]);
    for (size_t o = 0; o < node.outputs.size(); ++o)
      sbp_[static_cast<size_t>(node.outputs[o])] = c.sig.out[o];
    choice_[node.id] = c;
  }

  Attrs comm_attrs() const { return {{"parts", parts_}, {"mesh", std::string(mesh_axis_name(axis_))}}; }
  Attrs split_attrs(const Sbp& s) const {
    Attrs a = comm_attrs();
    a.set("axis", int64_t{s.axis});
    a.set("groups", int64_t{s.groups});
    return a;
  }
  std::string suffix(const char* op) const { return cat("/", op, "_", mesh_axis_name(axis_)); }

  // This rank's piece of value v under `want`, inserting the boxing op (once per value and SBP).
  ValueId boxed(ValueId v, const Sbp& want) {
    const Sbp have = *sbp_[static_cast<size_t>(v)];
    const ValueId local = local_[static_cast<size_t>(v)];
    if (have == want) return local;
    const std::string key = cat(v, "/", want.str());
    if (auto it = boxed_.find(key); it != boxed_.end()) return it->second;
    const std::string base = g_.value(v).name;
    ValueId out;
    if (have.kind == Sbp::P && want.kind == Sbp::B) {
      out = ng_.add_node("sbp_all_reduce", {local}, comm_attrs(), base + suffix("all_reduce"))[0];
    } else if (have.kind == Sbp::P) {
      out =
          ng_.add_node("sbp_reduce_scatter", {local}, split_attrs(want), base + suffix("reduce_scatter"))[0];
    } else if (have.kind == Sbp::B) {
      out = ng_.add_node("sbp_slice", {local}, split_attrs(want), base + suffix("slice"))[0];
    } else {
      out = ng_.add_node("sbp_all_gather", {local}, split_attrs(have), base + suffix("all_gather"))[0];
      if (want.kind == Sbp::S)
        out = ng_.add_node("sbp_slice", {out}, split_attrs(want), base + suffix("slice"))[0];
    }
    boxed_[key] = out;
    return out;
  }

  // A B value read by a split computation: the identity whose gradient, a partial sum on each rank, is
  // summed.
  ValueId entered(ValueId v, ValueId local) {
    if (auto it = entered_.find(v); it != entered_.end()) return it->second;
    const ValueId out =
        ng_.add_node("sbp_enter", {local}, comm_attrs(), g_.value(v).name + suffix("enter"))[0];
    ng_.value(out).placement.groups = g_.value(v).placement.groups;  // a fused projection's weight, entered
    entered_[v] = out;
    return out;
  }

  Attrs local_attrs(const Node& node, const SbpSignature& sig, const std::vector<ValueId>& inputs) {
    Attrs a = node.attrs;
    const Value& out0 = g_.value(node.outputs.at(0));
    const Sbp& s0 = sig.out.at(0);
    if (node.op == "reshape" || node.op == "broadcast_to")
      a.set("shape", local_shape(out0.shape(), s0, parts_));
    if (node.op == "split" && s0.kind == Sbp::S && sig.in[0].kind == Sbp::S && sig.in[0].groups > 1) {
      std::vector<int64_t> sizes = a.ints("sizes");
      for (int64_t& v : sizes) v /= parts_;
      a.set("sizes", sizes);
    }
    const Shape& in0 = g_.value(node.inputs[0]).shape();
    if (node.op == "cross_entropy" && sig.in[0].kind == Sbp::S &&
        sig.in[0].axis == static_cast<int>(in0.size()) - 1) {
      a.set("classes", in0.back());
      a.set("offset", rank_ * in0.back() / parts_);
    }
    if (node.op == "embedding" && s0.kind == Sbp::P) a.set("offset", rank_ * ng_.value(inputs[1]).shape()[0]);
    // Random ops number their elements in the whole tensor: rng_whole is the logical shape (the first axis
    // pass sets it), rng_start this rank's first index on each axis (each axis pass adds its offset).
    if (OpRegistry::get().at(node.op).random && s0.kind == Sbp::S) {
      const Shape& shape = out0.shape();
      std::vector<int64_t> start =
          a.has("rng_start") ? a.ints("rng_start") : std::vector<int64_t>(shape.size(), 0);
      if (!a.has("rng_whole")) a.set("rng_whole", shape);
      start[static_cast<size_t>(s0.axis)] += rank_ * shape[static_cast<size_t>(s0.axis)] / parts_;
      a.set("rng_start", start);
    }
    return a;
  }

  Placement placed(const Placement& from, const Sbp& s, const Shape& whole) const {
    Placement p = from;
    if (axis_ == MeshAxis::data) {
      p.data = s;
    } else {
      p.tensor = s;
      p.tensor_parts = parts_;
      if (s.kind == Sbp::S) p.whole = whole;
    }
    return p;
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
      ng_.value(nv).placement = placed(v.placement, s, v.shape());
      if (axis_ == MeshAxis::tensor) ng_.value(nv).placement.whole = v.shape();
      local_[static_cast<size_t>(v.id)] = nv;
    }
    for (NodeId id : order) {
      const Node& node = g_.node(id);
      const Choice& c = choice_.at(id);
      const OpDef& def = OpRegistry::get().at(node.op);
      const size_t first = ng_.nodes().size();
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
            ng_.add_node("sbp_all_reduce", {partial}, comm_attrs(), node.name + suffix("all_reduce"))[0];
        outs = ng_.add_node("add", {sum, in[2]}, {}, node.name + "/bias");
      } else {
        outs = ng_.add_node(node.op, in, local_attrs(node, c.sig, in), node.name);
      }
      if (c.sig.partial_mean)
        outs[0] = ng_.add_node("mul_scalar", {outs[0]}, {{"value", 1.0 / static_cast<double>(parts_)}},
                               node.name + suffix("mean"))[0];
      // The node's local pieces and the boxing of its inputs belong to its recompute segment.
      for (size_t i = first; i < ng_.nodes().size(); ++i) ng_.nodes()[i].segment = node.segment;
      for (size_t o = 0; o < node.outputs.size(); ++o) {
        const Value& whole = g_.value(node.outputs[o]);
        const Shape want = local_shape(whole.shape(), c.sig.out[o], parts_);
        FR_CHECK(ng_.value(outs[o]).shape() == want, node.name, ": local output ",
                 shape_str(ng_.value(outs[o]).shape()), ", expected ", shape_str(want), " (",
                 c.sig.out[o].str(), " of ", shape_str(whole.shape()), ")");
        ng_.value(outs[o]).placement = placed(ng_.value(outs[o]).placement, c.sig.out[o], whole.shape());
        local_[static_cast<size_t>(node.outputs[o])] = outs[o];
      }
    }
    // What the caller reads (the loss, logits) it reads whole on every rank of the tensor axis; on the data
    // axis partial sums are reduced and splits stay (a pipeline stage sends its own part of the batch on).
    for (const auto& [name, v] : g_.outputs()) {
      const Sbp have = *sbp_[static_cast<size_t>(v)];
      ng_.mark_output(name,
                      boxed(v, axis_ == MeshAxis::data && have.kind == Sbp::S ? have : Sbp::broadcast()));
    }
    return std::move(ng_);
  }

  const Graph& g_;
  MeshAxis axis_;
  int64_t parts_, rank_;
  Graph ng_;
  std::vector<std::optional<Sbp>> sbp_;
  std::map<NodeId, Choice> choice_;
  std::vector<ValueId> local_;
  std::map<std::string, ValueId> boxed_;
  std::map<ValueId, ValueId> entered_;
  std::map<ValueId, ValueId> alias_;  // a free value -> the free value it is the identity of
};

}  // namespace

void split_over_axis(Graph& g, MeshAxis axis, int64_t parts, int64_t rank) {
  if (parts <= 1) return;
  FR_CHECK(g.param_grads().empty(), "SBP deduction runs on the forward graph, before autodiff");
  g = SbpAxisPass(g, axis, parts, rank).run();
}

void shard_parameters(Graph& g, int64_t ranks) {
  if (ranks <= 1) return;
  // Each parameter enters the data axis once (SbpAxisPass::entered): its sbp_enter becomes the gather.
  std::map<ValueId, NodeId> entry;
  for (const Node& n : g.nodes())
    if (!n.dead && n.op == "sbp_enter" && n.attrs.is("mesh", "data") &&
        g.value(n.inputs[0]).kind == ValueKind::param)
      entry.emplace(n.inputs[0], n.id);
  const auto readers = g.consumers();
  for (const auto& [p, id] : entry) {
    Value& pv = g.value(p);
    const Shape local = pv.shape();
    for (NodeId r : readers[static_cast<size_t>(p)])
      FR_CHECK(r == id, "ZeRO-3: parameter ", pv.name, " is read by ", g.node(r).name, " besides its entry");
    pv.type.shape = {shard_size(numel(local), ranks)};
    pv.placement.global_shape = local;
    Node& n = g.node(id);
    n.op = "gather_shards";
    n.attrs = {{"shards", ranks}, {"shape", std::vector<int64_t>(local.begin(), local.end())}};
  }
}

void reduce_gradients(Graph& g, int64_t ranks, bool shard_grads, int64_t bucket_bytes) {
  if (ranks <= 1) return;
  GraphBuilder b(g);
  // Each parameter's gradient leaves the backward pass through the data axis's all-reduce of its sbp_enter
  // (P -> B). Take the partial sums from before it; the all-reduce, no longer read, is dead.
  std::vector<ValueId> params;
  for (auto& [p, grad] : g.param_grads()) {
    const Value& gv = g.value(grad);
    if (gv.producer < 0) continue;
    const Node& n = g.node(gv.producer);
    if (n.op != "sbp_all_reduce" || !n.attrs.is("mesh", "data")) continue;
    grad = n.inputs[0];
    params.push_back(p);
  }
  if (shard_grads) {
    // ZeRO-2: the boxing P -> S (a reduce-scatter) instead of P -> B: each rank receives only the flat shard
    // of every summed gradient whose optimizer state it keeps.
    for (ValueId p : params) {
      ValueId& grad = g.param_grads()[p];
      grad = b.op1("reduce_scatter_shard", {grad}, {{"shards", ranks}, {"scale", 1.0}},
                   cat("reduce_gradients/", g.value(p).name));
      g.mark_output("grad/" + g.value(p).name, grad);
    }
    return;
  }
  // Buckets of about bucket_bytes, filled in the order the backward pass produces the gradients (the last
  // layer's first): each bucket's all-reduce starts as soon as its last gradient exists (all_reduce_start
  // is eager) and is waited for only before the optimizer, so it overlaps the rest of the backward pass.
  const std::vector<NodeId> order = g.live_nodes_topological();
  std::vector<size_t> position(g.nodes().size(), 0);
  for (size_t i = 0; i < order.size(); ++i) position[static_cast<size_t>(order[i])] = i;
  auto made = [&](ValueId p) {
    return position[static_cast<size_t>(g.value(g.param_grads().at(p)).producer)];
  };
  std::stable_sort(params.begin(), params.end(), [&](ValueId a, ValueId c) { return made(a) < made(c); });
  std::map<DType, std::vector<ValueId>> open;  // a bucket being filled per gradient dtype
  std::map<DType, size_t> open_bytes;
  int bucket = 0;
  auto close = [&](DType t) {
    std::vector<ValueId>& ps = open[t];
    if (ps.empty()) return;
    std::vector<ValueId> grads;
    std::vector<int64_t> dims_rank, dims;
    for (ValueId p : ps) {
      const ValueId grad = g.param_grads().at(p);
      grads.push_back(grad);
      dims_rank.push_back(static_cast<int64_t>(g.value(grad).shape().size()));
      dims.insert(dims.end(), g.value(grad).shape().begin(), g.value(grad).shape().end());
    }
    const std::string name = cat("reduce_gradients/bucket", bucket++, "_", dtype_name(t));
    const std::vector<ValueId> started = b.op("all_reduce_start", grads, {}, name + "/start");
    const std::vector<ValueId> reduced = b.op(
        "all_reduce_wait", started, {{"ranks", dims_rank}, {"dims", dims}, {"scale", 1.0}}, name + "/wait");
    for (size_t i = 0; i < ps.size(); ++i) {
      g.param_grads()[ps[i]] = reduced[i];
      g.mark_output("grad/" + g.value(ps[i]).name, reduced[i]);
    }
    ps.clear();
    open_bytes[t] = 0;
  };
  for (ValueId p : params) {
    const Value& grad = g.value(g.param_grads().at(p));
    open[grad.dtype()].push_back(p);
    open_bytes[grad.dtype()] += grad.nbytes();
    if (open_bytes[grad.dtype()] >= static_cast<size_t>(bucket_bytes)) close(grad.dtype());
  }
  for (auto& [t, ps] : open) close(t);
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
