// The training loop: programs, data, metrics, progress, evaluation, checkpoints and resume.
#include "train/trainer.h"

#include <omp.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "ckpt/checkpoint.h"
#include "ckpt/weights.h"
#include "core/terminal.h"
#include "data/loader.h"
#include "io/h5.h"
#include "nn/model.h"
#include "optim/schedule.h"
#include "train/ckpt_writer.h"
#include "train/metrics.h"
#include "train/plan.h"
#include "train/program.h"
#include "train/run_dir.h"
#include "train/step_dump.h"
#include "train/stop.h"
#include "train/threads.h"

namespace flowrun {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Copies checkpoint tensors into the executor: every one of `names` must be present with the same type.
void restore(Executor& ex, const std::map<std::string, Tensor>& from, const std::vector<std::string>& names,
             const std::string& path, const char* what, const Mesh& mesh) {
  for (const std::string& name : names) {
    auto it = from.find(name);
    // The loss scaler of a run resumed in fp16 from an fp32 or bf16 checkpoint starts afresh (initial scale).
    if (it == from.end() && name.rfind("amp/", 0) == 0) {
      spdlog::info("checkpoint {} has no {}: the loss scaler starts afresh", path, name);
      continue;
    }
    if (it == from.end())
      throw input_error(cat("checkpoint ", path, ": ", what, " '", name,
                            "' of the model is missing (was it saved from another model or config?)"));
    scatter_value(ex, name, it->second, mesh, cat("checkpoint ", path, ": ", what));
  }
}

int64_t eval_batch_count(const RunConfig& cfg, const Dataset& data) {
  const int64_t bs = cfg.train.eval_batch_size;
  const int64_t all = (data.size(Split::val) + bs - 1) / bs;
  return cfg.data.eval_batches > 0 ? std::min(cfg.data.eval_batches, all) : all;
}

// Loss and top-1 accuracy over the validation split, from the eval program's "loss" and "logits". A model
// that scores other targets than the data's (BERT: the masked positions' original ids, -100 elsewhere) hands
// them out as "targets": the accuracy and the loss's weight count those.
// `each`, when given, sees every evaluated batch after the program ran on it (eval --dump).
EvalResult evaluate(Executor& ex, const Dataset& data, const RunConfig& cfg,
                    const std::function<void(const Batch&)>& each = nullptr) {
  EvalResult r;
  r.text = data.spec().text;
  r.token_unit = data.spec().token_unit;
  Loader loader(data, Split::val, cfg.train.eval_batch_size, false, cfg.train.seed, loader_prefetch(cfg));
  double loss_sum = 0.0;
  int64_t correct = 0;
  const int64_t batches = eval_batch_count(cfg, data);
  const bool own_targets = ex.program().graph.outputs().count("targets") > 0;
  for (int64_t b = 0; b < batches; ++b) {
    const Batch& batch = loader.next();
    feed(ex, batch, true);
    ex.run();
    if (each) each(batch);
    const Tensor loss = ex.output("loss");
    const Tensor logits = ex.output("logits");
    const Tensor targets = own_targets ? ex.output("targets") : batch.y;
    FR_CHECK(targets.dtype() == DType::i64 && targets.numel() == batch.y.numel(),
             "the eval program's targets do not match the batch's");
    const int64_t* y = targets.data<int64_t>();
    const int64_t classes = logits.shape().back();
    const float* l = logits.data<float>();
    int64_t valid = 0;
    for (int64_t i = 0; i < targets.numel(); ++i) {
      if (y[i] < 0) continue;
      ++valid;
      const float* row = l + i * classes;
      correct += std::max_element(row, row + classes) - row == y[i];
    }
    // The graph's loss is the mean over this batch's valid labels.
    loss_sum += static_cast<double>(loss.data<float>()[0]) * static_cast<double>(valid);
    r.count += valid;
  }
  r.loss = r.count > 0 ? loss_sum / static_cast<double>(r.count) : 0.0;
  r.accuracy = r.count > 0 ? static_cast<double>(correct) / static_cast<double>(r.count) : 0.0;
  return r;
}

std::string format_eta(double s) {
  const auto t = static_cast<int64_t>(s + 0.5);
  return t >= 3600 ? cat(t / 3600, "h", (t % 3600) / 60, "m")
                   : cat(t / 60, "m", t % 60 < 10 ? "0" : "", t % 60, "s");
}

// Keeps metrics.jsonl consistent with a resumed run: lines of steps after the checkpoint are dropped. The
// rewrite is atomic and checked: on a failure (a full disk) the file keeps every line it had.
void truncate_metrics(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::ostringstream kept;
  std::string line;
  while (std::getline(in, line)) {
    const auto k = line.find("\"step\": ");
    if (k != std::string::npos && std::stoll(line.substr(k + 8)) > step) continue;
    kept << line << '\n';
  }
  if (in.bad()) throw runtime_error(cat("cannot read ", path, ": ", std::strerror(errno)));
  in.close();
  write_file_atomically(path, kept.str());
}

// Flattens a YAML node into "key.path" -> scalar text (sequences as "key[i]").
void flatten(const YAML::Node& n, const std::string& at, std::map<std::string, std::string>& out) {
  if (n.IsMap()) {
    for (const auto& kv : n)
      flatten(kv.second, at.empty() ? kv.first.Scalar() : cat(at, ".", kv.first.Scalar()), out);
  } else if (n.IsSequence()) {
    for (size_t i = 0; i < n.size(); ++i) flatten(n[i], cat(at, "[", i, "]"), out);
  } else {
    out[at] = n.IsNull() ? "null" : n.Scalar();
  }
}

// The default parameters of a zoo model ("model.params.n_head" -> "4"), for comparing a config that sets a
// parameter with one that leaves it at its default (the run has built this model, so its file reads).
std::map<std::string, std::string> zoo_defaults(const ModelConfig& m) {
  std::map<std::string, std::string> out;
  if (!m.zoo.empty()) flatten(zoo_params(m), "model.params", out);
  return out;
}

// The architecture keys whose values differ between a checkpoint's resolved config and this run's, one
// "key: checkpoint V, this run W" each: the model section (but where zoo models are looked up and how
// parameters were first initialised) and, for text, the context length.
std::vector<std::string> architecture_differences(const RunConfig& cfg, const YAML::Node& saved, bool text) {
  std::map<std::string, std::string> a, b;
  flatten(saved["model"], "model", a);
  flatten(cfg.resolved["model"], "model", b);
  if (text) {
    if (saved["data"] && saved["data"]["seq_len"]) a["data.seq_len"] = saved["data"]["seq_len"].Scalar();
    b["data.seq_len"] = cat(cfg.data.seq_len);
  }
  for (auto* m : {&a, &b})
    for (const char* k : {"model.zoo_dir", "model.init"}) m->erase(k);
  // A zoo parameter given on one side only is compared with the zoo's default (an expression over the data,
  // such as the vocabulary, is left to the shape check).
  const bool same_zoo = a.count("model.zoo") && b.count("model.zoo") && a["model.zoo"] == b["model.zoo"];
  const std::map<std::string, std::string> defaults =
      same_zoo ? zoo_defaults(cfg.model) : std::map<std::string, std::string>{};
  std::set<std::string> keys;
  for (const auto* m : {&a, &b})
    for (const auto& [k, v] : *m) keys.insert(k);
  std::vector<std::string> out;
  for (const std::string& k : keys) {
    auto value = [&](const std::map<std::string, std::string>& m) -> std::optional<std::string> {
      if (auto it = m.find(k); it != m.end()) return it->second;
      if (auto it = defaults.find(k); it != defaults.end()) return it->second;
      return std::nullopt;
    };
    const auto x = value(a), y = value(b);
    if (x && y && (*x == *y || x->find("${") != std::string::npos || y->find("${") != std::string::npos))
      continue;
    out.push_back(cat(k, ": checkpoint ", x ? *x : std::string("(not set)"), ", this run ",
                      y ? *y : std::string("(not set)")));
  }
  return out;
}

class Run {
 public:
  Run(const RunConfig& cfg, const TrainOptions& opts) : cfg_(cfg), opts_(opts) {}
  TrainResult go();

