// Executor: binds every value to memory once and replays the kernel list.
#include "runtime/executor.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>

#include "core/cuda_backend.h"
#include "ops/cpu/elementwise.h"
#include "parallel/comm.h"

namespace flowrun {

// A persistent value's device copy (executors on a GPU). The trainer reads and writes persistent values as
// host tensors (Executor::tensor); the kernels use the device copy. `fresh` says which side holds the current
// bytes: a run uploads what the host changed and leaves parameters and state newer on the device; an access
// downloads them. Executors that share a host tensor (an eval program reading the training program's
// parameters) share its mirror, found by the host tensor's address.
struct DeviceMirror {
  enum class Fresh { both, host, device };
  Tensor host;
  void* device = nullptr;
  Fresh fresh = Fresh::host;
  bool written = false;  // a parameter or state: kernels update it
  ~DeviceMirror() { cuda::backend().free(device); }
};

namespace {

std::shared_ptr<DeviceMirror> mirror_of(const Tensor& host) {
  static std::mutex mutex;
  static std::map<const void*, std::weak_ptr<DeviceMirror>> mirrors;
  std::lock_guard<std::mutex> lock(mutex);
  std::weak_ptr<DeviceMirror>& known = mirrors[host.raw()];
  if (auto m = known.lock()) return m;
  auto m = std::make_shared<DeviceMirror>();
  m->host = host;
  m->device = cuda::backend().alloc(host.nbytes());
  known = m;
  return m;
}

// A host copy of device bytes.
Tensor download(const void* device, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  if (t.nbytes() > 0) cuda::backend().to_host(t.raw(), device, t.nbytes());
  return t;
}

}  // namespace

Executor::Executor(Program program, Device device, uint64_t seed, const std::map<std::string, Tensor>& shared,
                   Communicator* comm, Communicator* tp)
    : program_(std::move(program)), device_(device), seed_(seed) {
  const Graph& g = program_.graph;
  const MemoryPlan& mem = program_.memory;
  arena_ = std::make_shared<Storage>(std::max<size_t>(mem.arena_bytes, 1), device_);
  char* base = static_cast<char*>(arena_->data());

  if (device_.kind == DeviceKind::cuda) {
    stream_ = cuda::backend().stream_create();
    device_step_ = static_cast<int64_t*>(cuda::backend().alloc(2 * sizeof(int64_t)));  // step, micro-batch
  }

  std::vector<void*> addr(g.values().size(), nullptr);
  for (const auto& v : g.values()) {
    if (v.kind == ValueKind::intermediate) {
      if (mem.offset[static_cast<size_t>(v.id)] >= 0)
        addr[static_cast<size_t>(v.id)] = base + mem.offset[static_cast<size_t>(v.id)];
      continue;
    }
    Tensor t;
    if (auto it = shared.find(v.name); it != shared.end()) {
      FR_CHECK(it->second.shape() == v.shape() && it->second.dtype() == v.dtype(), "shared tensor ", v.name,
               " does not match the program's value");
      t = it->second;
    } else {
      t = Tensor::zeros(v.shape(), v.dtype());  // on the host: the trainer's side of it
    }
    addr[static_cast<size_t>(v.id)] = t.raw();
    if (device_.kind == DeviceKind::cuda) {
      std::shared_ptr<DeviceMirror> m = mirror_of(t);
      m->written = m->written || v.kind != ValueKind::input;
      addr[static_cast<size_t>(v.id)] = m->device;
      mirrors_.emplace(v.name, std::move(m));
    }
    persistent_.emplace(v.name, std::move(t));
  }

  for (const auto& v : g.values())
    if (mem.alias[static_cast<size_t>(v.id)] >= 0)
      addr[static_cast<size_t>(v.id)] = addr[static_cast<size_t>(mem.alias[static_cast<size_t>(v.id)])];
  loss_scaled_ = persistent_.count("amp/loss_scale") != 0;
  size_t nviews = 0;
  for (NodeId id : program_.order) nviews += g.node(id).inputs.size() + g.node(id).outputs.size();
  views_.reserve(nviews);  // Step contexts point into views_: it must never reallocate
  auto types_of = [&](const std::vector<ValueId>& vs) {
    std::vector<TensorType> t;
    for (ValueId v : vs) t.push_back(g.value(v).type);
    return t;
  };
  for (NodeId id : program_.order) {
    const Node& n = g.node(id);
    const OpDef& def = OpRegistry::get().at(n.op);
    const KernelChoice k = select_kernel(def, device_.kind, kernel_dtype(g, n));
    FR_CHECK(k.kernel != nullptr, "no kernel for ", n.op);
    // Widening converts on the host: a GPU program needs every kernel native.
    FR_CHECK(!k.widened || device_.kind == DeviceKind::cpu, n.name, ": ", n.op, " has no native ",
             dtype_name(kernel_dtype(g, n)), " kernel on ", device_str(device_));
    const WorkspaceLayout ws = workspace_layout(def, k, types_of(n.inputs), types_of(n.outputs), n.attrs);
    char* wbase = mem.workspace_offset[static_cast<size_t>(id)] >= 0
                      ? base + mem.workspace_offset[static_cast<size_t>(id)]
                      : nullptr;
    FR_CHECK(ws.bytes == 0 || (wbase && mem.workspace_bytes[static_cast<size_t>(id)] == ws.bytes),
             "workspace of ", n.name, " was not planned");
    Step s{k.kernel->fn, {}, 0, {}, {}};
    s.ctx.node = &n;
    s.ctx.in = views_.data() + views_.size();
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const Value& v = g.value(n.inputs[i]);
      void* data = addr[static_cast<size_t>(v.id)];
      if (ws.in_offset[i] >= 0) {
        FR_CHECK(data != nullptr, "input ", v.name, " of ", n.name, " has no memory");
        s.widen_in.push_back({data, v.dtype(), wbase + ws.in_offset[i], DType::f32, numel(v.shape())});
        views_.push_back({wbase + ws.in_offset[i], &v.shape(), DType::f32});
      } else {
        views_.push_back({data, &v.shape(), v.dtype()});
      }
    }
    s.ctx.num_in = static_cast<int>(n.inputs.size());
    s.ctx.out = views_.data() + views_.size();
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      const Value& v = g.value(n.outputs[i]);
      void* data = addr[static_cast<size_t>(v.id)];
      FR_CHECK(data != nullptr || v.nbytes() == 0, "value ", v.name, " has no memory");
      if (ws.out_offset[i] >= 0) {
        s.narrow_out.push_back({wbase + ws.out_offset[i], DType::f32, data, v.dtype(), numel(v.shape())});
        views_.push_back({wbase + ws.out_offset[i], &v.shape(), DType::f32});
      } else {
        views_.push_back({data, &v.shape(), v.dtype()});
      }
    }
    s.ctx.num_out = static_cast<int>(n.outputs.size());
    s.ctx.comm = comm;
    s.ctx.tp = tp;
    // A recomputed node draws what the node it repeats drew (a dropout mask).
    s.stream = name_stream(n.recomputes >= 0 ? g.node(n.recomputes).name : n.name);
    s.ctx.stream = stream_;
    s.ctx.device_step = device_step_;
    s.ctx.node_stream = s.stream;
    if (ws.kernel_bytes > 0) {
      s.ctx.workspace = wbase + ws.kernel_offset;
      s.ctx.workspace_bytes = ws.kernel_bytes;
    }
    steps_.push_back(std::move(s));
  }
  if (device_.kind != DeviceKind::cpu) return;
  // A graph input's memory is its own host tensor, read in place or through views that alias it (the same
  // address): every view at that address is a read of that input.
  for (const auto& v : g.values()) {
    if (v.kind != ValueKind::input || v.nbytes() == 0) continue;
    const void* at = persistent_.at(v.name).raw();
    InputRefs& refs = input_refs_[v.name];
    for (size_t i = 0; i < views_.size(); ++i)
      if (views_[i].data == at) refs.views.push_back(i);
    for (size_t i = 0; i < steps_.size(); ++i)
      for (size_t k = 0; k < steps_[i].widen_in.size(); ++k)
        if (steps_[i].widen_in[k].src == at) refs.widened.emplace_back(i, k);
  }
}

