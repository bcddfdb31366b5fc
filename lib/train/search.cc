// Layout search: every candidate layout is compiled (the program rank 0 would run) and its step time
// predicted from the program's own per-kernel FLOPs and bytes and its collectives against a machine profile;
// memory is `flowrun plan`'s. A model with `n_layer` is compiled with one and two layers per pipeline stage
// and its costs extended linearly to its depth (every layer-dependent cost is a per-layer sum), so a 48-layer
// model on 1024 devices is searched in seconds.
#include "train/search.h"

#include <omp.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "data/dataset.h"
#include "graph/builder.h"
#include "graph/passes.h"
#include "ops/registry.h"
#include "parallel/comm.h"
#include "runtime/executor.h"
#include "train/metrics.h"
#include "train/plan.h"
#include "train/program.h"

namespace flowrun {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string gib(double bytes) {
  return fmt("%.2f GiB", bytes / 1073741824.0);
}

// Memory in the search's table: MiB below 4 GiB (CPU processes), GiB above (devices).
std::string mem(double bytes) {
  return bytes < 4.0 * 1073741824.0 ? fmt("%.1f MiB", bytes / 1048576.0) : gib(bytes);
}

std::string ms(double seconds) {
  return fmt(seconds < 0.01 ? "%.3f ms" : seconds < 1 ? "%.1f ms" : "%.0f ms", seconds * 1e3);
}

// ---- machine profiles ----

double number_at(const YAML::Node& root, const std::string& key, const std::string& file, bool required) {
  YAML::Node n;
  n.reset(root);  // reset, not =: assigning a yaml-cpp node overwrites the node it refers to
  std::istringstream parts(key);
  for (std::string part; std::getline(parts, part, '.');) {
    if (!n.IsMap() || !n[part]) {
      if (!required) return 0;
      throw input_error(cat(file, ":", n.Mark().line + 1, ": machine profile: missing key ", key));
    }
    n.reset(n[part]);
  }
  try {
    if (n.IsScalar()) {
      const std::string text = n.as<std::string>();
      if (key == "device_memory") return parse_bytes(text, cat(file, ":", n.Mark().line + 1, ": ", key));
      size_t used = 0;
      const double v = std::stod(text, &used);
      if (used == text.size() && std::isfinite(v) && v >= 0) return v;
    }
  } catch (const std::exception&) {
  }
  throw input_error(cat(file, ":", n.Mark().line + 1, ":", n.Mark().column + 1, ": machine profile: ", key,
                        " must be a non-negative number"));
}

}  // namespace

double MachineProfile::flops(DType t) const {
  if (t == DType::bf16 && flops_bf16 > 0) return flops_bf16;
  if (t == DType::f16 && flops_fp16 > 0) return flops_fp16;
  return flops_fp32;
}

double parse_bytes(const std::string& text, const std::string& what) {
  static const std::vector<std::pair<std::string, double>> units = {{"TiB", 1099511627776.0},
                                                                    {"GiB", 1073741824.0},
                                                                    {"MiB", 1048576.0},
                                                                    {"KiB", 1024.0},
                                                                    {"TB", 1e12},
                                                                    {"GB", 1e9},
                                                                    {"MB", 1e6},
                                                                    {"KB", 1e3},
                                                                    {"B", 1.0}};
  double scale = 1;
  std::string number = text;
  for (const auto& [unit, factor] : units)
    if (text.size() > unit.size() && text.ends_with(unit)) {
      number = text.substr(0, text.size() - unit.size());
      scale = factor;
      break;
    }
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(number, &used);
  } catch (const std::exception&) {
  }
  if (used != number.size() || !(v > 0) || !std::isfinite(v))
    throw input_error(
        cat(what, ": '", text, "' is not a size (e.g. 2GiB, 512MiB, 80GB or a number of bytes)"));
  return v * scale;
}

