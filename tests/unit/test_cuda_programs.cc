// The GPU programs compile without a GPU (CUDA builds): every op of the training and evaluation steps of the
// configs meant for a GPU (fp32, bf16, fp16 with loss scaling; the MLP, GPTs, the CNN and the ResNet; the
// GPT's data, tensor and data x tensor parallel layouts) has a native CUDA kernel in the dtype the step uses
// (compile's check_kernels for the cuda device), the updates are multi-tensor ones, and a model with an op
// that has none is refused naming it. The GPU's fusion of linear and tanh GELU (any build): where
// it applies, and that the fused op computes, forward and backward, what the pair does (on the CPU,
// bitwise).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "config/config.h"
#include "core/cuda_backend.h"
#include "graph/builder.h"
#include "graph/passes.h"
#include "ops/registry.h"
#include "runtime/executor.h"
#include "train/program.h"

namespace flowrun {
namespace {

// x (6, 5) -> linear (8, with bias) -> gelu -> linear (3) -> sum of squares; with `second_reader` the first
// linear's result is also added to the loss.
void gelu_mlp(Graph& g, const std::string& approximate, bool second_reader = false) {
  GraphBuilder b(g);
  const ValueId x = g.add_input("x", {6, 5}, DType::f32);
  const ValueId w1 = g.add_param("w1", {8, 5}, DType::f32), b1 = g.add_param("b1", {8}, DType::f32);
  const ValueId w2 = g.add_param("w2", {3, 8}, DType::f32);
  const ValueId pre = b.op1("linear", {x, w1, b1});
  const ValueId y = b.op1("linear", {b.op1("gelu", {pre}, {{"approximate", approximate}}), w2});
  ValueId loss = b.reduce_sum(b.mul(y, y), {});
  if (second_reader) loss = b.add(loss, b.reduce_sum(pre, {}));
  g.mark_output("loss", loss);
}

int live_ops(const Graph& g, const std::string& op, bool with_activation = false) {
  int n = 0;
  for (const Node& node : g.nodes())
    n += !node.dead && node.op == op && node.attrs.has("activation") == with_activation;
  return n;
}

TEST(GeluFusion, OnlyTheGpusTanhGeluJoinsTheLinearBeforeIt) {
  for (const std::string approximate : {"tanh", "none"})
    for (DeviceKind d : {DeviceKind::cpu, DeviceKind::cuda})
      for (bool second_reader : {false, true}) {
        SCOPED_TRACE(cat(approximate, " on ", device_kind_name(d), second_reader ? ", pre read twice" : ""));
        Graph g;
        gelu_mlp(g, approximate, second_reader);
        fuse_ops(g, d);
        const bool fused = d == DeviceKind::cuda && approximate == "tanh" && !second_reader;
        EXPECT_EQ(live_ops(g, "gelu"), fused ? 0 : 1);
        EXPECT_EQ(live_ops(g, "linear", true), fused ? 1 : 0);
        EXPECT_EQ(live_ops(g, "linear"), fused ? 1 : 2);
      }
}

TEST(GeluFusion, TheFusedLinearGivesWhatLinearThenGeluGive) {
  // One SGD step on the CPU: the loss and the updated parameters (so every gradient) bitwise equal.
  std::vector<std::vector<float>> runs;
  for (bool fuse : {false, true}) {
    Graph g;
    gelu_mlp(g, "tanh");
    if (fuse) fuse_ops(g, DeviceKind::cuda);
    CompileOptions opts;
    opts.fuse = false;
    opts.optimizer.type = "sgd";
    Executor ex(compile(std::move(g), opts), kCpu, 1);
    for (const char* name : {"x", "w1", "b1", "w2"}) {
      Tensor& t = ex.tensor(name);
      std::vector<double> v(static_cast<size_t>(t.numel()));
      for (size_t k = 0; k < v.size(); ++k) v[k] = std::sin(1.7 * static_cast<double>(k) + name[0] + name[1]);
      t.fill_from(v);
    }
    ex.tensor("lr").data<float>()[0] = 0.1f;
    ex.run();
    std::vector<float> r = {ex.output("loss").data<float>()[0]};
    for (const char* name : {"w1", "b1", "w2"}) {
      const Tensor& t = ex.tensor(name);
      r.insert(r.end(), t.data<float>(), t.data<float>() + t.numel());
    }
    runs.push_back(r);
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  EXPECT_EQ(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)), 0);
}

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

// The GPU's updates are multi-tensor ones (graph pass group_updates): a training step has at least one and no
// single update is left.
void expect_grouped_updates(const Program& p, bool training) {
  int multi = 0;
  for (NodeId id : p.order) {
    const Node& n = p.graph.node(id);
    EXPECT_TRUE(n.op != "sgd_update" && n.op != "adamw_update") << n.name << " was not grouped";
    multi += n.op.ends_with("_update_multi");
  }
  if (training) {
    EXPECT_GE(multi, 1);
  }
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
      expect_grouped_updates(p, training);
      // Native, not widened: widening converts on the host, which the GPU executor refuses.
      for (NodeId id : p.order) {
        const Node& n = p.graph.node(id);
        const KernelChoice k =
            select_kernel(OpRegistry::get().at(n.op), DeviceKind::cuda, kernel_dtype(p.graph, n));
        EXPECT_TRUE(k.kernel && !k.widened)
            << n.name << " (" << n.op << ", " << dtype_name(kernel_dtype(p.graph, n)) << ")";
        // The GPT's MLP GELU (tanh) runs in its linear's GEMM epilogue.
        EXPECT_NE(n.op, "gelu") << n.name;
        // A convolution plans cuDNN's workspace (the CUDA kernel's own), not the CPU's im2col buffer.
        if (n.op.starts_with("conv2d")) {
          EXPECT_EQ(p.memory.workspace_bytes[static_cast<size_t>(id)], size_t{64} << 20) << n.name;
        }
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
      expect_grouped_updates(p, true);
    }
  }
}

