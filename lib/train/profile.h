// `flowrun time`: how long a config's training step takes, where the time goes (per layer forward and
// backward, per op type), and how much memory it needs, in the spirit of `caffe time`.
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"

namespace flowrun {

struct TimeOptions {
  int64_t steps = 20;   // timed optimizer steps
  int64_t warmup = 3;   // untimed steps first (page faults, BLAS buffers, caches)
  int64_t profile = 5;  // steps timed kernel by kernel for the breakdown (after the timed ones)
  int64_t nodes = 0;    // also list this many slowest nodes (name, op, shapes), 0 for none
};

struct TimeReport {
  double median_ms = 0, p10_ms = 0, p90_ms = 0;  // optimizer step wall time
  double flops_per_step = 0;                     // from the ops' registered costs
  double peak_rss_mib = 0, arena_mib = 0;
  double predicted_rss_mib = 0;  // predict_process_memory's total for this run (`flowrun plan`'s figure)
  double page_faults_per_step = 0;          // the process's page faults over the timed steps, per step
  double param_bytes = 0, state_bytes = 0;  // of the tensors this process holds (a rank's share under ZeRO)
  bool lead = true;                         // world rank 0, which reports (every rank's figures are its own)
  int64_t params = 0, items_per_step = 0;   // samples (or tokens) per optimizer step
  int64_t threads = 0, threads_now = 0;  // the most a step may use; the count train.adapt_threads settled on
  bool text = false;
  std::string table;  // the human-readable report
  std::string json;   // one JSON object with the numbers above
};

TimeReport time_training(const RunConfig& cfg, const TimeOptions& opts);

}  // namespace flowrun