MachineProfile load_machine_profile(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw input_error(cat(path, ": cannot read the machine profile"));
  } catch (const YAML::Exception& e) {
    throw input_error(cat(path, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg));
  }
  if (!root.IsMap()) throw input_error(cat(path, ": a machine profile is a YAML map of keys"));
  static const std::vector<std::string> known = {"name",
                                                 "device",
                                                 "devices_per_node",
                                                 "device_memory",
                                                 "gemm_flops",
                                                 "memory_bandwidth",
                                                 "op_overhead",
                                                 "overlap_gradients",
                                                 "intra_node",
                                                 "inter_node",
                                                 "cache"};
  for (const auto& kv : root) {
    const std::string k = kv.first.as<std::string>();
    if (std::find(known.begin(), known.end(), k) == known.end())
      throw input_error(cat(path, ":", kv.first.Mark().line + 1, ": machine profile: unknown key ", k,
                            " (the keys: ", join(known), ")"));
  }
  MachineProfile m;
  m.file = path;
  m.name = root["name"] ? root["name"].as<std::string>() : path;
  m.device = root["device"] ? root["device"].as<std::string>() : "cpu";
  if (m.device != "cpu" && m.device != "cuda")
    throw input_error(cat(path, ":", root["device"].Mark().line + 1,
                          ": machine profile: device is cpu or cuda, not ", m.device));
  m.devices_per_node = static_cast<int64_t>(number_at(root, "devices_per_node", path, true));
  if (m.devices_per_node < 1)
    throw input_error(cat(path, ":", root["devices_per_node"].Mark().line + 1,
                          ": machine profile: devices_per_node must be at least 1"));
  m.device_memory = number_at(root, "device_memory", path, true);
  m.flops_fp32 = number_at(root, "gemm_flops.fp32", path, true);
  m.flops_bf16 = number_at(root, "gemm_flops.bf16", path, false);
  m.flops_fp16 = number_at(root, "gemm_flops.fp16", path, false);
  m.memory_bandwidth = number_at(root, "memory_bandwidth", path, true);
  m.op_overhead = number_at(root, "op_overhead", path, false);
  m.cache_bytes = number_at(root, "cache.bytes", path, false);
  m.cache_bandwidth = number_at(root, "cache.bandwidth", path, false);
  if (const YAML::Node o = root["overlap_gradients"]) {
    if (!o.IsScalar() || (o.as<std::string>() != "true" && o.as<std::string>() != "false"))
      throw input_error(
          cat(path, ":", o.Mark().line + 1, ": machine profile: overlap_gradients is true or false"));
    m.overlap_gradients = o.as<std::string>() == "true";
  }
  m.intra_node = {number_at(root, "intra_node.bandwidth", path, true),
                  number_at(root, "intra_node.latency", path, true),
                  number_at(root, "intra_node.started_bandwidth", path, false)};
  m.inter_node = {number_at(root, "inter_node.bandwidth", path, true),
                  number_at(root, "inter_node.latency", path, true),
                  number_at(root, "inter_node.started_bandwidth", path, false)};
  for (const auto& [key, v] :
       std::vector<std::pair<const char*, double>>{{"gemm_flops.fp32", m.flops_fp32},
                                                   {"memory_bandwidth", m.memory_bandwidth},
                                                   {"intra_node.bandwidth", m.intra_node.bandwidth},
                                                   {"inter_node.bandwidth", m.inter_node.bandwidth}})
    if (!(v > 0)) throw input_error(cat(path, ": machine profile: ", key, " must be positive"));
  return m;
}

namespace {
std::string link_yaml(const MachineProfile::Link& l) {
  return cat("{bandwidth: ", fmt("%.4g", l.bandwidth), ", latency: ", fmt("%.4g", l.latency),
             l.started_bandwidth > 0 ? cat(", started_bandwidth: ", fmt("%.4g", l.started_bandwidth)) : "",
             "}");
}
}  // namespace

std::string machine_profile_yaml(const MachineProfile& m, const std::string& comment) {
  std::ostringstream os;
  os << comment << "name: " << m.name << "\ndevice: " << m.device
     << "\ndevices_per_node: " << m.devices_per_node << "\ndevice_memory: " << fmt("%.0f", m.device_memory)
     << "  # bytes\n"
     << "gemm_flops: {fp32: " << fmt("%.4g", m.flops_fp32) << ", bf16: " << fmt("%.4g", m.flops_bf16)
     << ", fp16: " << fmt("%.4g", m.flops_fp16) << "}  # FLOP/s per device\n"
     << "memory_bandwidth: " << fmt("%.4g", m.memory_bandwidth) << "  # bytes/s read + written\n"
     << "cache: {bytes: " << fmt("%.0f", m.cache_bytes) << ", bandwidth: " << fmt("%.4g", m.cache_bandwidth)
     << "}  # an op moving at most `bytes` runs at this bandwidth\n"
     << "op_overhead: " << fmt("%.4g", m.op_overhead) << "  # seconds per kernel\n"
     << "overlap_gradients: " << (m.overlap_gradients ? "true" : "false")
     << "  # the gradient all-reduce runs during the backward pass\n"
     << "intra_node: " << link_yaml(m.intra_node) << "  # bytes/s a rank sends; s per ring step\n"
     << "inter_node: " << link_yaml(m.inter_node) << "\n";
  return os.str();
}

