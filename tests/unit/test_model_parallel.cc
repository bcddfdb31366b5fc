// Tensor and pipeline parallelism without a launcher: SBP values, the layout SBP deduction gives the zoo's
// GPT and MLP, the local programs of every tensor rank run in threads over an in-process communicator against
// one process, and the pipeline's cut into stages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "graph/passes.h"
#include "nn/model.h"
#include "parallel/comm.h"
#include "parallel/sbp.h"
#include "runtime/executor.h"

namespace flowrun {
namespace {

TEST(Sbp, ParseAndPrint) {
  EXPECT_EQ(parse_sbp("B", 2, "t").str(), "B");
  EXPECT_EQ(parse_sbp("S(1)", 2, "t"), Sbp::split(1));
  EXPECT_EQ(parse_sbp("S(-1)", 3, "t"), Sbp::split(2));
  EXPECT_EQ(parse_sbp("S(0)x3", 2, "t").str(), "S(0)x3");
  for (const char* bad : {"S(2)", "S", "S(0", "S(0)x", "S(0)x0", "Q", "S(0)y3"})
    EXPECT_THROW(parse_sbp(bad, 2, "t"), Error) << bad;
}

TEST(Sbp, PiecesPutBackTogether) {
  // [6, 4] split on axis 0 in 3 groups over 2 ranks: rank r holds rows {r, 2 + r, 4 + r}... of each group.
  Tensor whole = Tensor::empty({6, 4}, DType::f32);
  for (int64_t i = 0; i < 24; ++i) whole.data<float>()[i] = static_cast<float>(i);
  const Sbp s = Sbp::split(0, 3);
  EXPECT_TRUE(splittable({6, 4}, s, 2));
  EXPECT_FALSE(splittable({4, 4}, s, 2));
  const Tensor p1 = take_part(whole, s, 1, 2);
  ASSERT_EQ(p1.shape(), (Shape{3, 4}));
  EXPECT_EQ(p1.data<float>()[0], 4.0f);   // row 1 of group 0
  EXPECT_EQ(p1.data<float>()[4], 12.0f);  // row 1 of group 1
  Tensor back = Tensor::zeros({6, 4}, DType::f32);
  for (int64_t r = 0; r < 2; ++r) put_part(back, take_part(whole, s, r, 2), s, r, 2);
  EXPECT_EQ(std::memcmp(back.raw(), whole.raw(), whole.nbytes()), 0);
}

// The ranks of one process's threads: each collective waits for every rank, then each combines the others'
// buffers in rank order (the same bits everywhere, as MPI's).
class ThreadGroup {
 public:
  explicit ThreadGroup(int n) : n_(n), bufs_(static_cast<size_t>(n)) {}
  int size() const { return n_; }
  // Publishes `buf` for rank r, waits for all, runs f(all buffers), waits again so that nobody reuses early.
  template <typename F>
  void exchange(int r, const void* buf, F f) {
    arrive(r, buf);
    f(bufs_);
    arrive(r, nullptr);
  }

 private:
  void arrive(int r, const void* buf) {
    std::unique_lock<std::mutex> l(m_);
    if (buf) bufs_[static_cast<size_t>(r)] = buf;
    const int64_t gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(l, [&] { return gen_ != gen; });
    }
  }
  int n_;
  std::vector<const void*> bufs_;
  std::mutex m_;
  std::condition_variable cv_;
  int count_ = 0;
  int64_t gen_ = 0;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(ThreadGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_.size(); }
  const char* backend() const override { return "threads"; }
  void all_reduce(void* data, int64_t n, DType t, ReduceOp op) override {
    std::vector<char> mine(static_cast<size_t>(n) * dtype_size(t));
    std::memcpy(mine.data(), data, mine.size());
    g_.exchange(rank_, mine.data(), [&](const std::vector<const void*>& all) {
      for (int64_t i = 0; i < n; ++i) {
        double acc = 0;
        for (size_t r = 0; r < all.size(); ++r) {
          const double v =
              t == DType::f64 ? static_cast<const double*>(all[r])[i] : static_cast<const float*>(all[r])[i];
          acc = r == 0 ? v : op == ReduceOp::sum ? acc + v : std::max(acc, v);
        }
        if (t == DType::f64)
          static_cast<double*>(data)[i] = acc;
        else
          static_cast<float*>(data)[i] = static_cast<float>(acc);
      }
    });
  }
  void broadcast(void*, int64_t, DType, int) override { FAIL() << "unused"; }
  void all_gather(const void* in, void* out, int64_t n, DType t) override {
    const size_t bytes = static_cast<size_t>(n) * dtype_size(t);
    g_.exchange(rank_, in, [&](const std::vector<const void*>& all) {
      for (size_t r = 0; r < all.size(); ++r) std::memcpy(static_cast<char*>(out) + r * bytes, all[r], bytes);
    });
  }
  void reduce_scatter(const void* in, void* out, int64_t n, DType t, ReduceOp) override {
    ASSERT_EQ(t, DType::f32);
    g_.exchange(rank_, in, [&](const std::vector<const void*>& all) {
      for (int64_t i = 0; i < n; ++i) {
        float acc = 0;
        for (const void* b : all) acc += static_cast<const float*>(b)[rank_ * n + i];
        static_cast<float*>(out)[i] = acc;
      }
    });
  }
  void send(const void*, int64_t, DType, int, int) override { FAIL() << "unused"; }
  void recv(void*, int64_t, DType, int, int) override { FAIL() << "unused"; }
  void post(const void*, int64_t, DType, int, int) override { FAIL() << "unused"; }
  void flush() override {}
  void barrier() override {
    g_.exchange(rank_, this, [](const auto&) {});
  }
  // Synchronous: the wait then has nothing left to do.
  int64_t start_all_reduce(void* data, int64_t n, DType t, ReduceOp op) override {
    all_reduce(data, n, t, op);
    return 0;
  }
  void wait(int64_t) override {}
  std::shared_ptr<Communicator> split(int, int) override { return nullptr; }

