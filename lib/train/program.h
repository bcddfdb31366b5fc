// What the trainer, `flowrun eval` and `flowrun time` share: a config's model compiled into a training or
// evaluation program over its data, and one optimizer step (micro-batches, accumulation, lr, Adam's step).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "config/config.h"
#include "data/loader.h"
#include "nn/model.h"
#include "parallel/comm.h"
#include "runtime/executor.h"

namespace flowrun {

// f32, f16 or bf16 from precision.dtype.
DType compute_dtype(const PrecisionConfig& p);

// The device of train.device (one GPU per process: index 0).
Device device_of(const RunConfig& cfg);
// Refuses devices this build or machine cannot use and applies train.threads.
void check_device(const RunConfig& cfg);

// A compiled program of cfg's model on `batch`-sized inputs: training (with the optimizer pass) or
// evaluation (forward and loss only: dropout off, batchnorm on running statistics). `batch` is one rank's;
// a training program is the local program of the mesh coordinates given (data rank, tensor rank, pipeline
// stage) under the config's layout.
// `layer_outputs` (evaluation: `flowrun eval --layer`) names top-level layers (as `flowrun check`'s table
// does) whose outputs the program also hands out, as outputs "layer/<name>". `keep_gradients` (--dump-step,
// --detect-anomaly) keeps every parameter's gradient a value of the step (CompileOptions::keep_gradients).
Program compile_model(const RunConfig& cfg, const DataSpec& spec, int64_t batch, bool training,
                      BuiltModel* built, int64_t tensor_rank = 0, int64_t stage = 0, int64_t data_rank = 0,
                      const std::vector<std::string>& layer_outputs = {}, bool keep_gradients = false);

// The training program of a config, its data, and an executor with freshly initialised parameters.
struct TrainProgram {
  Mesh mesh;  // the world (one process unless launched by mpirun/srun) and its axes; outlives ex
  std::unique_ptr<Dataset> data;
  BuiltModel model;
  std::unique_ptr<Executor> ex;
  // A pipeline stage keeps the activations of up to min(stages - stage, micro-batches) micro-batches at once
  // (1F1B): one executor each, sharing ex's parameters and state.
  std::vector<std::unique_ptr<Executor>> stash;
  std::vector<std::string> params, state;  // value names, as checkpoints hold them (this stage's)
};
// `joined`, when given, runs right after the world is joined, before anything is compiled or allocated
// (the trainer takes the run directory's lock there, all ranks together). The batch is checked against the
// train split, and on a CPU the planned memory against what the process may use (check_memory_fits), before
// any tensor is allocated. `keep_gradients` as for compile_model.
TrainProgram make_train_program(const RunConfig& cfg,
                                const std::function<void(const Mesh&)>& joined = nullptr,
                                bool keep_gradients = false);

// This process's place in the job the launcher started (see detect_launch), checked against the config's
// layout (an input_error unless the world has data x tensor x pipeline processes), as a device mesh.
Mesh join_world(const RunConfig& cfg);

// The batches a loader prepares ahead in its own thread: data.prefetch, except on a CPU run whose threads
// take every core this process may use (usable_cores), where it prepares each batch when the step asks for
// it. There the loader's thread has no core of its own: waking in the middle of a kernel it displaced a
// thread of the team, and the rest of the team waited for it at the next barrier. Synchronous, the bench
// MLP's step took 0.979x as long (0.971-0.988: data.prefetch 0 against 2 in one build, 5 alternating rounds
// of 1000 steps, 2 threads on 2 cores), the CNN's within the noise; the first layer's product, which the
// thread's work overlapped, 0.35 ms, not 0.42.
int64_t loader_prefetch(const RunConfig& cfg);

// The training loader of this rank: the global micro-batch (micro_batch_size x parallel.data), of which it
// takes its data-parallel share (the ranks of one tensor-parallel group read the same samples).
std::unique_ptr<Loader> train_loader(const Dataset& data, const RunConfig& cfg, const Mesh& mesh,
                                     LoaderPosition start = {});
// The train loader's position saved in checkpoint `ck` (read from `path`, its resolved config parsed as
// `saved`), in this run's batches: it counts batches of the checkpoint's own global micro-batch (its
// micro_batch_size x parallel.data), which a resume under another layout or accumulation (a pipeline's
// micro-batches, say) turns into as many samples of this run's.
LoaderPosition resume_position(const CheckpointData& ck, const YAML::Node& saved, const RunConfig& cfg,
                               const std::string& path);

// The tensors a safetensors file gives program `p` (of model `m`, built from `model`): its parameters
// (each required unless the model's Hugging Face name map lets a file lack it) and, when `with_state`, its
// running statistics (optional), by flowrun's or Hugging Face names (import_safetensors), whole.
std::map<std::string, Tensor> import_weights(const Program& p, const BuiltModel& m, const ModelConfig& model,
                                             const std::string& path, bool with_state);

// Names of the values of one kind in a program.
std::vector<std::string> persistent_names(const Program& p, ValueKind kind);

// The shape of value v as one process holds it: of the whole tensor where it is split over the tensor axis
// (Placement::whole) or sharded over the data axis (Placement::global_shape), else its own.
Shape whole_shape(const Value& v);
// The whole tensor of persistent value `name`: the value itself, or for a sharded one (ZeRO optimizer state,
// Placement::global_shape; a split over the tensor axis, Placement::tensor) every rank's piece gathered.
// Collective for sharded values: every rank calls it, for the same names in the same order.
Tensor gather_value(Executor& ex, const std::string& name, const Mesh& mesh);
// The same over the data axis only: the tensor-axis piece this rank holds, whole for a value ZeRO shards.
Tensor unshard_value(Executor& ex, const std::string& name, const Mesh& mesh);
// Loads `whole` into value `name`: a copy, or this rank's piece of it for a sharded value. An input_error
// when its shape is not the value's (whole) shape.
void scatter_value(Executor& ex, const std::string& name, const Tensor& whole, const Mesh& mesh,
                   const std::string& source);

// One node's registered cost (FLOPs, bytes read and written; zero for ops without one), and its FLOPs.
Cost node_cost(const Graph& g, const Node& n);
double node_flops(const Graph& g, const Node& n);
// FLOPs of one optimizer step: every-step nodes once per micro-batch, apply-phase nodes once.
double step_flops(const Program& p, int64_t accumulation);

// An eager program's time per op type (Executor::op_times, of one or more executors summed) as a table:
// calls and milliseconds per `unit` (e.g. "step", plural `units`) over `count` of them, and each op's share,
// slowest first.
std::string op_time_table(const std::map<std::string, OpTime>& times, int64_t count, const std::string& unit,
                          const std::string& units);

// Gives the program a batch as its inputs "x" and "y" (those it has: a pipeline stage may read one). With
// `in_place` a CPU program reads the batch's tensors themselves (Executor::bind_input), which must then stay
// unchanged until its run ends; otherwise, and on a GPU, they are copied.
void feed(Executor& ex, const Batch& b, bool in_place = false);

// One optimizer step of a pipeline stage (parallel.pipeline > 1): the micro-batches in the 1F1B order
// (stage s runs stages - s - 1 forward passes ahead, then alternates one forward and one backward), each on
// the executor of its slot (`main` and `stash`), activations and their gradients sent between neighbouring
// stages without blocking the sender. Returns the mean loss of the micro-batches (from the last stage, on
// every stage).
double pipeline_step(Executor& main, const std::vector<std::unique_ptr<Executor>>& stash, const Mesh& mesh,
                     Loader& loader, const RunConfig& cfg, int64_t step);

// Moves the tensors of every pipeline stage into `tensors` on stage 0 (collective over the pipeline axis;
// a name already there is kept: a tied parameter's copy is the same). Stages other than 0 keep theirs.
void gather_stages(std::map<std::string, Tensor>& tensors, const Mesh& mesh);

// Optimizer step `step` (0-based): lr from the schedule, every micro-batch of the accumulation window with
// its dropout stream, the update on the last one. Returns the mean loss of the micro-batches. `timer`, when
// given, receives each kernel's time (flowrun time).
// With `anomaly` (--detect-anomaly) every kernel's outputs are checked; the first node to produce an inf or
// NaN is stored there and the step stops (the caller reports it). Under fp16 loss scaling the backward pass
// is exempt: its overflows are expected and skip the step. An eager program checks every node itself and
// throws NonFiniteValue instead.
// `on_batch`, when given, sees each micro-batch as it is fed (--dump-step records them).
double train_step(Executor& ex, Loader& loader, const RunConfig& cfg, int64_t step,
                  const std::function<void(const Node&, double)>* timer = nullptr,
                  const Node** anomaly = nullptr,
                  const std::function<void(const Batch&)>* on_batch = nullptr);

}  // namespace flowrun
