// Timing a training step: wall time of whole steps, then a kernel-by-kernel breakdown.
#include "train/profile.h"

#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>
#include <vector>

#include "ops/registry.h"
#include "train/metrics.h"
#include "train/plan.h"
#include "train/program.h"
#include "train/threads.h"

namespace flowrun {

namespace {

using Clock = std::chrono::steady_clock;

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// Page faults of the process so far (minor and major): a steady-state step should fault none in, its memory
// planned and its buffers kept; a step that maps fresh memory pays the kernel for zeroed pages every time.
int64_t page_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_minflt + u.ru_majflt);
}

// What a node belongs to: the backward pass (autodiff scopes its nodes "grad/..."), the optimizer (its
// pass names nodes "update/..." and "opt/..."), or the forward pass; and the model layer it came from.
enum class Part { forward, backward, update };

// A node the recompute pass re-emitted counts in its layer's backward pass, which it serves.
Part part_of(const Node& n) {
  if (n.name.rfind("grad/", 0) == 0 || n.recomputes >= 0) return Part::backward;
  if (n.name.rfind("update/", 0) == 0 || n.name.rfind("opt/", 0) == 0 || n.phase == 1) return Part::update;
  return Part::forward;
}

std::string layer_of(const Node& n) {
  std::string name = n.name;
  for (const char* prefix : {"grad/", "update/", "opt/", "recompute/"})
    if (name.rfind(prefix, 0) == 0) name = name.substr(std::char_traits<char>::length(prefix));
  const auto slash = name.find('/');
  return slash == std::string::npos ? name : name.substr(0, slash);
}

struct Bucket {
  double seconds[3] = {0, 0, 0};  // forward, backward, update
  double flops = 0;
  int64_t calls = 0;
  double total() const { return seconds[0] + seconds[1] + seconds[2]; }
};

std::string ms(double seconds_per_step) {
  if (seconds_per_step == 0) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", seconds_per_step * 1e3);
  return buf;
}

// The `n` nodes that took longest, with the shapes and types they read and wrote: where to look first. Each
// node's rate counts all of its calls (a micro-step runs it once each under gradient accumulation).
std::string slowest_nodes(const Graph& g, const std::map<const Node*, Bucket>& nodes, int64_t n, double per) {
  std::vector<std::pair<const Node*, Bucket>> v(nodes.begin(), nodes.end());
  std::sort(v.begin(), v.end(),
            [](const auto& a, const auto& b) { return a.second.total() > b.second.total(); });
  if (static_cast<int64_t>(v.size()) > n) v.resize(static_cast<size_t>(n));
  auto values = [&](const std::vector<ValueId>& ids) {
    std::string s;
    for (ValueId id : ids) {
      const Value& val = g.value(id);
      s += (s.empty() ? "" : ", ") + std::string(dtype_name(val.dtype())) + shape_str(val.shape());
    }
    return s;
  };
  std::ostringstream os;
  char line[160];
  std::snprintf(line, sizeof line, "\n%-44s %-16s %10s %10s  %s\n", "node", "op", "ms/step", "GFLOP/s",
                "inputs -> outputs");
  os << line;
  for (const auto& [node, b] : v) {
    std::snprintf(line, sizeof line, "%-44s %-16s %10.3f %10.1f  ", node->name.c_str(), node->op.c_str(),
                  b.total() * per * 1e3, b.total() > 0 ? b.flops / b.total() * 1e-9 : 0.0);
    os << line << values(node->inputs) << " -> " << values(node->outputs) << "\n";
  }
  return os.str();
}

}  // namespace