namespace {

// ---- the cost of one layout ----

// What a compiled layout costs rank 0, every field a sum over the program's nodes or values, so that two
// depths extend linearly to a third.
struct Costs {
  double micro = 0;    // kernels of one micro-batch (phase 0)
  double update = 0;   // kernels of the update (phase 1)
  double tensor = 0;   // tensor-axis collectives per step
  double data = 0;     // data-axis collectives per step
  double buckets = 0;  // of which the gradient buckets, started during the backward pass
  double hop = 0;      // one activation's transfer between stages
  double memory = 0;   // what the profile's memory bounds: the device's tensors, or the process
  std::vector<double*> fields() { return {&micro, &update, &tensor, &data, &buckets, &hop, &memory}; }
};

Costs extend(Costs a, Costs b, double from, double to, double at) {
  // a at depth `from`, b at depth `to`: each field at depth `at`.
  Costs out;
  auto fa = a.fields(), fb = b.fields(), fo = out.fields();
  for (size_t i = 0; i < fo.size(); ++i) *fo[i] = *fa[i] + (*fb[i] - *fa[i]) * (at - from) / (to - from);
  return out;
}

bool is_collective(const std::string& op) {
  return op == "sbp_all_reduce" || op == "sbp_all_gather" || op == "sbp_reduce_scatter" ||
         op == "all_reduce" || op == "all_reduce_start" || op == "all_reduce_wait" ||
         op == "all_gather_into" || op == "reduce_scatter_shard" || op == "gather_shards";
}

// The link an axis's ranks use: the mesh is pipeline-major, then data, then tensor (comm.h), so the tensor
// axis spans `tensor` adjacent ranks, the data axis data x tensor, the pipeline all of them.
const MachineProfile::Link& link(const MachineProfile& m, int64_t span) {
  return span <= m.devices_per_node ? m.intra_node : m.inter_node;
}

double collective_seconds(const CollectivePlan& c, const MachineProfile::Link& l) {
  const double steps = c.calls * (c.reduce ? 2.0 : 1.0) * (c.group - 1);
  const bool started = c.op == "all_reduce_start" && l.started_bandwidth > 0;
  return steps * l.latency + c.sent_bytes / (started ? l.started_bandwidth : l.bandwidth);
}

Costs measure(const RunConfig& cfg, const Dataset& data, const MachineProfile& m) {
  BuiltModel built;
  const Program p = compile_model(cfg, data.spec(), cfg.train.micro_batch_size, true, &built);
  const Graph& g = p.graph;
  Costs c;
  for (NodeId id : p.order) {
    const Node& n = g.node(id);
    if (is_collective(n.op) || !OpRegistry::get().at(n.op).cost) continue;
    const Cost k = node_cost(g, n);
    const double t =
        std::max(k.flops / m.flops(kernel_dtype(g, n)), k.bytes / m.bandwidth(k.bytes)) + m.op_overhead;
    (n.phase == 1 ? c.update : c.micro) += t;
  }
  const int64_t t = cfg.parallel.tensor, d = cfg.parallel.data;
  for (const CollectivePlan& cp : plan_collectives(p, cfg)) {
    if (cp.axis == "tensor")
      c.tensor += collective_seconds(cp, link(m, t));
    else {
      // A two-rank group under a pipeline is its ends (first and last stage, tied embeddings): every rank
      // lies between them.
      const double s = collective_seconds(
          cp, link(m, cp.group == 2 && cfg.parallel.pipeline > 1 ? d * t * cfg.parallel.pipeline : d * t));
      c.data += s;
      if (cp.op == "all_reduce_start") c.buckets += s;
    }
  }
  if (cfg.parallel.pipeline > 1) {
    const double act = static_cast<double>(g.value(g.outputs().at("pp/out")).nbytes());
    const MachineProfile::Link& l = link(m, d * t * cfg.parallel.pipeline);
    c.hop = l.latency + act / l.bandwidth;
  }
  PlanReport r;
  count_memory(p, r);
  const auto slots = static_cast<double>(
      cfg.parallel.pipeline > 1 ? std::min(cfg.parallel.pipeline, cfg.train.grad_accumulation) : 1);
  // A training run also holds its evaluation program (the lead's whole model under a pipeline), as `flowrun
  // plan` counts it.
  const Program eval = rank0_eval_program(cfg, data.spec());
  PlanReport e;
  count_memory(eval, e);
  const bool own = eval_owns_parameters(cfg);
  const double state = r.optimizer_state_bytes + r.other_state_bytes;
  c.memory = m.device == "cuda" ? r.param_bytes + state + (r.input_bytes + r.arena_bytes) * slots +
                                      e.arena_bytes + e.input_bytes + (own ? e.param_bytes : 0.0)
                                : predict_process_memory(p, built, data, cfg, &eval).total;
  return c;
}

StepTime step_time(const Costs& c, const RunConfig& cfg, bool overlap) {
  const auto mb = static_cast<double>(cfg.train.grad_accumulation);
  const auto stages = static_cast<double>(cfg.parallel.pipeline);
  // 1F1B: m micro-batches through p stages take m + p - 1 slots of one micro-batch's forward and backward;
  // the tensor axis's collectives sit inside each micro-batch.
  const double tensor_per_micro = c.tensor / mb;
  StepTime s;
  s.compute = mb * c.micro + c.update;
  s.tensor = c.tensor;
  s.bubble = (stages - 1) * (c.micro + tensor_per_micro);
  // Where the transport progresses on its own (NCCL), the gradient buckets' all-reduce runs during the last
  // micro-batch's backward pass (about two thirds of its kernels); MPI on CPUs progresses only inside calls.
  s.data = c.data - (overlap ? std::min(c.buckets, 2.0 / 3.0 * c.micro) : 0.0);
  s.pipeline = stages > 1 ? 2.0 * (mb + stages - 1) * c.hop : 0;
  return s;
}

// The model's depth key, when it has one (the zoo's gpt, llama, bert): compiled at two and three layers per
// stage and extended (layout_costs).
std::optional<int64_t> depth_of(const RunConfig& cfg) {
  const YAML::Node params = cfg.resolved["model"]["params"];
  if (!params || !params.IsMap() || !params["n_layer"]) return std::nullopt;
  try {
    return params["n_layer"].as<int64_t>();
  } catch (const YAML::Exception&) {
    return std::nullopt;
  }
}

// A layout's costs: compiled whole when `exact`, else (a model with `n_layer` more than 3 layers per stage)
// extended from 2 and 3 layers per stage. At 1 layer per stage the embedding and head dominate the first
// stage and its arena is not yet on the line (GPT-2 1.5B, 8 stages: 2 and 3 per stage extend to 6 within 6%).
Costs layout_costs(const std::string& file, std::vector<std::string> sets, const Dataset& data,
                   const MachineProfile& m, bool exact, int* compiles) {
  const RunConfig cfg = load_config(file, sets);
  const int64_t stages = cfg.parallel.pipeline;
  const std::optional<int64_t> depth = depth_of(cfg);
  if (exact || !depth || *depth % stages != 0 || *depth <= 3 * stages) {
    ++*compiles;
    return measure(cfg, data, m);
  }
  sets.push_back(cat("model.n_layer=", 2 * stages));
  const Costs two = measure(load_config(file, sets), data, m);
  sets.back() = cat("model.n_layer=", 3 * stages);
  const Costs three = measure(load_config(file, sets), data, m);
  *compiles += 2;
  return extend(two, three, 2.0, 3.0, static_cast<double>(*depth / stages));
}

struct Candidate {
  int64_t data = 1, tensor = 1, pipeline = 1, micro = 1, zero = 0;
  std::string recompute = "none";
  std::vector<std::string> sets() const {
    std::vector<std::string> s = {cat("parallel.data=", data),           cat("parallel.tensor=", tensor),
                                  cat("parallel.pipeline=", pipeline),   cat("parallel.zero=", zero),
                                  cat("train.recompute=", recompute),    "train.micro_batch_size=0",
                                  cat("train.grad_accumulation=", micro)};
    s.push_back(cat("parallel.micro_batches=", pipeline > 1 ? micro : 1));
    return s;
  }
  std::string family() const { return cat("tensor ", tensor, " x pipeline ", pipeline); }
  std::string str() const {
    return cat("data ", data, " x tensor ", tensor, " x pipeline ", pipeline, ", ", micro, " micro-batch",
               micro == 1 ? "" : "es", ", ZeRO-", zero, ", recompute ", recompute);
  }
};

struct Scored {
  Candidate c;
  Costs costs;
  StepTime time;
  bool fits = false;
};

// The term that costs the most, for the rejected families' reasons.
std::string largest_term(const StepTime& s) {
  const std::vector<std::pair<double, const char*>> terms = {{s.compute, "compute"},
                                                             {s.bubble, "the pipeline bubble"},
                                                             {s.tensor, "tensor-axis collectives"},
                                                             {s.data, "data-axis collectives"},
                                                             {s.pipeline, "transfers between stages"}};
  return std::max_element(terms.begin(), terms.end())->second;
}

// f(i) for i in [0, n) on the machine's cores (OpenMP's thread count); adds the compiles each reports to
// `*compiles`. The first exception is rethrown once all are done.
void parallel_for(size_t n, const std::function<int(size_t)>& f, int* compiles) {
  std::atomic<size_t> next{0};
  std::atomic<int> total{0};
  std::mutex mu;
  std::exception_ptr error;
  const auto work = [&] {
    for (size_t i; (i = next++) < n;) {
      try {
        total += f(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> threads;
  const int count = std::max(1, std::min(omp_get_max_threads(), static_cast<int>(n)));
  for (int t = 1; t < count; ++t) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  *compiles += total;
  if (error) std::rethrow_exception(error);
}

std::string default_machine(const RunConfig& cfg) {
  return cat(FLOWRUN_MACHINES_DIR, "/",
             cfg.train.device == "cuda" ? "h100-sxm-8x-ib400.yaml" : "cpu-2core.yaml");
}

}  // namespace

std::string describe_step_time(const RunConfig& cfg, const MachineProfile& m, double* seconds) {
  const auto data = open_dataset(cfg.data);
  const StepTime s = step_time(measure(cfg, *data, m), cfg, m.overlap_gradients);
  if (seconds) *seconds = s.total();
  return cat("step time on ", m.name, " (", m.file, "), predicted: ", ms(s.total()), " (compute ",
             ms(s.compute), ", pipeline bubble ", ms(s.bubble), ", tensor axis ", ms(s.tensor),
             ", data axis ", ms(s.data), ", between stages ", ms(s.pipeline), ")\n");
}

std::string search_layouts(const std::string& file, const std::vector<std::string>& overrides,
                           const SearchOptions& o) {
  const auto t0 = Clock::now();
  const RunConfig base = load_config(file, overrides);
  const MachineProfile m = load_machine_profile(o.machine.empty() ? default_machine(base) : o.machine);
  const double limit = o.memory > 0 ? o.memory : m.device_memory;
  const int64_t world = o.world;
  if (world < 1) throw input_error("plan --search: --world-size N is required");
  const auto data = open_dataset(base.data);
  const int64_t batch = base.train.batch_size;
  const std::optional<int64_t> depth = depth_of(base);

  // The candidates: powers of two for the tensor axis (within a node) and the pipeline (up to the depth),
  // the data axis filling the world; micro-batches per step; every ZeRO stage the data axis allows; with and
  // without recomputing the blocks.
  std::vector<Candidate> candidates;
  for (int64_t t = 1; t <= std::min<int64_t>(world, std::max<int64_t>(m.devices_per_node, 1)); t *= 2)
    for (int64_t p = 1; t * p <= world && (!depth || p <= *depth); p *= 2) {
      if (world % (t * p) != 0) continue;
      const int64_t d = world / (t * p);
      if (batch % d != 0) continue;
      const int64_t per_rank = batch / d;
      // Micro-batches: a few steps of 4 (of 2 under a pipeline), and micro-batches of one sample, the least
      // memory the layout can have.
      std::vector<int64_t> micros;
      for (int64_t k :
           p > 1 ? std::vector<int64_t>{p, 2 * p, 4 * p, per_rank} : std::vector<int64_t>{1, 4, 16, per_rank})
        if (k <= per_rank && per_rank % k == 0 && k % p == 0 &&
            std::find(micros.begin(), micros.end(), k) == micros.end())
          micros.push_back(k);
      for (int64_t mb : micros)
        for (int64_t z = 0; z <= (d > 1 ? 3 : 0); ++z)
          for (const char* rc : {"none", "blocks"}) candidates.push_back({d, t, p, mb, z, rc});
    }

  std::vector<Scored> scored;
  std::map<std::string, std::string> invalid;  // family -> why its layouts could not be compiled
  int compiles = 0, exact = 0;
  auto score = [&](Scored& s, bool whole, int* n) {
    std::vector<std::string> sets = overrides;
    for (const std::string& x : s.c.sets()) sets.push_back(x);
    s.costs = layout_costs(file, sets, *data, m, whole, n);
    s.time = step_time(s.costs, load_config(file, sets), m.overlap_gradients);
    s.fits = limit <= 0 || s.costs.memory <= limit;
  };
  // Every candidate compiles on its own: the threads of this process take them in turn.
  std::vector<std::optional<Scored>> results(candidates.size());
  std::vector<std::string> why(candidates.size());
  parallel_for(
      candidates.size(),
      [&](size_t i) {
        Scored s{candidates[i], {}, {}, false};
        int n = 0;
        try {
          score(s, false, &n);
          results[i] = s;
        } catch (const Error& e) {
          if (e.code() != ExitCode::bad_input) throw;
          why[i] = e.what();
        }
        return n;
      },
      &compiles);
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (results[i]) scored.push_back(*results[i]);
    if (!why[i].empty()) invalid.emplace(candidates[i].family(), why[i]);
  }
  auto by_time = [](const Scored* a, const Scored* b) { return a->time.total() < b->time.total(); };
  auto ranked = [&] {
    std::vector<Scored*> fit;
    for (Scored& s : scored)
      if (s.fits) fit.push_back(&s);
    std::sort(fit.begin(), fit.end(), by_time);
    return fit;
  };
  // What the report shows is compiled whole: the leaders, each family's fastest layout, and the smallest of
  // a family where nothing fits.
  if (depth) {
    std::vector<Scored*> shown = ranked();
    shown.resize(std::min<size_t>(shown.size(), static_cast<size_t>(std::max<int64_t>(o.top, 1) + 2)));
    std::map<std::string, std::pair<Scored*, Scored*>> best;  // family -> (fastest fitting, smallest)
    for (Scored& s : scored) {
      auto& [fast, small] = best[s.c.family()];
      if (s.fits && (!fast || s.time.total() < fast->time.total())) fast = &s;
      if (!small || s.costs.memory < small->costs.memory) small = &s;
    }
    for (const auto& [family, pair] : best)
      if (Scored* s = pair.first ? pair.first : pair.second;
          std::find(shown.begin(), shown.end(), s) == shown.end())
        shown.push_back(s);
    parallel_for(
        shown.size(),
        [&](size_t i) {
          int n = 0;
          score(*shown[i], true, &n);
          return n;
        },
        &compiles);
    exact = static_cast<int>(shown.size());
  }
  const double took = seconds_since(t0);
  const std::vector<Scored*> fit = ranked();

  std::ostringstream os;
  os << "flowrun plan --search " << file << ": " << world << " device" << (world == 1 ? "" : "s") << " of "
     << m.name << " (" << m.file << "), memory per device " << gib(limit) << ", global batch " << batch
     << "\n";
  os << "searched " << scored.size() << " layouts in " << fmt("%.1f s", took) << " (" << compiles
     << " programs compiled"
     << (depth ? cat("; depth ", *depth, " extended from 2 and 3 layers per stage, then the ", exact,
                     " layouts below compiled whole")
               : std::string())
     << "); " << scored.size() - fit.size() << " do not fit\n\n";
  if (fit.empty()) {
    double least = 0;
    const Scored* smallest = nullptr;
    for (const Scored& s : scored)
      if (!smallest || s.costs.memory < least) smallest = &s, least = s.costs.memory;
    throw input_error(cat("plan --search: no layout of ", world, " devices fits in ", gib(limit),
                          smallest
                              ? cat(" per device: the smallest, ", smallest->c.str(), ", needs ", mem(least))
                              : std::string(),
                          invalid.empty() ? std::string() : cat(" (", invalid.begin()->second, ")")));
  }
  char line[320];
  std::snprintf(line, sizeof line, "%-4s %5s %6s %8s %6s %4s %9s %11s %10s  %s\n", "rank", "data", "tensor",
                "pipeline", "micro", "zero", "recompute", "step", "memory",
                "compute / bubble / tensor / data / stages");
  os << line;
  const double best = fit.front()->time.total();
  for (size_t i = 0; i < fit.size() && static_cast<int64_t>(i) < std::max<int64_t>(o.top, 1); ++i) {
    const Scored& s = *fit[i];
    const StepTime& t = s.time;
    std::snprintf(line, sizeof line,
                  "%-4zu %5lld %6lld %8lld %6lld %4lld %9s %11s %10s  %.0f / %.0f / %.0f / %.0f / %.0f%%\n",
                  i + 1, static_cast<long long>(s.c.data), static_cast<long long>(s.c.tensor),
                  static_cast<long long>(s.c.pipeline), static_cast<long long>(s.c.micro),
                  static_cast<long long>(s.c.zero), s.c.recompute.c_str(), ms(t.total()).c_str(),
                  mem(s.costs.memory).c_str(), 100 * t.compute / t.total(), 100 * t.bubble / t.total(),
                  100 * t.tensor / t.total(), 100 * t.data / t.total(), 100 * t.pipeline / t.total());
    os << line;
  }
  // Each family (tensor x pipeline) the winner's is not: why it lost.
  std::map<std::string, std::vector<const Scored*>> families;
  for (const Scored& s : scored) families[s.c.family()].push_back(&s);
  os << "\nper family (tensor x pipeline): its best layout, or why none\n";
  const std::string winner = fit.front()->c.family();
  for (const auto& [family, members] : families) {
    const Scored* fastest = nullptr;
    const Scored* smallest = nullptr;
    for (const Scored* s : members) {
      if (s->fits && (!fastest || s->time.total() < fastest->time.total())) fastest = s;
      if (!smallest || s->costs.memory < smallest->costs.memory) smallest = s;
    }
    os << "  " << family << ": ";
    if (!fastest)
      os << "nothing fits: the smallest (" << smallest->c.str() << ") needs " << mem(smallest->costs.memory)
         << "\n";
    else if (family == winner)
      os << "the winner, " << ms(fastest->time.total()) << "\n";
    else
      os << ms(fastest->time.total()) << ", " << fmt("%.2fx", fastest->time.total() / best)
         << " the winner's; most of it " << largest_term(fastest->time) << " ("
         << ms(std::max({fastest->time.compute, fastest->time.bubble, fastest->time.tensor,
                         fastest->time.data, fastest->time.pipeline}))
         << ")\n";
  }
  for (const auto& [family, why] : invalid)
    if (!families.count(family)) os << "  " << family << ": cannot be built: " << why << "\n";

  const Candidate& w = fit.front()->c;
  os << "\nchoice: " << w.str() << ": " << ms(best) << " per step predicted, "
     << mem(fit.front()->costs.memory) << " per device\n";
  if (!o.write_config.empty()) {
    std::vector<std::string> sets = overrides;
    for (const std::string& s : w.sets()) sets.push_back(s);
    const std::string text = dump_config(load_config(file, sets));
    const std::string tmp = o.write_config + ".tmp";
    {
      std::ofstream out(tmp);
      out << "# flowrun plan --search's choice for " << world << " devices of " << m.name << " (from " << file
          << ")\n"
          << text;
      out.close();
      if (!out) throw input_error(cat("--write-config: cannot write ", tmp));
    }
    if (std::rename(tmp.c_str(), o.write_config.c_str()) != 0)
      throw input_error(cat("--write-config: cannot rename ", tmp, " to ", o.write_config));
    os << "wrote " << o.write_config << "\n";
  }
  return os.str();
}

namespace {

// The median seconds of `run` over `reps` runs after one untimed, the slowest rank's (every rank runs at
// once, sharing the machine as training does).
double timed(Communicator& world, int reps, const std::function<void()>& run) {
  run();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    world.barrier();  // every rank runs at once, each time
    const auto t0 = Clock::now();
    run();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  double median = t[t.size() / 2];
  world.all_reduce(&median, 1, DType::f64, ReduceOp::max);
  return median;
}

// An executor running one graph built by `build` (inputs filled with ones).
std::unique_ptr<Executor> program_of(const std::function<void(Graph&, GraphBuilder&)>& build) {
  Graph g;
  GraphBuilder b(g);
  build(g, b);
  CompileOptions opts;
  opts.loss = "";
  auto ex = std::make_unique<Executor>(compile(std::move(g), opts), Device{DeviceKind::cpu, 0}, 1);
  for (const Value& v : ex->program().graph.values())
    if (v.kind == ValueKind::input) {
      Tensor& t = ex->tensor(v.name);
      t.fill_from(std::vector<double>(static_cast<size_t>(t.numel()), 1.0));
    }
  return ex;
}

double gemm_flops(Communicator& world, DType t) {
  const int64_t n = 1024;
  auto ex = program_of([&](Graph& g, GraphBuilder& b) {
    g.mark_output("y", b.op1("matmul", {g.add_input("a", {n, n}, t), g.add_input("b", {n, n}, t)}, {}));
  });
  return 2.0 * static_cast<double>(n * n * n) / timed(world, 5, [&] { ex->run(); });
}

}  // namespace

std::string calibrate_machine(const std::string& out, int64_t threads) {
  if (threads > 0) omp_set_num_threads(static_cast<int>(threads));
  const LaunchInfo launch = detect_launch();
  const std::shared_ptr<Communicator> world = world_communicator(launch);
  MachineProfile m;
  m.file = out;
  // Devices per node: the ranks that share this host's name.
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const auto mine = static_cast<int64_t>(std::hash<std::string>{}(host) >> 1);
  std::vector<int64_t> hosts(static_cast<size_t>(world->size()));
  world->all_gather(&mine, hosts.data(), 1, DType::i64);
  m.devices_per_node = std::count(hosts.begin(), hosts.end(), mine);
  m.name = cat(host, ", ", m.devices_per_node, " rank", m.devices_per_node == 1 ? "" : "s", " of ",
               omp_get_max_threads(), " thread", omp_get_max_threads() == 1 ? "" : "s");
  m.device = "cpu";
  m.device_memory = process_memory_limit().bytes / static_cast<double>(m.devices_per_node);
  m.flops_fp32 = gemm_flops(*world, DType::f32);
  m.flops_bf16 = gemm_flops(*world, DType::bf16);
  m.flops_fp16 = gemm_flops(*world, DType::f16);
  // Bandwidth: an add reads two arrays and writes one; over 32 MiB arrays (memory), and over arrays that
  // together fill half of a core's L2 (cache), timed over many runs.
  auto add_bandwidth = [&](int64_t n, int reps) {
    auto add = program_of([&](Graph& g, GraphBuilder& b) {
      g.mark_output("y",
                    b.op1("add", {g.add_input("a", {n}, DType::f32), g.add_input("b", {n}, DType::f32)}, {}));
    });
    return 3.0 * static_cast<double>(n) * sizeof(float) * reps / timed(*world, 5, [&] {
             for (int i = 0; i < reps; ++i) add->run();
           });
  };
  m.memory_bandwidth = add_bandwidth(8 << 20, 4);
  const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
  m.cache_bytes = static_cast<double>(l2 > 0 ? l2 : 1 << 20);
  m.cache_bandwidth = add_bandwidth(static_cast<int64_t>(m.cache_bytes / 2 / 3 / sizeof(float)), 200);
  // The cost of a kernel beyond its work: a chain of 200 one-element adds.
  const int chain = 200;
  auto tiny = program_of([&](Graph& g, GraphBuilder& b) {
    ValueId v = g.add_input("a", {1}, DType::f32);
    const ValueId one = g.add_input("b", {1}, DType::f32);
    for (int i = 0; i < chain; ++i) v = b.op1("add", {v, one}, {});
    g.mark_output("y", v);
  });
  m.op_overhead = timed(*world, 20, [&] { tiny->run(); }) / chain;
  // Links: an all-reduce of one value (2 (p - 1) ring steps of latency) and of 4 MiB (its bandwidth: the size
  // of a layer's activations and of gradient buckets; 64 MiB ran at half the rate here, out of cache).
  const int ranks = world->size();
  std::string links =
      "one process: the links are not measured (run under mpirun -np N to measure them); "
      "they are set from the memory bandwidth\n";
  if (ranks > 1) {
    float x = 1;
    const double steps = 2.0 * (ranks - 1);
    m.intra_node.latency =
        timed(*world, 50, [&] { world->all_reduce(&x, 1, DType::f32, ReduceOp::sum); }) / steps;
    std::vector<float> big(1 << 20, 1.0f);
    const double t = timed(*world, 10, [&] {
      world->all_reduce(big.data(), static_cast<int64_t>(big.size()), DType::f32, ReduceOp::sum);
    });
    const double bytes = steps / ranks * static_cast<double>(big.size() * sizeof(float));
    m.intra_node.bandwidth = bytes / std::max(t - steps * m.intra_node.latency, 1e-9);
    const double started = timed(*world, 10, [&] {
      world->wait(
          world->start_all_reduce(big.data(), static_cast<int64_t>(big.size()), DType::f32, ReduceOp::sum));
    });
    m.intra_node.started_bandwidth = bytes / std::max(started - steps * m.intra_node.latency, 1e-9);
    links = cat("links measured between the ", ranks,
                " ranks of this node; inter_node is set equal (one node)\n");
  } else {
    m.intra_node = {m.memory_bandwidth / 2, 1e-6};
  }
  m.inter_node = m.intra_node;
  const std::string text =
      machine_profile_yaml(m, cat("# flowrun calibrate: measured on ", m.name, "\n# ", links));
  if (world->rank() == 0 && !out.empty()) {
    const std::string tmp = out + ".tmp";
    {
      std::ofstream f(tmp);
      f << text;
      f.close();
      if (!f) throw input_error(cat("calibrate --out: cannot write ", tmp));
    }
    if (std::rename(tmp.c_str(), out.c_str()) != 0)
      throw input_error(cat("calibrate --out: cannot rename ", tmp, " to ", out));
  }
  return text;
}

}  // namespace flowrun