bool Executor::bind_input(const std::string& name, const Tensor& t) {
  if (device_.kind != DeviceKind::cpu) return false;
  auto refs = input_refs_.find(name);
  if (refs == input_refs_.end()) throw input_error(cat("the program has no input named '", name, "'"));
  Tensor& held = persistent_.at(name);
  FR_CHECK(t.shape() == held.shape() && t.dtype() == held.dtype(), "input ", name, " is ",
           dtype_name(held.dtype()), shape_str(held.shape()), ", given ", dtype_name(t.dtype()),
           shape_str(t.shape()));
  for (size_t i : refs->second.views) views_[i].data = t.raw();
  for (const auto& [step, k] : refs->second.widened) steps_[step].widen_in[k].src = t.raw();
  held = t;
  return true;
}

Executor::~Executor() {
  if (device_.kind != DeviceKind::cuda) return;
  const cuda::Backend& gpu = cuda::backend();
  for (void* graph : graph_) gpu.graph_destroy(graph);
  gpu.free(device_step_);
  gpu.stream_destroy(stream_);
}

void Executor::execute(const Step& s) {
  for (const Convert& c : s.widen_in) cpu::convert(c.src, c.from, c.dst, c.to, c.n);
  s.fn(s.ctx);
  for (const Convert& c : s.narrow_out) cpu::convert(c.src, c.from, c.dst, c.to, c.n);
}

