// Config rules beyond single keys: the model section, not-yet-supported values, derived defaults (data
// path, run directory, batch split) and cross-field consistency. Each error names the key it is about.
#include "config/checks.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "config/schema.h"
#include "core/error.h"
#include "data/dataset.h"

namespace flowrun::config {
namespace {

std::string env_or(const char* var, const std::string& fallback) {
  const char* v = std::getenv(var);
  return v && *v ? v : fallback;
}

// Whether x * y divides b, without forming the product (which could overflow).
bool divisible(int64_t b, int64_t x, int64_t y) {
  return b % x == 0 && (b / x) % y == 0;
}

// batch_size = micro_batch_size x grad_accumulation x parallel.data, with 0 meaning "derive this one".
void split_batch(RunConfig& cfg) {
  TrainConfig& t = cfg.train;
  // A pipeline's micro-batches are the accumulation window: every stage sees all of them before the update.
  const int64_t mb = cfg.parallel.micro_batches;
  if (cfg.parallel.pipeline == 1 && mb != 1)
    throw input_error(cat(cfg.where("parallel.micro_batches"), mb,
                          " micro-batches need parallel.pipeline > 1 (use train.grad_accumulation)"));
  if (cfg.parallel.pipeline > 1) {
    if (t.grad_accumulation != 0 && t.grad_accumulation != mb)
      throw input_error(cat(cfg.where("train.grad_accumulation"), t.grad_accumulation,
                            " != parallel.micro_batches ", mb, ": a pipeline accumulates over its micro-batches"));
    t.grad_accumulation = mb;
  }
  const int64_t b = t.batch_size, ranks = cfg.parallel.data;
  const std::string at = cfg.where("train.batch_size");
  if (t.micro_batch_size == 0) {
    const int64_t accum = std::max<int64_t>(t.grad_accumulation, 1);
    if (!divisible(b, accum, ranks)) {
      throw input_error(t.grad_accumulation == 0 ? cat(at, b, " is not divisible by parallel.data ", ranks)
                                                 : cat(at, b, " is not divisible into grad_accumulation ",
                                                       accum, " x parallel.data ", ranks, " micro-batches"));
    }
    t.micro_batch_size = b / accum / ranks;
    t.grad_accumulation = accum;
  } else if (t.grad_accumulation == 0) {
    if (!divisible(b, t.micro_batch_size, ranks))
      throw input_error(cat(at, b, " is not divisible into micro-batches of ", t.micro_batch_size,
                            " x parallel.data ", ranks));
    t.grad_accumulation = b / t.micro_batch_size / ranks;
  } else if (!divisible(b, t.micro_batch_size, ranks) ||
             b / t.micro_batch_size / ranks != t.grad_accumulation) {
    throw input_error(cat(at, b, " != micro_batch_size ", t.micro_batch_size, " x grad_accumulation ",
                          t.grad_accumulation, " x parallel.data ", ranks));
  }
}

void check_step_schedule(const RunConfig& cfg) {
  const ScheduleConfig& s = cfg.schedule;
  for (size_t i = 1; i < s.milestones.size(); ++i) {
    if (s.milestones[i] <= s.milestones[i - 1])
      throw input_error(cat(cfg.where("schedule.milestones"), "must be strictly increasing, but ",
                            s.milestones[i], " follows ", s.milestones[i - 1]));
  }
  if (s.type != "step") return;
  if (s.step_size == 0 && s.milestones.empty())
    throw input_error(cfg.where("schedule.type") +
                      "step needs schedule.step_size > 0 or schedule.milestones");
  if (s.step_size > 0 && !s.milestones.empty())
    throw input_error(cfg.where("schedule.milestones") +
                      "give either schedule.step_size or schedule.milestones");
}

void check_normalisation(const RunConfig& cfg) {
  const DataConfig& d = cfg.data;
  if (d.mean.size() == d.std.size()) return;
  const std::string key = d.std.empty() ? "data.mean" : "data.std";
  throw input_error(cat(cfg.where(key), "data.mean has ", d.mean.size(), " values but data.std has ",
                        d.std.size(), " (give both, one value per channel)"));
}

void check_optimizer(const RunConfig& cfg) {
  const OptimizerConfig& o = cfg.optimizer;
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
    throw input_error(cfg.where("optimizer.nesterov") +
                      "Nesterov momentum needs optimizer.momentum > 0 and "
                      "optimizer.dampening 0");
  if (cfg.schedule.min_lr > o.lr)
    throw input_error(cat(cfg.where("schedule.min_lr"), cfg.schedule.min_lr, " exceeds optimizer.lr ", o.lr));
}

}  // namespace

void check_model(const RunConfig& cfg, const std::map<std::string, Origin>& bare_keys) {
  const ModelConfig& m = cfg.model;
  const bool inline_layers = m.layers.IsDefined() && !m.layers.IsNull();
  // Checked first: a misspelt `layers` is a stray key, and the model then seems to have no layers.
  if (m.zoo.empty() && !bare_keys.empty()) {
    const auto& [name, origin] = *bare_keys.begin();
    std::vector<std::string> keys;
    for (const auto& k : find_section("model")->keys) keys.push_back(k.name);
    std::string hint = did_you_mean(name, keys);
    if (hint.empty()) hint = " (parameters of inline layers go under model.params)";
    throw input_error(
        cat(origin.str(), ": model.", abbreviate(name), ": unknown key '", abbreviate(name), "'", hint));
  }
  if (!m.zoo.empty() && inline_layers)
    throw input_error(cfg.where("model.layers") + "give either model.zoo or model.layers, not both");
  if (m.zoo.empty() && !inline_layers)
    throw input_error(cfg.where("model") +
                      "expected `zoo: NAME` (a zoo model) or `layers: [...]` (inline layers)");
  if (inline_layers && m.layers.size() == 0)
    throw input_error(cfg.where("model.layers") + "expected at least one layer");
}

void fill_derived(RunConfig& cfg) {
  if (cfg.model.zoo_dir.empty()) cfg.model.zoo_dir = env_or("FLOWRUN_MODELS", FLOWRUN_MODELS_DIR);
  const std::string& ds = cfg.data.dataset;
  // The user's own files have no default place: only built-in datasets are built into the cache.
  const bool own_file = ds == "hdf5" || ds == "text" || ds == "tokens" || ds == "csv";
  if (cfg.data.path.empty()) {
    if (own_file) {
      const char* what = ds == "hdf5"     ? "an HDF5 file with arrays x and y"
                         : ds == "text"   ? "any file, read as bytes"
                         : ds == "tokens" ? "a uint16 token file, flat or with llm.c's header"
                                          : "a CSV table with a header row";
      throw input_error(cat(cfg.where("data.dataset"), ds, " needs data.path (", what, ")"));
    }
    cfg.data.path = default_dataset_path(ds);
  }
  if (ds == "csv" && cfg.data.label.empty())
    throw input_error(cat(cfg.where("data.dataset"),
                          "csv needs data.label, the name of the column that holds the classes"));
  if (cfg.train.run_dir.empty()) {
    const std::string stem = std::filesystem::path(cfg.file).stem().string();
    cfg.train.run_dir = "runs/" + (stem.empty() ? std::string("run") : stem);
  }
  // A run shortened (`--set train.steps=10` on a config with a long warmup) still runs: its warmup ends
  // with the run.
  if (cfg.schedule.warmup_steps > cfg.train.steps) {
    cfg.notes.push_back(cat(cfg.where("schedule.warmup_steps"), cfg.schedule.warmup_steps,
                            " is longer than the run: capped to train.steps ", cfg.train.steps));
    cfg.schedule.warmup_steps = cfg.train.steps;
  }
  split_batch(cfg);
  // The global batch, not the per-rank micro-batch: data.eval_batches then counts the same validation
  // samples under any layout and accumulation (the lead rank evaluates whole batches).
  if (cfg.train.eval_batch_size == 0) cfg.train.eval_batch_size = cfg.train.batch_size;
}

void check_consistency(const RunConfig& cfg) {
  check_step_schedule(cfg);
  check_normalisation(cfg);
  check_optimizer(cfg);
}

}  // namespace flowrun::config
