// `flowrun plan --search` and `flowrun calibrate`: a machine's profile, the predicted step time of a layout
// from its compiled program's own FLOPs, bytes and collectives against that profile, and the search over
// layouts (data x tensor x pipeline, micro-batches, ZeRO stage, recompute) that ranks them by it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/dtype.h"

namespace flowrun {

// What a machine does, per device (one process: a GPU, or a CPU process with its threads). Read from YAML
// (configs/machines/), written by `flowrun calibrate`.
struct MachineProfile {
  std::string file, name;
  std::string device = "cpu";  // cpu: memory is the process's resident memory; cuda: the device's
  int64_t devices_per_node = 1;
  double device_memory = 0;                               // bytes per device
  double flops_fp32 = 0, flops_bf16 = 0, flops_fp16 = 0;  // dense matmul FLOP/s
  double memory_bandwidth = 0;                            // bytes/s, read + written
  // An op whose bytes (read + written) fit in cache_bytes (a core's L2 on CPUs) moves them at
  // cache_bandwidth; 0: always memory_bandwidth.
  double cache_bytes = 0, cache_bandwidth = 0;
  double bandwidth(double bytes) const {
    return bytes <= cache_bytes && cache_bandwidth > 0 ? cache_bandwidth : memory_bandwidth;
  }
  double op_overhead = 0;                                 // seconds per kernel
  bool overlap_gradients = false;  // the gradient buckets' all-reduce overlaps the backward pass (NCCL)
  struct Link {
    double bandwidth = 0;  // bytes/s each rank sends in a ring collective
    double latency = 0;    // seconds per ring step
    // A started all-reduce (the gradient buckets): Open MPI's non-blocking algorithm ran at 0.4x the blocking
    // one's rate here (12 MiB: 6.1 against 2.2 ms). 0: bandwidth.
    double started_bandwidth = 0;
  };
  Link intra_node, inter_node;
  double flops(DType t) const;
};

// input_error naming the file, key and line on a missing or bad key.
MachineProfile load_machine_profile(const std::string& path);
std::string machine_profile_yaml(const MachineProfile& m, const std::string& comment);

// "2GiB", "512MiB", "80GB", "1e9": bytes; input_error naming `what` otherwise.
double parse_bytes(const std::string& text, const std::string& what);

// The predicted time of one optimizer step of rank 0 (the first pipeline stage) and its parts.
struct StepTime {
  double compute = 0;   // kernels of every micro-batch and the update
  double bubble = 0;    // the pipeline's idle (p - 1) micro-batch slots under 1F1B
  double tensor = 0;    // tensor-axis collectives, every micro-batch
  double data = 0;      // data-axis collectives: gradients, ZeRO's gathers
  double pipeline = 0;  // activations and their gradients between stages
  double total() const { return compute + bubble + tensor + data + pipeline; }
};
// For `flowrun plan --machine`: the step time of cfg's layout, as the search predicts it, and its lines.
std::string describe_step_time(const RunConfig& cfg, const MachineProfile& m, double* seconds);

struct SearchOptions {
  int64_t world = 0;         // devices
  std::string machine;       // profile file; "" = the shipped one for the config's train.device
  double memory = 0;         // bytes per device; 0 = the profile's
  std::string write_config;  // the winner as a config file
  int64_t top = 5;           // layouts shown
};
// The report; writes options.write_config when given. input_error when no layout fits.
std::string search_layouts(const std::string& config, const std::vector<std::string>& overrides,
                           const SearchOptions& options);

// Measures this machine (every rank at once when launched by mpirun/srun: GEMMs, memory bandwidth, the
// per-kernel overhead, and all-reduce latency and bandwidth between the ranks) and writes the profile to
// `out` (rank 0). Returns the profile's text.
std::string calibrate_machine(const std::string& out, int64_t threads);

}  // namespace flowrun
