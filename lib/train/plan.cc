// Planning a layout from its compiled program: sizes of the persistent values and the arena, the ops' costs,
// and the collectives the parallel passes inserted.
#include "train/plan.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include "core/device.h"
#include "data/dataset.h"
#include "ops/registry.h"
#include "train/metrics.h"
#include "train/program.h"

namespace flowrun {

namespace {

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / 1048576.0);
  return buf;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / 1073741824.0);
  return buf;
}

}  // namespace

void count_memory(const Program& p, PlanReport& r) {
  const Graph& g = p.graph;
  for (const Value& v : g.values()) {
    const auto bytes = static_cast<double>(v.nbytes());
    if (v.kind == ValueKind::param) r.param_bytes += bytes;
    if (v.kind == ValueKind::input) r.input_bytes += bytes;
    if (v.kind == ValueKind::state)
      (v.name.rfind("opt/", 0) == 0 ? r.optimizer_state_bytes : r.other_state_bytes) += bytes;
  }
  for (const auto& [param, grad] : g.param_grads())
    r.grad_bytes += static_cast<double>(g.value(grad).nbytes());
  r.arena_bytes = static_cast<double>(p.memory.arena_bytes);
}

std::vector<CollectivePlan> plan_collectives(const Program& p, const RunConfig& cfg) {
  std::vector<CollectivePlan> out;
  const Graph& g = p.graph;
  const double ranks = static_cast<double>(cfg.parallel.data);
  const double tp = static_cast<double>(cfg.parallel.tensor);
  for (NodeId id : p.order) {
    const Node& n = g.node(id);
    const bool boxing = n.op == "sbp_all_reduce" || n.op == "sbp_all_gather" || n.op == "sbp_reduce_scatter";
    const bool tensor_axis = boxing && n.attrs.is("mesh", "tensor");
    const bool data_axis = (boxing && !tensor_axis) || n.op == "all_reduce" || n.op == "all_reduce_start" ||
                           n.op == "all_gather_into" || n.op == "reduce_scatter_shard" ||
                           n.op == "gather_shards";
    if (!data_axis && !tensor_axis) continue;
    CollectivePlan c;
    c.node = n.name;
    c.op = n.op;
    c.axis = tensor_axis ? "tensor" : "data";
    // What the collective covers: the whole tensor (the gathered output, the reduced input).
    c.tensor_bytes = static_cast<double>(
        g.value(n.op == "sbp_all_gather" || n.op == "gather_shards" ? n.outputs[0] : n.inputs[0]).nbytes());
    if (n.op == "all_reduce")
      for (size_t i = 1; i < n.inputs.size(); ++i)
        c.tensor_bytes += static_cast<double>(g.value(n.inputs[i]).nbytes());
    c.calls = n.phase == 1 ? 1.0 : static_cast<double>(cfg.train.grad_accumulation);
    if (n.op == "all_reduce_start") c.tensor_bytes = static_cast<double>(g.value(n.outputs[0]).nbytes());
    c.reduce = n.op == "all_reduce" || n.op == "all_reduce_start" || n.op == "sbp_all_reduce";
    c.group = tensor_axis ? tp : n.attrs.is("group", "ends") ? 2.0 : ranks;
    c.sent_bytes = c.calls * (c.reduce ? 2.0 : 1.0) * c.tensor_bytes * (c.group - 1) / c.group;
    out.push_back(c);
  }
  return out;
}

namespace {

// A field of /proc/self/status or /proc/meminfo ("VmSize:  123 kB"), in bytes; 0 when absent.
double proc_kb_field(const char* file, const std::string& field) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(field + ":", 0) == 0)
      return std::strtod(line.c_str() + field.size() + 1, nullptr) * 1024.0;
  return 0;
}

// A cgroup limit file's value; 0 for "max", unreadable or absent.
double cgroup_value(const std::string& path) {
  std::ifstream in(path);
  std::string v;
  if (!(in >> v) || v == "max") return 0;
  return std::strtod(v.c_str(), nullptr);
}

// Open MPI 4.1's shared-memory transport and its buffers, per process: VmRSS after MPI_Init_thread less
// before it, measured here with 2 ranks (7.8 MiB).
constexpr double kMpiProcessBytes = 8.0 * 1048576.0;

