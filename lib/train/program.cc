// Compiling a config's model, and one optimizer step over the loader's micro-batches.
#include "train/program.h"

#include <malloc.h>
#include <omp.h>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "ckpt/weights.h"
#include "core/cuda_backend.h"
#include "ops/registry.h"
#include "optim/schedule.h"
#include "train/plan.h"
#include "train/threads.h"

namespace flowrun {

namespace {

ModelInputs model_inputs(const DataSpec& spec, int64_t batch) {
  ModelInputs in;
  in.text = spec.text;
  in.x_shape = {batch};
  in.x_shape.insert(in.x_shape.end(), spec.sample_shape.begin(), spec.sample_shape.end());
  in.num_classes = spec.num_classes;
  return in;
}

OptimizerSpec optimizer_spec(const RunConfig& c) {
  OptimizerSpec s;
  s.type = c.optimizer.type;
  s.momentum = c.optimizer.momentum;
  s.dampening = c.optimizer.dampening;
  s.nesterov = c.optimizer.nesterov;
  s.weight_decay = c.optimizer.weight_decay;
  s.beta1 = c.optimizer.beta1;
  s.beta2 = c.optimizer.beta2;
  s.eps = c.optimizer.eps;
  s.decay_1d = c.optimizer.decay_1d;
  s.clip_grad_norm = c.train.clip_grad_norm;
  s.accumulation = c.train.grad_accumulation;
  if (c.precision.dtype == "fp16") {
    s.loss_scaling = true;
    s.dynamic_scale = c.precision.loss_scale == "dynamic";
    s.growth_interval = c.precision.growth_interval;
  }
  return s;
}

// The loss scale a run starts from (before a resume overwrites the state).
double initial_loss_scale(const PrecisionConfig& p) {
  return p.loss_scale == "dynamic" ? p.initial_scale : std::strtod(p.loss_scale.c_str(), nullptr);
}

template <typename T>
void set_scalar(Executor& ex, const std::string& name, T v) {
  if (ex.has_tensor(name)) ex.tensor(name).data<T>()[0] = v;
}

}  // namespace

DType compute_dtype(const PrecisionConfig& p) {
  return p.dtype == "fp16" ? DType::f16 : p.dtype == "bf16" ? DType::bf16 : DType::f32;
}

Device device_of(const RunConfig& c) {
  return c.train.device == "cuda" ? Device{DeviceKind::cuda, 0} : kCpu;
}

void check_device(const RunConfig& c) {
  if (c.train.device != "cpu") {
    // The CUDA backend is opened here, the first time a run asks for a GPU.
    std::string why;
    const cuda::Backend* gpu = cuda::load_backend(&why);
    if (!gpu) throw input_error(c.where("train.device") + "'cuda' is not available: " + why + "; use cpu");
    if (gpu->device_count(&why) == 0)
      throw input_error(c.where("train.device") + "'cuda' was asked for, but no CUDA device is visible (" +
                        why + "); use cpu");
  }
  if (c.train.threads > 0) omp_set_num_threads(static_cast<int>(c.train.threads));
}

Program compile_model(const RunConfig& cfg, const DataSpec& spec, int64_t batch, bool training,
                      BuiltModel* built, int64_t tensor_rank, int64_t stage, int64_t data_rank,
                      const std::vector<std::string>& layer_outputs, bool keep_gradients) {
  Graph g;
  // Training under data parallelism compiles the global micro-batch, which the data axis's SBP deduction
  // splits into each rank's `batch`.
  const int64_t ranks = training ? cfg.parallel.data : 1;
  *built = build_model(g, cfg.model, model_inputs(spec, batch * ranks), training, cfg.train.recompute);
  for (const std::string& name : layer_outputs) {
    auto it = built->layers.find(name);
    if (it == built->layers.end()) {
      std::vector<std::string> names;
      for (const auto& [n, v] : built->layers) names.push_back(n);
      throw input_error(
          cat("--layer: the model has no top-level layer '", name, "'; its layers: ", join(names)));
    }
    g.mark_output(cat("layer/", name), it->second);
  }
  // BERT's masking counts the masked positions of the optimizer step's whole batch, all of its micro-batches
  // (accumulation, or a pipeline's): its loss divides by the step's count over the pieces. An evaluation
  // batch is a step of one.
  if (training && cfg.train.grad_accumulation > 1)
    for (NodeId id : g.live_nodes_topological())
      if (g.node(id).op == "mlm_mask") g.node(id).attrs.set("micro_batches", cfg.train.grad_accumulation);
  CompileOptions o;
  o.eager = cfg.train.eager;
  o.keep_gradients = keep_gradients;
  o.device = device_of(cfg).kind;
  o.compute = compute_dtype(cfg.precision);
  o.tensor_parallel = cfg.parallel.tensor;
  o.tensor_rank = tensor_rank;
  o.pipeline = cfg.parallel.pipeline;
  o.pipeline_stage = stage;
  if (training) {
    // Only evaluation reads the logits: the training step may free them early (and, split over the tensor
    // axis, need not gather them).
    g.unmark_output("logits");
    o.optimizer = optimizer_spec(cfg);
    o.optimizer.pipeline = cfg.parallel.pipeline > 1;
    o.data_parallel = cfg.parallel.data;
    o.data_rank = data_rank;
    if (cfg.parallel.zero >= 1) o.optimizer.zero_shards = cfg.parallel.data;
    o.zero = cfg.parallel.data > 1 ? cfg.parallel.zero : 0;
    o.bucket_bytes = std::max<int64_t>(1, static_cast<int64_t>(cfg.parallel.bucket_mb * 1048576.0));
    o.optimizer.sharded_grads = o.zero >= 2;
  } else {
    o.loss = "";  // inference: no backward, no updates
  }
  return compile(std::move(g), o);
}

std::vector<std::string> persistent_names(const Program& p, ValueKind kind) {
  std::vector<std::string> names;
  for (const Value& v : p.graph.values())
    if (v.kind == kind) names.push_back(v.name);
  return names;
}

std::map<std::string, Tensor> import_weights(const Program& p, const BuiltModel& m, const ModelConfig& model,
                                             const std::string& path, bool with_state) {
  const Graph& g = p.graph;
  std::map<std::string, WantedTensor> want;
  for (ValueKind kind : {ValueKind::param, ValueKind::state}) {
    if (kind == ValueKind::state && !with_state) continue;
    for (const std::string& n : persistent_names(p, kind)) {
      if (!is_model_state(n)) continue;
      const Value& v = g.value(g.find_value(n));
      want[n] = {whole_shape(v), v.dtype(), kind == ValueKind::state};
    }
  }
  return import_safetensors(path, want, load_hf_map(model, m.env));
}

Mesh join_world(const RunConfig& cfg) {
  const LaunchInfo launch = detect_launch();
  const int64_t needed = cfg.parallel.data * cfg.parallel.tensor * cfg.parallel.pipeline;
  if (launch.world != needed)
    throw input_error(cat(cfg.where("parallel.data"), "the layout needs ", needed, " process",
                          needed == 1 ? "" : "es", " (data ", cfg.parallel.data, " x tensor ",
                          cfg.parallel.tensor, " x pipeline ", cfg.parallel.pipeline, ") but ",
                          launch.source == "none"
                              ? std::string("none was launched (use mpirun -np N or srun -n N)")
                              : cat("the launcher (", launch.source, ") started ", launch.world)));
  return make_mesh(world_communicator(launch), cfg.parallel.tensor, cfg.parallel.pipeline);
}

TrainProgram make_train_program(const RunConfig& cfg, const std::function<void(const Mesh&)>& joined,
                                bool keep_gradients) {
  check_device(cfg);
  TrainProgram t;
  t.mesh = join_world(cfg);
  if (joined) joined(t.mesh);
  if (cfg.train.device == "cuda") {
    // One GPU per process, by its rank on the node; then NCCL over each axis of more than one rank (the
    // kernels' collectives). Pipeline stages pass activations through the host tensors and MPI
    // (pipeline_step); the pipeline's NCCL groups serve the gradient norm and the tied parameters.
    const cuda::Backend& cu = cuda::backend();
    const int gpu = cu.select_gpu(detect_launch().local_rank);
    if (t.mesh.data->size() > 1) t.mesh.gpu_data = cu.make_nccl_communicator(*t.mesh.data);
    if (t.mesh.tensor->size() > 1) t.mesh.gpu_tensor = cu.make_nccl_communicator(*t.mesh.tensor);
    if (t.mesh.pipeline->size() > 1) t.mesh.gpu_pipeline = cu.make_nccl_communicator(*t.mesh.pipeline);
    if (t.mesh.ends == t.mesh.pipeline)
      t.mesh.gpu_ends = t.mesh.gpu_pipeline;
    else if (t.mesh.ends->size() > 1)
      t.mesh.gpu_ends = cu.make_nccl_communicator(*t.mesh.ends);
    if (t.mesh.world->size() > 1) spdlog::info("rank {}: GPU {}", t.mesh.world->rank(), gpu);
  }
  t.data = open_dataset(cfg.data);
  // The loader would refuse this too (an epoch holds whole steps), but only after the program's memory is
  // allocated (for a batch of billions, never: the allocation fails first).
  const int64_t samples = t.data->size(Split::train);
  if (cfg.train.batch_size > samples)
    throw input_error(cat(cfg.where("train.batch_size"), "a batch of ", cfg.train.batch_size,
                          " samples is larger than the ", samples,
                          " samples of the train split: an epoch needs at least one full batch"));
  Program p = compile_model(cfg, t.data->spec(), cfg.train.micro_batch_size, true, &t.model,
                            t.mesh.tensor->rank(), t.mesh.stage(), t.mesh.data->rank(), {}, keep_gradients);
  // Each pipeline micro-batch slot has an arena of its own (see below).
  const int64_t slots =
      t.mesh.stages() > 1 ? std::min(t.mesh.stages() - t.mesh.stage(), cfg.train.grad_accumulation) : 1;
  if (device_of(cfg).kind == DeviceKind::cpu) check_memory_fits(p, slots, cfg);
  if (t.mesh.world->rank() == 0)
    if (const std::string w = replication_warning(p, t.model, cfg); !w.empty()) spdlog::warn("{}", w);
  t.params = persistent_names(p, ValueKind::param);
  // Gradient accumulators are scratch within a step (its first micro-batch overwrites them): checkpoints,
  // taken between steps, leave them out.
  for (const std::string& n : persistent_names(p, ValueKind::state))
    if (!n.ends_with("/grad_acc")) t.state.push_back(n);
  spdlog::info("model: {} parameters, arena {:.1f} MiB (train), micro-batch {} x {} accumulation",
               t.model.num_params, static_cast<double>(p.memory.arena_bytes) / (1 << 20),
               cfg.train.micro_batch_size, cfg.train.grad_accumulation);
  t.ex = std::make_unique<Executor>(std::move(p), device_of(cfg), cfg.train.seed,
                                    std::map<std::string, Tensor>{}, t.mesh.kernel_data(),
                                    t.mesh.kernel_tensor());
  t.ex->use_cuda_graphs(cfg.train.cuda_graph);
  // Every rank draws whole tensors, as one process would, and keeps its piece (each name has its own random
  // stream: the parameters of other pipeline stages are skipped with an empty tensor). One whole tensor at a
  // time: each is cut into this rank's piece before the next is drawn (all of them at once were the
  // parameters' size again at the start of a tensor-parallel run, its peak: 774 against 675 MiB predicted).
  {
    Tensor elsewhere = Tensor::empty({0}, DType::f32), whole;
    std::string drawn;  // the parameter `whole` holds
    auto keep_piece = [&] {
      if (!drawn.empty() && t.ex->has_tensor(drawn))
        scatter_value(*t.ex, drawn, whole, t.mesh, "initialisation");
      drawn.clear();
    };
    init_parameters(t.model.init, cfg.train.seed, [&](const std::string& n) -> Tensor& {
      keep_piece();
      const ValueId id = t.ex->program().graph.find_value(n);
      if (id == kNoValue) return elsewhere;
      const Value& v = t.ex->program().graph.value(id);
      whole = Tensor::empty(whole_shape(v), v.dtype());
      drawn = n;
      return whole;
    });
    keep_piece();
  }
  // glibc keeps freed heap pages resident (the whole tensors': the parameters' size again, 193 MiB for a
  // 64-layer gpt-tiny, measured); give them back before the arena is touched.
  malloc_trim(0);
  t.ex->set_pipeline(t.mesh.kernel_pipeline(), t.mesh.kernel_ends());
  if (t.mesh.stages() > 1) {
    std::map<std::string, Tensor> shared;  // every parameter and state (gradient accumulators included)
    for (ValueKind kind : {ValueKind::param, ValueKind::state})
      for (const auto& n : persistent_names(t.ex->program(), kind)) shared.emplace(n, t.ex->tensor(n));
    for (int64_t k = 1; k < slots; ++k) {
      t.stash.push_back(std::make_unique<Executor>(t.ex->program(), device_of(cfg), cfg.train.seed, shared,
                                                   t.mesh.kernel_data(), t.mesh.kernel_tensor()));
      t.stash.back()->set_pipeline(t.mesh.kernel_pipeline(), t.mesh.kernel_ends());
    }
    spdlog::info("pipeline stage {} of {}: {} parameters here, {} micro-batch slot{}", t.mesh.stage(),
                 t.mesh.stages(), t.params.size(), slots, slots == 1 ? "" : "s");
  }
  set_scalar<float>(*t.ex, "amp/loss_scale", static_cast<float>(initial_loss_scale(cfg.precision)));
  return t;
}

int64_t loader_prefetch(const RunConfig& cfg) {
  if (device_of(cfg).kind != DeviceKind::cpu) return cfg.data.prefetch;
  const int threads = cfg.train.threads > 0 ? static_cast<int>(cfg.train.threads) : omp_get_max_threads();
  return threads < usable_cores() ? cfg.data.prefetch : 0;
}

std::unique_ptr<Loader> train_loader(const Dataset& data, const RunConfig& cfg, const Mesh& mesh,
                                     LoaderPosition start) {
  const Communicator& d = *mesh.data;
  return std::make_unique<Loader>(data, Split::train, cfg.train.micro_batch_size * d.size(), cfg.data.shuffle,
                                  cfg.train.seed, loader_prefetch(cfg), start, d.rank(), d.size(),
                                  cfg.train.grad_accumulation);
}

LoaderPosition resume_position(const CheckpointData& ck, const YAML::Node& saved_cfg, const RunConfig& cfg,
                               const std::string& path) {
  const LoaderPosition saved{ck.loader_epoch, ck.loader_index};
  if (!saved_cfg.IsMap() || !saved_cfg["train"] || !saved_cfg["parallel"]) return saved;
  const YAML::Node micro = saved_cfg["train"]["micro_batch_size"], data = saved_cfg["parallel"]["data"];
  if (!micro || !data) return saved;  // not a resolved config: the batch it counted in is unknown
  const int64_t was = micro.as<int64_t>() * data.as<int64_t>(),
                now = cfg.train.micro_batch_size * cfg.parallel.data;
  if (was == now) return saved;
  const int64_t samples = saved.index * was;
  if (samples % now != 0)
    throw input_error(cat("checkpoint ", path, ": its data position (", samples, " samples into epoch ",
                          saved.epoch, ", in batches of ", was,
                          ") is not a whole number of this run's batches of ", now,
                          " (train.micro_batch_size x parallel.data)"));
  spdlog::info("checkpoint {}: {} samples into epoch {}, batch {} of {} there, {} of {} here", path, samples,
               saved.epoch, saved.index, was, samples / now, now);
  return {saved.epoch, samples / now};
}

namespace {
const Value& value_named(const Executor& ex, const std::string& name) {
  const ValueId id = ex.program().graph.find_value(name);
  FR_CHECK(id != kNoValue, "no value ", name);
  return ex.program().graph.value(id);
}
}  // namespace

Shape whole_shape(const Value& v) {
  if (v.placement.tensor_split()) return v.placement.whole;
  return v.placement.sharded() ? v.placement.global_shape : v.shape();
}

Tensor unshard_value(Executor& ex, const std::string& name, const Mesh& mesh) {
  const Value& v = value_named(ex, name);
  Tensor local = ex.tensor(name);
  if (!v.placement.sharded()) return local;
  // ZeRO: flat shards over the data axis
  const int64_t s = local.numel();
  Tensor all = Tensor::empty({s * mesh.data->size()}, local.dtype());
  mesh.data->all_gather(local.raw(), all.raw(), s, local.dtype());
  Tensor piece = Tensor::empty(v.placement.global_shape, local.dtype());
  std::memcpy(piece.raw(), all.raw(), piece.nbytes());
  return piece;
}

Tensor gather_value(Executor& ex, const std::string& name, const Mesh& mesh) {
  const Value& v = value_named(ex, name);
  Tensor local = unshard_value(ex, name, mesh);
  if (!v.placement.tensor_split()) return local;
  const int64_t parts = v.placement.tensor_parts, n = local.numel();
  Tensor all = Tensor::empty({n * parts}, local.dtype());
  mesh.tensor->all_gather(local.raw(), all.raw(), n, local.dtype());
  Tensor whole = Tensor::empty(v.placement.whole, local.dtype());
  for (int64_t r = 0; r < parts; ++r) {
    Tensor one = Tensor::empty(local.shape(), local.dtype());
    std::memcpy(one.raw(),
                static_cast<const char*>(all.raw()) + static_cast<size_t>(r * n) * dtype_size(local.dtype()),
                one.nbytes());
    put_part(whole, one, v.placement.tensor, r, parts);
  }
  return whole;
}

void scatter_value(Executor& ex, const std::string& name, const Tensor& whole, const Mesh& mesh,
                   const std::string& source) {
  const Value& v = value_named(ex, name);
  Tensor& t = ex.tensor(name);
  const Shape want = whole_shape(v);
  if (whole.shape() != want || whole.dtype() != t.dtype())
    throw input_error(cat(source, ": '", name, "' is ", dtype_name(whole.dtype()), shape_str(whole.shape()),
                          " but the model has ", dtype_name(t.dtype()), shape_str(want)));
  const Tensor piece = v.placement.tensor_split() ? take_part(whole, v.placement.tensor, mesh.tensor->rank(),
                                                              v.placement.tensor_parts)
                                                  : whole;
  if (!v.placement.sharded()) {
    std::memcpy(t.raw(), piece.raw(), t.nbytes());
    return;
  }
  // This rank's flat shard, zero-padded past the end (as local_shard cuts it).
  const int64_t s = t.numel(), first = mesh.data->rank() * s,
                have = std::clamp<int64_t>(piece.numel() - first, 0, s);
  const size_t esize = dtype_size(t.dtype());
  std::memset(t.raw(), 0, t.nbytes());
  std::memcpy(t.raw(), static_cast<const char*>(piece.raw()) + static_cast<size_t>(first) * esize,
              static_cast<size_t>(have) * esize);
}

Cost node_cost(const Graph& g, const Node& n) {
  const OpDef& def = OpRegistry::get().at(n.op);
  if (!def.cost) return {};
  std::vector<TensorType> in, out;
  for (ValueId v : n.inputs) in.push_back(g.value(v).type);
  for (ValueId v : n.outputs) out.push_back(g.value(v).type);
  return def.cost(in, out, n.attrs);
}

double node_flops(const Graph& g, const Node& n) {
  return node_cost(g, n).flops;
}

double step_flops(const Program& p, int64_t accumulation) {
  double flops = 0;
  for (NodeId id : p.order) {
    const Node& n = p.graph.node(id);
    flops += node_flops(p.graph, n) * (n.phase == 1 ? 1.0 : static_cast<double>(accumulation));
  }
  return flops;
}

void feed(Executor& ex, const Batch& b, bool in_place) {
  for (const auto& [name, from] : {std::pair<const char*, const Tensor*>{"x", &b.x}, {"y", &b.y}}) {
    if (!ex.has_tensor(name)) continue;
    Tensor& t = ex.tensor(name);
    FR_CHECK(t.nbytes() == from->nbytes() && t.dtype() == from->dtype(),
             "batch does not match the model's input ", name);
    if (in_place && t.shape() == from->shape() && ex.bind_input(name, *from)) continue;
    std::memcpy(t.raw(), from->raw(), t.nbytes());
  }
}

namespace {
constexpr int kActivationTag = 1, kGradientTag = 2, kTensorsTag = 3;
}  // namespace

double pipeline_step(Executor& main, const std::vector<std::unique_ptr<Executor>>& stash, const Mesh& mesh,
                     Loader& loader, const RunConfig& cfg, int64_t step) {
  const int64_t m = cfg.train.grad_accumulation, stages = mesh.stages(), s = mesh.stage();
  Communicator& pipe = *mesh.pipeline;
  std::vector<Executor*> slots{&main};
  for (const auto& e : stash) slots.push_back(e.get());
  const auto k = static_cast<int64_t>(slots.size());
  const auto lr = static_cast<float>(scheduled_lr(cfg.schedule, cfg.optimizer.lr, step, cfg.train.steps));
  for (Executor* e : slots) {
    set_scalar<float>(*e, "lr", lr);
    set_scalar<int64_t>(*e, "opt/step", step + 1);
  }
  // The last micro-batch runs on `main`, whose outputs (grad_norm) the caller reads.
  auto slot = [&](int64_t i) -> Executor& { return *slots[static_cast<size_t>((m - 1 - i) % k)]; };
  const size_t backward = main.program().backward_begin, end = main.program().order.size();
  // Activations travel as bytes: MPI has no bf16 or f16 type.
  auto receive = [&](Tensor& t, int peer, int tag) {
    pipe.recv(t.raw(), static_cast<int64_t>(t.nbytes()), DType::u8, peer, tag);
  };
  auto send = [&](const Tensor& t, int peer, int tag) {
    pipe.post(t.raw(), static_cast<int64_t>(t.nbytes()), DType::u8, peer, tag);
  };
  const int prev = static_cast<int>(s) - 1, next = static_cast<int>(s) + 1;
  double loss_sum = 0;
  auto forward = [&](int64_t i) {
    Executor& e = slot(i);
    feed(e, loader.next());
    if (s > 0) receive(e.tensor("pp/in"), prev, kActivationTag);
    e.set_step(step);  // dropout: micro-batch i numbered as rows of the step's whole batch
    e.set_micro(i);
    e.run_part(0, backward, false);
    if (s < stages - 1) send(e.output("pp/out"), next, kActivationTag);
  };
  auto backward_pass = [&](int64_t i) {
    Executor& e = slot(i);
    set_scalar<int64_t>(e, "opt/micro", i);
    if (s < stages - 1) receive(e.tensor("pp/out_grad"), next, kGradientTag);
    e.set_step(step);
    e.set_micro(i);
    e.run_part(backward, end, false);
    if (s > 0) send(e.output("grad/pp/in"), prev, kGradientTag);
    if (s == stages - 1) loss_sum += e.output("loss").data<float>()[0];
  };
  const int64_t warmup = std::min(stages - s - 1, m);
  for (int64_t i = 0; i < warmup; ++i) forward(i);
  for (int64_t i = 0; i < m - warmup; ++i) {
    forward(warmup + i);
    backward_pass(i);
  }
  for (int64_t i = m - warmup; i < m; ++i) backward_pass(i);
  // The update, once every gradient has been sent on (its collectives span the stages).
  main.run_part(backward, end, true, /*apply_only=*/true);
  pipe.flush();
  double loss = loss_sum / static_cast<double>(m);
  pipe.broadcast(&loss, 1, DType::f64, static_cast<int>(stages - 1));
  return loss;
}

void gather_stages(std::map<std::string, Tensor>& tensors, const Mesh& mesh) {
  Communicator& pipe = *mesh.pipeline;
  if (pipe.size() == 1) return;
  if (pipe.rank() != 0) {
    // A manifest (name, dtype, shape per line), then every tensor's bytes in manifest order.
    std::string manifest;
    int64_t bytes = 0;
    for (const auto& [name, t] : tensors) {
      manifest += cat(name, "\t", dtype_name(t.dtype()));
      for (int64_t d : t.shape()) manifest += cat("\t", d);
      manifest += "\n";
      bytes += static_cast<int64_t>(t.nbytes());
    }
    std::vector<char> blob;
    blob.reserve(static_cast<size_t>(bytes));
    for (const auto& [name, t] : tensors)
      blob.insert(blob.end(), static_cast<const char*>(t.raw()),
                  static_cast<const char*>(t.raw()) + t.nbytes());
    const int64_t sizes[2] = {static_cast<int64_t>(manifest.size()), bytes};
    pipe.send(sizes, 2, DType::i64, 0, kTensorsTag);
    pipe.send(manifest.data(), sizes[0], DType::u8, 0, kTensorsTag);
    pipe.send(blob.data(), sizes[1], DType::u8, 0, kTensorsTag);
    return;
  }
  for (int from = 1; from < pipe.size(); ++from) {
    int64_t sizes[2] = {0, 0};
    pipe.recv(sizes, 2, DType::i64, from, kTensorsTag);
    std::string manifest(static_cast<size_t>(sizes[0]), '\0');
    std::vector<char> blob(static_cast<size_t>(sizes[1]));
    pipe.recv(manifest.data(), sizes[0], DType::u8, from, kTensorsTag);
    pipe.recv(blob.data(), sizes[1], DType::u8, from, kTensorsTag);
    std::istringstream lines(manifest);
    std::string line;
    size_t at = 0;
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      std::string name, dtype, dim;
      std::getline(fields, name, '\t');
      std::getline(fields, dtype, '\t');
      Shape shape;
      while (std::getline(fields, dim, '\t')) shape.push_back(std::stoll(dim));
      const std::optional<DType> type = parse_dtype(dtype);
      FR_CHECK(type.has_value(), "stage ", from, " sent a tensor of dtype ", dtype);
      Tensor t = Tensor::empty(shape, *type);
      std::memcpy(t.raw(), blob.data() + at, t.nbytes());
      at += t.nbytes();
      tensors.emplace(name, std::move(t));
    }
  }
}