void Executor::upload_changed() {
  if (device_.kind != DeviceKind::cuda) return;
  const cuda::Backend& gpu = cuda::backend();
  const int64_t where[2] = {step_, micro_};
  gpu.to_device(device_step_, where, sizeof where);
  for (auto& [name, m] : mirrors_)
    if (m->fresh == DeviceMirror::Fresh::host) {
      if (m->host.nbytes() > 0) gpu.to_device(m->device, m->host.raw(), m->host.nbytes());
      m->fresh = DeviceMirror::Fresh::both;
    }
}

void Executor::kernels_done() {
  if (mirrors_.empty()) return;
  cuda::backend().synchronize();  // a kernel's error surfaces here, in the step that made it
  for (auto& [name, m] : mirrors_)
    if (m->written) m->fresh = DeviceMirror::Fresh::device;
}

void Executor::run(bool apply) {
  upload_changed();
  if (graphs_on_ && device_.kind == DeviceKind::cuda) {
    run_graph(apply);
  } else {
    for (Step& s : steps_)
      if (apply || s.ctx.node->phase != 1) run_node(s);
  }
  kernels_done();
  ++step_;
}

void Executor::run_node(Step& s, const std::function<void(const Node&, double)>* timer) {
  s.ctx.rng = RngStream{seed_, mix_stream(static_cast<uint64_t>(step_), s.stream)};
  if (!program_.eager && !timer) return execute(s);
  const auto t0 = std::chrono::steady_clock::now();
  execute(s);
  if (device_.kind == DeviceKind::cuda) cuda::backend().synchronize();  // the kernel's time, not its launch's
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (program_.eager) {
    OpTime& t = op_times_[s.ctx.node->op];
    ++t.calls;
    t.seconds += seconds;
    if (!may_overflow(*s.ctx.node) && !outputs_finite(s)) throw non_finite(s);
  }
  if (timer) (*timer)(*s.ctx.node, seconds);
}

