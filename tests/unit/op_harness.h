// Builds and runs one OpSample as a tiny program: the generic op tests (gradient check, references,
// f32-vs-f64) all go through here.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "graph/builder.h"
#include "graph/passes.h"
#include "ops/registry.h"
#include "runtime/executor.h"

namespace flowrun::testing {

struct SampleProgram {
  std::unique_ptr<Executor> exec;
  std::vector<std::string> input_names;  // "x0", "x1", ...
  std::vector<bool> is_param;            // differentiable inputs are params (they get gradients)
  std::vector<int> diff_outputs;         // output slots that enter the loss
  int num_outputs = 0;
  bool has_loss = false;
};

inline bool contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Fills input i with the sample's generator or uniform [-1, 1] (ints: 0..3).
inline void fill_input(const OpSample& s, int i, Tensor& t, uint64_t seed) {
  if (s.fill) return s.fill(i, t, seed);
  std::vector<double> v(static_cast<size_t>(t.numel()));
  const RngStream r{seed, 1000 + static_cast<uint64_t>(i)};
  for (size_t k = 0; k < v.size(); ++k)
    v[k] = is_floating(t.dtype()) ? 2.0 * r.uniform(k) - 1.0 : static_cast<double>(r.block(k)[0] % 4);
  t.fill_from(v);
}

// `as` replaces f64 by another float dtype (for the f32 check); `with_grad` adds the weighted-sum loss;
// `inplace` false keeps every node's inputs intact after it runs (Executor::value in a run_timed callback).
inline SampleProgram build_sample(const OpDef& def, const OpSample& s, bool with_grad, DType as = DType::f64,
                                  std::set<std::string>* ops_seen = nullptr, bool inplace = true) {
  SampleProgram sp;
  Graph g;
  GraphBuilder b(g);
  std::vector<ValueId> ins;
  const std::vector<int> mutated = def.mutated_inputs(s.attrs, static_cast<int>(s.inputs.size()));
  // A mixed-precision kernel's parameters and statistics stay f32 (KernelDef::f32_inputs).
  const KernelDef* k = is_low_precision(as) ? select_kernel(def, DeviceKind::cpu, as).kernel : nullptr;
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    const std::string name = "x" + std::to_string(i);
    const bool f32_input = k && contains(k->f32_inputs, static_cast<int>(i));
    const DType t = s.inputs[i].dtype != DType::f64 ? s.inputs[i].dtype : f32_input ? DType::f32 : as;
    const bool param = with_grad && def.grad && is_floating(t) &&
                       !contains(def.nondiff_inputs, static_cast<int>(i)) &&
                       !contains(mutated, static_cast<int>(i));
    ins.push_back(param ? g.add_param(name, s.inputs[i].shape, t)
                        : (contains(mutated, static_cast<int>(i)) ? g.add_state(name, s.inputs[i].shape, t)
                                                                  : g.add_input(name, s.inputs[i].shape, t)));
    sp.input_names.push_back(name);
    sp.is_param.push_back(param);
  }
  const std::vector<ValueId> outs = b.op(def.name, ins, s.attrs, "op");
  sp.num_outputs = static_cast<int>(outs.size());
  ValueId loss = kNoValue;
  for (size_t j = 0; j < outs.size(); ++j) {
    g.mark_output("out" + std::to_string(j), outs[j]);
    if (!with_grad || !g.value(outs[j]).requires_grad || g.value(outs[j]).dtype() != as) continue;
    sp.diff_outputs.push_back(static_cast<int>(j));
    const ValueId w =
        g.add_input("w" + std::to_string(j), g.value(outs[j]).shape(), g.value(outs[j]).dtype());
    const ValueId term = b.reduce_sum(b.mul(outs[j], w), {});
    loss = loss == kNoValue ? term : b.add(loss, term);
  }
  CompileOptions opts;
  opts.fuse = false;  // test the op itself, not what fusion would replace it with
  opts.inplace = inplace;
  if (loss != kNoValue) {
    g.mark_output("loss", loss);
    sp.has_loss = true;
  } else {
    opts.loss = "";
  }
  Program prog = compile(std::move(g), opts);
  if (ops_seen)
    for (NodeId id : prog.order) ops_seen->insert(prog.graph.node(id).op);
  sp.exec = std::make_unique<Executor>(std::move(prog), kCpu, 1234);
  return sp;
}

inline void fill_all(const OpSample& s, SampleProgram& sp, uint64_t seed) {
  for (size_t i = 0; i < sp.input_names.size(); ++i) {
    Tensor t = Tensor::empty(s.inputs[i].shape, s.inputs[i].dtype);
    fill_input(s, static_cast<int>(i), t, seed);
    Tensor& dst = sp.exec->tensor(sp.input_names[i]);
    dst.fill_from(t.to_f64());
  }
  for (int j : sp.diff_outputs) {
    Tensor& w = sp.exec->tensor("w" + std::to_string(j));
    std::vector<double> v(static_cast<size_t>(w.numel()));
    const RngStream r{seed, 5000 + static_cast<uint64_t>(j)};
    for (size_t k = 0; k < v.size(); ++k) v[k] = 0.5 + r.uniform(k);  // positive, distinct weights
    w.fill_from(v);
  }
}

inline double run_loss(SampleProgram& sp) {
  sp.exec->set_step(0);  // random ops draw the same numbers on every evaluation
  sp.exec->run();
  return sp.exec->output("loss").to_f64()[0];
}

// Runs kernel `k` of `def` on `in` into fresh outputs of the given types, with the kernel's workspace.
inline std::vector<Tensor> run_kernel(const OpDef& def, const KernelDef& k, const Attrs& attrs,
                                      const std::vector<Tensor>& in) {
  std::vector<TensorType> it, ot;
  for (const Tensor& t : in) it.push_back({t.shape(), t.dtype()});
  ot = def.infer(it, attrs);
  Node node;
  node.op = def.name;
  node.attrs = attrs;
  std::vector<TensorView> iv, ov;
  for (const Tensor& t : in) iv.push_back({t.raw(), &t.shape(), t.dtype()});
  std::vector<Tensor> out;
  for (const TensorType& t : ot) out.push_back(Tensor::zeros(t.shape, t.dtype));
  for (Tensor& t : out) ov.push_back({t.raw(), &t.shape(), t.dtype()});
  const auto& size = k.workspace ? k.workspace : def.workspace;
  const size_t ws_bytes = size ? size(it, ot, attrs) : 0;
  std::vector<double> ws(ws_bytes / sizeof(double) + 1);
  KernelCtx c;
  c.node = &node;
  c.in = iv.data();
  c.num_in = static_cast<int>(iv.size());
  c.out = ov.data();
  c.num_out = static_cast<int>(ov.size());
  c.workspace = ws.data();
  c.workspace_bytes = ws_bytes;
  k.fn(c);
  return out;
}

}  // namespace flowrun::testing