 private:
  ThreadGroup& g_;
  int rank_;
};

ModelConfig zoo(const std::string& name, const std::string& params) {
  ModelConfig c;
  c.zoo = name;
  c.zoo_dir = FLOWRUN_SOURCE_DIR "/models";
  c.params = YAML::Load(params);
  return c;
}

const std::string kGpt = "{n_layer: 2, n_head: 4, d_model: 16, dropout: 0.1}";
const ModelInputs kText{true, {2, 8}, 32};

Program compile_tp(const ModelConfig& m, const ModelInputs& in, int64_t parts, int64_t rank,
                   BuiltModel* built, int64_t data = 1) {
  Graph g;
  *built = build_model(g, m, in, /*training=*/true);
  g.unmark_output("logits");  // as training programs do
  // SGD: the update is linear in the gradient (Adam's first step, lr * g / |g|, would magnify the rounding
  // differences of near-zero gradients).
  CompileOptions o;
  o.optimizer.type = "sgd";
  o.optimizer.momentum = 0.9;
  o.optimizer.clip_grad_norm = 0.5;
  o.tensor_parallel = data > 1 ? 1 : parts;
  o.tensor_rank = data > 1 ? 0 : rank;
  o.data_parallel = data;
  o.data_rank = data > 1 ? rank : 0;
  return compile(std::move(g), o);
}

std::string sbp_of(const Program& p, const std::string& name) {
  const ValueId v = p.graph.find_value(name);
  return v == kNoValue ? "absent" : p.graph.value(v).placement.tensor.str();
}

TEST(TensorParallel, GptGetsMegatronsLayout) {
  BuiltModel m;
  const Program p = compile_tp(zoo("gpt", kGpt), kText, 2, 1, &m);
  EXPECT_EQ(sbp_of(p, "wte/w"), "S(0)");  // vocabulary-parallel embedding and tied head
  EXPECT_EQ(sbp_of(p, "wpe/w"), "B");
  for (const std::string b : {"blocks.0/", "blocks.1/"}) {
    EXPECT_EQ(sbp_of(p, b + "attn/qkv/w"), "S(0)x3");  // column parallel, q|k|v split block by block
    EXPECT_EQ(sbp_of(p, b + "attn/qkv/b"), "S(0)x3");
    EXPECT_EQ(sbp_of(p, b + "attn/proj/w"), "S(1)");  // row parallel
    EXPECT_EQ(sbp_of(p, b + "attn/proj/b"), "B");
    EXPECT_EQ(sbp_of(p, b + "mlp/fc/w"), "S(0)");
    EXPECT_EQ(sbp_of(p, b + "mlp/proj/w"), "S(1)");
    EXPECT_EQ(sbp_of(p, b + "ln1/gamma"), "B");
  }
  // Each rank holds its piece; the whole shape is recorded.
  const Value& qkv = p.graph.value(p.graph.find_value("blocks.0/attn/qkv/w"));
  EXPECT_EQ(qkv.shape(), (Shape{24, 16}));
  EXPECT_EQ(qkv.placement.whole, (Shape{48, 16}));
  // Forward: 2 all-reduces per block and one for the embedding; backward: one per column-parallel input
  // (q|k|v, MLP up, tied head). Logits are never gathered (vocabulary-parallel cross-entropy).
  int reduces = 0, gathers = 0;
  for (NodeId id : p.order) {
    reduces += p.graph.node(id).op == "sbp_all_reduce";
    gathers += p.graph.node(id).op == "sbp_all_gather";
  }
  EXPECT_EQ(reduces, 10);
  EXPECT_EQ(gathers, 0);
}

TEST(TensorParallel, ModelYamlOverridesTheLayout) {
  ModelConfig c;
  c.layers = YAML::Load(
      "[{flatten: {}}, {linear: {name: a, out: 8, sbp: {w: B, b: B}}}, {activation: {kind: relu}}, "
      "{linear: {name: b, out: 4}}]");
  BuiltModel m;
  const Program p = compile_tp(c, {false, {4, 6}, 4}, 2, 0, &m);
  EXPECT_EQ(sbp_of(p, "a/w"), "B");
  EXPECT_EQ(sbp_of(p, "b/w"), "S(0)");  // B in: column parallel, and the cross-entropy splits by class
  ModelConfig bad;
  bad.layers = YAML::Load("[{flatten: {}}, {linear: {name: a, out: 8, sbp: {w: S(2)}}}]");
  Graph g;
  EXPECT_THROW(build_model(g, bad, {false, {4, 6}, 4}, true), Error);
  bad.layers = YAML::Load("[{flatten: {}}, {linear: {name: a, out: 8, sbp: {q: B}}}]");
  EXPECT_THROW(build_model(g, bad, {false, {4, 6}, 4}, true), Error);
}

// The batch of the ranks-in-threads tests: token ids and targets, or images and labels.
void feed_batch(Executor& ex, const ModelInputs& in) {
  Tensor& x = ex.tensor("x");
  Tensor& y = ex.tensor("y");
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (in.text)
      x.data<int64_t>()[i] = (i * 7 + 3) % in.num_classes;
    else
      x.data<float>()[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
  }
  for (int64_t i = 0; i < y.numel(); ++i) y.data<int64_t>()[i] = (i * 5 + 1) % in.num_classes;
  ex.tensor("lr").data<float>()[0] = 0.1f;
}

// One SGD step (clipped by the global norm) of `model` on `parts` tensor ranks (threads) gives the loss and
// the (gathered) weights of one process.
void expect_tensor_ranks_match_one_process(const ModelConfig& model, const ModelInputs& in) {
  BuiltModel built;
  Executor one(compile_tp(model, in, 1, 0, &built), kCpu, 5);
  init_parameters(built.init, 5, [&](const std::string& n) -> Tensor& { return one.tensor(n); });
  feed_batch(one, in);
  one.run();
  const double loss = one.output("loss").to_f64()[0];

  for (int parts : {2, 4}) {
    ThreadGroup group(parts);
    std::vector<double> losses(static_cast<size_t>(parts));
    std::vector<std::map<std::string, Tensor>> pieces(static_cast<size_t>(parts));
    std::vector<Program> programs;
    for (int r = 0; r < parts; ++r) {
      BuiltModel b;
      programs.push_back(compile_tp(model, in, parts, r, &b));
    }
    std::vector<std::thread> threads;
    for (int r = 0; r < parts; ++r)
      threads.emplace_back([&, r] {
        ThreadCommunicator comm(group, r);
        Executor local(programs[static_cast<size_t>(r)], kCpu, 5, {}, nullptr, &comm);
        std::map<std::string, Tensor> whole;
        init_parameters(built.init, 5, [&](const std::string& n) -> Tensor& {
          return whole.emplace(n, Tensor::empty(one.tensor(n).shape(), DType::f32)).first->second;
        });
        for (const auto& [n, w] : whole) {
          const Value& v = local.program().graph.value(local.program().graph.find_value(n));
          const Tensor p = take_part(w, v.placement.tensor, r, parts);
          std::memcpy(local.tensor(n).raw(), p.raw(), p.nbytes());
        }
        feed_batch(local, in);
        local.run();
        losses[static_cast<size_t>(r)] = local.output("loss").to_f64()[0];
        for (const auto& [n, w] : whole) pieces[static_cast<size_t>(r)][n] = local.tensor(n).clone();
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < parts; ++r) EXPECT_NEAR(losses[static_cast<size_t>(r)], loss, 1e-6 * loss) << parts;
    for (const auto& [n, piece] : pieces[0]) {
      const Value& v = programs[0].graph.value(programs[0].graph.find_value(n));
      Tensor whole = Tensor::empty(one.tensor(n).shape(), DType::f32);
      for (int r = 0; r < parts; ++r)
        put_part(whole, pieces[static_cast<size_t>(r)].at(n), v.placement.tensor, r, parts);
      const std::vector<double> a = one.tensor(n).to_f64(), b = whole.to_f64();
      double scale = 0, diff = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        scale = std::max(scale, std::abs(a[i]));
        diff = std::max(diff, std::abs(a[i] - b[i]));
      }
      // An attention key bias has an exactly zero gradient (softmax ignores a shift shared by all keys), so
      // its update is rounding noise: judged against the weights' scale, not its own.
      EXPECT_LE(diff, 1e-5 * scale + 1e-8) << n << " on " << parts << " ranks";
    }
  }
}

TEST(TensorParallel, RanksInThreadsMatchOneProcess) {
  expect_tensor_ranks_match_one_process(zoo("gpt", kGpt), kText);
}

// The modern zoo (4 heads and 4 key/value heads, so that 4 ranks split them): Llama's separate q/k/v and
// SwiGLU, ViT's patches and class token, BERT's masking, post-LN blocks and decoder bias.
const std::string kLlama = "{n_layer: 2, n_head: 4, n_kv_head: 4, d_model: 16, ffn: 32, dropout: 0.1}";
const std::string kLlamaGqa = "{n_layer: 2, n_head: 8, n_kv_head: 4, d_model: 32, ffn: 32}";
const std::string kVit = "{patch: 4, n_layer: 2, n_head: 4, d_model: 16, ffn: 32, dropout: 0.1}";
// bert's default vocabulary (the data's 32 ids and [MASK], padded to 40) is one the ranks divide, so that
// the tied decoder and its cross-entropy are vocabulary-parallel: split by rows instead, each rank's mean
// over its masked positions would be averaged, which is not the mean over all of them (their counts
// differ).
const std::string kBert = "{n_layer: 2, n_head: 4, d_model: 16, ffn: 32, dropout: 0.1, mask_p: 0.5}";
const ModelInputs kImages{false, {2, 1, 8, 8}, 4};

TEST(TensorParallel, LlamaRanksInThreadsMatchOneProcess) {
  expect_tensor_ranks_match_one_process(zoo("llama", kLlama), kText);
  expect_tensor_ranks_match_one_process(zoo("llama", kLlamaGqa), kText);
}
TEST(TensorParallel, VitRanksInThreadsMatchOneProcess) {
  expect_tensor_ranks_match_one_process(zoo("vit", kVit), kImages);
}
TEST(TensorParallel, BertRanksInThreadsMatchOneProcess) {
  expect_tensor_ranks_match_one_process(zoo("bert", kBert), kText);
}

// Megatron-LM's layout for Llama by deduction alone: q, k, v and SwiGLU's gate and up column-parallel, the
// attention output and down projections row-parallel, heads and key/value heads split alike.
TEST(TensorParallel, LlamaGetsMegatronsLayout) {
  BuiltModel m;
  const Program p = compile_tp(zoo("llama", kLlamaGqa), kText, 2, 1, &m);
  EXPECT_EQ(sbp_of(p, "embed_tokens/w"), "S(0)");
  EXPECT_EQ(sbp_of(p, "lm_head/w"), "S(0)");  // vocabulary-parallel head
  EXPECT_EQ(sbp_of(p, "norm/gamma"), "B");
  for (const std::string b : {"layers.0/", "layers.1/"}) {
    for (const std::string w : {"attn/q/w", "attn/k/w", "attn/v/w", "mlp/gate/w", "mlp/up/w"})
      EXPECT_EQ(sbp_of(p, b + w), "S(0)") << b + w;
    EXPECT_EQ(sbp_of(p, b + "attn/proj/w"), "S(1)");
    EXPECT_EQ(sbp_of(p, b + "mlp/down/w"), "S(1)");
    EXPECT_EQ(sbp_of(p, b + "ln1/gamma"), "B");
  }
  const Value& k = p.graph.value(p.graph.find_value("layers.0/attn/k/w"));
  EXPECT_EQ(k.shape(), (Shape{8, 32}));  // 2 of the 4 key/value heads of width 4
  // Forward: the embedding's partial sums and 2 row-parallel outputs per block; nothing gathered.
  int reduces = 0, gathers = 0;
  for (NodeId id : p.order) {
    reduces += p.graph.node(id).op == "sbp_all_reduce";
    gathers += p.graph.node(id).op == "sbp_all_gather";
  }
  EXPECT_EQ(gathers, 0);
  EXPECT_GE(reduces, 5);
}

// The same step on `parts` data ranks (threads), each fed its rows of the global batch of 4: the SBP pass
// splits the batch, the loss is the global batch's mean, dropout draws what one process draws for those
// rows, and the bucketed gradient all-reduce leaves every rank with one process's weights.
// The global batch's values from row `first` on, whatever part of it a rank holds.
void feed_rows(Executor& ex, const ModelInputs& in, int64_t first) {
  Tensor& x = ex.tensor("x");
  Tensor& y = ex.tensor("y");
  const int64_t xoff = first * (x.numel() / x.shape()[0]), yoff = first * (y.numel() / y.shape()[0]);
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (in.text)
      x.data<int64_t>()[i] = ((xoff + i) * 7 + 3) % in.num_classes;
    else
      x.data<float>()[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(xoff + i)));
  }
  for (int64_t i = 0; i < y.numel(); ++i) y.data<int64_t>()[i] = ((yoff + i) * 5 + 1) % in.num_classes;
  ex.tensor("lr").data<float>()[0] = 0.1f;
}

