// `flowrun plan`: what a config's layout costs each device, without running it: memory (parameters,
// gradients, optimizer state, the planned arena), FLOPs per step, and the bytes every collective moves.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "graph/passes.h"
#include "nn/model.h"

namespace flowrun {

class Dataset;
struct DataSpec;

// The resident memory of one process of a run at its peak, as `flowrun plan` predicts it: each part in print
// order with its bytes. Of rank 0 (the first pipeline stage, and the lead that evaluates and checkpoints).
struct ProcessMemory {
  std::vector<std::pair<std::string, double>> parts;
  double total = 0;
};

struct CollectivePlan {
  std::string node, op;     // e.g. "reduce_gradients/bucket0_f32/start", "all_reduce_start"
  std::string axis;         // the mesh axis it runs on: "data" or "tensor"
  double tensor_bytes = 0;  // what the collective covers on one device
  double calls = 0;         // per optimizer step
  double sent_bytes = 0;    // per device per step: ring all-reduce 2T(p-1)/p, all-gather T(p-1)/p
  double group = 1;         // ranks taking part
  bool reduce = false;      // an all-reduce (2(p-1) ring steps), else a gather or scatter (p-1)
};

struct PlanReport {
  int64_t world = 1, data = 1;
  double param_bytes = 0, grad_bytes = 0, optimizer_state_bytes = 0, other_state_bytes = 0, input_bytes = 0;
  double arena_bytes = 0, flops_per_step = 0, sent_bytes_per_step = 0;
  ProcessMemory process;  // of a training run
  std::vector<CollectivePlan> collectives;
  std::string table, json;
};

// The evaluation program a training run compiles beside its training program, as rank 0 holds it (under a
// pipeline, the lead's whole model); and whether it holds parameters of its own (ZeRO-3's gathered shards,
// the pipeline lead's whole model) instead of reading the training program's.
Program rank0_eval_program(const RunConfig& cfg, const DataSpec& spec);
bool eval_owns_parameters(const RunConfig& cfg);

// `p` is rank 0's training program, `eval` its evaluation program in a training run (null for `flowrun
// time`, which neither evaluates nor checkpoints).
ProcessMemory predict_process_memory(const Program& p, const BuiltModel& built, const Dataset& data,
                                     const RunConfig& cfg, const Program* eval);

// The resident bytes of this process when this was first called: `flowrun` calls it first thing, so it is
// the binary and its libraries as loaded, before any work (the baseline of predict_process_memory).
double process_baseline_bytes();
// The process's peak resident bytes so far (VmHWM).
double peak_resident_bytes();

// Under parallel.tensor > 1, a warning when the model's head counts are not divisible by the axis (attention
// then runs whole on every rank), and when most of the program's parameter elements (whole shapes) stay
// replicated on the tensor axis rather than split, naming the largest. "" otherwise. `flowrun plan` and
// `train` print it.
std::string replication_warning(const Program& p, const BuiltModel& built, const RunConfig& cfg);

// The bytes of a program's parameters, state (optimizer's, other), inputs and gradients, and its arena.
void count_memory(const Program& p, PlanReport& r);
// The collectives of rank 0's program under cfg's layout, with their bytes per step.
std::vector<CollectivePlan> plan_collectives(const Program& p, const RunConfig& cfg);

// The plan of one rank of cfg's layout (every rank's is the same in data parallelism and ZeRO-1).
PlanReport plan_layout(const RunConfig& cfg);

// The host memory this process may use, and what sets it: the smallest of RLIMIT_AS and RLIMIT_DATA (each
// less what the process already maps), the cgroup's limit (v2 memory.max, v1 memory.limit_in_bytes, the
// cgroup's and its ancestors') and MemTotal. (MemAvailable is left out: it changes with every other process.)
struct MemoryLimit {
  double bytes = 0;
  std::string source;  // e.g. "RLIMIT_AS (ulimit -v) 8.00 GiB less 0.31 GiB already mapped"
};
MemoryLimit process_memory_limit();

// Refuses, as an input_error, a training program whose planned memory (what `flowrun plan` counts:
// parameters, state, inputs and `arenas` arenas) exceeds process_memory_limit(): the message gives both
// numbers and the largest tensors. Called before anything is allocated.
void check_memory_fits(const Program& p, int64_t arenas, const RunConfig& cfg);

}  // namespace flowrun
