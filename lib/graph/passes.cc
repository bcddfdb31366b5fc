// The compile pipeline and the small passes: shape inference, fusion, optimizer insertion, dead-node
// elimination and the kernel check.
#include "graph/passes.h"

#include <algorithm>
#include <cstddef>
#include <map>
#include <set>

#include "core/cuda_backend.h"
#include "graph/builder.h"
#include "ops/cpu/matmul.h"
#include "ops/cpu/reduce.h"
#include "ops/registry.h"

namespace flowrun {

DType kernel_dtype(const Graph& g, const Node& n) {
  for (ValueId v : n.inputs)
    if (is_floating(g.value(v).dtype())) return g.value(v).dtype();
  if (!n.inputs.empty()) return g.value(n.inputs[0]).dtype();
  FR_CHECK(!n.outputs.empty(), "node ", n.name, " has neither inputs nor outputs");
  return g.value(n.outputs[0]).dtype();
}

void infer_shapes(Graph& g) {
  for (NodeId id : g.live_nodes_topological()) {
    Node& n = g.node(id);
    std::vector<TensorType> in;
    for (ValueId v : n.inputs) in.push_back(g.value(v).type);
    const std::vector<TensorType> out = OpRegistry::get().at(n.op).infer(in, n.attrs);
    FR_CHECK(out.size() == n.outputs.size(), "node ", n.name, ": output count changed");
    for (size_t i = 0; i < out.size(); ++i) g.value(n.outputs[i]).type = out[i];
  }
}

namespace {

// Readers of value `from`, and the graph outputs naming it, read `to` instead.
void replace_uses(Graph& g, ValueId from, ValueId to) {
  for (Node& n : g.nodes())
    for (ValueId& v : n.inputs)
      if (v == from) v = to;
  for (const auto& [name, v] : std::map<std::string, ValueId>(g.outputs()))
    if (v == from) g.mark_output(name, to);
}

// linear -> gelu becomes one linear with attribute activation: gelu, whose outputs are the GELU and the
// pre-activation its gradient reads, when the gelu is all that reads the linear's result. On the GPU only,
// and only the tanh GELU, which cuBLASLt's GEMM epilogue computes (the erf one would run the same GEMM and
// gelu kernel as unfused). Not on the CPU: the fused kernel is the same GEMM and gelu loop, measured no
// faster there (lib/ops/cuda/README.md, "Fused bias+GELU").
void fuse_linear_gelu(Graph& g, DeviceKind device) {
  if (device != DeviceKind::cuda) return;
  const auto consumers = g.consumers();
  const std::set<ValueId> outputs = g.output_values();
  const std::vector<Node> snapshot = g.nodes();
  for (const Node& ge : snapshot) {
    if (ge.dead || ge.op != "gelu" || !ge.attrs.is("approximate", "tanh")) continue;
    // Copies, not references: add_node below may reallocate the node and value lists.
    const Value pre = g.value(ge.inputs[0]);
    if (pre.producer < 0 || consumers[static_cast<size_t>(pre.id)].size() != 1 || outputs.count(pre.id))
      continue;
    const Node lin = g.node(pre.producer);
    if (lin.op != "linear" || lin.attrs.has("activation")) continue;
    Attrs attrs = lin.attrs;
    attrs.set("activation", std::string("gelu"));
    attrs.set("approximate", std::string("tanh"));
    const std::vector<ValueId> fused = g.add_node("linear", lin.inputs, attrs, lin.name + "+gelu");
    g.nodes().back().segment = lin.segment;
    replace_uses(g, ge.outputs[0], fused[0]);
    g.node(ge.id).dead = true;
    g.node(lin.id).dead = true;
  }
}

}  // namespace

// silu -> mul (a Llama MLP's silu(gate) * up) becomes one swiglu when the mul alone reads the silu and both
// factors have one shape and dtype: one pass over gate and up where the pair took two, and no silu(gate)
// kept for the backward pass, whose swiglu_grad recomputes it (the unfused bits either way). CPU only, where
// the fused kernel is.
void fuse_swiglu(Graph& g, DeviceKind device) {
  if (device != DeviceKind::cpu) return;
  const auto consumers = g.consumers();
  const std::set<ValueId> outputs = g.output_values();
  const std::vector<Node> snapshot = g.nodes();  // add_node below may reallocate the node list
  for (const Node& mul : snapshot) {
    if (mul.dead || mul.op != "mul") continue;
    for (const size_t side : {size_t{0}, size_t{1}}) {
      const Value a = g.value(mul.inputs[side]), b = g.value(mul.inputs[1 - side]);
      if (a.producer < 0 || a.shape() != b.shape() || a.dtype() != b.dtype() || outputs.count(a.id) ||
          consumers[static_cast<size_t>(a.id)].size() != 1)
        continue;
      const Node& silu = g.node(a.producer);
      if (silu.dead || silu.op != "silu") continue;
      const NodeId silu_id = silu.id;
      const std::vector<ValueId> fused = g.add_node("swiglu", {silu.inputs[0], b.id}, {}, mul.name + "+silu");
      g.nodes().back().segment = mul.segment;
      g.nodes().back().schedule_as = mul.id;
      replace_uses(g, mul.outputs[0], fused[0]);
      g.node(mul.id).dead = true;
      g.node(silu_id).dead = true;
      break;
    }
  }
}

void fuse_ops(Graph& g, DeviceKind device) {
  // log_softmax -> nll_loss becomes one cross_entropy when nothing else reads the log-probabilities: the
  // fused op never materialises them in the backward pass and reads the logits once.
  const auto consumers = g.consumers();
  std::vector<Node> snapshot = g.nodes();
  for (const Node& nll : snapshot) {
    if (nll.dead || nll.op != "nll_loss") continue;
    // Copies, not references: add_node below may reallocate the node and value lists.
    const Value logp = g.value(nll.inputs[0]);
    if (logp.producer < 0) continue;
    const Node ls = g.node(logp.producer);
    if (ls.op != "log_softmax" || consumers[static_cast<size_t>(logp.id)].size() != 1) continue;
    const int64_t rank = static_cast<int64_t>(logp.shape().size());
    if (ls.attrs.i("axis", -1) != -1 && ls.attrs.i("axis", -1) != rank - 1) continue;
    const std::vector<ValueId> fused =
        g.add_node("cross_entropy", {ls.inputs[0], nll.inputs[1]}, nll.attrs, nll.name + "+fused");
    g.nodes().back().segment = nll.segment;
    replace_uses(g, nll.outputs[0], fused[0]);
    g.node(nll.id).dead = true;
    g.node(ls.id).dead = true;
  }
  fuse_linear_gelu(g, device);
  fuse_swiglu(g, device);
}

namespace {

// What the attention fusions match on: the readers of each value, the graph's outputs, and the heads'
// transposes and merges around an sdpa.
struct AttentionPattern {
  Graph& g;
  std::vector<std::vector<NodeId>> consumers;
  std::set<ValueId> outputs;
  explicit AttentionPattern(Graph& graph)
      : g(graph), consumers(graph.consumers()), outputs(graph.output_values()) {}
  bool single_reader(ValueId v) const {
    return consumers[static_cast<size_t>(v)].size() == 1 && !outputs.count(v);
  }
  // The node producing `v` when it is `op` and `v` has no reader but one node and is no graph output.
  const Node* sole(ValueId v, const char* op) const {
    const Value& val = g.value(v);
    if (val.producer < 0 || !single_reader(v)) return nullptr;
    const Node& n = g.node(val.producer);
    return n.dead || n.op != op ? nullptr : &n;
  }
  static bool swaps_1_2(const Node& t) { return t.attrs.i("dim0", 0) == 1 && t.attrs.i("dim1", 0) == 2; }
  // An sdpa whose lse nothing reads (the forward graph: the backward that reads it comes later).
  bool fusable(const Node& att, size_t inputs) const {
    return !att.dead && att.op == "sdpa" && att.inputs.size() == inputs &&
           consumers[static_cast<size_t>(att.outputs[1])].empty() && !outputs.count(att.outputs[1]);
  }
  // heads(x) = transpose(reshape(x, (B, L, H, D)), 1, 2) at `v`, each read by the next alone: the reshape.
  const Node* heads_of(ValueId v) const {
    const Node* tr = sole(v, "transpose");
    return tr && swaps_1_2(*tr) ? sole(tr->inputs[0], "reshape") : nullptr;
  }
  // The merge of att's output: reshape(transpose(out, 1, 2), (B, T, H Dv)), each read by the next alone, as
  // (transpose, reshape); nulls otherwise.
  std::pair<const Node*, const Node*> merge_of(const Node& att) const {
    const Shape& hs = g.value(att.outputs[0]).shape();  // (B, H, T, Dv)
    if (!single_reader(att.outputs[0])) return {};
    const Node& to = g.node(consumers[static_cast<size_t>(att.outputs[0])][0]);
    if (to.op != "transpose" || !swaps_1_2(to) || !single_reader(to.outputs[0])) return {};
    const Node& ro = g.node(consumers[static_cast<size_t>(to.outputs[0])][0]);
    if (ro.op != "reshape" || g.value(ro.outputs[0]).shape() != Shape{hs[0], hs[2], hs[1] * hs[3]}) return {};
    return {&to, &ro};
  }
};

}  // namespace

void fuse_packed_attention(Graph& g) {
  const AttentionPattern m(g);
  const std::vector<Node> snapshot = g.nodes();
  for (const Node& att : snapshot) {
    if (!m.fusable(att, 3)) continue;
    const Shape& hs = g.value(att.inputs[0]).shape();  // (B, H, T, D)
    const DType t = g.value(att.inputs[0]).dtype();
    if (t != DType::f32 && t != DType::f64) continue;
    // q, k and v: heads(split(qkv)[i]).
    std::vector<NodeId> dead;
    const Node* split = nullptr;
    bool ok = true;
    for (int i = 0; i < 3; ++i) {
      const ValueId in = att.inputs[static_cast<size_t>(i)];
      const Node* rs = g.value(in).shape() == hs ? m.heads_of(in) : nullptr;
      const Node* sp = rs ? m.sole(rs->inputs[0], "split") : nullptr;
      ok = sp && (!split || sp == split) && sp->outputs.size() == 3 &&
           sp->outputs[static_cast<size_t>(i)] == rs->inputs[0];
      if (!ok) break;
      split = sp;
      dead.insert(dead.end(), {g.value(in).producer, rs->id});
    }
    if (!ok) continue;
    const Value& qkv = g.value(split->inputs[0]);
    const int64_t B = hs[0], H = hs[1], T = hs[2], D = hs[3];
    const int64_t axis = split->attrs.i("axis", 0);
    if (qkv.shape() != Shape{B, T, 3 * H * D} || (axis != 2 && axis != -1)) continue;
    const auto [to, ro] = m.merge_of(att);
    if (!ro) continue;
    Attrs attrs = att.attrs;
    attrs.set("heads", H);
    const NodeId split_id = split->id, att_id = att.id, to_id = to->id, ro_id = ro->id;
    const ValueId merged = ro->outputs[0], lse = att.outputs[1];
    const std::vector<ValueId> fused = g.add_node("sdpa_qkv", {qkv.id}, attrs, att.name + "+qkv");
    g.nodes().back().segment = att.segment;
    replace_uses(g, merged, fused[0]);
    replace_uses(g, lse, fused[1]);
    dead.insert(dead.end(), {split_id, att_id, to_id, ro_id});
    for (NodeId n : dead) g.node(n).dead = true;
  }
}

// BERT's 32 transposes a step (q, k, v, out and their gradients) become no copies at all: the kernels read
// and write the heads in the rows as the linears write them. After fuse_packed_attention, which takes the
// packed projections' pattern.
void fuse_row_attention(Graph& g) {
  const AttentionPattern m(g);
  const std::vector<Node> snapshot = g.nodes();
  for (const Node& att : snapshot) {
    if (!m.fusable(att, 3) && !m.fusable(att, 4)) continue;
    const int64_t H = g.value(att.inputs[0]).shape()[1];
    // q, k and v: heads(x) of an x (B, L, H D).
    std::vector<ValueId> rows;
    std::vector<NodeId> dead;
    for (size_t i = 0; i < 3; ++i) {
      const Node* rs = m.heads_of(att.inputs[i]);
      if (!rs) break;
      const Shape& x = g.value(rs->inputs[0]).shape();
      const Shape& heads = g.value(rs->outputs[0]).shape();
      if (x.size() != 3 || heads.size() != 4 || heads[2] != H || heads[0] != x[0] || heads[1] != x[1]) break;
      rows.push_back(rs->inputs[0]);
      dead.insert(dead.end(), {g.value(att.inputs[i]).producer, rs->id});
    }
    if (rows.size() != 3) continue;
    const auto [to, ro] = m.merge_of(att);
    if (!ro) continue;
    Attrs attrs = att.attrs;
    attrs.set("heads", H);
    if (att.inputs.size() == 4) rows.push_back(att.inputs[3]);
    const NodeId att_id = att.id, to_id = to->id, ro_id = ro->id;
    const ValueId merged = ro->outputs[0];
    const std::vector<ValueId> fused = g.add_node("sdpa_rows", rows, attrs, att.name + "+rows");
    g.nodes().back().segment = att.segment;
    g.nodes().back().schedule_as = att_id;
    replace_uses(g, merged, fused[0]);
    dead.insert(dead.end(), {att_id, to_id, ro_id});
    for (NodeId n : dead) g.node(n).dead = true;
  }
}

namespace {

bool is_row_norm(const Node& n) {
  return !n.dead && (n.op == "layernorm" || n.op == "rmsnorm");
}
bool is_norm_grad(const Node& n) {
  return !n.dead && (n.op == "layernorm_grad" || n.op == "rmsnorm_grad");
}

// Makes v output `slot` of n (a new last output where slot is n's output count), the node that now writes it;
// a value that n wrote there before is left without a producer.
void set_output(Graph& g, Node& n, size_t slot, ValueId v) {
  if (slot == n.outputs.size()) {
    n.outputs.push_back(v);
  } else {
    g.value(n.outputs[slot]).producer = -1;
    n.outputs[slot] = v;
  }
  g.value(v).producer = n.id;
  g.value(v).producer_slot = static_cast<int>(slot);
}

// Whether node `n` is among the producers that value v is computed from.
bool depends_on(const Graph& g, ValueId v, NodeId n) {
  std::vector<ValueId> todo = {v};
  std::set<NodeId> seen;
  while (!todo.empty()) {
    const Value& x = g.value(todo.back());
    todo.pop_back();
    if (x.producer < 0 || !seen.insert(x.producer).second) continue;
    if (x.producer == n) return true;
    for (ValueId in : g.node(x.producer).inputs) todo.push_back(in);
  }
  return false;
}

}  // namespace

void fuse_backward(Graph& g, DeviceKind device) {
  // The mask input exists in the CPU kernels only. A conv -> relu -> maxpool gradient otherwise writes the
  // pooled gradient over the whole activation and reads it back at once to mask it (the bench CNN's largest
  // tensors, a twelfth of its step). The mask is the pooling's output y: relu_grad's mask is relu's output,
  // the pooling's input x, and it matters only at each window's chosen element, whose value y holds; a
  // quarter of x's bytes for 2x2 windows.
  if (device != DeviceKind::cpu) return;
  const auto consumers = g.consumers();
  const std::set<ValueId> outputs = g.output_values();
  for (Node& rg : g.nodes()) {
    if (rg.dead || rg.op != "relu_grad" || rg.inputs.size() != 2) continue;
    const Value& d = g.value(rg.inputs[0]);
    if (d.producer < 0 || consumers[static_cast<size_t>(d.id)].size() != 1 || outputs.count(d.id)) continue;
    Node& pool = g.node(d.producer);
    if (pool.op != "maxpool2d_grad" || pool.inputs.size() != 2) continue;
    const Value& idx = g.value(pool.inputs[1]);
    if (idx.producer < 0) continue;
    const Node& fwd = g.node(idx.producer);
    if (fwd.op != "maxpool2d" || fwd.inputs[0] != rg.inputs[1]) continue;
    pool.inputs.push_back(fwd.outputs[0]);
    pool.name += "+relu_grad";
    rg.dead = true;
    replace_uses(g, rg.outputs[0], d.id);
  }
  // A ResNet's bn -> relu -> conv: the relu's gradient joins batchnorm_grad as its mask (dy read where
  // mask > 0), one pass over the gradient fewer; and, when batchnorm's output has no other reader, the relu
  // joins batchnorm (attr relu), one pass over the activation fewer. Both compute the unfused bits.
  const auto readers = g.consumers();
  for (Node& rg : g.nodes()) {
    if (rg.dead || rg.op != "relu_grad") continue;
    const ValueId d = rg.outputs[0];
    const auto& users = readers[static_cast<size_t>(d)];
    if (users.size() != 1 || outputs.count(d)) continue;
    Node& bg = g.node(users[0]);
    if (bg.op != "batchnorm_grad" || bg.inputs.size() != 5 || bg.inputs[0] != d) continue;
    bg.inputs[0] = rg.inputs[0];
    bg.inputs.push_back(rg.inputs[1]);
    bg.name += "+relu_grad";
    rg.dead = true;
  }
  for (Node& r : g.nodes()) {
    if (r.dead || r.op != "relu") continue;
    const Value& y = g.value(r.inputs[0]);
    if (y.producer < 0 || readers[static_cast<size_t>(y.id)].size() != 1 || outputs.count(y.id)) continue;
    Node& bn = g.node(y.producer);
    if (bn.op != "batchnorm" || bn.outputs[0] != y.id || bn.attrs.b("relu")) continue;
    bn.attrs.set("relu", true);
    bn.name += "+relu";
    r.dead = true;
    replace_uses(g, r.outputs[0], y.id);
  }
  // A ResNet block's bn -> add (the shortcut) -> relu: the add and the relu join batchnorm (attr residual,
  // the shortcut its last input, and attr relu), which writes the block's output; two passes over the
  // activation fewer, the same bits (the sum of the rounded normalised value, as the add read it).
  const auto now = g.consumers();
  const auto only_reader = [&](ValueId v) -> Node* {
    const auto& users = now[static_cast<size_t>(v)];
    return users.size() == 1 && !outputs.count(v) ? &g.node(users[0]) : nullptr;
  };
  for (Node& a : g.nodes()) {
    if (a.dead || a.op != "add" || a.inputs.size() != 2) continue;
    const Value& sum = g.value(a.outputs[0]);
    for (const size_t side : {size_t{0}, size_t{1}}) {
      const Value &y = g.value(a.inputs[side]), &r = g.value(a.inputs[1 - side]);
      if (y.producer < 0 || y.producer_slot != 0 || only_reader(y.id) != &a || r.shape() != y.shape() ||
          r.dtype() != y.dtype() || sum.dtype() != y.dtype())
        continue;
      Node& bn = g.node(y.producer);
      if (bn.dead || bn.op != "batchnorm" || bn.attrs.b("relu") || bn.attrs.b("residual") ||
          depends_on(g, r.id, bn.id))
        continue;
      bn.inputs.push_back(r.id);
      bn.attrs.set("residual", true);
      bn.name += "+add";
      ValueId out = sum.id;
      Node* relu = only_reader(sum.id);
      if (relu && relu->op == "relu") {
        bn.attrs.set("relu", true);
        bn.name += "+relu";
        relu->dead = true;
        out = relu->outputs[0];
      }
      set_output(g, bn, 0, out);
      a.dead = true;
      break;
    }
  }
  // The other end in the backward pass: a block's input gradient, the sum of its shortcut's and its first
  // convolution's, read only by the previous block's relu_grad, is added by that relu_grad (a third input):
  // two passes over the gradient fewer, the same bits.
  const auto then = g.consumers();
  for (Node& rg : g.nodes()) {
    if (rg.dead || rg.op != "relu_grad" || rg.inputs.size() != 2) continue;
    const Value& dy = g.value(rg.inputs[0]);
    if (dy.producer < 0 || then[static_cast<size_t>(dy.id)].size() != 1 || outputs.count(dy.id)) continue;
    Node& a = g.node(dy.producer);
    if (a.dead || a.op != "add" || a.inputs.size() != 2) continue;
    const Value &u = g.value(a.inputs[0]), &v = g.value(a.inputs[1]);
    if (u.shape() != dy.shape() || v.shape() != dy.shape() || u.dtype() != dy.dtype() ||
        v.dtype() != dy.dtype())
      continue;
    rg.inputs = {u.id, rg.inputs[1], v.id};
    rg.name += "+add";
    a.dead = true;
  }
  // conv -> relu -> maxpool, once the pooling's gradient masks by its own output (above): nothing but the
  // pooling reads the relu's output, so the pooling applies the relu as it loads each element (attr relu),
  // the same values and choices, and the activation is neither written nor kept for the backward pass.
  const auto last = g.consumers();
  for (Node& mp : g.nodes()) {
    if (mp.dead || mp.op != "maxpool2d" || mp.attrs.b("relu")) continue;
    const Value& x = g.value(mp.inputs[0]);
    if (x.producer < 0 || last[static_cast<size_t>(x.id)].size() != 1 || outputs.count(x.id)) continue;
    Node& r = g.node(x.producer);
    if (r.dead || r.op != "relu") continue;
    mp.inputs[0] = r.inputs[0];
    mp.attrs.set("relu", true);
    mp.name += "+relu";
    r.dead = true;
  }
}

void fuse_bias_gradients(Graph& g, DeviceKind device) {
  if (device != DeviceKind::cpu) return;
  const auto readers = g.consumers();
  const std::set<ValueId> outputs = g.output_values();
  const std::vector<Node> snapshot = g.nodes();  // add_node below may reallocate the node list
  for (const Node& gg : snapshot) {
    // relu_grad with its two inputs only (not the fused add of fuse_backward's third).
    if (gg.dead || !(gg.op == "gelu_grad" || (gg.op == "relu_grad" && gg.inputs.size() == 2))) continue;
    const std::string fused_op = gg.op.substr(0, gg.op.size() - 5) + "_bias_grad";  // "<act>_grad"
    const OpDef& fused_def = OpRegistry::get().at(fused_op);
    const Value dx = g.value(gg.outputs[0]);
    const KernelChoice k = select_kernel(fused_def, device, dx.dtype());
    if (outputs.count(dx.id) || !k.kernel || k.widened) continue;
    // A relu's gradient over rows that make one chunk of the sum (reduce.h) stays unfused: its threads would
    // share the rows' columns, and the bench MLP's 128 x 512 took 21 us fused against 4 + 6 as two ops (2
    // threads); 2048 x 1024 took 0.46 ms against 0.45 + 0.25.
    const int64_t cols = dx.shape().back();
    if (gg.op == "relu_grad" && cpu::reduce_row_chunks(numel(dx.shape()) / std::max<int64_t>(cols, 1)) == 1)
      continue;
    Shape sums(dx.shape().size(), 1);
    sums.back() = dx.shape().back();
    // A reader keeping dx's rank whose result is 1 on every leading axis and whole on the last sums over
    // exactly the leading axes (or, with one column, over all: the same sum).
    const Node* sum = nullptr;
    for (NodeId r : readers[static_cast<size_t>(dx.id)]) {
      const Node& n = g.node(r);
      if (!n.dead && n.op == "reduce_sum" && !n.attrs.b("blocked") && g.value(n.outputs[0]).shape() == sums) {
        sum = &n;
        break;
      }
    }
    if (!sum) continue;
    Attrs attrs = gg.attrs;
    if (sum->attrs.has("out_dtype")) attrs.set("out_dtype", sum->attrs.s("out_dtype"));
    const NodeId grad_id = gg.id, sum_id = sum->id;
    const ValueId db = sum->outputs[0];
    const std::vector<ValueId> fused = g.add_node(fused_op, gg.inputs, attrs, gg.name + "+bias_grad");
    // Scheduled where the activation's gradient was (not last, as its id would have it), as layout.cc's
    // reorders are.
    g.nodes().back().schedule_as = gg.schedule_as >= 0 ? gg.schedule_as : gg.id;
    g.nodes().back().phase = gg.phase;
    for (const auto& [from, to] : {std::pair{dx.id, fused[0]}, std::pair{db, fused[1]}}) {
      replace_uses(g, from, to);
      for (auto& [param, grad] : g.param_grads())
        if (grad == from) grad = to;
    }
    g.node(grad_id).dead = true;
    g.node(sum_id).dead = true;
  }
}

void fuse_momentum_products(Graph& g, DeviceKind device) {
  if (device != DeviceKind::cpu) return;
  const auto readers = g.consumers();
  const std::vector<Node> snapshot = g.nodes();  // add_node below may reallocate the node list
  for (const Node& u : snapshot) {
    // Momentum without dampening, Nesterov or a coefficient (clipping, accumulation, loss scaling): buf =
    // momentum * buf + grad, one fma, which the GEMM's beta computes alike (weight decay is added after it).
    if (u.dead || u.op != "sgd_update" || u.inputs.size() != 5 || u.attrs.f("momentum", 0) == 0 ||
        u.attrs.f("dampening", 0) != 0 || u.attrs.b("nesterov"))
      continue;
    const Value grad = g.value(u.inputs[1]);
    // Autodiff hands each gradient out as "grad/<param>"; any other name a caller reads keeps it.
    const std::string handed_out = "grad/" + g.value(u.inputs[0]).name;
    const bool read_elsewhere = std::any_of(g.outputs().begin(), g.outputs().end(), [&](const auto& o) {
      return o.second == grad.id && o.first != handed_out;
    });
    if (grad.producer < 0 || grad.dtype() != DType::f32 || read_elsewhere ||
        readers[static_cast<size_t>(grad.id)].size() != 1)
      continue;
    const Node mm = g.node(grad.producer);
    if (mm.dead || mm.op != "matmul" || mm.phase != u.phase || mm.attrs.has("out_dtype")) continue;
    const Value x = g.value(mm.inputs[0]), y = g.value(mm.inputs[1]);
    if (x.shape().size() != 2 || y.shape().size() != 2 || x.dtype() != DType::f32 || y.dtype() != DType::f32)
      continue;
    const bool ta = mm.attrs.b("trans_a"), tb = mm.attrs.b("trans_b");
    const int64_t k = ta ? x.shape()[0] : x.shape()[1];
    if (!cpu::gemm_fuses_beta(ta, tb, grad.shape()[0], grad.shape()[1], k)) continue;
    const Attrs attrs{{"momentum", u.attrs.f("momentum")},
                      {"weight_decay", u.attrs.f("weight_decay", 0)},
                      {"trans_a", ta},
                      {"trans_b", tb}};
    g.add_node("sgd_product_update", {u.inputs[0], x.id, y.id, u.inputs[2], u.inputs[3]}, attrs, u.name);
    g.nodes().back().phase = u.phase;
    // Where the product was, once the parameter's other readers (its input gradient's product) have run:
    // at the end of the step it would keep its factors, the backward pass's activations, alive until then.
    g.nodes().back().schedule_as = mm.schedule_as >= 0 ? mm.schedule_as : mm.id;
    g.node(u.id).dead = true;
    g.node(mm.id).dead = true;
    g.unmark_output(handed_out);
    // The gradient is never made: nothing holds memory for it (flowrun plan's gradient bytes).
    std::erase_if(g.param_grads(), [&](const auto& pg) { return pg.second == grad.id; });
  }
}

void fold_norm_casts(Graph& g, DeviceKind device) {
  if (device != DeviceKind::cpu) return;
  const auto readers = g.consumers();
  const std::set<ValueId> outputs = g.output_values();
  for (Node& c : g.nodes()) {
    if (c.dead || c.op != "cast" || !c.attrs.is("dtype", "bf16")) continue;
    const Value& y = g.value(c.inputs[0]);
    if (y.producer < 0 || y.dtype() != DType::f32 || readers[static_cast<size_t>(y.id)].size() != 1 ||
        outputs.count(y.id))
      continue;
    Node& n = g.node(y.producer);
    if (!is_row_norm(n) || n.outputs[0] != y.id || n.attrs.has("out_dtype")) continue;
    n.attrs.set("out_dtype", std::string("bf16"));
    set_output(g, n, 0, c.outputs[0]);
    c.dead = true;
  }
}

void fuse_norm_grad_residual(Graph& g, DeviceKind device) {
  if (device != DeviceKind::cpu) return;
  const std::set<ValueId> outputs = g.output_values();
  const auto readers = g.consumers();
  for (Node& a : g.nodes()) {
    if (a.dead || a.op != "add" || a.inputs.size() != 2) continue;
    for (const size_t side : {size_t{0}, size_t{1}}) {
      const Value& dx = g.value(a.inputs[side]);
      const Value& r = g.value(a.inputs[1 - side]);
      if (dx.producer < 0 || dx.producer_slot != 0 || dx.dtype() != DType::f32 || r.dtype() != DType::f32 ||
          r.shape() != dx.shape() || readers[static_cast<size_t>(dx.id)].size() != 1 || outputs.count(dx.id))
        continue;
      Node& n = g.node(dx.producer);
      if (!is_norm_grad(n) || n.attrs.b("residual") || depends_on(g, r.id, n.id)) continue;
      n.inputs.push_back(r.id);
      n.attrs.set("residual", true);
      set_output(g, n, 0, a.outputs[0]);
      a.dead = true;
      break;
    }
  }
  for (Node& c : g.nodes()) {
    if (c.dead || c.op != "cast" || !c.attrs.is("dtype", "bf16")) continue;
    const Value& v = g.value(c.inputs[0]);
    if (v.producer < 0 || v.producer_slot != 0 || v.dtype() != DType::f32) continue;
    Node& n = g.node(v.producer);
    if (!is_norm_grad(n) || n.attrs.b("dx_bf16")) continue;
    n.attrs.set("dx_bf16", true);
    set_output(g, n, n.outputs.size(), c.outputs[0]);
    c.dead = true;
  }
}

void fuse_residual_norm(Graph& g, DeviceKind device) {
  if (device != DeviceKind::cpu) return;
  const auto readers = g.consumers();
  for (Node& a : g.nodes()) {
    if (a.dead || a.op != "add" || a.inputs.size() != 2) continue;
    const Value &sum = g.value(a.outputs[0]), &u = g.value(a.inputs[0]), &v = g.value(a.inputs[1]);
    if (sum.dtype() != DType::f32 || u.dtype() != DType::f32 || v.dtype() != DType::f32 ||
        u.shape() != sum.shape() || v.shape() != sum.shape())
      continue;
    Node* norm = nullptr;
    for (NodeId r : readers[static_cast<size_t>(sum.id)]) {
      Node& n = g.node(r);
      if (is_row_norm(n) && n.inputs[0] == sum.id && !n.attrs.b("residual")) {
        norm = &n;
        break;
      }
    }
    if (!norm) continue;
    norm->inputs[0] = u.id;
    norm->inputs.push_back(v.id);
    norm->attrs.set("residual", true);
    set_output(g, *norm, norm->outputs.size(), a.outputs[0]);
    a.dead = true;
  }
}

namespace {

ValueId scalar_input(Graph& g, const std::string& name, DType t) {
  const ValueId v = g.find_value(name);
  return v != kNoValue ? v : g.add_input(name, {}, t);
}

// Nodes added from index `first` on run only in the apply phase.
void set_phase_from(Graph& g, size_t first, int phase) {
  for (size_t i = first; i < g.nodes().size(); ++i) g.nodes()[i].phase = phase;
}

// Sums each gradient over the micro-steps of a window into "opt/<param>/grad_acc" (every step, phase 0);
// returns param -> accumulator, the gradient sum the apply phase reads.
// A parameter's optimizer state is split over the tensor axis as the parameter is.
void split_like(Graph& g, ValueId state, const Value& param) {
  Placement& p = g.value(state).placement;
  p.tensor = param.placement.tensor;
  p.tensor_parts = param.placement.tensor_parts;
  p.whole = param.placement.whole;
}

std::map<ValueId, ValueId> accumulate_gradients(Graph& g, const std::map<ValueId, ValueId>& grads) {
  GraphBuilder b(g);
  const ValueId micro = scalar_input(g, "opt/micro", DType::i64);
  std::map<ValueId, ValueId> acc;
  for (const auto& [p, grad] : grads) {
    const Value pv = g.value(p);
    acc[p] = g.add_state(cat("opt/", pv.name, "/grad_acc"), g.value(grad).shape(), g.value(grad).dtype());
    split_like(g, acc[p], pv);
    b.op("grad_accumulate", {acc[p], grad, micro}, {}, cat("accumulate/", pv.name));
  }
  return acc;
}

// The gradients whose norm is taken: those of parameters split over the tensor axis first (global_norm sums
// their squares over its ranks), then the others.
std::vector<ValueId> norm_inputs(const Graph& g, const std::map<ValueId, ValueId>& grads) {
  std::vector<ValueId> split, whole;
  for (const auto& [p, grad] : grads) {
    if (g.value(p).placement.pipe_copy) continue;  // another stage counts it
    (g.value(p).placement.tensor_split() ? split : whole).push_back(grad);
  }
  split.insert(split.end(), whole.begin(), whole.end());
  return split;
}

Attrs norm_attrs(const Graph& g, const std::map<ValueId, ValueId>& grads, double scale,
                 const OptimizerSpec& spec) {
  int64_t split = 0;
  for (const auto& [p, grad] : grads)
    split += g.value(p).placement.tensor_split() && !g.value(p).placement.pipe_copy;
  Attrs a{{"scale", scale}};
  if (split > 0) a.set("split_inputs", split);
  // ZeRO-2: each rank holds a flat shard of every gradient: the squares are summed over the data axis.
  if (spec.sharded_grads) a.set("data_sharded", true);
  // Each pipeline stage holds its own parameters: the squares are summed over the stages too.
  if (g.find_value("pp/in") != kNoValue || g.outputs().count("pp/out")) a.set("pipeline", true);
  return a;
}

// The scalar every gradient is multiplied by before its update: the clipping factor (with the "grad_norm"
// output) and the 1/accumulation mean over micro-batches; kNoValue when it would be 1.
ValueId gradient_coef(Graph& g, const OptimizerSpec& spec, const std::map<ValueId, ValueId>& grads,
                      ValueId lr) {
  GraphBuilder b(g);
  const double scale = 1.0 / static_cast<double>(spec.accumulation);
  if (spec.loss_scaling) {
    // The norm of the scaled gradients tells both whether they are finite and, divided by the scale, the
    // true norm for clipping.
    const ValueId norm = b.op1("global_norm", norm_inputs(g, grads), norm_attrs(g, grads, scale, spec),
                               "opt/scaled_grad_norm");
    const ValueId loss_scale = g.find_value("amp/loss_scale");
    FR_CHECK(loss_scale != kNoValue, "loss scaling without the amp/loss_scale state");
    const auto coef = b.op("unscale_coef", {norm, loss_scale},
                           {{"max_norm", spec.clip_grad_norm}, {"scale", scale}}, "opt/unscale_coef");
    if (spec.clip_grad_norm > 0) g.mark_output("grad_norm", coef[1]);
    b.op("loss_scale_update",
         {norm, loss_scale, g.add_state("amp/good_steps", {}, DType::i64),
          g.add_state("amp/skipped_steps", {}, DType::i64)},
         {{"dynamic", spec.dynamic_scale}, {"growth_interval", spec.growth_interval}},
         "opt/loss_scale_update");
    return coef[0];
  }
  if (spec.clip_grad_norm > 0) {
    const ValueId norm =
        b.op1("global_norm", norm_inputs(g, grads), norm_attrs(g, grads, scale, spec), "opt/grad_norm");
    g.mark_output("grad_norm", norm);
    return b.op1("clip_coef", {norm}, {{"max_norm", spec.clip_grad_norm}, {"scale", scale}}, "opt/clip_coef");
  }
  if (spec.accumulation > 1) return b.op1("fill_like", {lr}, {{"value", scale}}, "opt/grad_scale");
  return kNoValue;
}

// One parameter's update node "update/<param>", with its state. Under ZeRO (spec.zero_shards > 1) the update
// runs on this rank's flat shard of the parameter and gradient, with state of the shard's size, and the
// updated shards are gathered back into the parameter.
void add_update(Graph& g, const OptimizerSpec& spec, ValueId p, ValueId grad, ValueId lr, ValueId step,
                ValueId coef) {
  GraphBuilder b(g);
  const Value pv = g.value(p);
  // Biases and norm scales (rank < 2) are left undecayed when decay_1d is off, as in common PyTorch recipes
  // (the rank of the parameter, not of the flat shard ZeRO-3 keeps).
  const size_t rank = (pv.placement.sharded() ? pv.placement.global_shape : pv.shape()).size();
  const double wd = !spec.decay_1d && rank < 2 ? 0.0 : spec.weight_decay;
  const bool zero = spec.zero_shards > 1;
  // ZeRO-3 keeps the parameter as this shard already (shard_parameters): nothing to cut or gather back.
  const bool cut = zero && !pv.placement.sharded();
  const Attrs shards{{"shards", spec.zero_shards}};
  const ValueId target = cut ? b.op1("local_shard", {p}, shards, cat("zero/", pv.name, "/param")) : p;
  if (cut && !spec.sharded_grads) grad = b.op1("local_shard", {grad}, shards, cat("zero/", pv.name, "/grad"));
  const Shape state_shape = g.value(target).shape();
  auto state = [&](const std::string& name, const Shape& shape) {
    const ValueId v = g.add_state(cat("opt/", pv.name, "/", name), shape, pv.dtype());
    if (numel(shape) > 0) split_like(g, v, pv);
    if (zero && numel(shape) > 0)
      g.value(v).placement.global_shape = cut ? pv.shape() : pv.placement.global_shape;
    return v;
  };
  std::vector<ValueId> in;
  Attrs attrs;
  if (spec.type == "sgd") {
    const ValueId mom = spec.momentum != 0.0 ? state("momentum", state_shape) : state("unused", {0});
    in = {target, grad, mom, lr, step};
    attrs = {{"momentum", spec.momentum},
             {"dampening", spec.dampening},
             {"nesterov", spec.nesterov},
             {"weight_decay", wd}};
  } else {
    const ValueId m = state("m", state_shape);
    const ValueId v = state("v", state_shape);
    in = {target, grad, m, v, lr, step};
    attrs = {{"beta1", spec.beta1},
             {"beta2", spec.beta2},
             {"eps", spec.eps},
             {"weight_decay", wd},
             {"decoupled", spec.type == "adamw"}};
  }
  if (coef != kNoValue) in.push_back(coef);
  b.op(spec.type == "sgd" ? "sgd_update" : "adamw_update", in, attrs, "update/" + pv.name);
  // Created after the update: among the nodes that only mutate, the schedule keeps creation order.
  if (cut) b.op("all_gather_into", {p, target}, shards, cat("zero/", pv.name, "/gather"));
}

}  // namespace

void add_optimizer(Graph& g, const OptimizerSpec& spec) {
  if (spec.type == "none") return;
  if (spec.type != "sgd" && spec.type != "adam" && spec.type != "adamw")
    throw input_error(
        cat("optimizer '", spec.type, "' is not supported by the graph compiler (sgd, adam, adamw)"));
  if (spec.accumulation < 1)
    throw input_error(cat("gradient accumulation must be >= 1, got ", spec.accumulation));
  const ValueId lr = scalar_input(g, "lr", DType::f32);
  const ValueId step = scalar_input(g, "opt/step", DType::i64);
  std::map<ValueId, ValueId> grads = g.param_grads();
  if (spec.accumulation > 1) grads = accumulate_gradients(g, grads);
  // Under accumulation everything from here reads the summed gradients and runs once per window.
  const size_t first_apply_node = g.nodes().size();
  if (spec.pipeline) pipeline_shared_grads(g, grads);
  const ValueId coef = gradient_coef(g, spec, grads, lr);
  for (const auto& [p, grad] : grads) add_update(g, spec, p, grad, lr, step, coef);
  if (spec.accumulation > 1 || spec.pipeline) set_phase_from(g, first_apply_node, 1);
}

void group_updates(Graph& g) {
  struct Group {
    const Node* first;
    std::vector<NodeId> nodes;
  };
  std::vector<Group> groups;
  for (const Node& n : g.nodes()) {
    if (n.dead || (n.op != "sgd_update" && n.op != "adamw_update")) continue;
    const size_t lists = n.op == "sgd_update" ? 3 : 4;
    auto same = [&](const Group& gr) {
      const Node& f = *gr.first;
      return f.op == n.op && f.phase == n.phase && f.attrs.all() == n.attrs.all() &&
             g.value(f.inputs[0]).dtype() == g.value(n.inputs[0]).dtype() &&
             std::equal(f.inputs.begin() + static_cast<std::ptrdiff_t>(lists), f.inputs.end(),
                        n.inputs.begin() + static_cast<std::ptrdiff_t>(lists), n.inputs.end());
    };
    auto it = std::find_if(groups.begin(), groups.end(), same);
    if (it == groups.end())
      groups.push_back({&n, {n.id}});
    else
      it->nodes.push_back(n.id);
  }
  int index = 0;
  for (const Group& gr : groups) {
    if (gr.nodes.size() < 2) continue;
    // The first update's node becomes the group's: among the nodes that only mutate, the schedule keeps
    // creation order, so it still runs before anything created after that update (ZeRO's gathers of the
    // updated shards).
    Node& fused = g.node(gr.nodes[0]);
    const size_t lists = fused.op == "sgd_update" ? 3 : 4;
    std::vector<ValueId> in;
    for (size_t l = 0; l < lists; ++l)
      for (NodeId id : gr.nodes) in.push_back(g.node(id).inputs[l]);
    in.insert(in.end(), fused.inputs.begin() + static_cast<std::ptrdiff_t>(lists), fused.inputs.end());
    fused.op += "_multi";
    fused.name = cat("update/group", index++);
    fused.attrs.set("tensors", static_cast<int64_t>(gr.nodes.size()));
    fused.inputs = std::move(in);
    std::vector<TensorType> types;
    for (ValueId v : fused.inputs) types.push_back(g.value(v).type);
    OpRegistry::get().at(fused.op).infer(types, fused.attrs);
    for (size_t k = 1; k < gr.nodes.size(); ++k) g.node(gr.nodes[k]).dead = true;
  }
}

void eliminate_dead_nodes(Graph& g) {
  // Live: nodes producing a marked output, nodes that mutate state (updates), and their transitive inputs.
  std::vector<bool> live(g.nodes().size(), false), needed(g.values().size(), false);
  for (const auto& [name, v] : g.outputs()) needed[static_cast<size_t>(v)] = true;
  // In reverse schedule order, not construction order: passes append nodes (casts) that earlier nodes read.
  const std::vector<NodeId> order = g.live_nodes_topological();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node& n = g.node(*it);
    const OpDef& def = OpRegistry::get().at(n.op);
    bool keep = def.updates_in_place() && n.outputs.empty();
    for (ValueId v : n.outputs) keep = keep || needed[static_cast<size_t>(v)];
    if (!keep) {
      n.dead = true;
      continue;
    }
    for (ValueId v : n.inputs) needed[static_cast<size_t>(v)] = true;
  }
}