// The same step on `parts` data ranks (threads), each fed its rows of the global batch of 4: the SBP pass
// splits the batch, the loss is the global batch's mean, dropout draws what one process draws for those
// rows, and the bucketed gradient all-reduce leaves every rank with one process's weights.
void expect_data_ranks_match_one_process(const ModelConfig& model, const ModelInputs& in) {
  BuiltModel built;
  Executor one(compile_tp(model, in, 1, 0, &built), kCpu, 5);
  init_parameters(built.init, 5, [&](const std::string& n) -> Tensor& { return one.tensor(n); });
  feed_rows(one, in, 0);
  one.run();
  const double loss = one.output("loss").to_f64()[0];

  for (int parts : {2, 4}) {
    ThreadGroup group(parts);
    std::vector<double> losses(static_cast<size_t>(parts));
    std::vector<std::map<std::string, Tensor>> weights(static_cast<size_t>(parts));
    std::vector<Program> programs;
    for (int r = 0; r < parts; ++r) {
      BuiltModel b;
      programs.push_back(compile_tp(model, in, parts, r, &b, parts));
    }
    std::vector<std::thread> threads;
    for (int r = 0; r < parts; ++r)
      threads.emplace_back([&, r] {
        ThreadCommunicator comm(group, r);
        Executor local(programs[static_cast<size_t>(r)], kCpu, 5, {}, &comm, nullptr);
        init_parameters(built.init, 5, [&](const std::string& n) -> Tensor& { return local.tensor(n); });
        feed_rows(local, in, r * in.x_shape[0] / parts);
        local.run();
        losses[static_cast<size_t>(r)] = local.output("loss").to_f64()[0];
        for (const auto& [n, spec] : built.init) weights[static_cast<size_t>(r)][n] = local.tensor(n).clone();
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < parts; ++r) {
      EXPECT_NEAR(losses[static_cast<size_t>(r)], loss, 1e-6 * loss) << parts;
      for (const auto& [n, w] : weights[static_cast<size_t>(r)]) {
        const std::vector<double> a = one.tensor(n).to_f64(), b = w.to_f64();
        double scale = 0, diff = 0;
        for (size_t i = 0; i < a.size(); ++i) {
          scale = std::max(scale, std::abs(a[i]));
          diff = std::max(diff, std::abs(a[i] - b[i]));
        }
        EXPECT_LE(diff, 1e-5 * scale + 1e-8) << n << " on rank " << r << " of " << parts;
      }
    }
  }
}

TEST(DataParallel, RanksInThreadsMatchOneProcess) {
  expect_data_ranks_match_one_process(zoo("gpt", kGpt), {true, {4, 8}, 32});
}

// Llama and ViT (every label counts, so the ranks' means average to the batch's). BERT's loss is a mean
// over masked positions, which the ranks count differently (models/README.md).
TEST(DataParallel, LlamaAndVitRanksInThreadsMatchOneProcess) {
  expect_data_ranks_match_one_process(zoo("llama", kLlamaGqa), {true, {4, 8}, 32});
  expect_data_ranks_match_one_process(zoo("vit", kVit), {false, {4, 1, 8, 8}, 4});
}

// Multi-tensor updates (graph pass group_updates), on the CPU: the grouped program of a GPT, and the same
// training whether its updates are grouped or not, on one process and under ZeRO-1 on 2 data ranks.
CompileOptions update_options(const std::string& type, bool grouped) {
  CompileOptions o;
  o.optimizer.type = type;
  o.optimizer.momentum = 0.9;
  o.optimizer.weight_decay = 0.1;
  o.optimizer.decay_1d = false;  // two groups: the decayed 2-d weights and the undecayed 1-d ones
  o.group_updates = grouped;
  return o;
}

Program compile_gpt(const CompileOptions& o, const ModelInputs& in, BuiltModel* built) {
  Graph g;
  *built = build_model(g, zoo("gpt", kGpt), in, /*training=*/true);
  g.unmark_output("logits");
  return compile(std::move(g), o);
}

TEST(MultiTensorUpdates, AGptsUpdatesBecomeTwoNodes) {
  for (const std::string type : {"adamw", "sgd"}) {
    SCOPED_TRACE(type);
    const std::string single = type == "sgd" ? "sgd_update" : "adamw_update";
    for (bool grouped : {false, true}) {
      BuiltModel built;
      const Program p = compile_gpt(update_options(type, grouped), kText, &built);
      int singles = 0, multis = 0;
      int64_t tensors = 0;
      for (NodeId id : p.order) {
        const Node& n = p.graph.node(id);
        // Ungrouped, SGD computes some weights' gradients into their momentum (fuse_momentum_products).
        singles += n.op == single || n.op == "sgd_product_update";
        if (n.op == single + "_multi") {
          ++multis;
          tensors += n.attrs.i("tensors");
        }
      }
      EXPECT_EQ(singles, grouped ? 0 : static_cast<int>(built.init.size()));
      EXPECT_EQ(multis, grouped ? 2 : 0);
      EXPECT_EQ(tensors, grouped ? static_cast<int64_t>(built.init.size()) : 0);
    }
  }
  // The default: grouped on the GPU only.
  BuiltModel built;
  CompileOptions o = update_options("adamw", false);
  o.group_updates.reset();
  const Program p = compile_gpt(o, kText, &built);
  for (NodeId id : p.order) EXPECT_EQ(p.graph.node(id).op.find("_multi"), std::string::npos);
}

// Steps of the GPT on row-shifted batches; each parameter and optimizer state after them, by name.
std::map<std::string, Tensor> train_gpt(const Program& p, const BuiltModel& built, int64_t steps,
                                        int64_t accumulation, Communicator* data = nullptr,
                                        int64_t first_row = 0) {
  Executor ex(p, kCpu, 5, {}, data, nullptr);
  // ZeRO-3's parameters are flat shards: drawn whole, as one process draws them, and cut (zero-padded).
  std::map<std::string, Tensor> whole;
  init_parameters(built.init, 5, [&](const std::string& n) -> Tensor& {
    const Value& v = p.graph.value(p.graph.find_value(n));
    if (!v.placement.sharded()) return ex.tensor(n);
    return whole.emplace(n, Tensor::empty(v.placement.global_shape, v.dtype())).first->second;
  });
  for (const auto& [n, w] : whole) {
    Tensor& t = ex.tensor(n);
    const int64_t s = t.numel(), first = (data ? data->rank() : 0) * s;
    const size_t esize = dtype_size(t.dtype());
    std::memset(t.raw(), 0, t.nbytes());
    std::memcpy(t.raw(), static_cast<const char*>(w.raw()) + static_cast<size_t>(first) * esize,
                static_cast<size_t>(std::clamp<int64_t>(w.numel() - first, 0, s)) * esize);
  }
  for (int64_t step = 0; step < steps; ++step) {
    ex.tensor("lr").data<float>()[0] = 0.05f / static_cast<float>(step + 1);
    if (p.graph.find_value("opt/step") != kNoValue) ex.tensor("opt/step").data<int64_t>()[0] = step + 1;
    for (int64_t micro = 0; micro < accumulation; ++micro) {
      Tensor& x = ex.tensor("x");
      Tensor& y = ex.tensor("y");
      const int64_t off = first_row * x.shape()[1] + (step * accumulation + micro) * 11;
      for (int64_t i = 0; i < x.numel(); ++i) x.data<int64_t>()[i] = ((off + i) * 7 + 3) % 32;
      for (int64_t i = 0; i < y.numel(); ++i) y.data<int64_t>()[i] = ((off + i) * 5 + 1) % 32;
      if (accumulation > 1) ex.tensor("opt/micro").data<int64_t>()[0] = micro;
      ex.run(/*apply=*/micro == accumulation - 1);
    }
  }
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : ex.persistent()) {
    const ValueKind k = p.graph.value(p.graph.find_value(name)).kind;
    if (k == ValueKind::param || k == ValueKind::state) out[name] = t.clone();
  }
  return out;
}

