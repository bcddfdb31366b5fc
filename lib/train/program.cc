// Compiling a config's model, and one optimizer step over the loader's micro-batches.
#include "train/program.h"

#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "ops/registry.h"
#include "optim/schedule.h"

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

void check_device(const RunConfig& c) {
  if (c.train.device != "cpu")
    throw input_error(c.where("train.device") +
                      "'cuda' is not available: this build of flowrun has no CUDA backend yet; use cpu");
  if (c.train.threads > 0) omp_set_num_threads(static_cast<int>(c.train.threads));
}

Program compile_model(const RunConfig& cfg, const DataSpec& spec, int64_t batch, bool training,
                      BuiltModel* built, int64_t tensor_rank) {
  Graph g;
  *built = build_model(g, cfg.model, model_inputs(spec, batch), training);
  CompileOptions o;
  o.compute = compute_dtype(cfg.precision);
  o.tensor_parallel = cfg.parallel.tensor;
  o.tensor_rank = tensor_rank;
  if (training) {
    // Only evaluation reads the logits: the training step may free them early (and, split over the tensor
    // axis, need not gather them).
    g.unmark_output("logits");
    o.optimizer = optimizer_spec(cfg);
    o.data_parallel = cfg.parallel.data;
    if (cfg.parallel.zero >= 1) o.optimizer.zero_shards = cfg.parallel.data;
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
  return make_mesh(world_communicator(launch), cfg.parallel.tensor);
}

TrainProgram make_train_program(const RunConfig& cfg) {
  check_device(cfg);
  TrainProgram t;
  t.mesh = join_world(cfg);
  t.data = open_dataset(cfg.data);
  Program p =
      compile_model(cfg, t.data->spec(), cfg.train.micro_batch_size, true, &t.model, t.mesh.tensor->rank());
  t.params = persistent_names(p, ValueKind::param);
  t.state = persistent_names(p, ValueKind::state);
  spdlog::info("model: {} parameters, arena {:.1f} MiB (train), micro-batch {} x {} accumulation",
               t.model.num_params, static_cast<double>(p.memory.arena_bytes) / (1 << 20),
               cfg.train.micro_batch_size, cfg.train.grad_accumulation);
  t.ex = std::make_unique<Executor>(std::move(p), kCpu, cfg.train.seed, std::map<std::string, Tensor>{},
                                    t.mesh.data.get(), t.mesh.tensor.get());
  // Every rank draws whole tensors, as one process would, and keeps its piece.
  std::map<std::string, Tensor> whole;
  init_parameters(t.model.init, cfg.train.seed, [&](const std::string& n) -> Tensor& {
    const Value& v = t.ex->program().graph.value(t.ex->program().graph.find_value(n));
    const Shape shape = v.placement.tensor_split() ? v.placement.whole : v.shape();
    return whole.emplace(n, Tensor::empty(shape, v.dtype())).first->second;
  });
  for (const auto& [n, w] : whole) scatter_value(*t.ex, n, w, t.mesh, "initialisation");
  set_scalar<float>(*t.ex, "amp/loss_scale", static_cast<float>(initial_loss_scale(cfg.precision)));
  return t;
}

std::unique_ptr<Loader> train_loader(const Dataset& data, const RunConfig& cfg, const Mesh& mesh,
                                     LoaderPosition start) {
  const Communicator& d = *mesh.data;
  return std::make_unique<Loader>(data, Split::train, cfg.train.micro_batch_size * d.size(), cfg.data.shuffle,
                                  cfg.train.seed, cfg.data.prefetch, start, d.rank(), d.size());
}

namespace {
const Value& value_named(const Executor& ex, const std::string& name) {
  const ValueId id = ex.program().graph.find_value(name);
  FR_CHECK(id != kNoValue, "no value ", name);
  return ex.program().graph.value(id);
}
}  // namespace

Tensor gather_value(Executor& ex, const std::string& name, const Mesh& mesh) {
  const Value& v = value_named(ex, name);
  Tensor local = ex.tensor(name);
  if (v.placement.sharded()) {  // ZeRO: flat shards over the data axis
    const int64_t s = local.numel();
    Tensor all = Tensor::empty({s * mesh.data->size()}, local.dtype());
    mesh.data->all_gather(local.raw(), all.raw(), s, local.dtype());
    Tensor piece = Tensor::empty(v.placement.global_shape, local.dtype());
    std::memcpy(piece.raw(), all.raw(), piece.nbytes());
    local = piece;
  }
  if (!v.placement.tensor_split()) return local;
  const int64_t parts = v.placement.tensor_parts, n = local.numel();
  Tensor all = Tensor::empty({n * parts}, local.dtype());
  mesh.tensor->all_gather(local.raw(), all.raw(), n, local.dtype());
  Tensor whole = Tensor::empty(v.placement.whole, local.dtype());
  for (int64_t r = 0; r < parts; ++r) {
    Tensor one = Tensor::empty(local.shape(), local.dtype());
    std::memcpy(one.raw(), static_cast<const char*>(all.raw()) + static_cast<size_t>(r * n) * dtype_size(local.dtype()),
                one.nbytes());
    put_part(whole, one, v.placement.tensor, r, parts);
  }
  return whole;
}

void scatter_value(Executor& ex, const std::string& name, const Tensor& whole, const Mesh& mesh,
                   const std::string& source) {
  const Value& v = value_named(ex, name);
  Tensor& t = ex.tensor(name);
  const Shape& local_shape = v.placement.sharded() ? v.placement.global_shape : t.shape();
  const Shape& want = v.placement.tensor_split() ? v.placement.whole : local_shape;
  if (whole.shape() != want || whole.dtype() != t.dtype())
    throw input_error(cat(source, ": '", name, "' is ", dtype_name(whole.dtype()), shape_str(whole.shape()),
                          " but the model has ", dtype_name(t.dtype()), shape_str(want)));
  const Tensor piece = v.placement.tensor_split()
                           ? take_part(whole, v.placement.tensor, mesh.tensor->rank(), v.placement.tensor_parts)
                           : whole;
  if (!v.placement.sharded()) {
    std::memcpy(t.raw(), piece.raw(), t.nbytes());
    return;
  }
  // This rank's flat shard, zero-padded past the end (as local_shard cuts it).
  const int64_t s = t.numel(), first = mesh.data->rank() * s, have = std::clamp<int64_t>(piece.numel() - first, 0, s);
  const size_t esize = dtype_size(t.dtype());
  std::memset(t.raw(), 0, t.nbytes());
  std::memcpy(t.raw(), static_cast<const char*>(piece.raw()) + static_cast<size_t>(first) * esize,
              static_cast<size_t>(have) * esize);
}

double node_flops(const Graph& g, const Node& n) {
  const OpDef& def = OpRegistry::get().at(n.op);
  if (!def.cost) return 0;
  std::vector<TensorType> in, out;
  for (ValueId v : n.inputs) in.push_back(g.value(v).type);
  for (ValueId v : n.outputs) out.push_back(g.value(v).type);
  return def.cost(in, out, n.attrs).flops;
}

double step_flops(const Program& p, int64_t accumulation) {
  double flops = 0;
  for (NodeId id : p.order) {
    const Node& n = p.graph.node(id);
    flops += node_flops(p.graph, n) * (n.phase == 1 ? 1.0 : static_cast<double>(accumulation));
  }
  return flops;
}

void feed(Executor& ex, const Batch& b) {
  Tensor& x = ex.tensor("x");
  Tensor& y = ex.tensor("y");
  FR_CHECK(x.nbytes() == b.x.nbytes() && y.nbytes() == b.y.nbytes() && x.dtype() == b.x.dtype(),
           "batch does not match the model's inputs");
  std::memcpy(x.raw(), b.x.raw(), x.nbytes());
  std::memcpy(y.raw(), b.y.raw(), y.nbytes());
}

double train_step(Executor& ex, Loader& loader, const RunConfig& cfg, int64_t step,
                  const std::function<void(const Node&, double)>* timer, const Node** anomaly) {
  const int64_t accum = cfg.train.grad_accumulation;
  set_scalar<float>(ex, "lr",
                    static_cast<float>(scheduled_lr(cfg.schedule, cfg.optimizer.lr, step, cfg.train.steps)));
  set_scalar<int64_t>(ex, "opt/step", step + 1);
  double loss_sum = 0.0;
  for (int64_t micro = 0; micro < accum; ++micro) {
    feed(ex, loader.next());
    set_scalar<int64_t>(ex, "opt/micro", micro);
    ex.set_step(step * accum + micro);  // the dropout streams of this micro-batch
    if (anomaly) {
      const bool scaled = ex.has_tensor("amp/loss_scale");
      *anomaly = ex.run_checked(micro == accum - 1,
                                [&](const Node& n) { return scaled && n.name.rfind("grad/", 0) == 0; });
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
