// The GPU programs compile without a GPU (CUDA builds): every op of the training and evaluation steps of the
// configs meant for a GPU (fp32, bf16, fp16 with loss scaling) has a native CUDA kernel in the dtype the step
// uses (compile's check_kernels for
// the cuda device), and a model with an op that has none is refused naming it.
#include <gtest/gtest.h>

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
      }
    }
  }
}

// Data parallelism on GPUs: each rank's program (gradient buckets, ZeRO's shards and gathers, the sharded
// gradient norm) has native CUDA kernels for every node, the collectives included (NCCL's).
TEST(CudaPrograms, DataParallelProgramsCompileForTheGpu) {
  for (const char* zero : {"0", "1", "2"}) {
    const RunConfig cfg = load_config(FLOWRUN_SOURCE_DIR "/configs/kjv_gpt.yaml",
                                      {"train.device=cuda", "parallel.data=2", cat("parallel.zero=", zero),
                                       "precision.dtype=bf16", "train.clip_grad_norm=1.0"});
    for (int64_t rank : {0, 1}) {
      SCOPED_TRACE(cat("zero ", zero, ", data rank ", rank));
      BuiltModel m;
      const Program p = compile_model(cfg, text_spec(128), 2, true, &m, 0, 0, rank);
      int collectives = 0;
      for (NodeId id : p.order) {
        const Node& n = p.graph.node(id);
        const KernelChoice k =
            select_kernel(OpRegistry::get().at(n.op), DeviceKind::cuda, kernel_dtype(p.graph, n));
        EXPECT_TRUE(k.kernel && !k.widened) << n.name << " (" << n.op << ")";
        collectives +=
            n.op.starts_with("all_") || n.op.starts_with("sbp_") || n.op.find("shard") != n.op.npos;
      }
      EXPECT_GT(collectives, 0) << "no collective in a data-parallel program";
    }
  }
}

TEST(CudaPrograms, AnOpWithoutACudaKernelIsNamed) {
  const RunConfig cfg = load_config(FLOWRUN_SOURCE_DIR "/configs/fashion_cnn.yaml", {"train.device=cuda"});
  BuiltModel m;
  try {
    compile_model(cfg, image_spec(1, 28, 28), 2, true, &m);
    FAIL() << "compiled a convolution for the GPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_input);
    EXPECT_NE(std::string(e.what()).find("conv2d"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no cuda kernel"), std::string::npos) << e.what();
  }
}

#endif

}  // namespace
}  // namespace flowrun
