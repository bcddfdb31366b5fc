// The generic CUDA kernel test (label gpu: needs a GPU): every op with a CUDA kernel runs on the device in
// f32, f16 and bf16 against the CPU kernel on the same inputs. An op with samples runs them (the device gets
// the inputs before the CPU run, which updates mutated ones in place); a backward helper without samples
// (cross_entropy_grad, layernorm_grad, ...) is caught in the backward passes of the ops it serves
// (OpDef::covered_by): programs compiled without in-place reuse, so that after each of its nodes the node's
// inputs and outputs can be read back.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/cuda/runtime.h"
#include "core/cuda_backend.h"
#include "op_harness.h"

namespace flowrun {
namespace {

using testing::build_sample;
using testing::fill_all;
using testing::SampleProgram;

std::vector<std::string> ops_with_cuda_kernels() {
  cuda::backend();  // the CUDA kernels join the registry
  std::vector<std::string> names;
  for (const auto& [name, def] : OpRegistry::get().all())
    for (const KernelDef& k : def.kernels)
      if (k.device == DeviceKind::cuda) {
        names.push_back(name);
        break;
      }
  return names;
}

// Device copies of a node's tensors, freed on scope exit.
struct DeviceBuffers {
  std::vector<void*> ptrs;
  void* add(size_t bytes) {
    ptrs.push_back(cuda::alloc(bytes));
    return ptrs.back();
  }
  ~DeviceBuffers() {
    for (void* p : ptrs) cuda::free(p);
  }
};

// Floating values in a storage the CUDA kernels have (labels and ids are copied as they are).
bool cuda_storable(DType t) {
  return !is_floating(t) || t == DType::f32 || t == DType::f16 || t == DType::bf16;
}

bool storable(const Graph& g, const Node& n) {
  bool ok = true;
  for (ValueId v : n.inputs) ok = ok && cuda_storable(g.value(v).dtype());
  for (ValueId v : n.outputs) ok = ok && cuda_storable(g.value(v).dtype());
  return ok;
}

void expect_close(const Tensor& want_t, const Tensor& got_t, DType t, const std::string& what) {
  const auto want = want_t.to_f64(), got = got_t.to_f64();
  ASSERT_EQ(want.size(), got.size()) << what;
  double scale = 1e-3;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  // f32: CUDA's libm and the CPU's (and the summation orders) differ in the last bits; f16/bf16: about one
  // rounding of the output apart.
  const double tol = (t == DType::bf16 ? 1.0 / 128 : t == DType::f16 ? 1.0 / 1024 : 1e-5) * scale;
  // One failure per output, naming how many elements are off, the first few and the worst: a wrong
  // kernel would otherwise print a line per element, and the GPU machine returns logs of 16 MiB at most.
  size_t bad = 0, worst = 0;
  double worst_err = 0;
  std::string first;
  for (size_t e = 0; e < want.size(); ++e) {
    // NaN where the CPU has NaN is right (and equal infinities); any other NaN is off by infinity.
    double err =
        got[e] == want[e] || (std::isnan(want[e]) && std::isnan(got[e])) ? 0.0 : std::fabs(got[e] - want[e]);
    if (std::isnan(err)) err = INFINITY;
    if (err > tol) {
      if (++bad <= 5) first += cat(" [", e, "] ", got[e], " vs ", want[e], ";");
      if (err > worst_err) worst_err = err, worst = e;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << want.size() << " elements off by more than " << tol
                     << " (device vs CPU):" << first << " worst [" << worst << "] " << got[worst] << " vs "
                     << want[worst];
}

// Runs kernel k of node n of g on the device with `inputs` and compares its outputs with `want`, and the
// inputs it updates in place with `want_mutated` (by input index). `seed` and `step`: the CPU executor's,
// from which it seeded the node's random numbers (dropout draws the same ones on the device).
void check_on_device(const OpDef& def, const KernelDef& k, const Graph& g, const Node& n,
                     const std::vector<Tensor>& inputs, const std::vector<Tensor>& want,
                     const std::map<int, Tensor>& want_mutated, DType t, uint64_t seed, int64_t step) {
  DeviceBuffers mem;
  std::vector<TensorView> in, out;
  std::vector<TensorType> in_types, out_types;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const Tensor& host = inputs[i];
    void* d = mem.add(host.nbytes());
    cuda::to_device(d, host.raw(), host.nbytes());
    in.push_back({d, &g.value(n.inputs[i]).shape(), host.dtype()});
    in_types.push_back(g.value(n.inputs[i]).type);
  }
  for (ValueId v : n.outputs) {
    out.push_back({mem.add(g.value(v).nbytes()), &g.value(v).shape(), g.value(v).dtype()});
    out_types.push_back(g.value(v).type);
  }
  KernelCtx ctx;
  ctx.node_stream = name_stream(n.name);
  ctx.rng = RngStream{seed, mix_stream(static_cast<uint64_t>(step), ctx.node_stream)};
  // As the executor lays it out: the step, then the micro-batch (random kernels read both).
  const int64_t where[2] = {step, 0};
  auto* device_step = static_cast<int64_t*>(mem.add(sizeof where));
  cuda::to_device(device_step, where, sizeof where);
  ctx.device_step = device_step;
  // The CUDA kernel's own workspace (cuDNN's), else the op's.
  const auto& size = k.workspace ? k.workspace : def.workspace;
  ctx.workspace_bytes = size ? size(in_types, out_types, n.attrs) : 0;
  if (ctx.workspace_bytes > 0) ctx.workspace = mem.add(ctx.workspace_bytes);
  ctx.node = &n;
  ctx.in = in.data();
  ctx.num_in = static_cast<int>(in.size());
  ctx.out = out.data();
  ctx.num_out = static_cast<int>(out.size());
  k.fn(ctx);
  cuda::synchronize();
  for (size_t j = 0; j < out.size(); ++j) {
    Tensor got = Tensor::empty(want[j].shape(), want[j].dtype());
    cuda::to_host(got.raw(), out[j].data, got.nbytes());
    expect_close(want[j], got, t, cat(n.name, " output ", j));
  }
  for (const auto& [i, w] : want_mutated) {
    Tensor got = Tensor::empty(w.shape(), w.dtype());
    cuda::to_host(got.raw(), in[static_cast<size_t>(i)].data, got.nbytes());
    expect_close(w, got, t, cat(n.name, " input ", i, " (updated in place)"));
  }
}

const Node& node_named(const Graph& g, const std::string& name) {
  for (const Node& n : g.nodes())
    if (n.name == name) return n;
  throw std::runtime_error("no node " + name);
}

class CudaKernel : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaKernel, MatchesTheCpuKernel) {
  std::string why;
  ASSERT_GT(cuda::device_count(&why), 0) << "the gpu tests need a CUDA device: " << why;
  const OpDef& def = OpRegistry::get().at(GetParam());
  int checked = 0;
  std::vector<DType> dtypes = {DType::f32, DType::f16, DType::bf16};
  // An op whose CUDA kernel serves integers only (mlm_mask on token ids) runs its samples once, as they are.
  if (!def.kernel(DeviceKind::cuda, DType::f32) && def.kernel(DeviceKind::cuda, DType::i64))
    dtypes = {DType::i64};
  for (DType t : dtypes) {
    const KernelDef* k = def.kernel(DeviceKind::cuda, t);
    const KernelDef* host = select_kernel(def, DeviceKind::cpu, t).kernel;
    if (!k || !host) continue;  // no kernel to test, or none to test against
    // The CPU's bf16 norms take their parameters in f32 (KernelDef::f32_inputs), the CUDA ones in bf16: no
    // sample runs on both. The CUDA bf16 norms run in the bf16 GPT of tests/cli/test_gpu_train.sh.
    if (host->f32_inputs != k->f32_inputs) continue;
    if (def.samples) {
      for (const OpSample& s : def.samples()) {
        if (s.attrs.b("relu")) continue;  // batchnorm's fused relu is a CPU fusion (graph/passes.cc)
        SCOPED_TRACE(cat(s.label, " in ", dtype_name(t)));
        SampleProgram cpu = build_sample(def, s, false, t);
        const Graph& g = cpu.exec->program().graph;
        const Node& n = node_named(g, "op");
        if (!storable(g, n)) continue;  // e.g. a cast to f64
        fill_all(s, cpu, 11);
        std::vector<Tensor> inputs;
        for (const std::string& name : cpu.input_names) inputs.push_back(cpu.exec->tensor(name).clone());
        const int64_t step = cpu.exec->step();
        cpu.exec->run();
        std::vector<Tensor> want;
        for (int j = 0; j < cpu.num_outputs; ++j) want.push_back(cpu.exec->output(cat("out", j)));
        std::map<int, Tensor> mutated;
        for (int i : def.mutated_inputs(s.attrs, static_cast<int>(s.inputs.size())))
          mutated[i] = cpu.exec->tensor(cpu.input_names[static_cast<size_t>(i)]);
        check_on_device(def, *k, g, n, inputs, want, mutated, t, cpu.exec->seed(), step);
        ++checked;
      }
      continue;
    }
    // A backward helper: in the backward passes of the ops it serves.
    for (const std::string& user : def.covered_by) {
      const OpDef& udef = OpRegistry::get().at(user);
      // The CPU cannot run the forward (batchnorm updates its running statistics in place: never widened).
      if (!select_kernel(udef, DeviceKind::cpu, t).kernel) continue;
      for (const OpSample& s : udef.samples()) {
        if (!s.gradcheck || s.attrs.b("relu")) continue;  // as above: the fused relu's mask is the CPU's
        SCOPED_TRACE(cat(user, " ", s.label, " in ", dtype_name(t)));
        SampleProgram cpu = build_sample(udef, s, true, t, nullptr, /*inplace=*/false);
        fill_all(s, cpu, 11);
        const Graph& g = cpu.exec->program().graph;
        const int64_t step = cpu.exec->step();
        cpu.exec->run_timed([&](const Node& n, double) {
          if (n.op != def.name || !storable(g, n)) return;
          std::vector<Tensor> inputs, want;
          for (ValueId v : n.inputs) inputs.push_back(cpu.exec->value(v));
          for (ValueId v : n.outputs) want.push_back(cpu.exec->value(v));
          check_on_device(def, *k, g, n, inputs, want, {}, t, cpu.exec->seed(), step);
          ++checked;
        });
      }
    }
  }
  EXPECT_GT(checked, 0) << "no sample of " << def.name << " ran on the device";
}

INSTANTIATE_TEST_SUITE_P(Registry, CudaKernel, ::testing::ValuesIn(ops_with_cuda_kernels()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace flowrun
