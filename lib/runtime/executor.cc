// Executor: binds every value to memory once and replays the kernel list.
#include "runtime/executor.h"

#include <chrono>
#include <cstring>

namespace flowrun {

Executor::Executor(Program program, Device device, uint64_t seed, const std::map<std::string, Tensor>& shared)
    : program_(std::move(program)), device_(device), seed_(seed) {
  const Graph& g = program_.graph;
  const MemoryPlan& mem = program_.memory;
  arena_ = std::make_shared<Storage>(std::max<size_t>(mem.arena_bytes, 1), device_);
  char* base = static_cast<char*>(arena_->data());

  std::vector<void*> addr(g.values().size(), nullptr);
  for (const auto& v : g.values()) {
    if (v.kind == ValueKind::intermediate) {
      if (mem.offset[static_cast<size_t>(v.id)] >= 0) addr[static_cast<size_t>(v.id)] = base + mem.offset[static_cast<size_t>(v.id)];
      continue;
    }
    Tensor t;
    if (auto it = shared.find(v.name); it != shared.end()) {
      FR_CHECK(it->second.shape() == v.shape() && it->second.dtype() == v.dtype(), "shared tensor ", v.name,
               " does not match the program's value");
      t = it->second;
    } else {
      t = Tensor::zeros(v.shape(), v.dtype(), device_);
    }
    addr[static_cast<size_t>(v.id)] = t.raw();
    persistent_.emplace(v.name, std::move(t));
  }

  size_t nviews = 0;
  for (NodeId id : program_.order) nviews += g.node(id).inputs.size() + g.node(id).outputs.size();
  views_.reserve(nviews);  // Step contexts point into views_: it must never reallocate
  for (NodeId id : program_.order) {
    const Node& n = g.node(id);
    const OpDef& def = OpRegistry::get().at(n.op);
    const KernelDef* k = def.kernel(device_.kind, kernel_dtype(g, n));
    FR_CHECK(k != nullptr, "no kernel for ", n.op);
    Step s{k->fn, {}};
    s.ctx.node = &n;
    s.ctx.in = views_.data() + views_.size();
    for (ValueId v : n.inputs) views_.push_back({addr[static_cast<size_t>(v)], &g.value(v).shape(), g.value(v).dtype()});
    s.ctx.num_in = static_cast<int>(n.inputs.size());
    s.ctx.out = views_.data() + views_.size();
    for (ValueId v : n.outputs) {
      FR_CHECK(addr[static_cast<size_t>(v)] != nullptr || g.value(v).nbytes() == 0, "value ", g.value(v).name,
               " has no memory");
      views_.push_back({addr[static_cast<size_t>(v)], &g.value(v).shape(), g.value(v).dtype()});
    }
    s.ctx.num_out = static_cast<int>(n.outputs.size());
    if (mem.workspace_offset[static_cast<size_t>(id)] >= 0) {
      s.ctx.workspace = base + mem.workspace_offset[static_cast<size_t>(id)];
      s.ctx.workspace_bytes = mem.workspace_bytes[static_cast<size_t>(id)];
    }
    steps_.push_back(s);
  }
}

void Executor::run(bool apply) {
  for (Step& s : steps_) {
    if (!apply && s.ctx.node->phase == 1) continue;
    s.ctx.rng = RngStream{seed_, mix_stream(static_cast<uint64_t>(step_), static_cast<uint64_t>(s.ctx.node->id))};
    s.fn(s.ctx);
  }
  ++step_;
}

void Executor::run_timed(const std::function<void(const Node&, double)>& timer, bool apply) {
  for (Step& s : steps_) {
    if (!apply && s.ctx.node->phase == 1) continue;
    s.ctx.rng = RngStream{seed_, mix_stream(static_cast<uint64_t>(step_), static_cast<uint64_t>(s.ctx.node->id))};
    const auto t0 = std::chrono::steady_clock::now();
    s.fn(s.ctx);
    timer(*s.ctx.node, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  ++step_;
}

Tensor& Executor::tensor(const std::string& name) {
  auto it = persistent_.find(name);
  if (it == persistent_.end()) throw input_error(cat("the program has no input, parameter or state named '", name, "'"));
  return it->second;
}

Tensor Executor::output(const std::string& name) const {
  const Graph& g = program_.graph;
  auto it = g.outputs().find(name);
  if (it == g.outputs().end()) throw input_error(cat("the program has no output named '", name, "'"));
  const Value& v = g.value(it->second);
  if (v.kind != ValueKind::intermediate) return persistent_.at(v.name);
  Tensor t = Tensor::empty(v.shape(), v.dtype(), device_);
  std::memcpy(t.raw(), static_cast<char*>(arena_->data()) + program_.memory.offset[static_cast<size_t>(v.id)], v.nbytes());
  return t;
}

}  // namespace flowrun
