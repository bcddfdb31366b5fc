// `flowrun train --dump-step FILE`: what the run's first optimizer step read and computed, in one HDF5
// file, so that another framework can redo the step and compare (scripts/check_parity.py). Layout:
//   /x, /y                    the step's whole batch (every micro-batch, in order, along dim 0)
//   /params/<name>            every parameter before the step
//   /grads/<name>             its gradient: the mean over the step's batch, the one the update reads
//                             (after accumulation, before clipping, which scales it inside the update)
//   /state/<name>             running statistics and optimizer state before the step (gradient
//                             accumulators left out)
//   /mlm/<node>/ids, labels   BERT's masking (op mlm_mask, by node name): the masked ids the model read
//                             and the labels its loss used, every micro-batch along dim 0
//   /micro_loss               f64, the loss of each micro-batch (one unless accumulating)
//   root attributes           format ("flowrun-step-dump"), format_version (1), step (the optimizer step,
//                             1-based), loss (f64: the mean of the micro-batches' losses), lr,
//                             grad_accumulation, micro_batch_size, seed, config (the resolved YAML)
// The file is replaced atomically (replace_file_atomically, as checkpoints are).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "data/loader.h"
#include "runtime/executor.h"

namespace flowrun {

// Records one optimizer step of a one-process training program. Construct before the step (it copies the
// parameters and state), pass batch() and timer() to train_step, then write().
class StepRecorder {
 public:
  StepRecorder(Executor& ex, const std::vector<std::string>& params, const std::vector<std::string>& state);

  // Called by train_step with each micro-batch it feeds.
  const std::function<void(const Batch&)>& batch() const { return on_batch_; }
  // Called after each kernel (Executor::run_timed): copies the gradients and the masking nodes' outputs
  // while they are live in the arena.
  const std::function<void(const Node&, double)>& timer() const { return on_node_; }

  // After the step: the accumulated gradients are read from their accumulators; then the file is written
  // atomically. A parameter whose gradient was never seen is a runtime_error (nothing is written).
  void write(const std::string& path, const std::string& config_yaml, int64_t step, double lr, double loss,
             int64_t accumulation, uint64_t seed);

 private:
  Executor& ex_;
  std::map<std::string, Tensor> params_, state_, grads_;
  std::map<ValueId, std::string> grad_of_;     // gradient value -> parameter name (no accumulation)
  std::map<std::string, std::string> acc_of_;  // parameter name -> its accumulator state (accumulation)
  std::vector<Tensor> x_, y_;
  std::vector<double> micro_loss_;
  std::map<ValueId, std::string>
      mlm_of_;  // a masking node's output that is read -> "<node>/ids" or "/labels"
  std::map<std::string, std::vector<Tensor>> mlm_;  // each micro-batch's, by that name
  std::function<void(const Batch&)> on_batch_;
  std::function<void(const Node&, double)> on_node_;
};

}  // namespace flowrun