void check_kernels(const Graph& g, DeviceKind device) {
  for (NodeId id : g.live_nodes_topological()) {
    const Node& n = g.node(id);
    const DType t = kernel_dtype(g, n);
    if (!select_kernel(OpRegistry::get().at(n.op), device, t).kernel)
      throw input_error(cat("op ", n.op, " (", n.name, ") has no ", device_kind_name(device), " kernel for ",
                            dtype_name(t)));
  }
}

std::vector<Pass> default_pipeline(const CompileOptions& opts) {
  std::vector<Pass> p;
  p.push_back({"infer_shapes", [](Graph& g, const CompileOptions&) { infer_shapes(g); }});
  if (opts.fuse && !opts.eager)
    p.push_back({"fuse", [](Graph& g, const CompileOptions& o) {
                   fuse_ops(g, o.device);
                   // sdpa_qkv and sdpa_rows split over the batch only.
                   if (o.device == DeviceKind::cpu && o.tensor_parallel <= 1) {
                     fuse_packed_attention(g);
                     fuse_row_attention(g);
                   }
                 }});
  if (opts.pipeline > 1)
    p.push_back({"pipeline_stage",
                 [](Graph& g, const CompileOptions& o) { pipeline_stage(g, o.pipeline, o.pipeline_stage); }});
  if (opts.data_parallel > 1)
    p.push_back({"data_parallel", [](Graph& g, const CompileOptions& o) {
                   split_over_axis(g, MeshAxis::data, o.data_parallel, o.data_rank);
                 }});
  if (opts.tensor_parallel > 1)
    p.push_back({"tensor_parallel", [](Graph& g, const CompileOptions& o) {
                   split_over_axis(g, MeshAxis::tensor, o.tensor_parallel, o.tensor_rank);
                 }});
  if (opts.zero >= 3 && opts.data_parallel > 1)
    p.push_back({"zero3", [](Graph& g, const CompileOptions& o) { shard_parameters(g, o.data_parallel); }});
  if (opts.compute != DType::f32)
    p.push_back({"mixed_precision",
                 [](Graph& g, const CompileOptions& o) { auto_mixed_precision(g, o.compute, o.device); }});
  if (!opts.loss.empty()) {
    p.push_back({"autodiff", [](Graph& g, const CompileOptions& o) {
                   auto it = g.outputs().find(o.loss);
                   ValueId seed =
                       o.optimizer.loss_scaling ? g.add_state("amp/loss_scale", {}, DType::f32) : kNoValue;
                   // A pipeline stage before the last differentiates its activation from the gradient that
                   // the next stage sends back.
                   if (it == g.outputs().end() && g.outputs().count("pp/out")) {
                     const Value& out = g.value(g.outputs().at("pp/out"));
                     seed = g.add_input("pp/out_grad", out.shape(), out.dtype());
                     it = g.outputs().find("pp/out");
                   }
                   if (it == g.outputs().end())
                     throw input_error(cat("the graph has no output named '", o.loss, "'"));
                   autodiff(g, it->second, seed);
                 }});
    // Recompute only saves memory: it repeats the forward nodes it copies, dropout streams included, so an
    // eager program, which keeps every value, skips it and computes the same.
    if (!opts.eager)
      p.push_back({"recompute", [](Graph& g, const CompileOptions&) { recompute_segments(g); }});
    if (opts.fuse && !opts.eager)
      p.push_back({"fuse_backward", [](Graph& g, const CompileOptions& o) { fuse_backward(g, o.device); }});
    if (opts.data_parallel > 1)
      p.push_back({"reduce_gradients", [](Graph& g, const CompileOptions& o) {
                     reduce_gradients(g, o.data_parallel, o.zero >= 2, o.bucket_bytes);
                   }});
    p.push_back({"optimizer", [](Graph& g, const CompileOptions& o) { add_optimizer(g, o.optimizer); }});
    if (opts.group_updates.value_or(opts.device == DeviceKind::cuda))
      p.push_back({"group_updates", [](Graph& g, const CompileOptions&) { group_updates(g); }});
  }
  if (opts.compute != DType::f32)
    p.push_back({"fold_f32_casts", [](Graph& g, const CompileOptions& o) { fold_f32_casts(g, o.device); }});
  if (opts.fuse && !opts.eager) {
    p.push_back(
        {"fuse_bias_gradients", [](Graph& g, const CompileOptions& o) { fuse_bias_gradients(g, o.device); }});
    if (!opts.keep_gradients)
      p.push_back({"fuse_momentum_products",
                   [](Graph& g, const CompileOptions& o) { fuse_momentum_products(g, o.device); }});
    if (opts.compute != DType::f32)
      p.push_back(
          {"fold_norm_casts", [](Graph& g, const CompileOptions& o) { fold_norm_casts(g, o.device); }});
    p.push_back({"fuse_norm_grad_residual",
                 [](Graph& g, const CompileOptions& o) { fuse_norm_grad_residual(g, o.device); }});
    p.push_back(
        {"fuse_residual_norm", [](Graph& g, const CompileOptions& o) { fuse_residual_norm(g, o.device); }});
  }
  if (opts.device == DeviceKind::cpu && opts.blocked_layout && !opts.eager)
    p.push_back(
        {"blocked_layout", [](Graph& g, const CompileOptions& o) { blocked_layout(g, o.blocked_as); }});
  p.push_back({"dead_nodes", [](Graph& g, const CompileOptions&) { eliminate_dead_nodes(g); }});
  p.push_back({"check_kernels", [](Graph& g, const CompileOptions& o) { check_kernels(g, o.device); }});
  return p;
}

Program compile(Graph g, const CompileOptions& opts) {
  // A GPU program needs the CUDA kernels, which join the registry when the backend is opened.
  if (opts.device == DeviceKind::cuda) cuda::backend();
  Program prog;
  for (const Pass& pass : default_pipeline(opts)) {
    pass.run(g, opts);
    const auto live = g.live_nodes_topological().size();
    prog.pass_log.push_back(cat(pass.name, ": ", live, " nodes"));
  }
  prog.order = g.live_nodes_topological();
  if (opts.pipeline > 1 && g.backward_begin >= 0) {
    const auto forward_end = std::stable_partition(prog.order.begin(), prog.order.end(),
                                                   [&](NodeId id) { return !g.in_backward(g.node(id)); });
    prog.backward_begin = static_cast<size_t>(forward_end - prog.order.begin());
  }
  prog.eager = opts.eager;
  prog.memory = plan_memory(g, prog.order, opts.inplace && !opts.eager, opts.device, !opts.eager);
  prog.pass_log.push_back(cat("memory_plan: arena ", prog.memory.arena_bytes, " bytes for ",
                              prog.memory.total_intermediate_bytes, " bytes of intermediates"));
  prog.graph = std::move(g);
  return prog;
}

}  // namespace flowrun
