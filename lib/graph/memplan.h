// Memory planning: liveness of every intermediate over the schedule, then one arena per device in which
// values whose lifetimes do not overlap share memory (greedy by size), and outputs reuse a dying input in
// place where the op allows it.
#pragma once

#include <cstdint>
#include <vector>

#include "core/device.h"
#include "graph/ir.h"

namespace flowrun {

struct MemoryPlan {
  size_t arena_bytes = 0;
  size_t total_intermediate_bytes = 0;  // sum of all intermediates and workspaces: the arena with no reuse
  std::vector<int64_t> offset;          // per value: byte offset in the arena, -1 if not an intermediate
  std::vector<int64_t> workspace_offset;  // per node: scratch offset, -1 if none
  std::vector<size_t> workspace_bytes;    // per node
  int inplace_count = 0;                  // outputs that take over a dying input's buffer
  int view_count = 0;                     // outputs of view ops (reshape) sharing their input's buffer
  // per value: the graph input whose bytes this view's output is (a reshape of a fed batch), -1 if none
  std::vector<int64_t> alias;
};

// `device` picks the kernels whose workspaces are planned (widened f16/bf16 kernels need f32 copies).
// With share = false (eager programs) no two values or workspaces share memory: each has bytes of its own
// for the whole step, so every value can still be read after the step (`inplace` must then be false).
MemoryPlan plan_memory(const Graph& g, const std::vector<NodeId>& order, bool inplace,
                       DeviceKind device = DeviceKind::cpu, bool share = true);

}  // namespace flowrun