void expect_bitwise_equal(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    const Tensor& u = b.at(name);
    ASSERT_EQ(t.nbytes(), u.nbytes()) << name;
    EXPECT_EQ(std::memcmp(t.raw(), u.raw(), t.nbytes()), 0) << name << " differs";
  }
}

// The packed attention fusion (graph/passes.cc, fuse_packed_attention): a GPT's qkv split, head transposes,
// sdpa and merge become one sdpa_qkv per block on the CPU, with no split, transpose or concat left in either
// pass, and training gives bitwise the eager (unfused) program's weights, dropout included, in f32 and in
// bf16 (native kernels where the CPU has avx512_bf16, else widened). Not under tensor parallelism, which
// splits the heads.
TEST(PackedAttention, AGptsAttentionIsOneOpAndTrainsBitwiseAsEager) {
  auto count = [](const Program& p) {
    std::map<std::string, int> ops;
    for (NodeId id : p.order) ++ops[p.graph.node(id).op];
    return ops;
  };
  for (const DType compute : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(compute));
    CompileOptions o = update_options("adamw", false);
    o.compute = compute;
    BuiltModel built;
    const Program fused = compile_gpt(o, kText, &built);
    auto ops = count(fused);
    EXPECT_EQ(ops["sdpa_qkv"], 2);
    EXPECT_EQ(ops["sdpa_qkv_grad"], 2);
    for (const std::string gone : {"sdpa", "sdpa_grad", "split", "transpose", "concat"})
      EXPECT_EQ(ops[gone], 0) << gone;
    for (NodeId id : fused.order)
      if (fused.graph.node(id).op == "sdpa_qkv") {
        EXPECT_EQ(fused.graph.value(fused.graph.node(id).outputs[0]).dtype(), compute);
      }
    o.eager = true;
    const Program eager = compile_gpt(o, kText, &built);
    EXPECT_EQ(count(eager)["sdpa_qkv"], 0);
    EXPECT_EQ(count(eager)["sdpa"], 2);
    expect_bitwise_equal(train_gpt(fused, built, 3, 1), train_gpt(eager, built, 3, 1));
  }
  BuiltModel built;
  EXPECT_EQ(count(compile_tp(zoo("gpt", kGpt), kText, 2, 0, &built))["sdpa_qkv"], 0);
}

