// Automatic mixed precision as a graph pass over the forward graph (before autodiff, so the backward pass
// inherits each op's dtype and the gradient of every cast is the cast back). Parameters stay f32 (master
// weights); an op that runs in f16/bf16 reads a low-precision copy made by one cast node per step.
#include <algorithm>
#include <array>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "graph/passes.h"
#include "ops/registry.h"

namespace flowrun {

AmpPolicy amp_policy(const std::string& op) {
  // GEMM-shaped ops gain from low precision and accumulate in f32 inside their kernels.
  static const std::set<std::string> low = {"matmul", "linear", "conv2d", "sdpa", "sdpa_qkv", "sdpa_rows"};
  // Ops whose results lose too much in 8 (bf16) or 11 (f16) bits of mantissa, or that sum many terms:
  // exponentials and logarithms, losses, reductions. The KV cache of decoding (sdpa_cache) stays f32, as the
  // state it updates in place.
  static const std::set<std::string> f32 = {"softmax",    "log_softmax", "cross_entropy", "nll_loss",
                                            "mse_loss",   "reduce_sum",  "reduce_mean",   "reduce_max",
                                            "pow_scalar", "sdpa_cache",  "global_avgpool"};
  // Norms sum their statistics in f32 from low-precision activations and round the normalised output once,
  // as PyTorch's CPU autocast runs them (bf16 activations, f32 parameters and statistics).
  static const std::set<std::string> norm = {"batchnorm", "layernorm", "rmsnorm"};
  if (low.count(op)) return AmpPolicy::low;
  if (f32.count(op)) return AmpPolicy::f32;
  if (norm.count(op)) return AmpPolicy::norm;
  return AmpPolicy::follow;
}

const char* amp_policy_name(AmpPolicy p) {
  switch (p) {
    case AmpPolicy::low:
      return "low";
    case AmpPolicy::f32:
      return "f32";
    case AmpPolicy::follow:
      return "follow";
    case AmpPolicy::norm:
      return "norm";
  }
  return "?";
}

void auto_mixed_precision(Graph& g, DType low, DeviceKind device) {
  FR_CHECK(is_low_precision(low), "mixed precision needs f16 or bf16, got ", dtype_name(low));
  auto amp_dtype = [&](DType t) { return t == DType::f32 || t == low; };
  std::map<std::pair<ValueId, DType>, ValueId> casts;  // one cast per (value, dtype)
  auto cast_to = [&](ValueId v, DType t) {
    auto [it, fresh] = casts.try_emplace({v, t}, kNoValue);
    if (fresh) {
      const std::string name = cat(g.value(v).name, "/to_", dtype_name(t));
      it->second = g.add_node("cast", {v}, {{"dtype", std::string(dtype_name(t))}}, name)[0];
    }
    return it->second;
  };
  const std::vector<NodeId> order = g.live_nodes_topological();
  for (NodeId id : order) {
    Node& n = g.node(id);
    const OpDef& def = OpRegistry::get().at(n.op);
    // The dtype this node's floating inputs must share, or none to leave them as they are.
    std::vector<size_t> floating;
    bool uniform = true;
    const std::vector<int> mutated = def.mutated_inputs(n.attrs, static_cast<int>(n.inputs.size()));
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const DType t = g.value(n.inputs[i]).dtype();
      // State updated in place (batchnorm's running statistics) keeps its dtype.
      if (!is_floating(t) || std::find(mutated.begin(), mutated.end(), static_cast<int>(i)) != mutated.end())
        continue;
      uniform = uniform && (floating.empty() || t == g.value(n.inputs[floating[0]]).dtype());
      floating.push_back(i);
    }
    bool convertible = !floating.empty();
    for (size_t i : floating) convertible = convertible && amp_dtype(g.value(n.inputs[i]).dtype());
    if (convertible) {
      AmpPolicy p = amp_policy(n.op);
      // A norm keeps a low-precision x (its first input) where the device's low kernel takes the rest in f32.
      const KernelDef* mixed = p == AmpPolicy::norm ? def.kernel(device, low) : nullptr;
      std::vector<DType> target(n.inputs.size(), DType::f64);  // f64: leave as it is
      if (mixed && !mixed->f32_inputs.empty() && g.value(n.inputs[0]).dtype() == low) {
        for (int i : mixed->f32_inputs) target[static_cast<size_t>(i)] = DType::f32;
      } else {
        if (p == AmpPolicy::norm) p = AmpPolicy::f32;
        // Mixed inputs of an op that follows them are promoted to the widest, as in PyTorch's autocast.
        const DType t = p == AmpPolicy::low ? low : p == AmpPolicy::f32 || !uniform ? DType::f32 : DType::f64;
        for (size_t i : floating) target[i] = t;
      }
      for (size_t i : floating) {
        const ValueId v = g.node(id).inputs[i];
        if (target[i] != DType::f64 && g.value(v).dtype() != target[i]) {
          const ValueId c = cast_to(v, target[i]);
          g.node(id).inputs[i] = c;  // add_node may have reallocated the node list: index again
        }
      }
    }
    // Re-infer: the outputs follow whatever the inputs became.
    const Node& cur = g.node(id);
    std::vector<TensorType> in;
    for (ValueId v : cur.inputs) in.push_back(g.value(v).type);
    const std::vector<TensorType> out = def.infer(in, cur.attrs);
    for (size_t i = 0; i < out.size(); ++i) g.value(cur.outputs[i]).type = out[i];
  }
  // The caller reads outputs (loss, logits) as f32.
  for (const auto& [name, v] : std::map<std::string, ValueId>(g.outputs()))
    if (g.value(v).dtype() == low) g.mark_output(name, cast_to(v, DType::f32));
}