void Executor::run_graph(bool apply) {
  const cuda::Backend& gpu = cuda::backend();
  auto launch_all = [&] {
    for (Step& s : steps_)
      if (apply || s.ctx.node->phase != 1) run_node(s);
  };
  void*& graph = graph_[apply ? 1 : 0];
  if (!graph && warmed_[apply ? 1 : 0]) {
    gpu.capture_begin(stream_);
    std::string why;
    try {
      launch_all();
    } catch (const std::exception& e) {
      why = e.what();  // a launch the capture refused; end the capture before anything else
    }
    std::string end_why;
    graph = gpu.capture_end(stream_, &end_why);
    if (!graph || !why.empty()) {
      gpu.graph_destroy(graph);
      graph = nullptr;
      graphs_on_ = false;
      spdlog::warn(
          "the training step could not be captured as a CUDA graph ({}); launching its kernels one "
          "by one",
          why.empty() ? end_why : why);
      launch_all();
      return;
    }
  }
  if (graph) {
    gpu.graph_launch(graph, stream_);
  } else {
    launch_all();
    warmed_[apply ? 1 : 0] = true;
  }
}

void Executor::run_part(size_t begin, size_t end, bool apply, bool apply_only) {
  FR_CHECK(begin <= end && end <= steps_.size(), "run_part ", begin, "..", end, " of ", steps_.size());
  upload_changed();
  for (size_t i = begin; i < end; ++i) {
    Step& s = steps_[i];
    if ((!apply && s.ctx.node->phase == 1) || (apply_only && s.ctx.node->phase != 1)) continue;
    run_node(s);
  }
  kernels_done();
}

void Executor::set_micro(int64_t m) {
  micro_ = m;
  for (Step& s : steps_) s.ctx.micro = m;
}

void Executor::set_pipeline(Communicator* pipeline, Communicator* ends) {
  for (Step& s : steps_) {
    s.ctx.pp = pipeline;
    s.ctx.ends = ends;
  }
}

void Executor::run_timed(const std::function<void(const Node&, double)>& timer, bool apply) {
  upload_changed();
  for (Step& s : steps_)
    if (apply || s.ctx.node->phase != 1) run_node(s, &timer);
  kernels_done();
  ++step_;
}

bool all_finite(const TensorView& t) {
  const int64_t n = t.numel();
  switch (t.dtype) {
    case DType::f32:
      for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(t.as<float>()[i])) return false;
      return true;
    case DType::f64:
      for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(t.as<double>()[i])) return false;
      return true;
    case DType::f16:
      for (int64_t i = 0; i < n; ++i)
        if ((t.as<f16>()[i].bits & 0x7c00u) == 0x7c00u) return false;  // all-ones exponent: inf or NaN
      return true;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i)
        if ((t.as<bf16>()[i].bits & 0x7f80u) == 0x7f80u) return false;
      return true;
    default:
      return true;
  }
}

// Every node after the forward pass: the gradients, their sums (named after their op) and the updates,
// which skip the step.
bool Executor::may_overflow(const Node& n) const {
  return loss_scaled_ && program_.graph.in_backward(n);
}

bool Executor::outputs_finite(const Step& s) const {
  for (int i = 0; i < s.ctx.num_out; ++i) {
    TensorView out = s.ctx.out[i];
    for (const Convert& c : s.narrow_out)
      if (c.src == out.data) out = TensorView{c.dst, out.shape, c.to};
    if (device_.kind == DeviceKind::cpu) {
      if (!all_finite(out)) return false;
    } else {
      const Tensor host = download(out.data, *out.shape, out.dtype);
      if (!all_finite({host.raw(), out.shape, out.dtype})) return false;
    }
  }
  return true;
}

