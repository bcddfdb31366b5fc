// The generic CUDA kernel test (label gpu: needs a GPU): every op with a CUDA kernel runs its own samples on
// the device in f32, f16 and bf16, against the CPU kernel on the same inputs. The CPU program of a sample
// gives the inputs, the node (attributes) and the expected outputs; the device run copies the inputs over,
// launches the CUDA kernel on them and copies the outputs back.
#include <gtest/gtest.h>

#include <cmath>

#include "core/cuda/runtime.h"
#include "op_harness.h"

namespace flowrun {
namespace {

using testing::build_sample;
using testing::fill_input;
using testing::SampleProgram;

std::vector<std::string> ops_with_cuda_kernels() {
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

bool cuda_storable(DType t) {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16;
}

class CudaKernel : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaKernel, MatchesTheCpuKernel) {
  std::string why;
  ASSERT_GT(cuda::device_count(&why), 0) << "the gpu tests need a CUDA device: " << why;
  const OpDef& def = OpRegistry::get().at(GetParam());
  int checked = 0;
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    const KernelDef* k = def.kernel(DeviceKind::cuda, t);
    if (!k) continue;
    for (const OpSample& s : def.samples()) {
      SCOPED_TRACE(cat(s.label, " in ", dtype_name(t)));
      SampleProgram cpu = build_sample(def, s, false, t);
      const Graph& g = cpu.exec->program().graph;
      const Node* node = nullptr;
      for (const Node& n : g.nodes())
        if (n.name == "op") node = &n;
      ASSERT_NE(node, nullptr);
      bool storable = true;
      for (ValueId v : node->inputs) storable = storable && cuda_storable(g.value(v).dtype());
      for (ValueId v : node->outputs) storable = storable && cuda_storable(g.value(v).dtype());
      if (!storable) continue;  // e.g. a cast to f64, which the CUDA kernels do not store
      for (size_t i = 0; i < cpu.input_names.size(); ++i)
        fill_input(s, static_cast<int>(i), cpu.exec->tensor(cpu.input_names[i]), 11);
      cpu.exec->run();

      DeviceBuffers mem;
      std::vector<TensorView> in, out;
      for (size_t i = 0; i < node->inputs.size(); ++i) {
        const Tensor& host = cpu.exec->tensor(cpu.input_names[i]);
        void* d = mem.add(host.nbytes());
        cuda::to_device(d, host.raw(), host.nbytes());
        in.push_back({d, &g.value(node->inputs[i]).shape(), host.dtype()});
      }
      for (ValueId v : node->outputs)
        out.push_back({mem.add(g.value(v).nbytes()), &g.value(v).shape(), g.value(v).dtype()});
      KernelCtx ctx;
      ctx.node = node;
      ctx.in = in.data();
      ctx.num_in = static_cast<int>(in.size());
      ctx.out = out.data();
      ctx.num_out = static_cast<int>(out.size());
      k->fn(ctx);
      cuda::synchronize();

      for (size_t j = 0; j < out.size(); ++j) {
        const Tensor want_t = cpu.exec->output(cat("out", j));
        Tensor got_t = Tensor::empty(want_t.shape(), want_t.dtype());
        cuda::to_host(got_t.raw(), out[j].data, got_t.nbytes());
        const auto want = want_t.to_f64(), got = got_t.to_f64();
        double scale = 1e-3;
        for (double v : want) scale = std::max(scale, std::fabs(v));
        // f32: transcendental functions of CUDA's libm and the CPU's differ in the last bits; f16/bf16: one
        // rounding of the output apart.
        const double tol = (t == DType::bf16 ? 1.0 / 128 : t == DType::f16 ? 1.0 / 1024 : 1e-5) * scale;
        for (size_t e = 0; e < want.size(); ++e) {
          if (std::isnan(want[e]))
            EXPECT_TRUE(std::isnan(got[e])) << "output " << j << " [" << e << "]";
          else
            EXPECT_NEAR(got[e], want[e], tol) << "output " << j << " [" << e << "]";
        }
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 0) << "no sample of " << def.name << " ran on the device";
}

INSTANTIATE_TEST_SUITE_P(Registry, CudaKernel, ::testing::ValuesIn(ops_with_cuda_kernels()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace flowrun
