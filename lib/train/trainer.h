// The trainer: a RunConfig turned into a compiled training program, an eval program sharing its
// parameters, a data loader and a step loop with metrics (metrics.jsonl), progress, periodic evaluation
// and HDF5 checkpoints; resume continues bit-exactly from any checkpoint it wrote.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"

namespace flowrun {

struct TrainOptions {
  std::string resume;  // "" = fresh, "auto" = newest complete checkpoint of the run (else fresh), or a path
  std::string init_from;     // a checkpoint whose parameters initialise the model (fine-tuning)
  int64_t exit_at_step = 0;  // > 0: save a checkpoint after this many steps and return (schedule unchanged)
  int progress = -1;         // 1: live progress line, 0: plain log lines, -1: live when stderr is a terminal
  bool detect_anomaly = false;  // check every kernel's outputs; name the first op to produce an inf/NaN
  // Non-empty: write the run's first optimizer step (batch, loss, parameters before it, gradients) to this
  // HDF5 file (train/step_dump.h); one process only.
  std::string dump_step;
};

struct EvalResult {
  double loss = 0.0;      // mean cross-entropy per sample (images) or per token (text, nats per byte)
  double accuracy = 0.0;  // top-1 over samples or tokens
  int64_t count = 0;      // samples (images) or tokens (text) evaluated
  bool text = false;
  std::string token_unit = "byte";  // text: the data's token (DataSpec::token_unit), for bits per it
};

struct TrainResult {
  int64_t step = 0;            // optimizer steps completed
  double loss = 0.0;           // training loss of the last step
  EvalResult eval;             // the last evaluation
  std::string checkpoint;      // the last checkpoint written
  bool stopped_early = false;  // --exit-at-step, a signal or the wall-time budget
  bool interrupted = false;    // a signal or the wall-time budget: exit with ExitCode::stopped
};

// Runs training as configured; the run directory is cfg.train.run_dir.
TrainResult train(const RunConfig& cfg, const TrainOptions& opts);

// What `flowrun eval` writes besides the scores: with `dump`, an HDF5 file (replaced atomically) of the
// evaluated batches' model inputs `x` (N, ...), `logits` and, for each of `layers` (top-level layer names,
// as `flowrun check` lists them), that layer's output as dataset `layer/<name>`, the batches concatenated
// along dim 0.
struct EvalOptions {
  std::string dump;
  std::vector<std::string> layers;
};

// Evaluates the parameters of `checkpoint` on the validation split of cfg's data: a flowrun checkpoint
// (.h5 file or sharded directory), or a safetensors file (flowrun's or Hugging Face names, as --init-from
// reads them; tensors the file may lack keep their initial values).
EvalResult evaluate_checkpoint(const RunConfig& cfg, const std::string& checkpoint,
                               const EvalOptions& opts = {});

// A one-line human-readable summary of an evaluation ("val_loss 0.41, val_accuracy 0.87, ...").
std::string eval_summary(const EvalResult& e);

}  // namespace flowrun