 private:
  void setup();
  void resume_from(const std::string& path);
  void init_from(const std::string& path);
  std::string save();
  std::string save_sharded(CheckpointData ck, Clock::time_point t0);  // train.sharded_checkpoints
  void finish_checkpoints();  // waits for the async write in flight and logs it
  void report_eager(int64_t steps) const;  // train.eager: the per-op table of the training steps (the lead)
  void report_threads() const;  // train.adapt_threads: the steps at each count, when it changed (the lead)
  void log_checkpoint(const CheckpointWriter::Done& d, double blocked);
  bool stop_requested(const StopRequests& stop, std::string* why);
  void log_step(int64_t step, double loss, double lr, double grad_norm, double step_seconds);
  void log_eval(int64_t step, const EvalResult& e);
  // Says which checkpoint a stopped run can go back to: this run's newest, the one it resumed from, or none.
  std::string last_good() const;
  EvalResult run_eval();  // on the `evaluates_` ranks; the result is the lead's
  // Whole tensors of this rank's `names` (tensor-axis pieces and ZeRO shards gathered; collective), with the
  // other pipeline stages' added on stage 0 (rank 0's pipeline group only).
  std::map<std::string, Tensor> whole(const std::vector<std::string>& names, bool copies);

  const RunConfig& cfg_;
  TrainOptions opts_;
  Mesh mesh_;           // declared before the executors, which use it
  Communicator* comm_;  // the world
  bool lead_ = true;    // rank 0: prints, writes metrics and checkpoints, evaluates
  // The ranks of rank 0's tensor-parallel group: they run the eval program together (under pipeline
  // parallelism: the ranks of data index 0, which gather the model for the lead, who evaluates it whole).
  bool evaluates_ = true;
  // ZeRO-3: every rank takes part in an evaluation, gathering the parameter shards; the evaluating ranks run
  // it.
  bool zero3_ = false;
  std::string run_dir_, ckpt_dir_;
  std::unique_ptr<RunDirLock> lock_;  // held by rank 0 for the whole run
  std::string last_checkpoint_;       // written by this run (or resumed from): finite weights
  std::unique_ptr<Dataset> data_;
  BuiltModel model_, eval_model_;
  std::unique_ptr<Executor> ex_, eval_ex_;
  std::unique_ptr<ThreadAdapter> threads_;
  std::vector<std::unique_ptr<Executor>> stash_;  // a pipeline stage's other micro-batch slots
  std::vector<std::string> params_, state_;
  int64_t step_ = 0;
  LoaderPosition position_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<CheckpointWriter> writer_;  // async checkpoints (lead rank)
  double pending_blocked_ = 0;                // step-loop time of the checkpoint being written
  bool live_ = false;
  Clock::time_point start_ = Clock::now();
  int64_t steps_timed_ = 0;
  int64_t non_finite_run_ = 0;  // consecutive steps with a non-finite loss
  static constexpr int64_t kNonFiniteTolerance = 30;
  double time_in_steps_ = 0.0;
};

void Run::setup() {
  run_dir_ = cfg_.train.run_dir;
  ckpt_dir_ = (fs::path(run_dir_) / "checkpoints").string();
  fs::create_directories(ckpt_dir_);
  // Rank 0 locks the run directory as soon as the world is joined, before anything is compiled, allocated
  // or written; the other ranks learn the outcome from it, so that every rank stops together.
  TrainProgram t = make_train_program(
      cfg_,
      [&](const Mesh& mesh) {
        // Every rank refuses alike, before anything is compiled: the dump is one process's whole step.
        if (!opts_.dump_step.empty() && mesh.world->size() > 1)
          throw input_error(
              cat(cfg_.where("parallel.data"), "--dump-step records one process's step, but this run has ",
                  mesh.world->size(),
                  " processes (parallel.data x tensor x pipeline); dump it without mpirun/srun"));
        std::exception_ptr refused;
        int64_t code = 0;
        if (mesh.world->rank() == 0) {
          try {
            lock_ = std::make_unique<RunDirLock>(run_dir_);
          } catch (const Error& e) {
            refused = std::current_exception();
            code = static_cast<int64_t>(e.code());
          }
        }
        if (mesh.world->size() > 1) mesh.world->broadcast(&code, 1, DType::i64, 0);
        if (refused) std::rethrow_exception(refused);
        if (code != 0)
          throw Error(static_cast<ExitCode>(code),
                      cat("rank 0 could not lock the run directory ", run_dir_, " (its message says why)"));
      },
      /*keep_gradients=*/!opts_.dump_step.empty() || opts_.detect_anomaly);
  mesh_ = std::move(t.mesh);
  comm_ = mesh_.world.get();
  lead_ = comm_->rank() == 0;
  evaluates_ = mesh_.data->rank() == 0;
  zero3_ = cfg_.parallel.zero >= 3 && mesh_.data->size() > 1;
  if (comm_->size() > 1) {
    // Every rank keeps a log of its own; only the lead rank prints.
    const std::string log = (fs::path(run_dir_) / cat("rank_", comm_->rank(), ".log")).string();
    auto logger = spdlog::basic_logger_mt(cat("rank", comm_->rank()), log, /*truncate=*/true);
    if (lead_) logger->sinks().push_back(spdlog::default_logger()->sinks().front());
    logger->flush_on(spdlog::level::info);
    spdlog::set_default_logger(logger);
    spdlog::info("rank {} of {} ({} backend)", comm_->rank(), comm_->size(), comm_->backend());
  }
  data_ = std::move(t.data);
  model_ = std::move(t.model);
  ex_ = std::move(t.ex);
  stash_ = std::move(t.stash);
  params_ = std::move(t.params);
  state_ = std::move(t.state);
  if (mesh_.stages() > 1) {
    if (lead_) {
      RunConfig whole_model = cfg_;
      whole_model.parallel = ParallelConfig{};
      eval_ex_ = std::make_unique<Executor>(
          compile_model(whole_model, data_->spec(), cfg_.train.eval_batch_size, false, &eval_model_),
          device_of(cfg_), cfg_.train.seed);
    }
    return;
  }

  // The eval program reads the training program's parameters and running statistics in place; under ZeRO-3
  // the parameters are shards, which run_eval gathers into the eval program's own copies.
  std::map<std::string, Tensor> shared;
  if (!zero3_)
    for (const auto& n : params_) shared.emplace(n, ex_->tensor(n));
  for (const auto& n : state_) shared.emplace(n, ex_->tensor(n));
  Program eval = compile_model(cfg_, data_->spec(), cfg_.train.eval_batch_size, false, &eval_model_,
                               mesh_.tensor->rank());
  eval_ex_ = std::make_unique<Executor>(std::move(eval), device_of(cfg_), cfg_.train.seed, shared, nullptr,
                                        mesh_.kernel_tensor());
  eval_ex_->use_cuda_graphs(cfg_.train.cuda_graph);
}

void Run::resume_from(const std::string& path) {
  const CheckpointData ck = load_checkpoint(path);
  // Same shapes do not make the same model (n_head splits d_model either way): a resume continues the
  // architecture it saved. --init-from, which takes only the weights, may change it.
  std::vector<std::string> changed;
  YAML::Node saved;
  try {
    saved = YAML::Load(ck.config_yaml);
  } catch (const YAML::Exception&) {
  }
  if (ck.config_yaml.empty() || !saved.IsMap() || !saved["model"])
    spdlog::info("checkpoint {} stores no readable config: its architecture is not compared with this run's",
                 path);
  else
    changed = architecture_differences(cfg_, saved, data_->spec().text);
  if (!changed.empty()) {
    std::string list;
    for (const auto& c : changed) list += cat(list.empty() ? "" : "; ", c);
    throw input_error(
        cat("--resume: checkpoint ", path, " was saved with another architecture than ", cfg_.file,
            " describes (", list,
            "): resume it under its own config, or start a new run from its weights with --init-from"));
  }
  restore(*ex_, ck.params, params_, path, "parameter", mesh_);
  restore(*ex_, ck.state, state_, path, "state", mesh_);
  if (ck.seed != cfg_.train.seed)
    spdlog::warn(
        "checkpoint {} was trained with seed {}, the config says {}: the run will not match an "
        "uninterrupted one",
        path, ck.seed, cfg_.train.seed);
  step_ = ck.step;
  position_ = resume_position(ck, saved, cfg_, path);
  last_checkpoint_ = path;
  spdlog::info("resumed from {} at step {}", path, step_);
}

void Run::init_from(const std::string& path) {
  if (is_safetensors(path)) {
    const std::map<std::string, Tensor> got = import_weights(ex_->program(), model_, cfg_.model, path, false);
    std::vector<std::string> names;
    for (const auto& [n, t] : got) names.push_back(n);
    restore(*ex_, got, names, path, "parameter", mesh_);
    spdlog::info("initialised {} of {} parameters from {}", names.size(), params_.size(), path);
    return;
  }
  const CheckpointData ck = load_checkpoint(path);
  restore(*ex_, ck.params, params_, path, "parameter", mesh_);
  spdlog::info("initialised parameters from {}", path);
}

std::string Run::save() {
  const auto t0 = Clock::now();
  // A diverged run must not overwrite good checkpoints with weights that cannot be trained or evaluated:
  // every rank checks its own tensors (a cheap pass beside the write), and all agree.
  std::string bad;
  for (const auto* names : {&params_, &state_})
    for (const auto& n : *names)
      if (bad.empty()) {
        const Tensor& t = ex_->tensor(n);
        if (!all_finite({t.raw(), &t.shape(), t.dtype()})) bad = n;
      }
  int64_t any = bad.empty() ? 0 : 1;
  if (comm_->size() > 1) comm_->all_reduce(&any, 1, DType::i64, ReduceOp::max);
  if (any)
    throw runtime_error(cat("step ", step_, ": ",
                            bad.empty() ? std::string("another rank's tensor") : cat("'", bad, "'"),
                            " holds inf or NaN (the run diverged: lower optimizer.lr, or clip with "
                            "train.clip_grad_norm); no checkpoint written; ",
                            last_good()));
  CheckpointData ck;
  ck.step = step_;
  ck.seed = cfg_.train.seed;
  ck.config_yaml = dump_config(cfg_);
  ck.loader_epoch = position_.epoch;
  ck.loader_index = position_.index;
  if (cfg_.train.sharded_checkpoints && comm_->size() > 1) return save_sharded(std::move(ck), t0);
  // Every rank takes part in gathering sharded state; the lead rank writes. An async write gets copies: the
  // step loop goes on updating the live tensors.
  const bool async = cfg_.train.async_checkpoint;
  ck.params = whole(params_, async);
  ck.state = whole(state_, async);
  const std::string path = (fs::path(ckpt_dir_) / checkpoint_file_name(step_)).string();
  if (!lead_) {
    last_checkpoint_ = path;  // the lead's, so that every rank's message names the same one
    return std::string();
  }
  if (!async) {
    const std::string written = save_checkpoint(ckpt_dir_, ck, cfg_.train.keep_checkpoints);
    const double s = seconds_since(t0);
    log_checkpoint({written, step_, s}, s);
    last_checkpoint_ = written;
    return written;
  }
  if (!writer_) writer_ = std::make_unique<CheckpointWriter>(ckpt_dir_, cfg_.train.keep_checkpoints);
  const double blocked_before = pending_blocked_;
  if (auto previous = writer_->submit(std::move(ck))) log_checkpoint(*previous, blocked_before);
  pending_blocked_ = seconds_since(t0);
  last_checkpoint_ = path;  // a failed write is reported by the next submit() or finish_checkpoints()
  return path;
}

std::string Run::save_sharded(CheckpointData ck, Clock::time_point t0) {
  // Each tensor is written once: by every data rank when ZeRO shards it, else by data rank 0; a piece of the
  // tensor axis by its tensor rank, a whole tensor by tensor rank 0; a tied weight by its first stage.
  const Graph& g = ex_->program().graph;
  for (const auto* names : {&params_, &state_})
    for (const auto& n : *names) {
      const Placement& p = g.value(g.find_value(n)).placement;
      const bool zero = p.sharded(), split = p.tensor_split();
      if ((!zero && mesh_.data->rank() != 0) || (!split && mesh_.tensor->rank() != 0) || p.pipe_copy)
        continue;
      ShardInfo info;
      if (split) {
        info.tensor = p.tensor.str();
        info.parts = p.tensor_parts;
        info.part = mesh_.tensor->rank();
        info.whole = p.whole;
      }
      if (zero) {
        info.zero = mesh_.data->size();
        info.zpart = mesh_.data->rank();
        info.zshape = p.global_shape;
      }
      (names == &params_ ? ck.params : ck.state).emplace(n, ex_->tensor(n));
      ck.layout += cat(n, "\t", info.str(), "\n");
    }
  const std::string tmp = (fs::path(ckpt_dir_) / (sharded_checkpoint_name(step_) + ".tmp")).string();
  if (lead_) {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  }
  comm_->barrier();
  write_shard_file(tmp, comm_->rank(), ck);
  comm_->barrier();  // every file is in place before the directory gets its final name
  std::string path;
  if (lead_) {
    path = commit_sharded_checkpoint(ckpt_dir_, tmp, step_, cfg_.train.keep_checkpoints);
    log_checkpoint({path, step_, seconds_since(t0)}, seconds_since(t0));
  }
  last_checkpoint_ = (fs::path(ckpt_dir_) / sharded_checkpoint_name(step_)).string();
  comm_->barrier();  // nobody reads the directory (a resume) before it exists
  return path;
}

std::map<std::string, Tensor> Run::whole(const std::vector<std::string>& names, bool copies) {
  std::map<std::string, Tensor> out;
  for (const auto& n : names) {
    Tensor t = gather_value(*ex_, n, mesh_);
    // A tensor gathered from pieces or shards is a copy already; only the live one needs copying (cloning
    // the gathered ones held every split tensor twice while an asynchronous checkpoint was written).
    const bool live = t.raw() == ex_->tensor(n).raw();
    out.emplace(n, copies && live ? t.clone() : t);
  }
  if (mesh_.stages() > 1 && mesh_.data->rank() == 0 && mesh_.tensor->rank() == 0) gather_stages(out, mesh_);
  return out;
}

EvalResult Run::run_eval() {
  if (mesh_.stages() > 1) {
    // The parameters and running statistics (gathered by the data index 0 ranks, and under ZeRO-3, whose
    // parameters are shards, by every rank).
    std::vector<std::string> names = params_;
    for (const auto& n : state_)
      if (is_model_state(n)) names.push_back(n);
    const std::map<std::string, Tensor> model = whole(names, false);
    if (!lead_) return {};
    for (const auto& [n, t] : model)
      if (eval_ex_->has_tensor(n)) std::memcpy(eval_ex_->tensor(n).raw(), t.raw(), t.nbytes());
  } else if (zero3_) {
    for (const auto& n : params_) {
      const Tensor t = unshard_value(*ex_, n, mesh_);
      if (evaluates_) std::memcpy(eval_ex_->tensor(n).raw(), t.raw(), t.nbytes());
    }
    if (!evaluates_) return {};
  }
  return evaluate(*eval_ex_, *data_, cfg_);
}

std::string Run::last_good() const {
  return last_checkpoint_.empty() ? std::string("this run has no good checkpoint")
                                  : cat("the last good checkpoint is ", last_checkpoint_);
}

void Run::finish_checkpoints() {
  if (!writer_) return;
  if (auto d = writer_->wait()) log_checkpoint(*d, pending_blocked_);
}

void Run::report_eager(int64_t steps) const {
  if (!cfg_.train.eager || !lead_) return;
  std::map<std::string, OpTime> times = ex_->op_times();
  for (const auto& slot : stash_)
    for (const auto& [op, t] : slot->op_times()) {
      times[op].calls += t.calls;
      times[op].seconds += t.seconds;
    }
  if (live_) std::fprintf(stderr, "\r\033[K");
  std::printf("%s", op_time_table(times, steps, "step", "steps").c_str());
  std::fflush(stdout);
}

void Run::log_checkpoint(const CheckpointWriter::Done& d, double blocked) {
  JsonLine j;
  j.add("step", d.step).add("checkpoint", d.path).add("blocked_s", blocked).add("write_s", d.seconds);
  metrics_->write(j);
  spdlog::debug("checkpoint {}: step loop blocked {:.3f} s, write {:.3f} s", d.path, blocked, d.seconds);
}

// A stop is due when a signal arrived or the wall-time budget is spent, on any rank: the ranks agree (one
// tiny all-reduce), so that all of them checkpoint together.
bool Run::stop_requested(const StopRequests& stop, std::string* why) {
  const int sig = stop.signal();
  const bool out_of_time = cfg_.train.max_wall_time > 0 && seconds_since(start_) >= cfg_.train.max_wall_time;
  int64_t code = sig != 0 ? sig : out_of_time ? -1 : 0;
  if (comm_->size() > 1) {
    int64_t any = code != 0 ? 1 : 0;
    comm_->all_reduce(&any, 1, DType::i64, ReduceOp::max);
    if (any && code == 0) code = -2;
  }
  if (code == 0) return false;
  *why = code > 0     ? std::string(signal_name(static_cast<int>(code)))
         : code == -1 ? cat("train.max_wall_time ", cfg_.train.max_wall_time, " s")
                      : std::string("another rank's request");
  return true;
}

void Run::report_threads() const {
  if (lead_ && threads_->steps_at().size() > 1) spdlog::info("threads: {}", threads_->summary());
}

void Run::log_step(int64_t step, double loss, double lr, double grad_norm, double step_seconds) {
  if (!lead_) return;
  const bool text = data_->spec().text;
  const double per_step =
      static_cast<double>(cfg_.train.batch_size) * (text ? static_cast<double>(cfg_.data.seq_len) : 1.0);
  const double rate = step_seconds > 0 ? per_step / step_seconds : 0.0;
  JsonLine j;
  j.add("step", step).add("loss", loss).add("lr", lr);
  if (!std::isnan(grad_norm)) j.add("grad_norm", grad_norm);
  const bool scaled = ex_->has_tensor("amp/loss_scale");
  double scale = 0;
  int64_t skipped = 0;
  if (scaled) {
    scale = ex_->tensor("amp/loss_scale").data<float>()[0];
    skipped = ex_->tensor("amp/skipped_steps").data<int64_t>()[0];
    j.add("loss_scale", scale).add("skipped_steps", skipped);
  }
  j.add(text ? "tokens_per_s" : "samples_per_s", rate).add("threads", threads_->last());
  j.add("time", seconds_since(start_));
  metrics_->write(j);
  const double eta = time_in_steps_ / static_cast<double>(std::max<int64_t>(steps_timed_, 1)) *
                     static_cast<double>(cfg_.train.steps - step);
  char buf[160];
  std::snprintf(buf, sizeof buf, "step %lld/%lld  loss %.4f  lr %.3g  %.0f %s  eta %s",
                static_cast<long long>(step), static_cast<long long>(cfg_.train.steps), loss, lr, rate,
                text ? "tok/s" : "samples/s", format_eta(eta).c_str());
  std::string line = buf;
  if (scaled) line += cat("  scale ", fmt_num(scale, 6), "  skipped ", skipped);
  if (live_) {
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    std::fflush(stderr);
  } else {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
}

void Run::log_eval(int64_t step, const EvalResult& e) {
  JsonLine j;
  j.add("step", step)
      .add("split", std::string("val"))
      .add("val_loss", e.loss)
      .add("val_accuracy", e.accuracy);
  if (e.text)
    j.add("val_perplexity", std::exp(e.loss)).add(cat("val_bits_per_", e.token_unit), e.loss / std::log(2.0));
  j.add("time", seconds_since(start_));
  metrics_->write(j);
  if (live_) std::fprintf(stderr, "\r\033[K");
  std::printf("eval step %lld: %s\n", static_cast<long long>(step), eval_summary(e).c_str());
  std::fflush(stdout);
}

// --dump-step's checks that need no compiled program: they fail before the run starts.
void check_dump_step(const RunConfig& cfg, const TrainOptions& opts) {
  if (opts.dump_step.empty()) return;
  if (opts.detect_anomaly)
    throw input_error("--dump-step and --detect-anomaly exclude each other (each runs the step its own way)");
  if (cfg.precision.dtype == "fp16")
    throw input_error(
        cat(cfg.where("precision.dtype"),
            "fp16 scales the gradients by the loss scale and may skip the step: --dump-step records "
            "fp32 or bf16 runs"));
  const fs::path dir = fs::path(opts.dump_step).parent_path();
  if (!dir.empty() && !fs::is_directory(dir))
    throw input_error(
        cat("--dump-step ", opts.dump_step, ": the directory ", dir.string(), " does not exist"));
  if (fs::is_directory(opts.dump_step))
    throw input_error(cat("--dump-step ", opts.dump_step, ": is a directory, not a file name"));
}

TrainResult Run::go() {
  check_dump_step(cfg_, opts_);
  setup();
  if (!opts_.resume.empty() && !opts_.init_from.empty())
    throw input_error(
        "--resume and --init-from exclude each other: resume continues a run, --init-from starts "
        "a new one from another run's weights");
  if (opts_.resume == "auto") {
    const std::string latest = find_latest_checkpoint(ckpt_dir_);
    if (latest.empty())
      spdlog::info("no checkpoint in {}: starting fresh", ckpt_dir_);
    else
      resume_from(latest);
  } else if (!opts_.resume.empty()) {
    if (!fs::exists(opts_.resume))
      throw input_error(cat("--resume: checkpoint ", opts_.resume, " does not exist"));
    resume_from(opts_.resume);
  } else if (!opts_.init_from.empty()) {
    if (!fs::exists(opts_.init_from))
      throw input_error(cat("--init-from: checkpoint ", opts_.init_from, " does not exist"));
    init_from(opts_.init_from);
  }

  // Before the run directory's files are touched.
  if (!opts_.dump_step.empty() && step_ >= cfg_.train.steps)
    throw input_error(cat(cfg_.where("train.steps"),
                          "--dump-step: the run has no step left to dump (resumed at step ", step_, " of ",
                          cfg_.train.steps, ")"));
  const std::string metrics_path = (fs::path(run_dir_) / "metrics.jsonl").string();
  if (lead_) {
    if (step_ > 0)
      truncate_metrics(metrics_path, step_);
    else
      fs::remove(metrics_path);
    metrics_ = std::make_unique<MetricsWriter>(metrics_path);
    write_file_atomically((fs::path(run_dir_) / "config.yaml").string(), dump_config(cfg_));
  }
  live_ = lead_ && (opts_.progress == 1 || (opts_.progress < 0 && interactive_terminal(STDERR_FILENO)));

  TrainResult result;
  const int64_t total = cfg_.train.steps;
  const std::unique_ptr<Loader> owned_loader = train_loader(*data_, cfg_, mesh_, position_);
  Loader& loader = *owned_loader;
  if (lead_)
    std::printf("training %s: %lld steps from step %lld, %lld parameters, batch %lld, run dir %s\n",
                cfg_.file.c_str(), static_cast<long long>(total), static_cast<long long>(step_),
                static_cast<long long>(model_.num_params), static_cast<long long>(cfg_.train.batch_size),
                run_dir_.c_str());
  std::fflush(stdout);
  const StopRequests stop;
  double loss = std::nan("");
  const int64_t first_step = step_;
  std::unique_ptr<StepRecorder> dump;
  if (!opts_.dump_step.empty()) dump = std::make_unique<StepRecorder>(*ex_, params_, state_);
  threads_ = std::make_unique<ThreadAdapter>(omp_get_max_threads(),
                                             cfg_.train.adapt_threads && cfg_.train.device == "cpu");
  while (step_ < total) {
    threads_->begin_step();
    const auto t0 = Clock::now();
    const double lr = scheduled_lr(cfg_.schedule, cfg_.optimizer.lr, step_, total);
    const Node* anomaly = nullptr;
    try {
      if (mesh_.stages() > 1)
        loss = pipeline_step(*ex_, stash_, mesh_, loader, cfg_, step_);
      else if (dump)
        loss = train_step(*ex_, loader, cfg_, step_, &dump->timer(), nullptr, &dump->batch());
      else
        loss = train_step(*ex_, loader, cfg_, step_, nullptr, opts_.detect_anomaly ? &anomaly : nullptr);
    } catch (const NonFiniteValue& e) {  // an eager program's check
      finish_checkpoints();
      throw runtime_error(cat("step ", step_ + 1, ": ", e.what(), "\nstopping (train.eager); ", last_good()));
    }
    if (dump) {
      dump->write(opts_.dump_step, dump_config(cfg_), step_ + 1, lr, loss, cfg_.train.grad_accumulation,
                  cfg_.train.seed);
      spdlog::info("--dump-step: wrote step {} to {}", step_ + 1, opts_.dump_step);
      dump.reset();
    }
    if (anomaly) {
      finish_checkpoints();
      throw runtime_error(cat("step ", step_ + 1, ": ", anomaly->name, " (op ", anomaly->op,
                              ") produced a non-finite value (--detect-anomaly); stopping; ", last_good()));
    }
    position_ = loader.position();
    ++step_;
    // A background checkpoint write that failed (a full disk) stops the run now, not a checkpoint later.
    if (writer_) writer_->check();
    const double dt = seconds_since(t0);
    threads_->end_step(dt);
    // The first step includes one-time costs (page faults, BLAS buffers): keep it out of the ETA.
    if (step_ > 1 || total == 1) {
      time_in_steps_ += dt;
      ++steps_timed_;
    }
    // Under fp16 loss scaling an overflowing step is skipped and the scale lowered, so a non-finite loss is
    // survivable; many in a row mean the forward pass itself overflows, which no scale can fix.
    non_finite_run_ = std::isfinite(loss) ? 0 : non_finite_run_ + 1;
    const int64_t tolerated = ex_->has_tensor("amp/loss_scale") ? kNonFiniteTolerance : 0;
    if (non_finite_run_ > tolerated) {
      finish_checkpoints();
      throw runtime_error(cat("step ", step_, ": the loss is ", loss,
                              tolerated ? cat(" for ", non_finite_run_, " steps in a row") : std::string(),
                              "; stopping; ", last_good()));
    }
    if (step_ % cfg_.train.log_every == 0 || step_ == total || step_ == 1) {
      const double gn = ex_->program().graph.outputs().count("grad_norm")
                            ? static_cast<double>(ex_->output("grad_norm").data<float>()[0])
                            : std::nan("");
      log_step(step_, loss, lr, gn, dt);
    }
    if ((evaluates_ || zero3_) && cfg_.train.eval_every > 0 && step_ % cfg_.train.eval_every == 0 &&
        step_ != total) {
      result.eval = run_eval();
      if (lead_) log_eval(step_, result.eval);
    }
    std::string why;
    const bool requested = step_ < total && stop_requested(stop, &why);
    const bool exit_now =
        requested || (opts_.exit_at_step > 0 && step_ == opts_.exit_at_step && step_ < total);
    if ((cfg_.train.checkpoint_every > 0 && step_ % cfg_.train.checkpoint_every == 0) || step_ == total ||
        exit_now)
      result.checkpoint = save();
    if (exit_now) {
      finish_checkpoints();
      report_eager(step_ - first_step);
      report_threads();
      if (live_) std::fprintf(stderr, "\n");
      if (lead_)
        std::printf("stopped at step %lld (%s); checkpoint %s%s\n", static_cast<long long>(step_),
                    requested ? why.c_str() : "--exit-at-step", result.checkpoint.c_str(),
                    requested ? "; continue with --resume auto" : "");
      std::fflush(stdout);
      result.step = step_;
      result.loss = loss;
      result.stopped_early = true;
      result.interrupted = requested;
      return result;
    }
  }
  finish_checkpoints();
  if (live_) std::fprintf(stderr, "\n");
  report_eager(step_ - first_step);
  report_threads();
  result.step = step_;
  result.loss = loss;
  if (!evaluates_ && !zero3_) return result;
  result.eval = run_eval();
  if (!lead_) return result;
  log_eval(step_, result.eval);
  if (result.checkpoint.empty()) result.checkpoint = find_latest_checkpoint(ckpt_dir_);
  spdlog::info(
      "memory: peak resident {:.1f} MiB (flowrun plan predicted {:.1f} MiB)",
      peak_resident_bytes() / (1 << 20),
      predict_process_memory(ex_->program(), model_, *data_, cfg_, &eval_ex_->program()).total / (1 << 20));
  result.step = step_;
  result.loss = loss;
  std::printf("done: %lld steps in %.1f s; train loss %s; %s; checkpoint %s; metrics %s\n",
              static_cast<long long>(step_), seconds_since(start_), fmt_num(loss, 5).c_str(),
              eval_summary(result.eval).c_str(), result.checkpoint.c_str(), metrics_path.c_str());
  return result;
}

}  // namespace

TrainResult train(const RunConfig& cfg, const TrainOptions& opts) {
  return Run(cfg, opts).go();
}

EvalResult evaluate_checkpoint(const RunConfig& cfg, const std::string& checkpoint, const EvalOptions& opts) {
  check_device(cfg);
  if (!fs::exists(checkpoint)) throw input_error(cat("--checkpoint: ", checkpoint, " does not exist"));
  if (!opts.layers.empty() && opts.dump.empty())
    throw input_error("--layer names what --dump writes: give --dump FILE");
  if (!opts.dump.empty()) {
    const fs::path dir = fs::path(opts.dump).parent_path();
    if (!dir.empty() && !fs::is_directory(dir))
      throw input_error(cat("--dump ", opts.dump, ": the directory ", dir.string(), " does not exist"));
  }
  const bool st = is_safetensors(checkpoint);
  const CheckpointData ck = st ? CheckpointData{} : load_checkpoint(checkpoint);
  const auto data = open_dataset(cfg.data);
  BuiltModel m;
  RunConfig one_process = cfg;  // checkpoints hold whole tensors: any layout evaluates in one process
  one_process.parallel = ParallelConfig{};
  Executor ex(
      compile_model(one_process, data->spec(), cfg.train.eval_batch_size, false, &m, 0, 0, 0, opts.layers),
      device_of(cfg), cfg.train.seed);
  ex.use_cuda_graphs(cfg.train.cuda_graph);
  const Program& p = ex.program();
  const Mesh one = make_mesh(make_single_communicator(), 1);
  if (st) {
    // What the file lacks (a head an encoder-only checkpoint has not) keeps the run's initial values.
    Tensor unused;
    init_parameters(m.init, cfg.train.seed, [&](const std::string& n) -> Tensor& {
      return ex.has_tensor(n) ? ex.tensor(n) : (unused = Tensor::empty({0}, DType::f32));
    });
    for (const auto& [n, t] : import_weights(p, m, cfg.model, checkpoint, true))
      scatter_value(ex, n, t, one, cat("safetensors file ", checkpoint));
  } else {
    restore(ex, ck.params, persistent_names(p, ValueKind::param), checkpoint, "parameter", one);
    restore(ex, ck.state, persistent_names(p, ValueKind::state), checkpoint, "state", one);
  }
  const auto report_eager = [&] {
    if (cfg.train.eager)
      std::printf("%s", op_time_table(ex.op_times(), ex.step(), "batch", "batches").c_str());
  };
  if (opts.dump.empty()) {
    const EvalResult r = evaluate(ex, *data, cfg);
    report_eager();
    return r;
  }
  // The batches' real rows (the last batch is padded), copied as each batch is evaluated and concatenated
  // when the file is written.
  std::map<std::string, std::vector<Tensor>> rows;
  const EvalResult r = evaluate(ex, *data, cfg, [&](const Batch& b) {
    auto keep = [&](const std::string& name, const Tensor& t) {
      Shape s = t.shape();
      s[0] = b.valid;
      Tensor head = Tensor::empty(s, t.dtype());
      std::memcpy(head.raw(), t.raw(), head.nbytes());
      rows[name].push_back(head);
    };
    keep("x", b.x);
    keep("logits", ex.output("logits"));
    for (const std::string& l : opts.layers) keep(cat("layer/", l), ex.output(cat("layer/", l)));
  });
  report_eager();
  replace_file_atomically(opts.dump, [&](const std::string& tmp) {
    h5::File f(tmp, h5::File::Mode::create);
    f.set_attr("", "format", std::string("flowrun-eval-dump"));
    f.set_attr("", "checkpoint", checkpoint);
    for (const auto& [name, parts] : rows) {
      if (parts.empty()) continue;
      Shape s = parts[0].shape();
      s[0] = 0;
      for (const Tensor& t : parts) s[0] += t.shape()[0];
      Tensor all = Tensor::empty(s, parts[0].dtype());
      size_t at = 0;
      for (const Tensor& t : parts) {
        std::memcpy(static_cast<char*>(all.raw()) + at, t.raw(), t.nbytes());
        at += t.nbytes();
      }
      f.write(name, all);
    }
    f.close();
  });
  spdlog::info("--dump: wrote {} batches to {}", rows.count("x") ? rows["x"].size() : 0, opts.dump);
  return r;
}

std::string eval_summary(const EvalResult& e) {
  std::string s = cat("val_loss ", fmt_num(e.loss, 5), ", val_accuracy ", fmt_num(e.accuracy, 5));
  if (e.text)
    s += cat(", perplexity ", fmt_num(std::exp(e.loss), 5), ", bits/", e.token_unit, " ",
             fmt_num(e.loss / std::log(2.0), 4));
  return s;
}

}  // namespace flowrun