// What every run's process adds on first use beyond the parts counted: library code paged in (oneDNN's,
// HDF5's), oneDNN's generated kernels, the OpenMP threads' stacks, the compiled graph and the executor's
// tables. Measured here as the peak less every counted part: 12.1 to 15.4 MiB over the bench models (mlp,
// cnn, resnet, gpt-tiny) in one process and 10.5 to 14.3 MiB per rank under 2 (`flowrun time`).
constexpr double kRuntimeBytes = 12.0 * 1048576.0;

// What a GPU run's process adds beyond the parts counted: the CUDA context's host memory and the code of the
// runtime, cuBLASLt and cuDNN paged in. Measured once, on an H200 (CUDA 13.0, cuDNN 9, driver 580), as the
// peak less every counted part: 407 MiB in `flowrun time configs/bench/gpt2_124m.yaml` (1866 MiB in all).
constexpr double kCudaHostBytes = 407.0 * 1048576.0;

// The loader's ring (prefetch + 1 batches of `rows` samples, x and y).
double loader_bytes(const DataSpec& spec, int64_t rows, int64_t prefetch) {
  const auto sample = static_cast<double>(numel(spec.sample_shape));
  const double per_row =
      spec.text ? 2.0 * sample * sizeof(int64_t) : sample * sizeof(float) + sizeof(int64_t);
  return static_cast<double>(rows) * per_row * static_cast<double>(prefetch + 1);
}

// The kernels' library buffers outside the arena: each pool at the largest need of any node of `programs`.
double library_bytes(const std::vector<const Program*>& programs, DeviceKind device) {
  std::map<std::string, size_t> pools;
  for (const Program* p : programs) {
    if (!p) continue;
    const Graph& g = p->graph;
    for (NodeId id : p->order) {
      const Node& n = g.node(id);
      std::vector<TensorType> in, out;
      for (ValueId v : n.inputs) in.push_back(g.value(v).type);
      for (ValueId v : n.outputs) out.push_back(g.value(v).type);
      const KernelChoice k = select_kernel(OpRegistry::get().at(n.op), device, kernel_dtype(g, n));
      for (const auto& [pool, bytes] : host_buffers(k, in, out, n.attrs))
        pools[pool] = std::max(pools[pool], bytes);
    }
  }
  double total = 0;
  for (const auto& [pool, bytes] : pools) total += static_cast<double>(bytes);
  return total;
}

// The whole (unsplit, unsharded) bytes of the parameters and state a checkpoint holds, of this program's
// stage: what gathering them for a checkpoint makes.
double whole_checkpoint_bytes(const Program& p) {
  double bytes = 0;
  for (const Value& v : p.graph.values())
    if ((v.kind == ValueKind::param || v.kind == ValueKind::state) && !v.name.ends_with("/grad_acc"))
      bytes += static_cast<double>(numel(whole_shape(v))) * static_cast<double>(dtype_size(v.dtype()));
  return bytes;
}

double resident_field(const char* field) {
  return proc_kb_field("/proc/self/status", field);
}

}  // namespace

double process_baseline_bytes() {
  static const double at_start = resident_field("VmRSS");
  return at_start;
}

double peak_resident_bytes() {
  return resident_field("VmHWM");
}

Program rank0_eval_program(const RunConfig& cfg, const DataSpec& spec) {
  RunConfig whole_model = cfg;
  if (cfg.parallel.pipeline > 1) whole_model.parallel = ParallelConfig{};
  BuiltModel built;
  return compile_model(whole_model, spec, cfg.train.eval_batch_size, false, &built);
}

bool eval_owns_parameters(const RunConfig& cfg) {
  return cfg.parallel.zero == 3 || cfg.parallel.pipeline > 1;
}