TEST(MultiTensorUpdates, TrainingIsBitwiseTheSameGroupedOrNot) {
  struct Case {
    std::string type;
    int64_t accumulation;
    double clip;
  };
  for (const Case& c :
       {Case{"adamw", 1, 0.5}, Case{"adamw", 2, 0}, Case{"sgd", 1, 0.5}, Case{"adam", 2, 0.5}}) {
    SCOPED_TRACE(cat(c.type, ", accumulation ", c.accumulation, ", clip ", c.clip));
    std::vector<std::map<std::string, Tensor>> runs;
    for (bool grouped : {false, true}) {
      CompileOptions o = update_options(c.type, grouped);
      o.optimizer.accumulation = c.accumulation;
      o.optimizer.clip_grad_norm = c.clip;
      BuiltModel built;
      const Program p = compile_gpt(o, kText, &built);
      runs.push_back(train_gpt(p, built, 3, c.accumulation));
    }
    expect_bitwise_equal(runs[0], runs[1]);
  }
}

// ZeRO-1: the grouped update runs on the ranks' shards before their gathers (the schedule keeps the first
// update's place), so every rank ends with the ungrouped program's parameters and state.
TEST(MultiTensorUpdates, ZeroShardsAreUpdatedAlikeGroupedOrNot) {
  const ModelInputs in{true, {4, 8}, 32};
  constexpr int kParts = 2;
  std::vector<std::vector<std::map<std::string, Tensor>>> runs(2);
  for (bool grouped : {false, true}) {
    CompileOptions o = update_options("adamw", grouped);
    o.optimizer.clip_grad_norm = 0.5;
    o.optimizer.zero_shards = kParts;
    o.zero = 1;
    o.data_parallel = kParts;
    std::vector<Program> programs;
    BuiltModel built;
    for (int r = 0; r < kParts; ++r) {
      o.data_rank = r;
      programs.push_back(compile_gpt(o, in, &built));
    }
    if (grouped) {
      const Graph& g = programs[0].graph;
      bool updated = false;
      int gathers = 0;
      for (NodeId id : programs[0].order) {
        updated = updated || g.node(id).op == "adamw_update_multi";
        if (g.node(id).op == "all_gather_into") {
          EXPECT_TRUE(updated) << g.node(id).name << " before the update";
          ++gathers;
        }
      }
      EXPECT_EQ(gathers, static_cast<int>(built.init.size()));
    }
    ThreadGroup group(kParts);
    runs[grouped ? 1 : 0].resize(kParts);
    std::vector<std::thread> threads;
    for (int r = 0; r < kParts; ++r)
      threads.emplace_back([&, r] {
        ThreadCommunicator comm(group, r);
        runs[grouped ? 1 : 0][static_cast<size_t>(r)] =
            train_gpt(programs[static_cast<size_t>(r)], built, 3, 1, &comm, r * 4 / kParts);
      });
    for (auto& t : threads) t.join();
  }
  for (int r = 0; r < kParts; ++r)
    expect_bitwise_equal(runs[0][static_cast<size_t>(r)], runs[1][static_cast<size_t>(r)]);
}