TimeReport time_training(const RunConfig& cfg, const TimeOptions& opts) {
  if (opts.steps < 1 || opts.warmup < 0 || opts.profile < 0)
    throw input_error("time: --steps must be >= 1, --warmup and --profile >= 0");
  TrainProgram t = make_train_program(cfg);
  Executor& ex = *t.ex;
  const std::unique_ptr<Loader> owned = train_loader(*t.data, cfg, t.mesh);
  Loader& loader = *owned;
  // A pipeline stage runs the 1F1B schedule; its kernels are not timed one by one.
  auto run_step = [&](int64_t step, const std::function<void(const Node&, double)>* timer) {
    if (t.mesh.stages() > 1) return pipeline_step(ex, t.stash, t.mesh, loader, cfg, step);
    return train_step(ex, loader, cfg, step, timer);
  };
  // The steps run as a training run's do, at the thread count train.adapt_threads picks.
  ThreadAdapter threads(omp_get_max_threads(), cfg.train.adapt_threads && cfg.train.device == "cpu");
  std::vector<double> times;
  int64_t step = 0, faults_before = 0;
  for (; step < opts.warmup + opts.steps; ++step) {
    if (step == opts.warmup) faults_before = page_faults();
    threads.begin_step();
    const auto t0 = Clock::now();
    run_step(step, nullptr);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    threads.end_step(seconds);
    if (step >= opts.warmup) times.push_back(seconds);
  }
  const int64_t timed_faults = page_faults() - faults_before;
  omp_set_num_threads(threads.current());

  // Kernel-by-kernel: per layer and part, and per op type.
  std::map<std::string, Bucket> layers, ops;
  std::map<const Node*, Bucket> nodes;  // the same, per node (--nodes)
  std::vector<std::string> layer_order;
  const Program& prog = ex.program();
  std::map<const Node*, double> flops_of;
  for (NodeId id : prog.order) flops_of[&prog.graph.node(id)] = node_flops(prog.graph, prog.graph.node(id));
  const std::function<void(const Node&, double)> timer = [&](const Node& n, double s) {
    const int part = static_cast<int>(part_of(n));
    const std::string layer = layer_of(n);
    if (!layers.count(layer)) layer_order.push_back(layer);
    layers[layer].seconds[part] += s;
    Bucket& o = ops[n.op];
    o.seconds[part] += s;
    o.flops += flops_of[&n];
    ++o.calls;
    Bucket& b = nodes[&n];
    b.seconds[part] += s;
    b.flops += flops_of[&n];
    ++b.calls;
  };
  for (int64_t i = 0; i < opts.profile; ++i, ++step) run_step(step, &timer);

  TimeReport r;
  r.median_ms = percentile(times, 0.5) * 1e3;
  r.p10_ms = percentile(times, 0.1) * 1e3;
  r.p90_ms = percentile(times, 0.9) * 1e3;
  r.flops_per_step = step_flops(prog, cfg.train.grad_accumulation);
  r.peak_rss_mib = peak_rss_mib();
  r.page_faults_per_step = static_cast<double>(timed_faults) / static_cast<double>(opts.steps);
  r.predicted_rss_mib =
      predict_process_memory(prog, t.model, *t.data, cfg, nullptr).total / static_cast<double>(1 << 20);
  r.arena_mib = static_cast<double>(prog.memory.arena_bytes) / (1 << 20);
  r.params = t.model.num_params;
  // What this process actually holds, for comparison with `flowrun plan`.
  for (const Value& v : prog.graph.values()) {
    if (v.kind != ValueKind::param && v.kind != ValueKind::state) continue;
    (v.kind == ValueKind::param ? r.param_bytes : r.state_bytes) +=
        static_cast<double>(ex.tensor(v.name).nbytes());
  }
  r.lead = t.mesh.world->rank() == 0;
  r.threads = threads.max();
  r.threads_now = threads.current();
  r.text = t.data->spec().text;
  r.items_per_step = cfg.train.batch_size * (r.text ? cfg.data.seq_len : 1);

  const double per = opts.profile > 0 ? 1.0 / static_cast<double>(opts.profile) : 0.0;
  double kernel_total = 0;
  for (const auto& [name, b] : layers) kernel_total += b.total();
  std::ostringstream os;
  char line[256];
  // The header names the config file, whatever the length of its path.
  std::vector<char> head(512 + cfg.file.size());
  std::snprintf(head.data(), head.size(),
                "flowrun time %s: %lld steps after %lld warmup, %s%s%s\n"
                "step: median %.3f ms (p10 %.3f, p90 %.3f); %.0f %s/s; %.3g GFLOP/step = %.1f GFLOP/s\n"
                "memory: arena %.2f MiB, peak resident %.1f MiB (predicted %.1f MiB), %.0f page faults a "
                "step; %lld parameters\n\n",
                cfg.file.c_str(), static_cast<long long>(opts.steps), static_cast<long long>(opts.warmup),
                threads.summary().c_str(),
                cfg.train.recompute == "none" ? "" : (", recompute " + cfg.train.recompute).c_str(),
                cfg.train.eager ? ", eager" : "", r.median_ms, r.p10_ms, r.p90_ms,
                static_cast<double>(r.items_per_step) / (r.median_ms * 1e-3), r.text ? "tokens" : "samples",
                r.flops_per_step * 1e-9, r.flops_per_step * 1e-6 / r.median_ms, r.arena_mib, r.peak_rss_mib,
                r.predicted_rss_mib, r.page_faults_per_step, static_cast<long long>(r.params));
  os << head.data();
  if (opts.profile > 0) {
    std::snprintf(line, sizeof line, "%-28s %12s %12s %12s %7s\n", "layer (ms per step)", "forward",
                  "backward", "update", "share");
    os << line;
    for (const std::string& name : layer_order) {
      const Bucket& b = layers[name];
      std::snprintf(line, sizeof line, "%-28s %12s %12s %12s %6.1f%%\n", name.c_str(),
                    ms(b.seconds[0] * per).c_str(), ms(b.seconds[1] * per).c_str(),
                    ms(b.seconds[2] * per).c_str(), 100.0 * b.total() / kernel_total);
      os << line;
    }
    std::vector<std::pair<std::string, Bucket>> by_time(ops.begin(), ops.end());
    std::sort(by_time.begin(), by_time.end(),
              [](const auto& a, const auto& b) { return a.second.total() > b.second.total(); });
    std::snprintf(line, sizeof line, "\n%-28s %12s %12s %10s %7s\n", "op", "calls/step", "ms/step", "GFLOP/s",
                  "share");
    os << line;
    for (const auto& [name, b] : by_time) {
      std::snprintf(line, sizeof line, "%-28s %12lld %12s %10.1f %6.1f%%\n", name.c_str(),
                    static_cast<long long>(static_cast<double>(b.calls) * per), ms(b.total() * per).c_str(),
                    b.total() > 0 ? b.flops / b.total() * 1e-9 : 0.0, 100.0 * b.total() / kernel_total);
      os << line;
    }
    if (opts.nodes > 0) os << slowest_nodes(prog.graph, nodes, opts.nodes, per);
    std::snprintf(line, sizeof line,
                  "\nkernels: %.3f ms per step of %.3f ms measured with per-kernel timing\n",
                  kernel_total * per * 1e3, r.median_ms);
    os << line;
  }
  r.table = os.str();
  JsonLine j;
  j.add("config", cfg.file)
      .add("median_step_ms", r.median_ms)
      .add("p10_step_ms", r.p10_ms)
      .add("p90_step_ms", r.p90_ms);
  j.add("peak_rss_mib", r.peak_rss_mib)
      .add("predicted_rss_mib", r.predicted_rss_mib)
      .add("page_faults_per_step", r.page_faults_per_step)
      .add("arena_mib", r.arena_mib)
      .add("params", r.params);
  j.add("param_bytes", r.param_bytes).add("state_bytes", r.state_bytes);
  j.add("flops_per_step", r.flops_per_step)
      .add("threads", r.threads)
      .add("threads_now", r.threads_now)
      .add(r.text ? "tokens_per_step" : "samples_per_step", r.items_per_step);
  r.json = j.str();
  return r;
}

}  // namespace flowrun