ProcessMemory predict_process_memory(const Program& p, const BuiltModel& built, const Dataset& data,
                                     const RunConfig& cfg, const Program* eval) {
  ProcessMemory m;
  auto add = [&](std::string what, double bytes) {
    if (bytes <= 0) return;
    m.parts.emplace_back(std::move(what), bytes);
    m.total += bytes;
  };
  PlanReport r;
  count_memory(p, r);
  const int64_t world = cfg.parallel.data * cfg.parallel.tensor * cfg.parallel.pipeline;
  // Rank 0 is the first pipeline stage: its micro-batch slots under 1F1B each have an arena and inputs.
  const auto slots = static_cast<double>(
      cfg.parallel.pipeline > 1 ? std::min(cfg.parallel.pipeline, cfg.train.grad_accumulation) : 1);
  const DeviceKind device = device_of(cfg).kind;
  const bool host = device == DeviceKind::cpu;
  add("this binary and its libraries at start (measured)", process_baseline_bytes());
  add("runtime (libraries paged in, threads, the graph)", kRuntimeBytes);
  if (world > 1) add("MPI (Open MPI's shared-memory transport)", kMpiProcessBytes);
  add("dataset (held in memory or mapped)", static_cast<double>(data.memory_bytes()));
  const int64_t prefetch = loader_prefetch(cfg);
  double loaders = loader_bytes(data.spec(), cfg.train.micro_batch_size, prefetch);
  if (eval) loaders += loader_bytes(data.spec(), cfg.train.eval_batch_size, prefetch);
  add(eval ? "loader batches (train and evaluation)" : "loader batches", loaders);
  if (host) {
    add("parameters", r.param_bytes);
    add("optimizer and other state", r.optimizer_state_bytes + r.other_state_bytes);
    add("inputs", r.input_bytes * slots);
    // Each arena in whole 2 MiB pages where they are huge (core/device.h resident_bytes).
    add(slots > 1 ? cat("arena x ", static_cast<int64_t>(slots), " micro-batch slots") : std::string("arena"),
        static_cast<double>(resident_bytes(p.memory.arena_bytes)) * slots);
    add("oneDNN buffers (convolution scratchpad, reorders)", library_bytes({&p, eval}, device));
  } else {
    // The trainer works on host copies of the parameters and state; the device holds the rest.
    add("parameters and state (host copies of the device's)",
        r.param_bytes + r.optimizer_state_bytes + r.other_state_bytes);
    add("CUDA runtime and libraries (measured)", kCudaHostBytes);
  }
  // Open MPI's non-blocking all-reduce copies its whole message (measured: the peak grows by the message's
  // size), and the gradient buckets are all in flight by the end of the backward pass; a blocking
  // all-reduce of p ranks keeps (p - 1) / p of its message.
  if (host && world > 1) {
    double started = 0, blocking = 0;
    for (NodeId id : p.order) {
      const Node& n = p.graph.node(id);
      if (n.op == "all_reduce_start") started += static_cast<double>(p.graph.value(n.outputs[0]).nbytes());
      if (n.op == "all_reduce")
        for (ValueId v : n.inputs)
          blocking = std::max(blocking, static_cast<double>(p.graph.value(v).nbytes()));
    }
    const auto ranks = static_cast<double>(cfg.parallel.data);
    add("MPI all-reduce buffers", started + blocking * (ranks - 1) / ranks);
  }
  if (!eval) return m;
  if (host) {
    // The evaluation program shares the training program's parameters and state, except whole copies of
    // ZeRO-3's shards and, under pipeline parallelism, the lead's whole model.
    PlanReport e;
    count_memory(*eval, e);
    add("evaluation program (arena, inputs)",
        static_cast<double>(resident_bytes(eval->memory.arena_bytes)) + e.input_bytes);
    if (eval_owns_parameters(cfg))
      add("evaluation program's parameters", e.param_bytes + e.other_state_bytes);
  }
  // A checkpoint gathers every parameter and state tensor whole on the writing rank; an asynchronous one
  // copies them even when nothing is split. Sharded checkpoints write each rank's tensors in place.
  double ckpt = whole_checkpoint_bytes(p);
  if (cfg.parallel.pipeline > 1) {
    double here = 0;  // this stage's share of the model's parameters
    for (const Value& v : p.graph.values())
      if (v.kind == ValueKind::param) here += static_cast<double>(numel(whole_shape(v)));
    if (here > 0) ckpt *= static_cast<double>(built.num_params) / here;
  }
  bool split = cfg.parallel.pipeline > 1;
  for (const Value& v : p.graph.values())
    split = split || v.placement.sharded() || v.placement.tensor_split();
  const bool sharded_files = cfg.train.sharded_checkpoints && world > 1;
  if (!sharded_files && (cfg.train.async_checkpoint || split))
    add(cfg.train.async_checkpoint ? "checkpoint snapshot (asynchronous write)"
                                   : "checkpoint (gathered whole)",
        ckpt);
  return m;
}