namespace {

// "[64, 10] f32: 3 of 640 non-finite, largest finite magnitude 1.2e+38" (floating tensors).
std::string describe_values(const TensorView& t) {
  std::string shape;
  for (int64_t d : *t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
  std::string head = cat("[", shape, "] ", dtype_name(t.dtype));
  if (!is_floating(t.dtype)) return head;
  const int64_t n = t.numel();
  int64_t bad = 0;
  double largest = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = load_as_f64(t.data, t.dtype, i);
    if (!std::isfinite(v))
      ++bad;
    else
      largest = std::max(largest, std::fabs(v));
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g", largest);
  return cat(head, ": ", bad == 0 ? std::string("finite") : cat(bad, " of ", n, " non-finite"),
             ", largest finite magnitude ", buf);
}

}  // namespace

NonFiniteValue Executor::non_finite(const Step& s) const {
  const Node& n = *s.ctx.node;
  const Graph& g = program_.graph;
  std::string msg = cat(n.name, " (op ", n.op, ") produced a non-finite value");
  auto add = [&](const char* what, ValueId id, const TensorView& view) {
    const Tensor host =
        device_.kind == DeviceKind::cpu ? Tensor() : download(view.data, *view.shape, view.dtype);
    msg += cat("\n  ", what, " ", g.value(id).name, " ",
               describe_values(host.defined() ? TensorView{host.raw(), view.shape, view.dtype} : view));
  };
  for (int i = 0; i < s.ctx.num_in; ++i) add("input ", n.inputs[static_cast<size_t>(i)], s.ctx.in[i]);
  for (int i = 0; i < s.ctx.num_out; ++i) add("output", n.outputs[static_cast<size_t>(i)], s.ctx.out[i]);
  return NonFiniteValue(n, msg);
}

const Node* Executor::run_checked(bool apply) {
  const Node* bad = nullptr;
  upload_changed();
  for (Step& s : steps_) {
    if (!apply && s.ctx.node->phase == 1) continue;
    s.ctx.rng = RngStream{seed_, mix_stream(static_cast<uint64_t>(step_), s.stream)};
    execute(s);
    if (!may_overflow(*s.ctx.node) && !outputs_finite(s)) {
      bad = s.ctx.node;
      break;
    }
  }
  kernels_done();
  ++step_;
  return bad;
}

Tensor& Executor::tensor(const std::string& name) {
  auto it = persistent_.find(name);
  if (it == persistent_.end())
    throw input_error(cat("the program has no input, parameter or state named '", name, "'"));
  if (auto m = mirrors_.find(name); m != mirrors_.end()) {
    DeviceMirror& d = *m->second;
    if (d.fresh == DeviceMirror::Fresh::device && d.host.nbytes() > 0)
      cuda::backend().to_host(d.host.raw(), d.device, d.host.nbytes());
    d.fresh = DeviceMirror::Fresh::host;  // the caller may write it: the next run uploads it
  }
  return it->second;
}

Tensor Executor::output(const std::string& name) const {
  const Graph& g = program_.graph;
  auto it = g.outputs().find(name);
  if (it == g.outputs().end()) throw input_error(cat("the program has no output named '", name, "'"));
  return value(it->second);
}

Tensor Executor::value(ValueId id) const {
  const Value& v = program_.graph.value(id);
  if (v.kind != ValueKind::intermediate) {
    auto m = mirrors_.find(v.name);
    if (m != mirrors_.end() && m->second->fresh == DeviceMirror::Fresh::device)
      return download(m->second->device, v.shape(), v.dtype());
    return persistent_.at(v.name);
  }
  if (const int64_t src = program_.memory.alias[static_cast<size_t>(v.id)]; src >= 0) {
    const Tensor bytes = value(src);  // a view of a graph input: its bytes under this value's shape
    Tensor t = Tensor::empty(v.shape(), v.dtype());
    std::memcpy(t.raw(), bytes.raw(), v.nbytes());
    return t;
  }
  FR_CHECK(program_.memory.offset[static_cast<size_t>(v.id)] >= 0 || v.nbytes() == 0, v.name,
           " has no memory");
  const char* at = static_cast<char*>(arena_->data()) + program_.memory.offset[static_cast<size_t>(v.id)];
  if (device_.kind != DeviceKind::cpu) return download(at, v.shape(), v.dtype());
  Tensor t = Tensor::empty(v.shape(), v.dtype());
  if (v.nbytes() > 0) std::memcpy(t.raw(), at, v.nbytes());
  return t;
}

}  // namespace flowrun
