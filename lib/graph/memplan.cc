// Liveness analysis and greedy-by-size offset assignment (as in TFLite's arena planner).
#include "graph/memplan.h"

#include <algorithm>
#include <numeric>

#include "core/device.h"
#include "graph/passes.h"
#include "ops/registry.h"

namespace flowrun {

namespace {
struct Buffer {
  size_t bytes = 0;
  int first = 0, last = 0;  // schedule positions where it is written first and read last
  int64_t offset = -1;
};

size_t align_up(size_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

std::vector<TensorType> types_of(const Graph& g, const std::vector<ValueId>& vs) {
  std::vector<TensorType> t;
  for (ValueId v : vs) t.push_back(g.value(v).type);
  return t;
}
}  // namespace

MemoryPlan plan_memory(const Graph& g, const std::vector<NodeId>& order, bool inplace, DeviceKind device,
                       bool share) {
  FR_CHECK(share || !inplace, "an unshared memory plan has no in-place outputs");
  MemoryPlan plan;
  plan.offset.assign(g.values().size(), -1);
  plan.alias.assign(g.values().size(), -1);
  plan.workspace_offset.assign(g.nodes().size(), -1);
  plan.workspace_bytes.assign(g.nodes().size(), 0);
  const int end = static_cast<int>(order.size());

  std::vector<int> last_use(g.values().size(), -1);
  for (int pos = 0; pos < end; ++pos)
    for (ValueId v : g.node(order[static_cast<size_t>(pos)]).inputs) last_use[static_cast<size_t>(v)] = pos;
  for (const auto& [name, v] : g.outputs()) last_use[static_cast<size_t>(v)] = end;

  std::vector<Buffer> buffers;
  std::vector<int> buffer_of(g.values().size(), -1);
  for (int pos = 0; pos < end; ++pos) {
    const Node& n = g.node(order[static_cast<size_t>(pos)]);
    const OpDef& def = OpRegistry::get().at(n.op);
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      const ValueId v = n.outputs[i];
      const Value& val = g.value(v);
      const int last = std::max(last_use[static_cast<size_t>(v)], pos);
      plan.total_intermediate_bytes += align_up(val.nbytes());
      if (i == 0 && inplace && def.view) {
        // A view of a graph input (an MLP flattening its images) reads the fed bytes: the executor writes
        // inputs only between steps, and nothing writes into a value that has no buffer of its own.
        const Value& src = g.value(n.inputs[0]);
        if (src.kind == ValueKind::input && src.nbytes() == val.nbytes() &&
            last_use[static_cast<size_t>(v)] < end) {
          plan.alias[static_cast<size_t>(v)] = src.id;
          ++plan.view_count;
          continue;
        }
        // One buffer for both: it lives until the later of their last uses.
        const int b = buffer_of[static_cast<size_t>(n.inputs[0])];
        if (b >= 0 && g.value(n.inputs[0]).nbytes() == val.nbytes()) {
          buffers[static_cast<size_t>(b)].last = std::max(buffers[static_cast<size_t>(b)].last, last);
          buffer_of[static_cast<size_t>(v)] = b;
          ++plan.view_count;
          continue;
        }
      }
      if (i == 0 && inplace && def.inplace_input >= 0) {
        const ValueId src = n.inputs[static_cast<size_t>(def.inplace_input)];
        const int b = buffer_of[static_cast<size_t>(src)];
        if (b >= 0 && last_use[static_cast<size_t>(src)] == pos && g.value(src).nbytes() == val.nbytes() &&
            buffers[static_cast<size_t>(b)].last == pos) {
          buffers[static_cast<size_t>(b)].last = last;
          buffer_of[static_cast<size_t>(v)] = b;
          ++plan.inplace_count;
          continue;
        }
      }
      buffer_of[static_cast<size_t>(v)] = static_cast<int>(buffers.size());
      buffers.push_back({val.nbytes(), pos, last, -1});
    }
    {
      const KernelChoice k = select_kernel(def, device, kernel_dtype(g, n));
      const size_t ws =
          workspace_layout(def, k, types_of(g, n.inputs), types_of(g, n.outputs), n.attrs).bytes;
      if (ws > 0) {
        plan.workspace_bytes[static_cast<size_t>(n.id)] = ws;
        plan.total_intermediate_bytes += align_up(ws);
        plan.workspace_offset[static_cast<size_t>(n.id)] = -2 - static_cast<int64_t>(buffers.size());
        buffers.push_back({ws, pos, pos, -1});
      }
    }
  }

  // Largest first; each takes the lowest offset that does not collide with a placed, overlapping buffer.
  // Unshared: end to end, in schedule order.
  std::vector<size_t> idx(buffers.size());
  std::iota(idx.begin(), idx.end(), 0);
  if (share)
    std::stable_sort(idx.begin(), idx.end(),
                     [&](size_t a, size_t b) { return buffers[a].bytes > buffers[b].bytes; });
  std::vector<size_t> placed;
  for (size_t i : idx) {
    if (!share) {
      buffers[i].offset = static_cast<int64_t>(plan.arena_bytes);
      plan.arena_bytes += align_up(buffers[i].bytes);
      continue;
    }
    Buffer& b = buffers[i];
    std::vector<std::pair<size_t, size_t>> busy;
    for (size_t j : placed) {
      const Buffer& o = buffers[j];
      if (o.first <= b.last && b.first <= o.last)
        busy.emplace_back(static_cast<size_t>(o.offset), static_cast<size_t>(o.offset) + align_up(o.bytes));
    }
    std::sort(busy.begin(), busy.end());
    size_t off = 0;
    for (const auto& [lo, hi] : busy) {
      if (off + align_up(b.bytes) <= lo) break;
      off = std::max(off, hi);
    }
    b.offset = static_cast<int64_t>(off);
    plan.arena_bytes = std::max(plan.arena_bytes, off + align_up(b.bytes));
    placed.push_back(i);
  }
  for (size_t v = 0; v < g.values().size(); ++v)
    if (buffer_of[v] >= 0) plan.offset[v] = buffers[static_cast<size_t>(buffer_of[v])].offset;
  for (auto& w : plan.workspace_offset)
    if (w <= -2) w = buffers[static_cast<size_t>(-2 - w)].offset;
  return plan;
}

}  // namespace flowrun