// Pipeline stages on GPUs: each stage's program (the stage boundary's inputs and outputs, the tied
// embeddings' all-reduce between the ends, the gradient norm over the stages) has native CUDA kernels.
TEST(CudaPrograms, PipelineStagesCompileForTheGpu) {
  const RunConfig cfg = load_config(FLOWRUN_SOURCE_DIR "/configs/kjv_gpt.yaml",
                                    {"train.device=cuda", "parallel.pipeline=2", "parallel.micro_batches=4",
                                     "precision.dtype=bf16", "train.clip_grad_norm=1.0"});
  for (int64_t stage : {0, 1}) {
    SCOPED_TRACE(cat("stage ", stage));
    BuiltModel m;
    const Program p = compile_model(cfg, text_spec(128), 2, true, &m, 0, stage, 0);
    for (NodeId id : p.order) {
      const Node& n = p.graph.node(id);
      const KernelChoice k =
          select_kernel(OpRegistry::get().at(n.op), DeviceKind::cuda, kernel_dtype(p.graph, n));
      EXPECT_TRUE(k.kernel && !k.widened) << n.name << " (" << n.op << ")";
    }
    expect_grouped_updates(p, true);
  }
}

// Tensor parallelism on GPUs, alone and under data parallelism: Megatron's GPT (column and row-parallel
// linears, vocabulary-parallel embedding and tied head) with the vocabulary-parallel cross-entropy, whose
// row statistics its CUDA kernel reduces over the tensor axis. Every rank coordinate's training and
// evaluation programs have a native CUDA kernel for every node.
TEST(CudaPrograms, TensorParallelProgramsCompileForTheGpu) {
  for (const char* layout : {"parallel.data=1", "parallel.data=2"}) {
    const RunConfig cfg = load_config(FLOWRUN_SOURCE_DIR "/configs/kjv_gpt.yaml",
                                      {"train.device=cuda", "parallel.tensor=2", layout});
    for (int64_t data_rank = 0; data_rank < cfg.parallel.data; ++data_rank)
      for (int64_t tensor_rank : {0, 1})
        for (bool training : {true, false}) {
          SCOPED_TRACE(cat(layout, ", data rank ", data_rank, ", tensor rank ", tensor_rank,
                           training ? " training" : " evaluation"));
          BuiltModel m;
          const Program p = compile_model(cfg, text_spec(128), 2, training, &m, tensor_rank, 0, data_rank);
          int split_losses = 0;
          for (NodeId id : p.order) {
            const Node& n = p.graph.node(id);
            const KernelChoice k =
                select_kernel(OpRegistry::get().at(n.op), DeviceKind::cuda, kernel_dtype(p.graph, n));
            EXPECT_TRUE(k.kernel && !k.widened) << n.name << " (" << n.op << ")";
            split_losses += n.op.starts_with("cross_entropy") && n.attrs.has("classes");
          }
          EXPECT_EQ(split_losses, training ? 2 : 1) << "the cross-entropy (and its gradient) split by class";
          expect_grouped_updates(p, training);
        }
  }
}

TEST(CudaPrograms, AnOpWithoutACudaKernelIsNamed) {
  // Every op has CUDA kernels now, for the dtypes the GPU stores (f32, f16, bf16): an f64 op has none.
  cuda::backend();  // the CUDA kernels join the registry
  Graph g;
  GraphBuilder b(g);
  const ValueId x = b.input("x", {4}, DType::f64);
  g.mark_output("y", b.op1("tanh", {x}));
  try {
    check_kernels(g, DeviceKind::cuda);
    FAIL() << "an f64 tanh passed for the GPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_input);
    EXPECT_NE(std::string(e.what()).find("tanh"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no cuda kernel for f64"), std::string::npos) << e.what();
  }
}

#endif

}  // namespace
}  // namespace flowrun
