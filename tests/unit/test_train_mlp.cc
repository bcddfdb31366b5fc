// Trains an MLP built through the C++ builder on a real table (scikit-learn's wine data, from Debian's
// python3-sklearn) with SGD + momentum, and checks held-out accuracy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "data/table.h"
#include "models.h"

namespace flowrun::testing {
namespace {

struct Split {
  Tensor x_train, y_train, x_test, y_test;
};

// Seeded shuffle, 80/20 split, features standardised with the training statistics.
Split split_standardise(const Table& t, uint64_t seed) {
  const int64_t n = t.x.shape()[0], f = t.x.shape()[1], n_train = n * 4 / 5;
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  const RngStream r{seed, 99};
  for (int64_t i = n - 1; i > 0; --i) std::swap(idx[static_cast<size_t>(i)], idx[r.block(static_cast<uint64_t>(i))[0] % static_cast<uint64_t>(i + 1)]);
  std::vector<double> mean(static_cast<size_t>(f), 0), sd(static_cast<size_t>(f), 0);
  for (int64_t i = 0; i < n_train; ++i)
    for (int64_t c = 0; c < f; ++c) mean[static_cast<size_t>(c)] += t.x.data<float>()[idx[static_cast<size_t>(i)] * f + c] / static_cast<double>(n_train);
  for (int64_t i = 0; i < n_train; ++i)
    for (int64_t c = 0; c < f; ++c) {
      const double d = t.x.data<float>()[idx[static_cast<size_t>(i)] * f + c] - mean[static_cast<size_t>(c)];
      sd[static_cast<size_t>(c)] += d * d / static_cast<double>(n_train);
    }
  Split s{Tensor::empty({n_train, f}, DType::f32), Tensor::empty({n_train}, DType::i64),
          Tensor::empty({n - n_train, f}, DType::f32), Tensor::empty({n - n_train}, DType::i64)};
  for (int64_t i = 0; i < n; ++i) {
    const bool train = i < n_train;
    Tensor& x = train ? s.x_train : s.x_test;
    Tensor& y = train ? s.y_train : s.y_test;
    const int64_t row = train ? i : i - n_train, src = idx[static_cast<size_t>(i)];
    for (int64_t c = 0; c < f; ++c)
      x.data<float>()[row * f + c] = static_cast<float>((t.x.data<float>()[src * f + c] - mean[static_cast<size_t>(c)]) /
                                                        std::sqrt(sd[static_cast<size_t>(c)] + 1e-12));
    y.data<int64_t>()[row] = t.y.data<int64_t>()[src];
  }
  return s;
}

// Copies rows [start, start + batch) (wrapping) of x and y into the executor's inputs.
void feed(Executor& ex, const Tensor& x, const Tensor& y, int64_t start, int64_t batch) {
  const int64_t n = x.shape()[0], f = x.shape()[1];
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t src = (start + i) % n;
    std::memcpy(ex.tensor("x").data<float>() + i * f, x.data<float>() + src * f, static_cast<size_t>(f) * sizeof(float));
    ex.tensor("y").data<int64_t>()[i] = y.data<int64_t>()[src];
  }
}

double accuracy(Executor& train, const Tensor& x, const Tensor& y, const std::vector<int64_t>& dims) {
  Graph g;
  build_mlp(g, x.shape()[0], dims, /*with_loss=*/false);
  CompileOptions opts;
  opts.loss = "";
  Executor ev(compile(std::move(g), opts));
  for (auto& [name, t] : ev.persistent())
    if (name != "x") std::memcpy(ev.tensor(name).raw(), train.tensor(name).raw(), t.nbytes());
  std::memcpy(ev.tensor("x").raw(), x.raw(), x.nbytes());
  ev.run();
  const Tensor logits = ev.output("logits");
  const int64_t n = logits.shape()[0], k = logits.shape()[1];
  int64_t correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits.data<float>() + i * k;
    correct += (std::max_element(row, row + k) - row) == y.data<int64_t>()[i];
  }
  return static_cast<double>(correct) / static_cast<double>(n);
}

TEST(TrainMLP, WineHeldOutAccuracyAtLeast94Percent) {
  const Table t = load_sklearn_csv(sklearn_data_dir() + "/wine_data.csv");
  ASSERT_EQ(t.x.shape(), (Shape{178, 13}));
  const Split s = split_standardise(t, 7);
  const std::vector<int64_t> dims = {13, 32, 3};
  const int64_t batch = 16;
  Graph g;
  build_mlp(g, batch, dims, /*with_loss=*/true);
  CompileOptions opts;
  opts.optimizer.type = "sgd";
  opts.optimizer.momentum = 0.9;
  Executor ex(compile(std::move(g), opts), kCpu, 1);
  // The fusion pass replaced log_softmax + nll_loss by one cross_entropy.
  int fused = 0;
  for (NodeId id : ex.program().order) fused += ex.program().graph.node(id).op == "cross_entropy";
  EXPECT_EQ(fused, 1);
  init_params(ex, 3);
  ex.tensor("lr").data<float>()[0] = 0.02f;
  const double before = accuracy(ex, s.x_test, s.y_test, dims);
  double first_loss = 0, last_loss = 0;
  for (int64_t step = 0; step < 300; ++step) {
    feed(ex, s.x_train, s.y_train, step * batch, batch);
    ex.run();
    const double loss = ex.output("loss").to_f64()[0];
    ASSERT_TRUE(std::isfinite(loss)) << "step " << step;
    if (step == 0) first_loss = loss;
    last_loss = loss;
  }
  const double after = accuracy(ex, s.x_test, s.y_test, dims);
  std::printf("wine MLP: held-out accuracy %.3f before training, %.3f after 300 steps; loss %.4f -> %.4f\n", before,
              after, first_loss, last_loss);
  EXPECT_LT(last_loss, first_loss * 0.2);
  EXPECT_GE(after, 0.94);
}

}  // namespace
}  // namespace flowrun::testing
