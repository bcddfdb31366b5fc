// Small models built through the C++ GraphBuilder, shared by the training, allocation and planner tests.
#pragma once

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "graph/builder.h"
#include "graph/passes.h"
#include "runtime/executor.h"

namespace flowrun::testing {

// MLP: dims[0] -> dims[1] -> ... -> dims.back() classes, ReLU between layers; outputs "logits" and, with
// labels, "loss" (log_softmax + nll_loss, which the fusion pass turns into one cross_entropy). `dtype`: of
// the input and the parameters.
inline void build_mlp(Graph& g, int64_t batch, const std::vector<int64_t>& dims, bool with_loss,
                      DType dtype = DType::f32) {
  GraphBuilder b(g);
  ValueId h = b.input("x", {batch, dims[0]}, dtype);
  for (size_t i = 1; i < dims.size(); ++i) {
    const std::string l = "fc" + std::to_string(i);
    const ValueId w = b.param(l + "/weight", {dims[i], dims[i - 1]}, dtype);
    const ValueId bias = b.param(l + "/bias", {dims[i]}, dtype);
    h = b.op1("linear", {h, w, bias}, {}, l);
    if (i + 1 < dims.size()) h = b.op1("relu", {h});
  }
  g.mark_output("logits", h);
  if (with_loss) {
    const ValueId y = b.input("y", {batch}, DType::i64);
    const ValueId logp = b.op1("log_softmax", {h}, {{"axis", int64_t{-1}}});
    g.mark_output("loss", b.op1("nll_loss", {logp, y}));
  }
}

// One pre-LayerNorm GPT block (causal attention + GELU MLP) on x (B, T, C), loss = mse against "target".
inline void build_transformer_block(Graph& g, int64_t B, int64_t T, int64_t C, int64_t H) {
  GraphBuilder b(g);
  const int64_t D = C / H;
  const ValueId x = b.input("x", {B, T, C});
  auto ln = [&](ValueId v, const std::string& name) {
    const ValueId gamma = b.param(name + "/weight", {C}), beta = b.param(name + "/bias", {C});
    return b.op(name == "" ? "layernorm" : "layernorm", {v, gamma, beta}, {}, name)[0];
  };
  auto linear = [&](ValueId v, int64_t in, int64_t out, const std::string& name) {
    return b.op1("linear", {v, b.param(name + "/weight", {out, in}), b.param(name + "/bias", {out})}, {}, name);
  };
  auto heads = [&](ValueId v) {  // (B,T,C) -> (B,H,T,D)
    return b.op1("transpose", {b.reshape(v, {B, T, H, D})}, {{"dim0", int64_t{1}}, {"dim1", int64_t{2}}});
  };
  const ValueId a = ln(x, "ln1");
  const ValueId q = heads(linear(a, C, C, "q")), k = heads(linear(a, C, C, "k")), v = heads(linear(a, C, C, "v"));
  const ValueId att = b.op("sdpa", {q, k, v}, {{"causal", true}}, "attn")[0];
  const ValueId merged =
      b.reshape(b.op1("transpose", {att}, {{"dim0", int64_t{1}}, {"dim1", int64_t{2}}}), {B, T, C});
  const ValueId r1 = b.add(x, linear(merged, C, C, "proj"));
  const ValueId m = linear(b.op1("gelu", {linear(ln(r1, "ln2"), C, 4 * C, "fc")}), 4 * C, C, "fc_out");
  const ValueId out = b.add(r1, m);
  g.mark_output("loss", b.op1("mse_loss", {out, b.input("target", {B, T, C})}));
}

// PyTorch's default Linear init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases; norms' weights 1.
inline void init_params(Executor& ex, uint64_t seed) {
  uint64_t stream = 0;
  for (auto& [name, t] : ex.persistent()) {
    const Value& v = ex.program().graph.value(ex.program().graph.find_value(name));
    if (v.kind != ValueKind::param) continue;
    Tensor& p = ex.tensor(name);
    std::vector<double> vals(static_cast<size_t>(p.numel()));
    const bool norm = name.rfind("ln", 0) == 0;
    const double fan_in = p.shape().size() == 2 ? static_cast<double>(p.shape()[1]) : static_cast<double>(p.shape()[0]);
    const RngStream r{seed, stream++};
    for (size_t i = 0; i < vals.size(); ++i)
      vals[i] = norm ? (name.find("weight") != std::string::npos ? 1.0 : 0.0)
                     : (2.0 * r.uniform(i) - 1.0) / std::sqrt(fan_in);
    p.fill_from(vals);
  }
}

// The options train_sgd's programs are compiled with: SGD with momentum 0.9 (its learning rate the "lr"
// input), fused or eager; callers set the rest (compute dtype, layouts).
inline CompileOptions sgd_options(bool eager = false) {
  CompileOptions opts;
  opts.optimizer = {.type = "sgd", .momentum = 0.9};
  opts.eager = eager;
  return opts;
}

// Losses of `steps` SGD steps (lr 0.05, parameters from init_params(5)) on inputs "x" and "target" drawn
// uniform in [-0.5, 0.5) from step-keyed streams, and the final f32 persistent tensors (parameters and
// state: momentum, running statistics), for comparing two compilations of one model bit for bit. `setup`
// fills any other inputs once.
inline std::pair<std::vector<float>, std::map<std::string, std::vector<float>>> train_sgd(
    Program p, int steps, const std::function<void(Executor&)>& setup = {}) {
  Executor ex(std::move(p), kCpu, /*seed=*/3);
  init_params(ex, 5);
  if (setup) setup(ex);
  ex.tensor("lr").data<float>()[0] = 0.05f;
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    for (const char* in : {"x", "target"}) {
      Tensor& t = ex.tensor(in);
      const RngStream r{7, static_cast<uint64_t>(s * 2 + (in[0] == 'x'))};
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(r.uniform(i) - 0.5);
    }
    ex.set_step(s);
    ex.run();
    losses.push_back(ex.output("loss").data<float>()[0]);
  }
  std::map<std::string, std::vector<float>> tensors;
  for (auto& [name, t] : ex.persistent())
    if (t.dtype() == DType::f32) tensors[name].assign(t.data<float>(), t.data<float>() + t.numel());
  return {losses, tensors};
}

}  // namespace flowrun::testing