void fold_f32_casts(Graph& g, DeviceKind device) {
  if (device != DeviceKind::cpu) return;
  static const std::set<std::string> foldable = {"matmul", "linear", "reduce_sum"};
  const auto readers = g.consumers();
  const std::set<ValueId> outputs = g.output_values();
  // v is a low-precision value read only by the node before it in the chain.
  auto single = [&](ValueId v) {
    const Value& x = g.value(v);
    return x.producer >= 0 && is_low_precision(x.dtype()) && readers[static_cast<size_t>(v)].size() == 1 &&
           !outputs.count(v);
  };
  for (Node& c : g.nodes()) {
    if (c.dead || c.op != "cast" || !c.attrs.is("dtype", "f32") || !single(c.inputs[0])) continue;
    // Back through reshapes (a bias gradient is reduce_sum with keepdims, then reshaped to the bias).
    std::vector<NodeId> chain;  // the producer, then each reshape after it, in order
    ValueId v = c.inputs[0];
    while (g.node(g.value(v).producer).op == "reshape" && single(g.node(g.value(v).producer).inputs[0])) {
      chain.insert(chain.begin(), g.value(v).producer);
      v = g.node(g.value(v).producer).inputs[0];
    }
    Node& p = g.node(g.value(v).producer);
    const DType low = g.value(v).dtype();
    if (p.dead || !foldable.count(p.op) || p.outputs.size() != 1 || p.attrs.has("out_dtype") ||
        kernel_dtype(g, p) != low)
      continue;
    const KernelChoice k = select_kernel(OpRegistry::get().at(p.op), device, low);
    if (!k.kernel || k.widened) continue;
    p.attrs.set("out_dtype", std::string("f32"));
    chain.insert(chain.begin(), p.id);
    // The chain's values become f32, and its last node writes the cast's output; the value it wrote before is
    // left without producer or readers.
    for (size_t i = 0; i + 1 < chain.size(); ++i)
      g.value(g.node(chain[i]).outputs[0]).type.dtype = DType::f32;
    Node& last = g.node(chain.back());
    g.value(last.outputs[0]).producer = -1;
    last.outputs[0] = c.outputs[0];
    g.value(c.outputs[0]).producer = last.id;
    g.value(c.outputs[0]).producer_slot = 0;
    c.dead = true;
  }
}

std::string describe_precision(const Graph& g, const std::vector<NodeId>& order, DeviceKind device,
                               bool every_node) {
  // Backward and optimizer nodes are recognised by the scopes autodiff and the optimizer pass give them.
  auto part = [](const std::string& name) {
    if (name.rfind("grad/", 0) == 0) return 1;
    if (name.rfind("update/", 0) == 0 || name.rfind("opt/", 0) == 0 || name.rfind("accumulate/", 0) == 0)
      return 2;
    return 0;
  };
  std::map<std::tuple<std::string, std::string, std::string>, std::array<int, 3>>
      rows;  // (op, dtype, kernel)
  std::ostringstream nodes;
  int casts = 0, param_casts = 0;
  for (NodeId id : order) {
    const Node& n = g.node(id);
    const DType t = kernel_dtype(g, n);
    const KernelChoice k = select_kernel(OpRegistry::get().at(n.op), device, t);
    const std::string kernel = k.widened ? "widened" : "native";
    ++rows[{n.op, dtype_name(t), kernel}][static_cast<size_t>(part(n.name))];
    if (n.op == "cast") {
      ++casts;
      param_casts += g.value(n.inputs[0]).kind == ValueKind::param;
    }
    if (every_node)
      nodes << std::left << std::setw(20) << n.op << std::setw(6) << dtype_name(t) << std::setw(9) << kernel
            << n.name << "\n";
  }
  std::ostringstream os;
  os << std::left << std::setw(20) << "op" << std::setw(6) << "dtype" << std::setw(9) << "kernel"
     << std::setw(8) << "policy"
     << "forward / backward / optimizer nodes\n";
  for (const auto& [key, count] : rows)
    os << std::setw(20) << std::get<0>(key) << std::setw(6) << std::get<1>(key) << std::setw(9)
       << std::get<2>(key) << std::setw(8) << (count[0] ? amp_policy_name(amp_policy(std::get<0>(key))) : "-")
       << count[0] << " / " << count[1] << " / " << count[2] << "\n";
  os << casts << " casts, " << param_casts << " of them low-precision copies of parameters (one per step)\n";
  if (every_node) os << "\nschedule:\n" << nodes.str();
  return os.str();
}

}  // namespace flowrun
