// Config rules beyond single keys (internal to lib/config): the model section's shape, values not
// supported yet, defaults derived from other values, and cross-field consistency.
#pragma once

#include <map>
#include <string>

#include "config/config.h"

namespace flowrun::config {

// `model` names exactly one of a zoo model and inline layers; parameters written directly under `model`
// (`bare_keys`: name -> where the key is written) belong to a zoo model.
void check_model(const RunConfig& cfg, const std::map<std::string, Origin>& bare_keys);
// Defaults that depend on other values: model.zoo_dir, data.path, train.run_dir, the batch split
// (micro_batch_size, grad_accumulation, eval_batch_size), and a warmup capped at the run's length (with a
// note).
void fill_derived(RunConfig& cfg);
// Rules across keys: the step schedule, mean/std, Nesterov, min_lr.
void check_consistency(const RunConfig& cfg);

}  // namespace flowrun::config