MemoryLimit process_memory_limit() {
  MemoryLimit best;
  auto consider = [&](double bytes, const std::string& source) {
    if (bytes > 0 && (best.bytes == 0 || bytes < best.bytes)) best = {bytes, source};
  };
  for (const auto& [resource, name, mapped_field] : {std::tuple{RLIMIT_AS, "RLIMIT_AS (ulimit -v)", "VmSize"},
                                                     {RLIMIT_DATA, "RLIMIT_DATA (ulimit -d)", "VmData"}}) {
    rlimit lim{};
    if (::getrlimit(resource, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) continue;
    const auto limit = static_cast<double>(lim.rlim_cur);
    const double mapped = std::min(proc_kb_field("/proc/self/status", mapped_field), limit);
    consider(std::max(limit - mapped, 1.0),
             cat(name, " ", gib(limit), " less ", gib(mapped), " already mapped"));
  }
  // /proc/self/cgroup: "0::/path" (v2) or "N:...memory...:/path" (v1). Inside a container the path may not
  // exist below the mount (the container's own cgroup is the mount's root): the root's file is read too.
  std::ifstream cg("/proc/self/cgroup");
  for (std::string line; std::getline(cg, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const bool v2 = line.compare(0, a, "0") == 0 && controllers.empty();
    const bool v1 = (',' + controllers + ',').find(",memory,") != std::string::npos;
    if (!v2 && !v1) continue;
    const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    const std::string file = v2 ? "memory.max" : "memory.limit_in_bytes";
    for (std::filesystem::path at = line.substr(b + 1);; at = at.parent_path()) {
      const std::string path = root + (at.string() == "/" ? "" : at.string()) + "/" + file;
      consider(cgroup_value(path), cat("the cgroup's memory limit (", path, ")"));
      if (at.empty() || at == at.parent_path()) break;
    }
  }
  consider(proc_kb_field("/proc/meminfo", "MemTotal"), "MemTotal");
  return best;
}

void check_memory_fits(const Program& p, int64_t arenas, const RunConfig& cfg) {
  const MemoryLimit limit = process_memory_limit();
  if (limit.bytes <= 0) return;
  PlanReport r;
  count_memory(p, r);
  const double state = r.optimizer_state_bytes + r.other_state_bytes;
  const double need = r.param_bytes + state + r.input_bytes * static_cast<double>(arenas) +
                      r.arena_bytes * static_cast<double>(arenas);
  if (need <= limit.bytes) return;
  std::vector<const Value*> values;
  for (const Value& v : p.graph.values()) values.push_back(&v);
  const size_t top = std::min<size_t>(5, values.size());
  std::partial_sort(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(top), values.end(),
                    [](const Value* a, const Value* b) { return a->nbytes() > b->nbytes(); });
  std::string largest;
  for (size_t i = 0; i < top; ++i)
    largest += cat(i ? ", " : "", values[i]->name, " ", dtype_name(values[i]->dtype()),
                   shape_str(values[i]->shape()), " ", gib(static_cast<double>(values[i]->nbytes())));
  throw input_error(
      cat(cfg.file, ": the training step needs ", gib(need), " (", static_cast<int64_t>(need),
          " bytes: parameters ", gib(r.param_bytes), ", optimizer and other state ", gib(state), ", arena ",
          gib(r.arena_bytes), arenas > 1 ? cat(" x ", arenas, " micro-batch slots") : std::string(),
          ") but this process may use at most ", gib(limit.bytes), " (", static_cast<int64_t>(limit.bytes),
          " bytes, ", limit.source, "); the largest tensors: ", largest,
          ". Make the model or train.micro_batch_size smaller, or raise the limit"));
}

std::string replication_warning(const Program& p, const BuiltModel& built, const RunConfig& cfg) {
  const int64_t tp = cfg.parallel.tensor;
  if (tp <= 1) return "";
  double whole = 0, kept = 0;
  std::vector<std::pair<double, std::string>> largest;  // the replicated parameters, by size
  for (const Value& v : p.graph.values()) {
    if (v.kind != ValueKind::param) continue;
    const Shape& s = v.placement.tensor_split() ? v.placement.whole : v.shape();
    const double n = static_cast<double>(numel(s));
    whole += n;
    if (!v.placement.tensor_split()) {
      kept += n;
      largest.emplace_back(n, cat(v.name, " ", shape_str(s)));
    }
  }
  // Attention splits by whole heads (and key/value heads): with a head count the axis does not divide, its
  // projections are split by columns and their outputs gathered, so every rank computes every head.
  std::vector<std::string> heads;
  for (const char* key : {"n_head", "n_kv_head"})
    if (const nn::MValue* h = built.env.find(key); h && h->is_int() && h->as_int() % tp != 0)
      heads.push_back(cat("model.", key, " ", h->as_int(), " is not divisible by parallel.tensor ", tp));
  const std::string attention =
      heads.empty() ? ""
                    : cat(join(heads),
                          ": attention cannot be split by heads (every tensor rank computes every "
                          "head, on the q, k and v projections gathered whole)");
  if (whole == 0 || kept <= 0.5 * whole) return attention;
  std::sort(largest.begin(), largest.end(), std::greater<>());
  std::vector<std::string> names;
  for (size_t i = 0; i < std::min<size_t>(3, largest.size()); ++i) names.push_back(largest[i].second);
  char share[32];
  std::snprintf(share, sizeof share, "%.0f%%", 100.0 * kept / whole);
  return cat("parallel.tensor ", tp, " leaves ", share, " of the parameters (",
             with_commas(static_cast<int64_t>(kept)), " of ", with_commas(static_cast<int64_t>(whole)),
             " elements) whole on every tensor rank, largest ", join(names),
             attention.empty() ? "" : "; " + attention,
             "; parameter memory is then barely divided by the tensor axis");
}

PlanReport plan_layout(const RunConfig& cfg) {
  PlanReport r;
  r.data = cfg.parallel.data;
  r.world = cfg.parallel.data * cfg.parallel.tensor * cfg.parallel.pipeline;
  const auto data = open_dataset(cfg.data);
  BuiltModel built;
  const Program p = compile_model(cfg, data->spec(), cfg.train.micro_batch_size, true, &built);
  const Graph& g = p.graph;
  count_memory(p, r);
  const Program eval = rank0_eval_program(cfg, data->spec());
  r.process = predict_process_memory(p, built, *data, cfg, &eval);
  r.flops_per_step = step_flops(p, cfg.train.grad_accumulation);
  r.collectives = plan_collectives(p, cfg);
  for (const CollectivePlan& c : r.collectives) r.sent_bytes_per_step += c.sent_bytes;

  char buf[256];
  std::string t =
      cat("flowrun plan ", cfg.file, ": ", r.world, " process", r.world == 1 ? "" : "es", " (data ",
          cfg.parallel.data, " x tensor ", cfg.parallel.tensor, " x pipeline ", cfg.parallel.pipeline,
          ", zero ", cfg.parallel.zero, "), micro-batch ", cfg.train.micro_batch_size, " x ",
          cfg.train.grad_accumulation, " accumulation per rank, ", cfg.precision.dtype,
          cfg.train.recompute == "none" ? "" : cat(", recompute ", cfg.train.recompute), "\n\n",
          "model: ", with_commas(built.num_params), " parameters\n\n");
  if (const std::string w = replication_warning(p, built, cfg); !w.empty()) t += cat("warning: ", w, "\n\n");
  t += "memory per device\n";
  for (const auto& [what, bytes] : std::vector<std::pair<const char*, double>>{
           {"parameters", r.param_bytes},
           {"optimizer state", r.optimizer_state_bytes},
           {"other state (running statistics, loss scaler)", r.other_state_bytes},
           {"inputs", r.input_bytes},
           {"arena (activations, gradients, workspaces)", r.arena_bytes}}) {
    std::snprintf(buf, sizeof buf, "  %-48s %14.0f bytes  %s\n", what, bytes, mib(bytes).c_str());
    t += buf;
  }
  const double total =
      r.param_bytes + r.optimizer_state_bytes + r.other_state_bytes + r.input_bytes + r.arena_bytes;
  std::snprintf(buf, sizeof buf, "  %-48s %14.0f bytes  %s\n", "total", total, mib(total).c_str());
  t += buf;
  std::snprintf(buf, sizeof buf, "  (gradients, inside the arena: %s)\n\n", mib(r.grad_bytes).c_str());
  t += buf;
  t += "resident memory of a training process (rank 0), predicted peak\n";
  for (const auto& [what, bytes] : r.process.parts) {
    std::snprintf(buf, sizeof buf, "  %-52s %12s\n", what.c_str(), mib(bytes).c_str());
    t += buf;
  }
  std::snprintf(buf, sizeof buf, "  %-52s %12s\n\ncompute per device: %.3f GFLOP per step\n", "total",
                mib(r.process.total).c_str(), r.flops_per_step * 1e-9);
  t += buf;
  if (r.collectives.empty()) {
    t += "collectives: none\n";
  } else {
    // One line per op and pass (ZeRO gathers every parameter on its own, a 7B model has 226 gradient buckets:
    // one line for all of them).
    t += "collectives per device per step\n";
    std::vector<std::pair<std::string, CollectivePlan>> lines;
    for (const CollectivePlan& c : r.collectives) {
      const std::string key = c.op == "all_gather_into"        ? "zero/*/gather"
                              : c.op == "reduce_scatter_shard" ? "gradient shards (ZeRO-2/3)"
                              : c.op == "gather_shards"        ? "parameters (ZeRO-3: forward, backward)"
                              : c.op == "all_reduce_start"     ? "gradient buckets"
                              : c.op.rfind("sbp_", 0) == 0     ? cat(c.axis, " axis boxing")
                                                               : c.node;
      auto it = std::find_if(lines.begin(), lines.end(),
                             [&](const auto& l) { return l.first == key && l.second.op == c.op; });
      if (it == lines.end()) {
        lines.push_back({key, c});
        continue;
      }
      it->second.tensor_bytes += c.tensor_bytes;
      it->second.sent_bytes += c.sent_bytes;
      it->second.calls += c.calls;
    }
    for (const auto& [key, c] : lines) {
      std::snprintf(buf, sizeof buf, "  %-16s %-28s %12.0f bytes in %g calls: %12.0f bytes sent\n",
                    c.op.c_str(), key.c_str(), c.tensor_bytes, c.calls, c.sent_bytes);
      t += buf;
    }
    std::snprintf(buf, sizeof buf, "  total sent %s per step\n", mib(r.sent_bytes_per_step).c_str());
    t += buf;
  }
  if (cfg.parallel.pipeline > 1) {
    // Stage 0 of the pipeline: what it holds at once under 1F1B, and what it sends to stage 1.
    const int64_t m = cfg.train.grad_accumulation, slots = std::min(cfg.parallel.pipeline, m);
    const double act = static_cast<double>(g.value(g.outputs().at("pp/out")).nbytes());
    std::snprintf(
        buf, sizeof buf,
        "pipeline stage 0 of %lld: %lld micro-batch slots (arena %s each, 1F1B), sends %lld activations "
        "of %.0f bytes per step and receives as many gradients\n",
        static_cast<long long>(cfg.parallel.pipeline), static_cast<long long>(slots),
        mib(r.arena_bytes).c_str(), static_cast<long long>(m), act);
    t += buf;
  }
  if (cfg.parallel.tensor > 1) {
    t += "\nparameters on the tensor axis (whole shape, SBP)\n";
    for (const Value& v : g.values())
      if (v.kind == ValueKind::param)
        t += cat("  ", v.name, " ", shape_str(v.placement.tensor_split() ? v.placement.whole : v.shape()),
                 " ", v.placement.tensor.str(), "\n");
  }
  r.table = t;
  JsonLine j;
  j.add("world", r.world)
      .add("num_params", built.num_params)
      .add("param_bytes", r.param_bytes)
      .add("grad_bytes", r.grad_bytes)
      .add("optimizer_state_bytes", r.optimizer_state_bytes)
      .add("other_state_bytes", r.other_state_bytes)
      .add("arena_bytes", r.arena_bytes)
      .add("flops_per_step", r.flops_per_step)
      .add("sent_bytes_per_step", r.sent_bytes_per_step)
      .add("predicted_peak_rss_bytes", r.process.total);
  r.json = j.str();
  return r;
}

}  // namespace flowrun