// ZeRO-3: every parameter is a flat shard, gathered where the forward pass reads it and again, just before
// its first reader, in the backward pass; the gradients arrive reduce-scattered and the shards are updated
// in place. On two data ranks (threads) each rank ends with its part of ZeRO-2's parameters and with its
// optimizer state, bit for bit (grouped updates or not).
TEST(Zero3, ShardedParametersGatheredAroundTheirUsesTrainAsZero2) {
  const ModelInputs in{true, {4, 8}, 32};
  constexpr int kParts = 2;
  auto train = [&](int zero, bool grouped, BuiltModel* built, std::vector<Program>* programs) {
    CompileOptions o = update_options("adamw", grouped);
    o.optimizer.clip_grad_norm = 0.5;
    o.optimizer.zero_shards = kParts;
    o.optimizer.sharded_grads = true;
    o.zero = zero;
    o.data_parallel = kParts;
    for (int r = 0; r < kParts; ++r) {
      o.data_rank = r;
      programs->push_back(compile_gpt(o, in, built));
    }
    ThreadGroup group(kParts);
    std::vector<std::map<std::string, Tensor>> runs(kParts);
    std::vector<std::thread> threads;
    for (int r = 0; r < kParts; ++r)
      threads.emplace_back([&, r] {
        ThreadCommunicator comm(group, r);
        runs[static_cast<size_t>(r)] =
            train_gpt((*programs)[static_cast<size_t>(r)], *built, 3, 1, &comm, r * 4 / kParts);
      });
    for (auto& t : threads) t.join();
    return runs;
  };
  BuiltModel built;
  std::vector<Program> zero2_programs;
  const auto zero2 = train(2, false, &built, &zero2_programs);
  for (bool grouped : {false, true}) {
    SCOPED_TRACE(grouped ? "grouped updates" : "one update per parameter");
    std::vector<Program> programs;
    const auto zero3 = train(3, grouped, &built, &programs);
    const Program& p = programs[0];
    const Graph& g = p.graph;
    std::vector<size_t> pos(g.nodes().size());
    for (size_t i = 0; i < p.order.size(); ++i) pos[static_cast<size_t>(p.order[i])] = i;
    int forward = 0, backward = 0;
    for (NodeId id : p.order) {
      const Node& n = g.node(id);
      EXPECT_NE(n.op, "all_gather_into");
      EXPECT_NE(n.op, "local_shard");
      if (n.op != "gather_shards") continue;
      const Value& shard = g.value(n.inputs[0]);
      EXPECT_EQ(shard.kind, ValueKind::param);
      EXPECT_EQ(shard.shape(), Shape{shard_size(numel(shard.placement.global_shape), kParts)});
      if (n.recomputes < 0) {
        ++forward;
        continue;
      }
      ++backward;
      EXPECT_GE(id, g.backward_begin);
      EXPECT_LT(pos[static_cast<size_t>(id)], pos[static_cast<size_t>(n.schedule_as)]) << n.name;
    }
    EXPECT_EQ(forward, static_cast<int>(g.param_grads().size()));
    EXPECT_GT(backward, 0);  // the weights the backward pass reads (the matmuls' and the tied embedding)
    for (int r = 0; r < kParts; ++r) {
      for (const auto& [name, t] : zero3[static_cast<size_t>(r)]) {
        const Tensor& want = zero2[static_cast<size_t>(r)].at(name);
        if (g.value(g.find_value(name)).kind != ValueKind::param) {
          EXPECT_EQ(std::memcmp(t.raw(), want.raw(), t.nbytes()), 0) << name << " rank " << r;
          continue;
        }
        // This rank's part of the parameter ZeRO-2 keeps whole.
        const int64_t s = t.numel(), first = r * s, n = std::clamp<int64_t>(want.numel() - first, 0, s);
        EXPECT_EQ(std::memcmp(t.raw(), want.data<float>() + first, static_cast<size_t>(n) * sizeof(float)), 0)
            << name << " rank " << r;
      }
    }
  }
}

}  // namespace
}  // namespace flowrun