std::string op_time_table(const std::map<std::string, OpTime>& times, int64_t count, const std::string& unit,
                          const std::string& units) {
  std::vector<std::pair<std::string, OpTime>> rows(times.begin(), times.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double total = 0;
  for (const auto& r : rows) total += r.second.seconds;
  const double per = 1.0 / static_cast<double>(std::max<int64_t>(count, 1));
  std::string out = cat("eager: time per op over ", count, " ", count == 1 ? unit : units, "\n");
  char line[160];
  std::snprintf(line, sizeof line, "%-28s %12s %12s %7s\n", "op", ("calls/" + unit).c_str(),
                ("ms/" + unit).c_str(), "share");
  out += line;
  for (const auto& [op, t] : rows) {
    std::snprintf(line, sizeof line, "%-28s %12.4g %12.3f %6.1f%%\n", op.c_str(),
                  static_cast<double>(t.calls) * per, t.seconds * per * 1e3,
                  total > 0 ? 100.0 * t.seconds / total : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "%-28s %12s %12.3f\n", "all ops", "", total * per * 1e3);
  return out + line;
}

double train_step(Executor& ex, Loader& loader, const RunConfig& cfg, int64_t step,
                  const std::function<void(const Node&, double)>* timer, const Node** anomaly,
                  const std::function<void(const Batch&)>* on_batch) {
  const int64_t accum = cfg.train.grad_accumulation;
  set_scalar<float>(ex, "lr",
                    static_cast<float>(scheduled_lr(cfg.schedule, cfg.optimizer.lr, step, cfg.train.steps)));
  set_scalar<int64_t>(ex, "opt/step", step + 1);
  double loss_sum = 0.0;
  for (int64_t micro = 0; micro < accum; ++micro) {
    const Batch& batch = loader.next();
    if (on_batch) (*on_batch)(batch);
    // In place: the loader keeps this batch until the next next(), after this micro-batch's run.
    feed(ex, batch, true);
    set_scalar<int64_t>(ex, "opt/micro", micro);
    // Dropout keyed by the optimizer step, micro-batch `micro` numbered as rows of the step's whole batch:
    // the masks of the unsplit batch, however it is split.
    ex.set_step(step);
    ex.set_micro(micro);
    if (anomaly && !ex.program().eager) {  // an eager program checks every node itself
      *anomaly = ex.run_checked(micro == accum - 1);
      if (*anomaly) return std::nan("");
    } else if (timer) {
      ex.run_timed(*timer, micro == accum - 1);
    } else {
      ex.run(micro == accum - 1);
    }
    loss_sum += ex.output("loss").data<float>()[0];
  }
  return loss_sum / static_cast<double>(accum);
}

}  // namespace flowrun
