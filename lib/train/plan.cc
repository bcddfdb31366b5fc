// Planning a layout from its compiled program: sizes of the persistent values and the arena, the ops' costs,
// and the collectives the parallel passes inserted.
#include "train/plan.h"

#include <algorithm>
#include <cstdio>

#include "ops/registry.h"
#include "train/metrics.h"
#include "train/program.h"

namespace flowrun {

namespace {

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / 1048576.0);
  return buf;
}

}  // namespace

PlanReport plan_layout(const RunConfig& cfg) {
  PlanReport r;
  r.data = cfg.parallel.data;
  r.world = cfg.parallel.data * cfg.parallel.tensor * cfg.parallel.pipeline;
  const auto data = open_dataset(cfg.data);
  BuiltModel built;
  const Program p = compile_model(cfg, data->spec(), cfg.train.micro_batch_size, true, &built);
  const Graph& g = p.graph;
  for (const Value& v : g.values()) {
    const auto bytes = static_cast<double>(v.nbytes());
    if (v.kind == ValueKind::param) r.param_bytes += bytes;
    if (v.kind == ValueKind::input) r.input_bytes += bytes;
    if (v.kind == ValueKind::state)
      (v.name.rfind("opt/", 0) == 0 ? r.optimizer_state_bytes : r.other_state_bytes) += bytes;
  }
  for (const auto& [param, grad] : g.param_grads())
    r.grad_bytes += static_cast<double>(g.value(grad).nbytes());
  r.arena_bytes = static_cast<double>(p.memory.arena_bytes);
  r.flops_per_step = step_flops(p, cfg.train.grad_accumulation);
  const double ranks = static_cast<double>(r.data);
  const double tp = static_cast<double>(cfg.parallel.tensor);
  for (NodeId id : p.order) {
    const Node& n = p.graph.node(id);
    const bool boxing = n.op == "sbp_all_reduce" || n.op == "sbp_all_gather" || n.op == "sbp_reduce_scatter";
    const bool tensor_axis = boxing && n.attrs.is("mesh", "tensor");
    const bool data_axis = (boxing && !tensor_axis) || n.op == "all_reduce" || n.op == "all_reduce_start" ||
                           n.op == "all_gather_into" || n.op == "reduce_scatter_shard";
    if (!data_axis && !tensor_axis) continue;
    CollectivePlan c;
    c.node = n.name;
    c.op = n.op;
    c.axis = tensor_axis ? "tensor" : "data";
    // What the collective covers: the whole tensor (the gathered output, the reduced input).
    c.tensor_bytes =
        static_cast<double>(g.value(n.op == "sbp_all_gather" ? n.outputs[0] : n.inputs[0]).nbytes());
    if (n.op == "all_reduce")
      for (size_t i = 1; i < n.inputs.size(); ++i)
        c.tensor_bytes += static_cast<double>(g.value(n.inputs[i]).nbytes());
    c.calls = n.phase == 1 ? 1.0 : static_cast<double>(cfg.train.grad_accumulation);
    if (n.op == "all_reduce_start") c.tensor_bytes = static_cast<double>(g.value(n.outputs[0]).nbytes());
    const double factor =
        n.op == "all_reduce" || n.op == "all_reduce_start" || n.op == "sbp_all_reduce" ? 2.0 : 1.0;
    const double group = tensor_axis ? tp : n.attrs.is("group", "ends") ? 2.0 : ranks;
    c.sent_bytes = c.calls * factor * c.tensor_bytes * (group - 1) / group;
    r.sent_bytes_per_step += c.sent_bytes;
    r.collectives.push_back(c);
  }

  char buf[256];
  std::string t =
      cat("flowrun plan ", cfg.file, ": ", r.world, " process", r.world == 1 ? "" : "es", " (data ",
          cfg.parallel.data, " x tensor ", cfg.parallel.tensor, " x pipeline ", cfg.parallel.pipeline,
          ", zero ", cfg.parallel.zero, "), micro-batch ", cfg.train.micro_batch_size, " x ",
          cfg.train.grad_accumulation, " accumulation per rank, ", cfg.precision.dtype, "\n\n");
  t += "memory per device\n";
  for (const auto& [what, bytes] : std::vector<std::pair<const char*, double>>{
           {"parameters", r.param_bytes},
           {"optimizer state", r.optimizer_state_bytes},
           {"other state (running statistics, loss scaler)", r.other_state_bytes},
           {"inputs", r.input_bytes},
           {"arena (activations, gradients, workspaces)", r.arena_bytes}}) {
    std::snprintf(buf, sizeof buf, "  %-48s %14.0f bytes  %s\n", what, bytes, mib(bytes).c_str());
    t += buf;
  }
  const double total =
      r.param_bytes + r.optimizer_state_bytes + r.other_state_bytes + r.input_bytes + r.arena_bytes;
  std::snprintf(buf, sizeof buf, "  %-48s %14.0f bytes  %s\n", "total", total, mib(total).c_str());
  t += buf;
  std::snprintf(buf, sizeof buf,
                "  (gradients, inside the arena: %s)\n\ncompute per device: %.3f GFLOP per step\n",
                mib(r.grad_bytes).c_str(), r.flops_per_step * 1e-9);
  t += buf;
  if (r.collectives.empty()) {
    t += "collectives: none\n";
  } else {
    // One line per op and pass (ZeRO gathers every parameter on its own: one line for all of them).
    t += "collectives per device per step\n";
    std::vector<std::pair<std::string, CollectivePlan>> lines;
    for (const CollectivePlan& c : r.collectives) {
      const std::string key = c.op == "all_gather_into"        ? "zero/*/gather"
                              : c.op == "reduce_scatter_shard" ? "reduce_gradients/* (ZeRO-2)"
                              : c.op.rfind("sbp_", 0) == 0     ? cat(c.axis, " axis boxing")
                                                               : c.node;
      auto it = std::find_if(lines.begin(), lines.end(),
                             [&](const auto& l) { return l.first == key && l.second.op == c.op; });
      if (it == lines.end()) {
        lines.push_back({key, c});
        continue;
      }
      it->second.tensor_bytes += c.tensor_bytes;
      it->second.sent_bytes += c.sent_bytes;
      it->second.calls += c.calls;
    }
    for (const auto& [key, c] : lines) {
      std::snprintf(buf, sizeof buf, "  %-16s %-28s %12.0f bytes in %g calls: %12.0f bytes sent\n",
                    c.op.c_str(), key.c_str(), c.tensor_bytes, c.calls, c.sent_bytes);
      t += buf;
    }
    std::snprintf(buf, sizeof buf, "  total sent %s per step\n", mib(r.sent_bytes_per_step).c_str());
    t += buf;
  }
  if (cfg.parallel.pipeline > 1) {
    // Stage 0 of the pipeline: what it holds at once under 1F1B, and what it sends to stage 1.
    const int64_t m = cfg.train.grad_accumulation, slots = std::min(cfg.parallel.pipeline, m);
    const double act = static_cast<double>(g.value(g.outputs().at("pp/out")).nbytes());
    std::snprintf(
        buf, sizeof buf,
        "pipeline stage 0 of %lld: %lld micro-batch slots (arena %s each, 1F1B), sends %lld activations "
        "of %.0f bytes per step and receives as many gradients\n",
        static_cast<long long>(cfg.parallel.pipeline), static_cast<long long>(slots),
        mib(r.arena_bytes).c_str(), static_cast<long long>(m), act);
    t += buf;
  }
  if (cfg.parallel.tensor > 1) {
    t += "\nparameters on the tensor axis (whole shape, SBP)\n";
    for (const Value& v : g.values())
      if (v.kind == ValueKind::param)
        t += cat("  ", v.name, " ", shape_str(v.placement.tensor_split() ? v.placement.whole : v.shape()),
                 " ", v.placement.tensor.str(), "\n");
  }
  r.table = t;
  JsonLine j;
  j.add("world", r.world)
      .add("param_bytes", r.param_bytes)
      .add("grad_bytes", r.grad_bytes)
      .add("optimizer_state_bytes", r.optimizer_state_bytes)
      .add("other_state_bytes", r.other_state_bytes)
      .add("arena_bytes", r.arena_bytes)
      .add("flops_per_step", r.flops_per_step)
      .add("sent_bytes_per_step", r.sent_bytes_per_step);
  r.json = j.str();
  return r;
}

}  // namespace flowrun
