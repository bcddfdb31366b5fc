// Data parallelism without a launcher: rank detection from the environment, the data axis's SBP pass and
// gradient buckets, the sharded loader, and checkpoint comparison.
#include <gtest/gtest.h>

#include <map>

#include "ckpt/checkpoint.h"
#include "data/loader.h"
#include "graph/builder.h"
#include "graph/passes.h"
#include "parallel/comm.h"
#include "parallel/launch.h"
#include "runtime/executor.h"

namespace flowrun {
namespace {

LaunchInfo launch_with(const std::map<std::string, std::string>& vars) {
  return detect_launch([&](const char* n) -> const char* {
    auto it = vars.find(n);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(ParallelLaunch, EnvironmentsInPriorityOrder) {
  EXPECT_EQ(launch_with({}).world, 1);
  EXPECT_EQ(launch_with({}).source, "none");
  // mpirun inside sbatch: every rank sees SLURM_PROCID=0, OpenMPI's variables win.
  const LaunchInfo m = launch_with({{"OMPI_COMM_WORLD_RANK", "3"},
                                    {"OMPI_COMM_WORLD_SIZE", "4"},
                                    {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                    {"SLURM_PROCID", "0"},
                                    {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(m.rank, 3);
  EXPECT_EQ(m.world, 4);
  EXPECT_EQ(m.local_rank, 1);
  EXPECT_EQ(m.source, "OMPI");
  // srun --mpi=pmix: PMIX_RANK and SLURM_* only.
  const LaunchInfo p =
      launch_with({{"PMIX_RANK", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"}, {"SLURM_PROCID", "1"}});
  EXPECT_EQ(p.source, "PMIX");
  EXPECT_EQ(p.rank, 1);
  EXPECT_EQ(p.world, 2);
  EXPECT_EQ(launch_with({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "3"}}).source, "SLURM");
  const LaunchInfo r = launch_with({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  EXPECT_EQ(r.source, "RANK");
  EXPECT_EQ(r.world, 1);
}

// Issue 16 row 15: RANK/WORLD_SIZE with MASTER_ADDR is torchrun's launch; MPI would see a world of one.
TEST(ParallelLaunch, TorchrunStyleWorldIsRefusedNamingTheLaunchers) {
  try {
    launch_with({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_input);
    const std::string m = e.what();
    EXPECT_NE(m.find("mpirun -np 2"), std::string::npos) << m;
    EXPECT_NE(m.find("srun -n 2 --mpi=pmix"), std::string::npos) << m;
  }
}

TEST(ParallelLaunch, MalformedEnvironmentIsAnInputError) {
  EXPECT_THROW(launch_with({{"RANK", "x"}, {"WORLD_SIZE", "1"}}), Error);
  EXPECT_THROW(launch_with({{"RANK", "1"}, {"WORLD_SIZE", "1"}}), Error);
  EXPECT_THROW(launch_with({{"RANK", "0"}}), Error);
  try {
    launch_with({{"OMPI_COMM_WORLD_RANK", "-1"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_input);
    EXPECT_NE(std::string(e.what()).find("OMPI_COMM_WORLD_RANK"), std::string::npos);
  }
}

TEST(ParallelComm, SingleProcessWorld) {
  const auto c = world_communicator({});
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(std::string(c->backend()), "single");
  float x[2] = {1, 2}, y[2] = {0, 0};
  c->all_reduce(x, 2, DType::f32, ReduceOp::sum);
  c->all_gather(x, y, 2, DType::f32);
  EXPECT_EQ(y[1], 2.0f);
}

// A linear model with dropout on the global batch of 8, data rank 2 of 4: each rank computes its 2 rows, the
// loss is its mean scaled by 1/4 (a partial sum) and all-reduced, the parameters' gradient all-reduces are
// fused into one bucket, and dropout numbers its elements from the rank's first row of the whole.
TEST(ParallelPass, GradientsBucketedAndLossReduced) {
  Graph g;
  GraphBuilder b(g);
  const ValueId x = b.input("x", {8, 3});
  const ValueId h = b.op("dropout", {x}, {{"p", 0.5}})[0];
  const ValueId y = b.op1("linear", {h, b.param("w", {2, 3}), b.param("b", {2})});
  g.mark_output("loss", b.op1("mse_loss", {y, b.input("t", {8, 2})}));
  CompileOptions o;
  o.optimizer.type = "sgd";
  o.data_parallel = 4;
  o.data_rank = 2;
  const Program p = compile(std::move(g), o);
  const Graph& pg = p.graph;
  EXPECT_EQ(pg.value(pg.find_value("x")).shape(), (Shape{2, 3}));
  EXPECT_EQ(pg.value(pg.find_value("x")).placement.data, Sbp::split(0));
  EXPECT_EQ(pg.value(pg.find_value("w")).placement.data, Sbp::broadcast());
  int starts = 0, dropouts = 0;
  for (NodeId id : p.order) {
    const Node& n = pg.node(id);
    if (n.op == "dropout") {
      ++dropouts;
      EXPECT_EQ(n.attrs.ints("rng_whole"), (std::vector<int64_t>{8, 3}));
      EXPECT_EQ(n.attrs.ints("rng_start"), (std::vector<int64_t>{4, 0}));
    }
    starts += n.op == "all_reduce_start" && n.inputs.size() == 2;
    EXPECT_NE(n.op, "sbp_all_gather") << n.name;  // nothing gathers the batch
  }
  EXPECT_EQ(dropouts, 1);
  EXPECT_EQ(starts, 1);
  for (const auto& [param, grad] : pg.param_grads())
    EXPECT_EQ(pg.node(pg.value(grad).producer).op, "all_reduce_wait") << pg.value(param).name;
  const Node& reduce = pg.node(pg.value(pg.outputs().at("loss")).producer);
  EXPECT_EQ(reduce.op, "sbp_all_reduce");
  EXPECT_EQ(reduce.attrs.s("mesh"), "data");
  const Node& mean = pg.node(pg.value(reduce.inputs[0]).producer);
  EXPECT_EQ(mean.op, "mul_scalar");
  EXPECT_DOUBLE_EQ(mean.attrs.f("value"), 0.25);
}

// Dropout's mask of a [rows, 6] piece (attrs: the piece's rng_whole/rng_start, or none) at step 3,
// micro-batch `micro` of the step.
std::vector<uint8_t> dropout_mask(int64_t rows, int64_t cols, const Attrs& piece, int64_t micro) {
  Graph g;
  GraphBuilder b(g);
  Attrs a = piece;
  a.set("p", 0.5);
  const auto out = b.op("dropout", {b.input("x", {rows, cols})}, a, "drop");
  g.mark_output("mask", out[1]);
  CompileOptions o;
  o.loss = "";
  Executor ex(compile(std::move(g), o), kCpu, 9);
  ex.tensor("x").fill_from(std::vector<double>(static_cast<size_t>(rows * cols), 1.0));
  ex.set_step(3);
  ex.set_micro(micro);
  ex.run();
  const Tensor m = ex.output("mask");
  return std::vector<uint8_t>(m.data<uint8_t>(), m.data<uint8_t>() + m.numel());
}

// Micro-batch m of b rows draws the masks of rows m * b.. of the step's whole batch: alone, as a data rank's
// rows of it (one contiguous run) and as a tensor rank's columns (row by row), so that accumulation and
// pipeline micro-batches follow the unsplit batch with dropout.
TEST(ParallelDropout, MicroBatchesDrawTheWholeBatchsMasks) {
  const std::vector<uint8_t> whole = dropout_mask(8, 6, {}, 0);
  auto rows_of_whole = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    std::vector<uint8_t> v;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) v.push_back(whole[static_cast<size_t>(r * 6 + c)]);
    return v;
  };
  for (int64_t m : {0, 1}) {
    SCOPED_TRACE(cat("micro-batch ", m));
    EXPECT_EQ(dropout_mask(4, 6, {}, m), rows_of_whole(4 * m, 4 * m + 4, 0, 6));
    // Data rank 1 of 2: rows 2..3 of the micro-batch of 4.
    const Attrs data_rank{{"rng_whole", std::vector<int64_t>{4, 6}},
                          {"rng_start", std::vector<int64_t>{2, 0}}};
    EXPECT_EQ(dropout_mask(2, 6, data_rank, m), rows_of_whole(4 * m + 2, 4 * m + 4, 0, 6));
    // Tensor rank 1 of 2: columns 3..5.
    const Attrs tensor_rank{{"rng_whole", std::vector<int64_t>{4, 6}},
                            {"rng_start", std::vector<int64_t>{0, 3}}};
    EXPECT_EQ(dropout_mask(4, 3, tensor_rank, m), rows_of_whole(4 * m, 4 * m + 4, 3, 6));
  }
}

// A batched matmul over a shared weight keeps the batch split on the data axis (no gather), and under
// tensor parallelism a weight split by columns gives output columns split: the matmul's own signatures.
TEST(ParallelPass, MatmulSignatures) {
  for (MeshAxis axis : {MeshAxis::data, MeshAxis::tensor}) {
    Graph g;
    GraphBuilder b(g);
    const ValueId x = b.input("x", {4, 3, 6});
    const ValueId w = b.param("w", {6, 8});
    g.mark_output("y", b.op1("matmul", {x, w}));
    split_over_axis(g, axis, 2, 1);
    int gathers = 0;
    for (NodeId id : g.live_nodes_topological()) gathers += g.node(id).op == "sbp_all_gather";
    const Value& local_x = g.value(g.find_value("x"));
    const Value& local_w = g.value(g.find_value("w"));
    if (axis == MeshAxis::data) {
      EXPECT_EQ(gathers, 0);
      EXPECT_EQ(local_x.shape(), (Shape{2, 3, 6}));
      EXPECT_EQ(local_w.shape(), (Shape{6, 8}));
    } else {
      // The free weight takes the split its reader asks for; the output is gathered whole for the caller.
      EXPECT_EQ(local_w.placement.tensor, Sbp::split(1));
      EXPECT_EQ(local_w.shape(), (Shape{6, 4}));
      EXPECT_EQ(gathers, 1);
    }
  }
}

// Small buckets on a 3-layer MLP: the last layer's gradients are bucketed first, and each bucket's transfer
// starts while the backward pass still has layers to go; every wait comes after the whole backward pass.
TEST(ParallelPass, BucketsStartDuringTheBackwardPass) {
  Graph g;
  GraphBuilder b(g);
  ValueId h = b.input("x", {8, 16});
  for (int i = 0; i < 3; ++i) {
    b.push_scope(cat("l", i));
    h = b.op1("relu", {b.op1("linear", {h, b.param("w", {16, 16}), b.param("b", {16})})});
    b.pop_scope();
  }
  g.mark_output("loss", b.op1("mse_loss", {h, b.input("t", {8, 16})}));
  CompileOptions o;
  o.optimizer.type = "sgd";
  o.data_parallel = 2;
  o.bucket_bytes = 16 * 16 * 4;  // one weight per bucket
  const Program p = compile(std::move(g), o);
  std::vector<std::string> started;
  size_t first_start = p.order.size(), last_backward = 0, first_wait = p.order.size();
  for (size_t i = 0; i < p.order.size(); ++i) {
    const Node& n = p.graph.node(p.order[i]);
    if (n.op == "all_reduce_start") {
      first_start = std::min(first_start, i);
      started.push_back(p.graph.value(n.inputs[0]).name);
    }
    if (n.op == "all_reduce_wait") first_wait = std::min(first_wait, i);
    if (n.op == "matmul") last_backward = i;
  }
  ASSERT_GE(started.size(), 3u);
  EXPECT_LT(first_start, last_backward);  // overlaps the rest of the backward pass
  EXPECT_GT(first_wait, last_backward);
  EXPECT_NE(started[0].find("l2"), std::string::npos) << started[0];  // the last layer's gradients first
}

// ZeRO-1 over 4 ranks: AdamW's moments hold a quarter of each parameter (rounded up) and remember its whole
// shape; every parameter is cut into its local shard and gathered back after the update.
TEST(ParallelZero, OptimizerStateIsSharded) {
  Graph g;
  GraphBuilder b(g);
  const ValueId y = b.op1("linear", {b.input("x", {4, 5}), b.param("w", {2, 5}), b.param("b", {2})});
  g.mark_output("loss", b.op1("mse_loss", {y, b.input("t", {4, 2})}));
  CompileOptions o;
  o.optimizer.type = "adamw";
  o.optimizer.zero_shards = 4;
  o.data_parallel = 4;
  const Program p = compile(std::move(g), o);
  const Graph& pg = p.graph;
  EXPECT_EQ(pg.value(pg.find_value("opt/w/m")).shape(), (Shape{3}));  // ceil(10 / 4)
  EXPECT_EQ(pg.value(pg.find_value("opt/w/v")).placement.global_shape, (Shape{2, 5}));
  EXPECT_EQ(pg.value(pg.find_value("opt/b/m")).shape(), (Shape{1}));
  int shards = 0, gathers = 0;
  for (NodeId id : p.order) {
    shards += pg.node(id).op == "local_shard";
    gathers += pg.node(id).op == "all_gather_into";
  }
  EXPECT_EQ(shards, 4);  // parameter and gradient of each
  EXPECT_EQ(gathers, 2);
  // Each gather comes after its parameter's update.
  auto pos = [&](const std::string& name) {
    for (size_t i = 0; i < p.order.size(); ++i)
      if (pg.node(p.order[i]).name == name) return static_cast<int>(i);
    return -1;
  };
  EXPECT_LT(pos("update/w"), pos("zero/w/gather"));
  EXPECT_GE(pos("update/w"), 0);
}

// Two shards of a sharded loader together hold exactly the rows of the unsharded one, in order.
TEST(ParallelLoader, ShardsPartitionTheGlobalBatch) {
  class Rows final : public Dataset {
   public:
    Rows() { spec_.sample_shape = {1}, spec_.num_classes = 10; }
    const DataSpec& spec() const override { return spec_; }
    int64_t size(Split) const override { return 40; }
    void fill(Split, int64_t i, Tensor& x, Tensor& y, int64_t row) const override {
      x.data<float>()[row] = static_cast<float>(i);
      y.data<int64_t>()[row] = i % 10;
    }
    int64_t memory_bytes() const override { return 0; }  // samples are computed

   private:
    DataSpec spec_;
  } data;
  Loader whole(data, Split::train, 8, true, 5, 0);
  Loader s0(data, Split::train, 8, true, 5, 0, {}, 0, 2), s1(data, Split::train, 8, true, 5, 0, {}, 1, 2);
  for (int step = 0; step < 7; ++step) {  // crosses an epoch (5 batches of 8)
    const Batch& w = whole.next();
    const Batch &a = s0.next(), &c = s1.next();
    ASSERT_EQ(a.x.numel(), 4);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(a.x.data<float>()[r], w.x.data<float>()[r]) << "step " << step;
      EXPECT_EQ(c.x.data<float>()[r], w.x.data<float>()[4 + r]) << "step " << step;
    }
    EXPECT_EQ(a.position.epoch, w.position.epoch);
    EXPECT_EQ(a.position.index, w.position.index);
  }
  EXPECT_THROW(Loader(data, Split::train, 9, true, 5, 0, {}, 0, 2), Error);
}

TEST(ParallelCheckpoint, CompareIsRelativeToEachTensorsScale) {
  CheckpointData a, b;
  a.params.emplace("w", Tensor::from<float>({3}, {100.0f, 1e-6f, -50.0f}));
  b.params.emplace("w", Tensor::from<float>({3}, {100.0f, 5e-5f, -50.0f}));  // 5e-5 off at scale 100
  double worst = 0;
  EXPECT_TRUE(compare_checkpoints(a, b, 1e-6, &worst).empty());
  EXPECT_NEAR(worst, 4.9e-7, 1e-8);
  EXPECT_EQ(compare_checkpoints(a, b, 1e-7).size(), 1u);
  b.state.emplace("m", Tensor::from<float>({1}, {1.0f}));
  EXPECT_EQ(compare_checkpoints(a, b, 1e-6).size(), 1u);  // only in the second
}

}  // namespace
}  // namespace flowrun