namespace flowrun {
namespace {

Program compile_stage(const ModelConfig& m, const ModelInputs& in, int64_t stages, int64_t stage) {
  Graph g;
  build_model(g, m, in, /*training=*/true);
  g.unmark_output("logits");
  CompileOptions o;
  o.optimizer.type = "adamw";
  o.optimizer.accumulation = 4;
  o.optimizer.pipeline = true;
  o.pipeline = stages;
  o.pipeline_stage = stage;
  return compile(std::move(g), o);
}

TEST(PipelineParallel, GptCutBetweenBlocks) {
  const ModelConfig m = zoo("gpt", "{n_layer: 4, n_head: 2, d_model: 16, dropout: 0.1}");
  const Program first = compile_stage(m, kText, 2, 0), last = compile_stage(m, kText, 2, 1);
  auto has = [](const Program& p, const std::string& n) { return p.graph.find_value(n) != kNoValue; };
  // Balanced by FLOPs: the head's matmul weighs like a block, so the first stage takes more blocks.
  EXPECT_TRUE(has(first, "blocks.0/attn/qkv/w"));
  EXPECT_FALSE(has(last, "blocks.0/attn/qkv/w"));
  EXPECT_TRUE(has(last, "blocks.3/mlp/fc/w"));
  EXPECT_FALSE(has(first, "blocks.3/mlp/fc/w"));
  // The activation crosses as pp/out -> pp/in ([2, 8, 16]), its gradient back; the loss is the last's.
  EXPECT_EQ(first.graph.value(first.graph.outputs().at("pp/out")).shape(), (Shape{2, 8, 16}));
  EXPECT_TRUE(has(first, "pp/out_grad"));
  EXPECT_TRUE(has(last, "pp/in"));
  EXPECT_TRUE(last.graph.outputs().count("grad/pp/in"));
  EXPECT_TRUE(last.graph.outputs().count("loss"));
  EXPECT_FALSE(first.graph.outputs().count("loss"));
  // The tied embedding lives on both ends; the last stage's copy is left out of the norm.
  const Value& wte0 = first.graph.value(first.graph.find_value("wte/w"));
  const Value& wte1 = last.graph.value(last.graph.find_value("wte/w"));
  EXPECT_TRUE(wte0.placement.pipe_shared && wte1.placement.pipe_shared);
  EXPECT_FALSE(wte0.placement.pipe_copy);
  EXPECT_TRUE(wte1.placement.pipe_copy);
  // Forward nodes first, then the backward pass, then the update (apply phase, even without accumulation).
  for (const Program* p : {&first, &last}) {
    ASSERT_GT(p->backward_begin, 0u);
    for (size_t i = 0; i < p->order.size(); ++i)
      EXPECT_EQ(p->graph.node(p->order[i]).id < p->graph.backward_begin, i < p->backward_begin);
    bool shared_reduced = false;
    for (NodeId id : p->order)
      if (p->graph.node(id).name == "pipeline/shared/wte/w") shared_reduced = p->graph.node(id).phase == 1;
    EXPECT_TRUE(shared_reduced);
  }
}

TEST(PipelineParallel, LlamaViTAndBertCutBetweenBlocks) {
  struct Case {
    std::string zoo, params, block;
    ModelInputs in;
    Shape activation;
  };
  const std::vector<Case> cases = {
      {"llama", "{n_layer: 4, n_head: 2, d_model: 16, ffn: 32}", "layers", kText, {2, 8, 16}},
      {"vit", "{patch: 4, n_layer: 4, n_head: 2, d_model: 16, ffn: 32}", "blocks", kImages, {2, 5, 16}},
      {"bert", "{n_layer: 4, n_head: 2, d_model: 16, ffn: 32}", "layer", kText, {2, 8, 16}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.zoo);
    const ModelConfig m = zoo(c.zoo, c.params);
    const Program first = compile_stage(m, c.in, 2, 0), last = compile_stage(m, c.in, 2, 1);
    auto has = [](const Program& p, const std::string& n) { return p.graph.find_value(n) != kNoValue; };
    const std::string w0 = c.block + ".0/ln1/gamma", w3 = c.block + ".3/ln2/gamma";
    EXPECT_TRUE(has(first, w0));
    EXPECT_FALSE(has(last, w0));
    EXPECT_TRUE(has(last, w3));
    EXPECT_FALSE(has(first, w3));
    // Exactly one block boundary: every block's parameters live on one stage.
    for (int b = 0; b < 4; ++b) {
      const std::string blk = cat(c.block, ".", b, "/");
      int on_first = 0, on_last = 0;
      for (const Value& v : first.graph.values())
        on_first += v.kind == ValueKind::param && v.name.rfind(blk, 0) == 0;
      for (const Value& v : last.graph.values())
        on_last += v.kind == ValueKind::param && v.name.rfind(blk, 0) == 0;
      EXPECT_TRUE(on_first == 0 || on_last == 0) << blk;
    }
    EXPECT_EQ(first.graph.value(first.graph.outputs().at("pp/out")).shape(), c.activation);
    EXPECT_TRUE(last.graph.outputs().count("loss"));
  }
}

TEST(PipelineParallel, TooManyStagesIsAnInputError) {
  ModelConfig c;
  c.layers = YAML::Load("[{flatten: {}}, {linear: {name: a, out: 8}}, {linear: {name: b, out: 4}}]");
  EXPECT_NO_THROW(compile_stage(c, {false, {4, 6}, 4}, 2, 1));
  try {
    compile_stage(c, {false, {4, 6}, 4}, 6, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_input);
    EXPECT_NE(std::string(e.what()).find("cannot be cut into 6 stages"), std::string::npos) << e.what();
  }
}

// One SBP deduction for both axes: every zoo model splits its batch through every layer (no data-axis
// gather or slice), the loss is the one data-axis all-reduce of the forward pass, and every parameter's
// gradient reaches the optimizer through a bucket. Under DP2 x TP2 the GPT keeps Megatron's layout and its
// gradients are summed over both axes.
TEST(DataParallel, ZooModelsSplitTheBatchThroughEveryLayer) {
  struct Case {
    std::string zoo, params;
    ModelInputs in;
    int64_t tensor;
  };
  const std::vector<Case> cases = {
      {"mlp", "{}", {false, {4, 1, 28, 28}, 10}, 1},
      {"cnn", "{channels: [8, 16], hidden: [32]}", {false, {4, 1, 28, 28}, 10}, 1},
      {"resnet", "{}", {false, {4, 3, 32, 32}, 10}, 1},
      {"gpt", kGpt, {true, {4, 8}, 32}, 1},
      {"gpt", kGpt, {true, {4, 8}, 32}, 2},
      {"llama", kLlamaGqa, {true, {4, 8}, 32}, 1},
      {"llama", kLlamaGqa, {true, {4, 8}, 32}, 2},
      {"vit", kVit, {false, {4, 1, 8, 8}, 4}, 1},
      {"vit", kVit, {false, {4, 1, 8, 8}, 4}, 2},
      {"bert", kBert, {true, {4, 8}, 32}, 1},
      {"bert", kBert, {true, {4, 8}, 32}, 2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(cat(c.zoo, " tensor ", c.tensor));
    Graph g;
    build_model(g, zoo(c.zoo, c.params), c.in, /*training=*/true);
    g.unmark_output("logits");
    CompileOptions o;
    o.optimizer.type = "sgd";
    o.data_parallel = 2;
    o.data_rank = 1;
    o.tensor_parallel = c.tensor;
    o.tensor_rank = c.tensor - 1;
    const Program p = compile(std::move(g), o);
    const Graph& pg = p.graph;
    EXPECT_EQ(pg.value(pg.find_value("x")).shape()[0], 2);  // the rank's half of the batch
    int loss_reduces = 0;
    for (NodeId id : p.order) {
      const Node& n = pg.node(id);
      const bool data = n.op.rfind("sbp_", 0) == 0 && n.attrs.is("mesh", "data");
      EXPECT_FALSE(data && (n.op == "sbp_all_gather" || n.op == "sbp_slice")) << n.name;
      loss_reduces += data && n.op == "sbp_all_reduce";
    }
    EXPECT_EQ(loss_reduces, 1);
    EXPECT_FALSE(pg.param_grads().empty());
    for (const auto& [param, grad] : pg.param_grads()) {
      EXPECT_EQ(pg.node(pg.value(grad).producer).op, "all_reduce_wait") << pg.value(param).name;
      EXPECT_EQ(pg.value(param).placement.data, Sbp::broadcast());
    }
    if (c.tensor > 1 && c.zoo == "gpt") {
      EXPECT_EQ(sbp_of(p, "blocks.0/attn/qkv/w"), "S(0)x3");
      EXPECT_EQ(sbp_of(p, "blocks.0/attn/proj/w"), "S(1)");
      EXPECT_EQ(sbp_of(p, "wte/w"), "S(0)");
    }
  }
}

}  // namespace
}  // namespace flowrun
