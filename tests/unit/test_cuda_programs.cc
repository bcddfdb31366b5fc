// The GPU programs compile without a GPU (CUDA builds): every op of the training and evaluation steps of the
// configs meant for a GPU (fp32, bf16, fp16 with loss scaling; the MLP, GPTs, the CNN and the ResNet) has a
// native CUDA kernel in the dtype the step uses (compile's check_kernels for the cuda device), and a model
// with an op that has none is refused naming it.
#include <gtest/gtest.h>

#include <fstream>

#include "config/config.h"
#include "graph/passes.h"
#include "ops/registry.h"
#include "train/program.h"

namespace flowrun {
namespace {

#ifdef FLOWRUN_HAS_CUDA

DataSpec text_spec(int64_t seq_len) {
  DataSpec s;
  s.text = true;
  s.sample_shape = {seq_len};
  s.num_classes = 256;
  return s;
}

DataSpec image_spec(int64_t c, int64_t h, int64_t w) {
  DataSpec s;
  s.sample_shape = {c, h, w};
  s.num_classes = 10;
  return s;
}

TEST(CudaPrograms, GpuConfigsCompileForTheGpu) {
  struct Case {
    std::string file;
    std::vector<std::string> sets;
    DataSpec spec;
  };
  const std::vector<Case> cases = {
      {"configs/quickstart.yaml", {}, image_spec(1, 28, 28)},
      {"configs/kjv_gpt.yaml", {}, text_spec(128)},
      {"configs/kjv_gpt.yaml",
       {"precision.dtype=bf16", "model.dropout=0.1", "train.grad_accumulation=2"},
       text_spec(128)},
      {"configs/kjv_gpt.yaml", {"precision.dtype=fp16"}, text_spec(128)},
      {"configs/bench/gpt2_124m.yaml", {"data.seq_len=64"}, text_spec(64)},
      {"configs/bench/cnn.yaml", {}, image_spec(1, 28, 28)},
      {"configs/fashion_cnn.yaml", {}, image_spec(1, 28, 28)},  // dropout, AdamW
      {"configs/bench/resnet.yaml", {}, image_spec(3, 32, 32)},
      {"configs/bench/resnet.yaml", {"precision.dtype=bf16"}, image_spec(3, 32, 32)},
      {"configs/bench/resnet.yaml",
       {"precision.dtype=fp16", "model.block=bottleneck", "model.depth=29"},
       image_spec(3, 32, 32)},
  };
  for (const Case& c : cases) {
    std::vector<std::string> sets = c.sets;
    sets.push_back("train.device=cuda");
    const RunConfig cfg = load_config(FLOWRUN_SOURCE_DIR "/" + c.file, sets);
    for (bool training : {true, false}) {
      SCOPED_TRACE(cat(c.file, training ? " training" : " evaluation"));
      BuiltModel m;
      const Program p = compile_model(cfg, c.spec, 2, training, &m);
      EXPECT_GT(p.order.size(), 0u);
      // Native, not widened: widening converts on the host, which the GPU executor refuses.
      for (NodeId id : p.order) {
        const Node& n = p.graph.node(id);
        const KernelChoice k =
            select_kernel(OpRegistry::get().at(n.op), DeviceKind::cuda, kernel_dtype(p.graph, n));
        EXPECT_TRUE(k.kernel && !k.widened)
            << n.name << " (" << n.op << ", " << dtype_name(kernel_dtype(p.graph, n)) << ")";
        // A convolution plans cuDNN's workspace (the CUDA kernel's own), not the CPU's im2col buffer.
        if (n.op.starts_with("conv2d")) {
          EXPECT_EQ(p.memory.workspace_bytes[static_cast<size_t>(id)], size_t{64} << 20) << n.name;
        }
      }
    }
  }
}

TEST(CudaPrograms, AnOpWithoutACudaKernelIsNamed) {
  // rmsnorm has no CUDA kernel yet.
  const std::string path = ::testing::TempDir() + "/cuda_rmsnorm.yaml";
  std::ofstream(path) << "model:\n"
                         "  layers:\n"
                         "    - flatten\n"
                         "    - linear: {name: fc, out: 16}\n"
                         "    - rmsnorm: {name: norm}\n"
                         "    - linear: {name: head, out: 10}\n"
                         "data:\n"
                         "  dataset: fashion_mnist\n";
  const RunConfig cfg = load_config(path, {"train.device=cuda"});
  BuiltModel m;
  try {
    compile_model(cfg, image_spec(1, 28, 28), 2, true, &m);
    FAIL() << "compiled an rmsnorm for the GPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_input);
    EXPECT_NE(std::string(e.what()).find("rmsnorm"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no cuda kernel"), std::string::npos) << e.what();
  }
}

#endif

}  // namespace
}  // namespace flowrun
